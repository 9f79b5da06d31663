package sbclaim_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/sbclaimtest"
)

// A downstream that stored a failure under the key replays it to every
// repeat (Stripe: a 500 with Idempotent-Replayed: true). The handler says
// a person must decide: no retry, the claim is flagged at once with the
// answer, and the message is completed.
func ExampleNeedsOperator() {
	ctx := context.Background()
	store, _ := sbclaim.OpenStore(ctx, "sqlite::memory:")
	defer store.Close()
	calls := 0
	router, _ := sbclaim.NewRouter(sbclaim.Route{
		Name:        "charge",
		KeyLifetime: 24 * time.Hour, // Stripe keeps keys for 24 hours
		AllowNewKey: true,
		Handler: func(ctx context.Context, d *sbclaim.Delivery) error {
			calls++
			// What the SDK got back: a stored 500, replayed.
			h := http.Header{"Idempotent-Replayed": {"true"}}
			d.ReportAnswer(ctx, http.StatusInternalServerError, h, nil)
			if h.Get("Idempotent-Replayed") == "true" {
				return sbclaim.NeedsOperator(errors.New("HTTP 500 replayed for this key"))
			}
			return nil
		},
	})
	queue := sbclaimtest.NewQueue(nil)
	run(store, router, queue, message("order-8", "payment.requested", `{}`))

	claims, _ := store.Claims(ctx, sbclaim.ClaimFilter{Consumer: "billing"})
	fmt.Println(calls, claims[0].State, claims[0].Answer.Status)
	fmt.Println(claims[0].FlagReason)
	fmt.Println(queue.Completed())
	// Output:
	// 1 flagged 500
	// needs an operator: unknown: HTTP 500 replayed for this key
	// [order-8]
}

func TestRouteKeyLifetimeMustNotBeNegative(t *testing.T) {
	h := func(context.Context, *sbclaim.Delivery) error { return nil }
	_, err := sbclaim.NewRouter(sbclaim.Route{Name: "a", Handler: h, KeyLifetime: -time.Hour})
	if err == nil || !strings.Contains(err.Error(), `route "a": KeyLifetime cannot be negative`) {
		t.Errorf("NewRouter with a negative KeyLifetime: %v", err)
	}
}
