package operator_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/operator"
	"github.com/sbclaim/sbclaim/sbclaimtest"
)

// The operator's tools see everything about a claim through the public
// view and filters, and tell every way an action ends by *ActionError's
// Kind: a redrive whose effect got a final answer (the claim failed, with
// the answer), a refusal (nothing changed, the claim as it is now), and a
// router that does not have the claim's route.
func TestOperatorActionsAndClaimView(t *testing.T) {
	st := sbclaimtest.NewStore(t)
	var (
		mu    sync.Mutex
		calls = map[string]int{}
	)
	router, err := sbclaim.NewRouter(sbclaim.Route{Name: "charge", Version: "v2", Match: sbclaim.MatchSubject("charge"),
		Recovery: sbclaim.RecoveryManual, Handler: func(ctx context.Context, d *sbclaim.Delivery) error {
			mu.Lock()
			calls[d.IdempotencyKey()]++
			n := calls[d.IdempotencyKey()]
			mu.Unlock()
			if n == 1 {
				return errors.New("read timeout: the charge may have happened")
			}
			d.ReportAnswer(ctx, http.StatusPaymentRequired, nil, map[string]string{"/error/code": "card_declined"})
			return sbclaim.Rejected(errors.New("card declined"))
		}})
	if err != nil {
		t.Fatal(err)
	}
	q := sbclaimtest.NewQueue(&sbclaimtest.QueueOptions{LockDuration: 300 * time.Millisecond})
	sbclaimtest.Start(t, sbclaim.ProcessorConfig{Consumer: "billing", Entity: "payments", Store: st, Router: router}, q)
	m1, m2 := message("charge-1", "charge", `{"amount":1}`), message("charge-2", "charge", `{"amount":2}`)
	m2.ApplicationProperties = map[string]any{"tenant": "t1"}
	send(t, q, m1, m2)
	waitIdle(t, q)

	ctx := context.Background()
	rec, err := operator.NewReconciler(operator.ReconcilerConfig{Store: st, Routers: map[string]*sbclaim.Router{"billing": router},
		HeartbeatInterval: 100 * time.Millisecond, StaleAfter: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var flagged int
	deadline := time.Now().Add(30 * time.Second)
	for flagged < 2 {
		res, err := rec.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		flagged += res.Flagged
		if res.Locked && res.Stats == nil {
			t.Fatal("a tick returned no table stats")
		}
		if time.Now().After(deadline) {
			t.Fatalf("the reconciler flagged %d claims, want 2", flagged)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// The filters.
	all, err := st.Claims(ctx, sbclaim.ClaimFilter{States: []sbclaim.ClaimState{sbclaim.StateFlagged}, Route: "charge"})
	if err != nil || len(all) != 2 {
		t.Fatalf("flagged charge claims: %d, %v", len(all), err)
	}
	c1, c2 := all[0], all[1]
	prefix := c2.FlagReason[:min(10, len(c2.FlagReason))]
	for _, tc := range []struct {
		f    sbclaim.ClaimFilter
		want int
	}{
		{sbclaim.ClaimFilter{Route: "other"}, 0},
		{sbclaim.ClaimFilter{ReasonPrefix: prefix}, 2},
		{sbclaim.ClaimFilter{ReasonPrefix: "nope"}, 0},
		{sbclaim.ClaimFilter{OlderThan: time.Hour}, 0},
		{sbclaim.ClaimFilter{Consumer: "billing", AfterID: c1.ID}, 1},
	} {
		if got, err := st.Claims(ctx, tc.f); err != nil || len(got) != tc.want {
			t.Errorf("Claims(%+v): %d, %v; want %d", tc.f, len(got), err, tc.want)
		}
	}

	// The view has what `reconciler show` prints.
	now, err := st.Now(ctx)
	if err != nil || now.Before(c2.ClaimedAt) {
		t.Errorf("Now %v (%v), claimed at %v", now, err, c2.ClaimedAt)
	}
	if c2.Subject != "charge" || c2.Entity != "payments" || c2.Properties["tenant"] != "t1" || string(c2.Payload) != `{"amount":2}` ||
		len(c2.PayloadHash) != 32 || c2.Fingerprint == "" || c2.Owner == "" || c2.HeartbeatAt.IsZero() || c2.FlaggedAt == nil ||
		c2.DeliveryCount != 1 || c2.IdempotencyKey != "billing/charge-2" || c2.KeyForm != "scoped" || c2.KeyRevision != 0 || c2.Attempts != 1 || c2.LastError == "" {
		t.Errorf("claim view: %+v", c2)
	}

	// Only a router that has the claim's route can redrive it here.
	other, _ := sbclaim.NewRouter(sbclaim.Route{Name: "mail", Match: sbclaim.MatchSubject("mail"),
		Handler: func(context.Context, *sbclaim.Delivery) error { return nil }})
	if name, ok := operator.RouteOf(router, c1); !ok || name != "charge" {
		t.Errorf("RouteOf = %q, %v; want charge", name, ok)
	}
	if _, ok := operator.RouteOf(other, c1); ok {
		t.Error("a router without the route routes the claim")
	}
	_, err = operator.Redrive(ctx, st, c1.ID, operator.RedriveOptions{By: "alice", Routers: map[string]*sbclaim.Router{"": other}})
	var ae *operator.ActionError
	if !errors.As(err, &ae) || ae.Kind != operator.ActionRefused || ae.Claim == nil || ae.Claim.State != sbclaim.StateFlagged ||
		!strings.Contains(ae.Error(), "nothing was changed") {
		t.Fatalf("redrive with a router that lacks the route: %v (%+v), want refused", err, ae)
	}

	// The redrive gets a final answer: the claim fails, with the answer.
	_, err = operator.Redrive(ctx, st, c1.ID, operator.RedriveOptions{By: "alice", Note: "PSP back", Routers: map[string]*sbclaim.Router{"billing": router},
		HeartbeatInterval: time.Second, QueryTimeout: 10 * time.Second})
	if !errors.As(err, &ae) || ae.Kind != operator.ActionEffectFailed || ae.Outcome != sbclaim.OutcomeRejected || !ae.Outcome.Final() ||
		!ae.Failed || ae.Reflagged || ae.IdempotencyKey != "billing/charge-1" || ae.Route != "charge" || ae.Answer == nil ||
		ae.Answer.Status != http.StatusPaymentRequired || ae.Answer.Fields["/error/code"] != "card_declined" {
		t.Fatalf("redrive to a decline: %v (%+v)", err, ae)
	}
	if got, _ := st.Claim(ctx, c1.ID); got.State != sbclaim.StateFailed || got.FailReason != "EffectRejected" || got.FailedAt == nil ||
		got.TakeOverPath != sbclaim.TakeOverOperator || got.Answer == nil || got.AnswerAt == nil {
		t.Errorf("after the declined redrive: %+v", got)
	}
	_, err = operator.Redrive(ctx, st, c1.ID, operator.RedriveOptions{By: "bob", Routers: map[string]*sbclaim.Router{"billing": router}})
	if !errors.As(err, &ae) || ae.Kind != operator.ActionRefused || !errors.Is(err, operator.ErrNotFlagged) || ae.Claim.State != sbclaim.StateFailed {
		t.Errorf("redrive of a failed claim: %v, want refused (ErrNotFlagged)", err)
	}

	// Resolve, then a second resolve is refused.
	res, err := operator.Resolve(ctx, st, c2.ID, sbclaim.ResolutionDone, "alice", "seen in the PSP")
	if err != nil || res.State != sbclaim.StateResolved || res.Resolution != sbclaim.ResolutionDone || res.ResolvedBy != "alice" ||
		res.ResolutionNote != "seen in the PSP" || res.ResolvedAt == nil {
		t.Fatalf("resolve: %+v, %v", res, err)
	}
	if _, err := operator.Resolve(ctx, st, c2.ID, sbclaim.ResolutionDiscarded, "bob", "late"); !errors.As(err, &ae) || ae.Kind != operator.ActionRefused {
		t.Errorf("second resolve: %v, want refused", err)
	}
	if _, err := st.Claim(ctx, 999999); !errors.Is(err, sbclaim.ErrNotFound) {
		t.Errorf("Claim of a missing id: %v, want ErrNotFound", err)
	}
}
