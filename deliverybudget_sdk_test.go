package sbclaim_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"

	"github.com/sbclaim/sbclaim"
)

// The SDK's own administration client, against a namespace that refuses
// the identity as Service Bus refuses a Data Receiver: the budget is
// unchecked (ErrNotAuthorized), the setting kept, no error.
func TestCheckMaxDeliveryCountRealClientUnauthorized(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusUnauthorized, http.StatusForbidden} {
		var asked atomic.Int32
		srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			asked.Add(1)
			w.WriteHeader(status)
			_, _ = w.Write([]byte(`<Error><Code>` + http.StatusText(status) + `</Code><Detail>Manage,EntityRead claims required for this operation.</Detail></Error>`))
		}))
		defer srv.Close()
		host := strings.TrimPrefix(srv.URL, "https://")
		a, err := admin.NewClientFromConnectionString("Endpoint=sb://"+host+"/;SharedAccessKeyName=receiver;SharedAccessKey=c2VjcmV0",
			&admin.ClientOptions{ClientOptions: azcore.ClientOptions{Transport: srv.Client(), Retry: policy.RetryOptions{MaxRetries: -1}}})
		if err != nil {
			t.Fatal(err)
		}
		got, err := sbclaim.CheckMaxDeliveryCount(context.Background(), a, sbclaim.EntityName{Queue: "payments"}, 5)
		if err != nil || got.Checked || got.MaxDeliveryCount != 5 || !errors.Is(got.Unchecked, sbclaim.ErrNotAuthorized) {
			t.Errorf("HTTP %d: got %+v, %v; want 5, unchecked with ErrNotAuthorized", status, got, err)
		}
		if asked.Load() == 0 {
			t.Errorf("HTTP %d: the client never reached the server", status)
		}
	}
}

// The SDK's own client reading a queue and a subscription as Service Bus
// describes them (Atom entries): the entity's MaxDeliveryCount is found,
// a mismatch refused, an unset setting takes it.
func TestCheckMaxDeliveryCountRealClientReads(t *testing.T) {
	t.Parallel()
	const (
		queue = `<entry xmlns="http://www.w3.org/2005/Atom"><title type="text">payments</title><content type="application/xml">` +
			`<QueueDescription xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/connect" xmlns:i="http://www.w3.org/2001/XMLSchema-instance">` +
			`<LockDuration>PT30S</LockDuration><MaxDeliveryCount>5</MaxDeliveryCount></QueueDescription></content></entry>`
		sub = `<entry xmlns="http://www.w3.org/2005/Atom"><title type="text">billing</title><content type="application/xml">` +
			`<SubscriptionDescription xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/connect" xmlns:i="http://www.w3.org/2001/XMLSchema-instance">` +
			`<LockDuration>PT1M</LockDuration><MaxDeliveryCount>3</MaxDeliveryCount></SubscriptionDescription></content></entry>`
	)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/atom+xml;type=entry;charset=utf-8")
		switch r.URL.Path {
		case "/payments":
			_, _ = w.Write([]byte(queue))
		case "/orders/Subscriptions/billing":
			_, _ = w.Write([]byte(sub))
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "https://")
	a, err := admin.NewClientFromConnectionString("Endpoint=sb://"+host+"/;SharedAccessKeyName=manage;SharedAccessKey=c2VjcmV0",
		&admin.ClientOptions{ClientOptions: azcore.ClientOptions{Transport: srv.Client(), Retry: policy.RetryOptions{MaxRetries: -1}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	payments, billing := sbclaim.EntityName{Queue: "payments"}, sbclaim.EntityName{Topic: "orders", Subscription: "billing"}
	if got, err := sbclaim.CheckMaxDeliveryCount(ctx, a, payments, 0); err != nil || !got.Checked || got.MaxDeliveryCount != 5 {
		t.Errorf("queue, unset: got %+v, %v; want the entity's 5, checked", got, err)
	}
	if got, err := sbclaim.CheckMaxDeliveryCount(ctx, a, billing, 3); err != nil || !got.Checked || got.MaxDeliveryCount != 3 {
		t.Errorf("subscription, 3: got %+v, %v; want 3, checked", got, err)
	}
	var mismatch *sbclaim.DeliveryCountMismatchError
	if _, err := sbclaim.CheckMaxDeliveryCount(ctx, a, payments, 10); !errors.As(err, &mismatch) || mismatch.Actual != 5 || mismatch.Configured != 10 {
		t.Errorf("queue, 10: err = %v, want a mismatch 10 against 5", err)
	}
	if got, err := sbclaim.CheckMaxDeliveryCount(ctx, a, sbclaim.EntityName{Queue: "refunds"}, 5); err != nil || got.Checked || got.Unchecked == nil {
		t.Errorf("unknown queue: got %+v, %v; want unchecked", got, err)
	}
}
