package operator_test

import (
	"context"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/sbclaimtest"
)

func message(id, subject, body string) *azservicebus.Message {
	return &azservicebus.Message{MessageID: &id, Subject: &subject, Body: []byte(body)}
}

func send(t *testing.T, q *sbclaimtest.Queue, msgs ...*azservicebus.Message) {
	t.Helper()
	if err := q.Send(context.Background(), msgs...); err != nil {
		t.Fatal(err)
	}
}

func waitIdle(t *testing.T, q *sbclaimtest.Queue) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := q.WaitIdle(ctx); err != nil {
		t.Fatal(err)
	}
}

func onlyClaim(t *testing.T, st *sbclaim.Store) *sbclaim.Claim {
	t.Helper()
	cs, err := st.Claims(context.Background(), sbclaim.ClaimFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 1 {
		t.Fatalf("%d claims, want 1: %+v", len(cs), cs)
	}
	return cs[0]
}
