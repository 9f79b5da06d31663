package sbclaim_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"

	"github.com/sbclaim/sbclaim"
)

// fakeAdmin answers like the administration client: a queue or a
// subscription with a MaxDeliveryCount, nil for an unknown entity, or err.
type fakeAdmin struct {
	queues map[string]int32
	subs   map[string]int32 // topic/subscription
	err    error
	block  bool // wait for ctx to end, then return its error
	calls  int
}

func (f *fakeAdmin) answer(ctx context.Context) error {
	f.calls++
	if f.block {
		<-ctx.Done()
		return ctx.Err()
	}
	return f.err
}

func (f *fakeAdmin) GetQueue(ctx context.Context, name string, _ *admin.GetQueueOptions) (*admin.GetQueueResponse, error) {
	if err := f.answer(ctx); err != nil {
		return nil, err
	}
	n, ok := f.queues[name]
	if !ok {
		return nil, nil // what the SDK returns for an entity that does not exist
	}
	return &admin.GetQueueResponse{QueueName: name, QueueProperties: admin.QueueProperties{MaxDeliveryCount: &n}}, nil
}

func (f *fakeAdmin) GetSubscription(ctx context.Context, topic, sub string, _ *admin.GetSubscriptionOptions) (*admin.GetSubscriptionResponse, error) {
	if err := f.answer(ctx); err != nil {
		return nil, err
	}
	n, ok := f.subs[topic+"/"+sub]
	if !ok {
		return nil, nil
	}
	return &admin.GetSubscriptionResponse{TopicName: topic, SubscriptionName: sub, SubscriptionProperties: admin.SubscriptionProperties{MaxDeliveryCount: &n}}, nil
}

func TestCheckMaxDeliveryCount(t *testing.T) {
	t.Parallel()
	queue := sbclaim.EntityName{Queue: "payments"}
	sub := sbclaim.EntityName{Topic: "orders", Subscription: "billing"}
	entities := func() *fakeAdmin {
		return &fakeAdmin{queues: map[string]int32{"payments": 5}, subs: map[string]int32{"orders/billing": 3}}
	}
	withErr := func(err error) *fakeAdmin { f := entities(); f.err = err; return f }
	for name, tc := range map[string]struct {
		admin      *fakeAdmin
		entity     sbclaim.EntityName
		configured int
		want       int
		checked    bool
		mismatch   *sbclaim.DeliveryCountMismatchError
		unchecked  string // in DeliveryBudget.Unchecked
		notAuth    bool
	}{
		"queue matches":               {admin: entities(), entity: queue, configured: 5, want: 5, checked: true},
		"subscription matches":        {admin: entities(), entity: sub, configured: 3, want: 3, checked: true},
		"unset adopts":                {admin: entities(), entity: queue, configured: 0, want: 5, checked: true},
		"unset adopts (subscription)": {admin: entities(), entity: sub, configured: 0, want: 3, checked: true},
		"mismatch refuses": {admin: entities(), entity: queue, configured: 10,
			mismatch: &sbclaim.DeliveryCountMismatchError{Entity: queue, Configured: 10, Actual: 5}},
		"mismatch refuses (subscription)": {admin: entities(), entity: sub, configured: 5,
			mismatch: &sbclaim.DeliveryCountMismatchError{Entity: sub, Configured: 5, Actual: 3}},
		"unauthorized keeps the setting": {admin: withErr(&azcore.ResponseError{StatusCode: http.StatusUnauthorized}), entity: queue, configured: 7,
			want: 7, unchecked: "HTTP 401", notAuth: true},
		"forbidden keeps the setting": {admin: withErr(&azcore.ResponseError{StatusCode: http.StatusForbidden}), entity: sub, configured: 3,
			want: 3, unchecked: "HTTP 403", notAuth: true},
		"unauthorized and unset assumes the default": {admin: withErr(&azcore.ResponseError{StatusCode: http.StatusUnauthorized}), entity: queue,
			want: sbclaim.DefaultMaxDeliveryCount, unchecked: "Manage rights", notAuth: true},
		"other HTTP error": {admin: withErr(&azcore.ResponseError{StatusCode: http.StatusInternalServerError, ErrorCode: "InternalError"}), entity: queue, configured: 5,
			want: 5, unchecked: "HTTP 500 InternalError"},
		"unreachable": {admin: withErr(errors.New("dial tcp: connection refused")), entity: queue, configured: 5,
			want: 5, unchecked: "could not be reached: dial tcp: connection refused"},
		"no answer in time": {admin: &fakeAdmin{block: true}, entity: queue, configured: 4,
			want: 4, unchecked: "no answer from the administration API in time"},
		"unknown entity": {admin: entities(), entity: sbclaim.EntityName{Queue: "refunds"}, configured: 5,
			want: 5, unchecked: "does not know entity refunds"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			if tc.admin.block {
				c, cancel := context.WithCancel(ctx)
				cancel() // the deadline has passed
				ctx = c
			}
			got, err := sbclaim.CheckMaxDeliveryCount(ctx, tc.admin, tc.entity, tc.configured)
			if tc.admin.calls != 1 {
				t.Errorf("%d administration calls, want 1", tc.admin.calls)
			}
			if tc.mismatch != nil {
				var me *sbclaim.DeliveryCountMismatchError
				if !errors.As(err, &me) || *me != *tc.mismatch {
					t.Fatalf("err = %v, want %+v", err, tc.mismatch)
				}
				for _, part := range []string{tc.mismatch.Entity.String(), "configured as " + strconv.Itoa(tc.mismatch.Configured), "MaxDeliveryCount " + strconv.Itoa(tc.mismatch.Actual)} {
					if !strings.Contains(err.Error(), part) {
						t.Errorf("error %q does not mention %q", err, part)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if got.MaxDeliveryCount != tc.want || got.Checked != tc.checked {
				t.Errorf("got %+v, want MaxDeliveryCount %d, Checked %v", got, tc.want, tc.checked)
			}
			switch {
			case tc.checked && got.Unchecked != nil:
				t.Errorf("checked, but Unchecked = %v", got.Unchecked)
			case !tc.checked && (got.Unchecked == nil || !strings.Contains(got.Unchecked.Error(), tc.unchecked)):
				t.Errorf("Unchecked = %v, want it to mention %q", got.Unchecked, tc.unchecked)
			case !tc.checked && errors.Is(got.Unchecked, sbclaim.ErrNotAuthorized) != tc.notAuth:
				t.Errorf("errors.Is(Unchecked, ErrNotAuthorized) = %v, want %v", !tc.notAuth, tc.notAuth)
			}
		})
	}
}

func TestCheckMaxDeliveryCountWithoutClient(t *testing.T) {
	t.Parallel()
	got, err := sbclaim.CheckMaxDeliveryCount(context.Background(), nil, sbclaim.EntityName{Queue: "q"}, 0)
	if err != nil || got.Checked || got.MaxDeliveryCount != sbclaim.DefaultMaxDeliveryCount || got.Unchecked == nil {
		t.Errorf("got %+v, %v; want the default, unchecked", got, err)
	}
}
