package sbclaim_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/sbclaimtest"
)

// TestAllClaimsReadsEveryPage: Claims returns one page; AllClaims reads
// them all, in id order, and stops when asked.
func TestAllClaimsReadsEveryPage(t *testing.T) {
	st := sbclaimtest.NewStore(t)
	router, err := sbclaim.NewRouter(sbclaim.Route{Name: "noop", Handler: func(context.Context, *sbclaim.Delivery) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	q := sbclaimtest.NewQueue(nil)
	sbclaimtest.Start(t, sbclaim.ProcessorConfig{Consumer: "c", Store: st, Router: router}, q)
	const n = 7
	var msgs []*azservicebus.Message
	for i := range n {
		msgs = append(msgs, message(fmt.Sprintf("m-%d", i), "s", `{}`))
	}
	send(t, q, msgs...)
	waitIdle(t, q)
	ctx := context.Background()
	f := sbclaim.ClaimFilter{Limit: 3}
	if page, err := st.Claims(ctx, f); err != nil || len(page) != 3 {
		t.Fatalf("one page: %d claims, %v; want 3", len(page), err)
	}
	var ids []int64
	for c, err := range st.AllClaims(ctx, f) {
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) > 0 && c.ID <= ids[len(ids)-1] {
			t.Fatalf("claim %d after %d: not in id order", c.ID, ids[len(ids)-1])
		}
		ids = append(ids, c.ID)
	}
	if len(ids) != n {
		t.Fatalf("AllClaims read %d claims, want %d", len(ids), n)
	}
	seen := 0
	for range st.AllClaims(ctx, f) {
		if seen++; seen == 4 {
			break
		}
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	yields := 0
	for c, err := range st.AllClaims(canceled, f) {
		yields++
		if c != nil || !errors.Is(err, context.Canceled) {
			t.Fatalf("a failed read yielded %v, %v; want nil and the error", c, err)
		}
	}
	if yields != 1 {
		t.Fatalf("a failed read yielded %d times, want once", yields)
	}
}
