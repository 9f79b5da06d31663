package reconciler_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/reconciler"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/sideeffects/routesfile"
	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
)

// routesFile builds an HTTP router for the fake downstream from a routes
// file template (%s is the downstream's URL).
func routesFile(t *testing.T, yml string) (*fakedownstream.Server, sideeffects.Router) {
	t.Helper()
	fake := fakedownstream.New(fakedownstream.Options{})
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	router, err := routesfile.Parse([]byte(strings.ReplaceAll(yml, "%s", srv.URL)), func(string) string { return "" }, nil, testLogger(t))
	if err != nil {
		t.Fatalf("routes: %v", err)
	}
	return fake, router
}

const paymentRoutes = `version: 1
routes:
  - {key: raw, name: payments, match: {subject: payment}, url: "%s/payments", timeout: 5s}
`

func recoveryRec(t *testing.T, st claim.Store, routes reconciler.Routes) *reconciler.Reconciler {
	t.Helper()
	return newRec(t, st, reconciler.Config{StaleAfter: time.Minute, HeartbeatInterval: 50 * time.Millisecond, Routes: routes,
		RecoveryMaxAttempts: 2, RecoveryBackoff: 10 * time.Minute})
}

// TestRecoveryReRunsStaleClaims: a claim whose holder died (claimed, no
// heartbeat) and one released and not taken over are taken over by the
// reconciler, re-run with the same idempotency key and marked processed
// — one effect each, including the one the dead holder had performed.
func TestRecoveryReRunsStaleClaims(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		fake, router := routesFile(t, paymentRoutes)
		cs := claimN(t, tdb.store, "rec", 3, nil)
		dead, released, live := cs[0], cs[1], cs[2]
		// The dead holder performed the effect before it died.
		msg := reconciler.MessageFromClaim(mustGet(t, tdb.store, dead.ID))
		h, _ := router.Route(msg)
		if err := h.Effect.Perform(ctx, msg, dead.MessageID); err != nil {
			t.Fatal(err)
		}
		if err := tdb.store.Release(ctx, &claim.ReleaseParams{ID: released.ID, Owner: released.Owner, Error: "503"}); err != nil {
			t.Fatal(err)
		}
		tdb.backdateHeartbeat(t, time.Hour, dead.ID, released.ID)

		res, err := recoveryRec(t, tdb.store, reconciler.Routes{"billing": router}).RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.Recovered != 2 || len(res.Flagged) != 0 {
			t.Fatalf("recovered %d, flagged %d; want 2 and 0", res.Recovered, len(res.Flagged))
		}
		for _, c := range []*claim.Claim{dead, released} {
			got := mustGet(t, tdb.store, c.ID)
			if got.State != claim.StateProcessed || got.TakeOverPath != claim.PathReconciler || got.Recoveries != 1 ||
				got.PreviousOwner != c.Owner || !strings.HasPrefix(got.ClaimedBy, "reconciler@") || !strings.Contains(got.TakeOverReason, "recovery") {
				t.Errorf("%s: %s path %q recoveries %d by %q reason %q", c.MessageID, got.State, got.TakeOverPath, got.Recoveries, got.ClaimedBy, got.TakeOverReason)
			}
			if n := fake.Effects(c.MessageID); n != 1 {
				t.Errorf("%s: %d effects, want 1", c.MessageID, n)
			}
		}
		if got := mustGet(t, tdb.store, live.ID); got.State != claim.StateClaimed || got.TakeOvers != 0 {
			t.Errorf("the live claim was touched: %+v", got)
		}
	})
}

// TestRecoveryFlagsOnlyWhatAPersonMustDecide: each claim recovery cannot
// safely re-run is flagged with a reason that says why; a released claim
// of a manual route is re-run (its effect was definitely not performed).
func TestRecoveryFlagsOnlyWhatAPersonMustDecide(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		fake, router := routesFile(t, `version: 1
routes:
  - {key: raw, name: payments, match: {subject: payment}, url: "%s/payments"}
  - {key: raw, name: mail, match: {subject: mail}, recovery: manual, url: "%s/mail"}
`)
		txRouter, err := sideeffects.NewRouter(sideeffects.Route{Name: "ledger", Match: sideeffects.Match{Subject: sideeffects.AnySubject},
			TxEffect: sideeffects.TxEffectFunc(func(context.Context, *sql.Tx, *azservicebus.ReceivedMessage, string) error { return nil })})
		if err != nil {
			t.Fatal(err)
		}
		claimAs := func(id, consumer, subject, route, fp string, payload bool) *claim.Claim {
			p := claim.ClaimParams{KeyForm: claim.KeyFormRaw, Owner: uuid.New(), MessageID: id, Consumer: consumer, Subject: subject, Route: route, Fingerprint: fp,
				PayloadHash: claim.HashPayload([]byte("{}")), DeliveryCount: 1}
			if payload {
				p.Payload = []byte("{}")
			}
			res, err := tdb.store.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "host-a", Claims: []claim.ClaimParams{p}})
			if err != nil {
				t.Fatal(err)
			}
			return res[0].Claim
		}
		payH, _ := router.Route(&azservicebus.ReceivedMessage{Subject: ptr("payment")})
		mailH, _ := router.Route(&azservicebus.ReceivedMessage{Subject: ptr("mail")})
		want := map[int64]string{}
		add := func(c *claim.Claim, reason string) { want[c.ID] = reason }
		add(claimAs("no-payload", "billing", "payment", "payments", payH.Fingerprint, false), "no stored payload")
		add(claimAs("manual", "billing", "mail", "mail", mailH.Fingerprint, true), `route "mail" is manual`)
		add(claimAs("changed", "billing", "payment", "payments", "an-older-fingerprint", true), "route changed")
		add(claimAs("renamed", "billing", "payment", "invoices", payH.Fingerprint, true), `route "invoices"`)
		add(claimAs("unrouted", "billing", "nothing-routes-this", "", "", true), "routes no effect")
		add(claimAs("no-routes", "notifications", "payment", "", "", true), `no routes for consumer "notifications"`)
		add(claimAs("tx", "ledger", "payment", "", "", true), "transactional")
		manualReleased := claimAs("manual-released", "billing", "mail", "mail", mailH.Fingerprint, true)
		if err := tdb.store.Release(ctx, &claim.ReleaseParams{ID: manualReleased.ID, Owner: manualReleased.Owner, Error: "503"}); err != nil {
			t.Fatal(err)
		}
		all := append(ids(mustList(t, tdb.store)), manualReleased.ID)
		tdb.backdateHeartbeat(t, time.Hour, all...)

		res, err := recoveryRec(t, tdb.store, reconciler.Routes{"billing": router, "ledger": txRouter}).RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.Recovered != 1 || len(res.Flagged) != len(want) {
			t.Errorf("recovered %d, flagged %d; want 1 (the released manual claim) and %d", res.Recovered, len(res.Flagged), len(want))
		}
		for id, reason := range want {
			got := mustGet(t, tdb.store, id)
			if got.State != claim.StateFlagged || !strings.Contains(got.FlagReason, reason) || got.TakeOvers != 0 {
				t.Errorf("%s: %s, reason %q, take-overs %d; want flagged (not taken over) with %q", got.MessageID, got.State, got.FlagReason, got.TakeOvers, reason)
			}
		}
		if got := mustGet(t, tdb.store, manualReleased.ID); got.State != claim.StateProcessed {
			t.Errorf("released claim of a manual route: %s, want processed (not performed, so safe to run)", got.State)
		}
		if n := fake.TotalRequests(); n != 1 {
			t.Errorf("%d requests reached the downstream, want 1 (only the released manual claim)", n)
		}
	})
}

func ptr(s string) *string { return &s }

func mustList(t *testing.T, st claim.Store) []*claim.Claim {
	t.Helper()
	cs, err := st.List(context.Background(), &claim.ListParams{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// TestRecoveryBacksOffAndFlagsStillUnknown: a recovery attempt that is
// not performed (503) releases the claim with a next-attempt time; no
// tick retries it before then. Attempts whose outcome stays unknown are
// repeated with the same key until RecoveryMaxAttempts, then flagged.
func TestRecoveryBacksOffAndFlagsStillUnknown(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		fake, router := routesFile(t, paymentRoutes)
		cs := claimN(t, tdb.store, "bo", 2, nil)
		busy, lost := cs[0], cs[1]
		fake.FailKey(busy.MessageID, 1, fakedownstream.FaultUnavailable)
		fake.FailKey(lost.MessageID, 0, fakedownstream.FaultErrorBefore) // 500: unknown, every time
		tdb.backdateHeartbeat(t, time.Hour, busy.ID, lost.ID)
		rec := recoveryRec(t, tdb.store, reconciler.Routes{"": router})

		res, err := rec.RunOnce(ctx)
		if err != nil || res.Postponed != 2 || res.Recovered != 0 || len(res.Flagged) != 0 {
			t.Fatalf("tick 1: postponed %d recovered %d flagged %d (%v); want 2, 0, 0", res.Postponed, res.Recovered, len(res.Flagged), err)
		}
		b := mustGet(t, tdb.store, busy.ID)
		if b.State != claim.StateReleased || b.NextAttemptAt == nil || b.NextAttemptAt.Sub(b.HeartbeatAt) < 9*time.Minute {
			t.Fatalf("after a 503: %s, next attempt %v (released at %v); want released with a 10m backoff", b.State, b.NextAttemptAt, b.HeartbeatAt)
		}
		l := mustGet(t, tdb.store, lost.ID)
		if l.State != claim.StateClaimed || l.NextAttemptAt == nil || l.Attempts != 1 {
			t.Fatalf("after a 500: %s, next attempt %v, attempts %d; want kept with a backoff", l.State, l.NextAttemptAt, l.Attempts)
		}
		// Stale again (an hour without heartbeat) but not due: left alone.
		tdb.backdateHeartbeat(t, time.Hour, busy.ID, lost.ID)
		if res, err := rec.RunOnce(ctx); err != nil || res.Postponed+res.Recovered+len(res.Flagged) != 0 {
			t.Fatalf("tick 2 before the backoff ended: %+v %v; want nothing done", res, err)
		}
		// Due: the 503 is over, so busy recovers; lost is still unknown on
		// its second (and last) attempt: flagged.
		tdb.backdateNextAttempt(t, time.Hour, busy.ID, lost.ID)
		res, err = rec.RunOnce(ctx)
		if err != nil || res.Recovered != 1 || len(res.Flagged) != 1 || res.Flagged[0].ID != lost.ID {
			t.Fatalf("tick 3: recovered %d flagged %v (%v); want busy recovered, lost flagged", res.Recovered, ids(res.Flagged), err)
		}
		if got := mustGet(t, tdb.store, lost.ID); !strings.Contains(got.FlagReason, "still unknown after 2 attempt(s)") || got.Recoveries != 2 {
			t.Errorf("flag reason %q, recoveries %d", got.FlagReason, got.Recoveries)
		}
		if n := fake.Requests(lost.MessageID); n != 2 {
			t.Errorf("%d requests for the unknown claim, want 2 (one per recovery attempt, same key)", n)
		}
	})
}

// staleThenAlive heartbeats every claim FindStale returns before handing
// it to the reconciler: the holder came back to life between the scan and
// the take-over.
type staleThenAlive struct{ claim.Store }

func (s staleThenAlive) FindStale(ctx context.Context, p *claim.FindStaleParams) ([]*claim.Claim, error) {
	cs, err := s.Store.FindStale(ctx, p)
	for _, c := range cs {
		if err := s.Store.Heartbeat(ctx, &claim.HeartbeatParams{ID: c.ID, Owner: c.Owner}); err != nil {
			return nil, err
		}
	}
	return cs, err
}

// TestRecoveryNeverTakesALiveHolder: the take-over re-checks staleness in
// its own UPDATE, by the database clock; a holder that showed life after
// the scan keeps its claim, and nothing reaches the downstream.
func TestRecoveryNeverTakesALiveHolder(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		fake, router := routesFile(t, paymentRoutes)
		c := claimN(t, tdb.store, "alive", 1, nil)[0]
		tdb.backdateHeartbeat(t, time.Hour, c.ID)
		res, err := recoveryRec(t, staleThenAlive{tdb.store}, reconciler.Routes{"": router}).RunOnce(context.Background())
		if err != nil || res.Recovered != 0 || len(res.Flagged) != 0 {
			t.Fatalf("recovered %d flagged %d (%v); want nothing", res.Recovered, len(res.Flagged), err)
		}
		if got := mustGet(t, tdb.store, c.ID); got.Owner != c.Owner || got.State != claim.StateClaimed || got.TakeOvers != 0 {
			t.Errorf("the live holder lost its claim: %+v", got)
		}
		if n := fake.TotalRequests(); n != 0 {
			t.Errorf("%d requests reached the downstream", n)
		}
	})
}

// TestRecoveryUnderAChangedRouteIsRefusedByTheStore: even when the
// reconciler's own check were skipped, the take-over primitive refuses a
// claim whose recorded fingerprint differs (the negative test of the
// store's guard, through the reconciler's path).
func TestRecoveryUnderAChangedRouteIsRefusedByTheStore(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		p := claim.ClaimParams{KeyForm: claim.KeyFormRaw, Owner: uuid.New(), MessageID: "fp", Consumer: "billing", Route: "payments", Fingerprint: "old",
			PayloadHash: claim.HashPayload(nil), Payload: []byte{}}
		res, err := tdb.store.ClaimBatch(context.Background(), &claim.ClaimBatchParams{Claims: []claim.ClaimParams{p}})
		if err != nil {
			t.Fatal(err)
		}
		c := res[0].Claim
		tdb.backdateHeartbeat(t, time.Hour, c.ID)
		_, err = tdb.store.TakeOver(context.Background(), &claim.TakeOverParams{ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(),
			Path: claim.PathReconciler, SilentFor: time.Minute, By: "reconciler", Route: "payments", Fingerprint: "new"})
		if !errors.Is(err, claim.ErrRouteChanged) {
			t.Fatalf("take-over under another fingerprint: %v, want ErrRouteChanged", err)
		}
	})
}

// gatedRoutes wraps a router so each effect waits at a gate first and
// announces that it started.
func gatedRoutes(t *testing.T, inner sideeffects.Router) (sideeffects.Router, chan struct{}, chan string) {
	gate, started := make(chan struct{}), make(chan string, 4)
	r := routerFunc(func(msg *azservicebus.ReceivedMessage) (sideeffects.Handler, error) {
		h, err := inner.Route(msg)
		if err != nil || h.Effect == nil {
			return h, err
		}
		eff := h.Effect
		h.Effect = sideeffects.EffectFunc(func(ctx context.Context, m *azservicebus.ReceivedMessage, key string) error {
			started <- key
			<-gate
			return eff.Perform(ctx, m, key)
		})
		return h, nil
	})
	return r, gate, started
}

type routerFunc func(*azservicebus.ReceivedMessage) (sideeffects.Handler, error)

func (f routerFunc) Route(m *azservicebus.ReceivedMessage) (sideeffects.Handler, error) { return f(m) }

// TestRedriveHoldsTheClaim (finding 1): while a redrive runs, a resolve
// and a second redrive are refused with a message that names the redrive,
// and change nothing; the downstream gets one request; the redrive then
// resolves the claim.
func TestRedriveHoldsTheClaim(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		fake, router := routesFile(t, paymentRoutes)
		gated, gate, started := gatedRoutes(t, router)
		c := flaggedClaim(t, tdb, "held")
		done := make(chan error, 1)
		go func() {
			_, err := reconciler.Redrive(ctx, tdb.store, &reconciler.RedriveParams{ID: c.ID, By: "alice", Note: "checked", Routes: reconciler.Routes{"": gated},
				Retry: fastRetry, HeartbeatInterval: 50 * time.Millisecond})
			done <- err
		}()
		<-started
		_, err := reconciler.Resolve(ctx, tdb.store, &reconciler.ResolveParams{ID: c.ID, Resolution: claim.ResolutionDiscarded, By: "bob", Note: "looked stuck"})
		var refused *reconciler.RefusedError
		if !errors.As(err, &refused) || !strings.Contains(err.Error(), "being redriven by operator:alice") || !strings.Contains(err.Error(), "nothing was changed") {
			t.Errorf("resolve during a redrive: %v, want a refusal naming the redrive", err)
		}
		_, err = reconciler.Redrive(ctx, tdb.store, &reconciler.RedriveParams{ID: c.ID, By: "carol", Routes: reconciler.Routes{"": router}, Retry: fastRetry})
		if !errors.As(err, &refused) || !errors.Is(err, reconciler.ErrNotFlagged) || !strings.Contains(err.Error(), "operator:alice") {
			t.Errorf("second redrive: %v, want a refusal naming the first", err)
		}
		close(gate)
		if err := <-done; err != nil {
			t.Fatalf("the first redrive: %v", err)
		}
		got := mustGet(t, tdb.store, c.ID)
		if got.State != claim.StateResolved || got.Resolution != claim.ResolutionRedriven || got.ResolvedBy != "alice" ||
			got.TakeOverPath != claim.PathOperator || got.ClaimedBy != "operator:alice" || !strings.Contains(got.TakeOverReason, "checked") {
			t.Errorf("after the redrive: %+v", got)
		}
		if n := fake.Requests(c.MessageID); n != 1 {
			t.Errorf("%d requests, want 1", n)
		}
	})
}

// TestConcurrentRedrivesOneRuns: two operators redrive one claim at once:
// one takes it, the other is refused; one request reaches the downstream.
func TestConcurrentRedrivesOneRuns(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		fake, router := routesFile(t, paymentRoutes)
		c := flaggedClaim(t, tdb, "twice")
		var wg sync.WaitGroup
		var ok, refused atomic.Int64
		start := make(chan struct{})
		for _, who := range []string{"alice", "bob"} {
			wg.Go(func() {
				<-start
				_, err := reconciler.Redrive(context.Background(), tdb.store, &reconciler.RedriveParams{ID: c.ID, By: who, Routes: reconciler.Routes{"": router}, Retry: fastRetry})
				var r *reconciler.RefusedError
				switch {
				case err == nil:
					ok.Add(1)
				case errors.As(err, &r):
					refused.Add(1)
				default:
					t.Errorf("%s: %v", who, err)
				}
			})
		}
		close(start)
		wg.Wait()
		if ok.Load() != 1 || refused.Load() != 1 {
			t.Errorf("%d redrives ran, %d refused; want 1 and 1", ok.Load(), refused.Load())
		}
		if n := fake.Requests(c.MessageID); n != 1 {
			t.Errorf("%d requests reached the downstream, want 1", n)
		}
	})
}

// TestRedriveRefusesAnotherRoutesFile (finding 2): the routes file given
// routes the claim's message to another route (or another version of the
// same route's effect): refused, naming both, nothing sent.
func TestRedriveRefusesAnotherRoutesFile(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		billing, billingRouter := routesFile(t, `version: 1
routes:
  - {key: raw, name: invoice, match: {subject: order}, url: "%s/invoices"}
`)
		_, notifyRouter := routesFile(t, `version: 1
routes:
  - {key: raw, name: email, match: {subject: order}, url: "%s/emails"}
`)
		notifyH, _ := notifyRouter.Route(&azservicebus.ReceivedMessage{Subject: ptr("order")})
		p := claim.ClaimParams{KeyForm: claim.KeyFormRaw, Owner: uuid.New(), MessageID: "order-7", Consumer: "notifications", Subject: "order", Route: notifyH.Name,
			Fingerprint: notifyH.Fingerprint, PayloadHash: claim.HashPayload([]byte("{}")), Payload: []byte("{}")}
		res, err := tdb.store.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "h", Claims: []claim.ClaimParams{p}})
		if err != nil {
			t.Fatal(err)
		}
		c := res[0].Claim
		tdb.backdateHeartbeat(t, time.Hour, c.ID)
		if _, err := newRec(t, tdb.store, reconciler.Config{StaleAfter: time.Minute}).RunOnce(ctx); err != nil {
			t.Fatal(err)
		}
		_, err = reconciler.Redrive(ctx, tdb.store, &reconciler.RedriveParams{ID: c.ID, By: "alice", Routes: reconciler.Routes{"": billingRouter}, Retry: fastRetry})
		if !errors.Is(err, claim.ErrRouteChanged) || !strings.Contains(err.Error(), `"email"`) || !strings.Contains(err.Error(), `"invoice"`) {
			t.Fatalf("redrive with the billing routes: %v, want a refusal naming both routes", err)
		}
		if n := billing.TotalRequests(); n != 0 {
			t.Errorf("%d requests reached the billing downstream", n)
		}
		if got := mustGet(t, tdb.store, c.ID); got.State != claim.StateFlagged || got.TakeOvers != 0 {
			t.Errorf("claim changed: %+v", got)
		}
		// Per consumer, the right file is picked.
		if _, err := reconciler.Redrive(ctx, tdb.store, &reconciler.RedriveParams{ID: c.ID, By: "alice",
			Routes: reconciler.Routes{"billing": billingRouter, "notifications": notifyRouter}, Retry: fastRetry}); err != nil {
			t.Fatalf("redrive with per-consumer routes: %v", err)
		}
	})
}

// failingResolve fails Resolve after its effect: the redrive performed
// the effect and must say so.
type failingResolve struct{ claim.Store }

func (failingResolve) Resolve(context.Context, *claim.ResolveParams) (*claim.Claim, error) {
	return nil, fmt.Errorf("resolve: %w", claim.ErrRefused)
}

// TestRedriveThatPerformedButCouldNotRecordSaysSo (finding 1): the effect
// WAS performed; the error says so and carries the key, it is not a
// refusal ("nothing was changed" would be a lie); the claim stays held by
// the redrive, and recovery later flags it as a redrive that stopped.
func TestRedriveThatPerformedButCouldNotRecordSaysSo(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		fake, router := routesFile(t, paymentRoutes)
		c := flaggedClaim(t, tdb, "unrecorded")
		_, err := reconciler.Redrive(ctx, failingResolve{tdb.store}, &reconciler.RedriveParams{ID: c.ID, By: "alice", Routes: reconciler.Routes{"": router}, Retry: fastRetry})
		var rec *reconciler.RecordError
		var refused *reconciler.RefusedError
		if !errors.As(err, &rec) || errors.As(err, &refused) || !strings.Contains(err.Error(), "WAS performed") || rec.Key != c.MessageID {
			t.Fatalf("err = %v, want a RecordError saying the effect was performed", err)
		}
		if n := fake.Effects(c.MessageID); n != 1 {
			t.Errorf("%d effects, want 1", n)
		}
		got := mustGet(t, tdb.store, c.ID)
		if got.State != claim.StateClaimed || got.ClaimedBy != "operator:alice" {
			t.Fatalf("after the failed record: %s by %q, want held by the redrive", got.State, got.ClaimedBy)
		}
		tdb.backdateHeartbeat(t, time.Hour, c.ID)
		res, err := recoveryRec(t, tdb.store, reconciler.Routes{"": router}).RunOnce(ctx)
		if err != nil || len(res.Flagged) != 1 || !strings.Contains(res.Flagged[0].FlagReason, "redrive by operator:alice stopped") {
			t.Fatalf("recovery of a redrive that stopped: flagged %v (%v), want it flagged for an operator", res.Flagged, err)
		}
	})
}

// TestFailedRedriveIsFlaggedAgain: the effect fails; the claim goes back
// to operators with the failure as its reason.
func TestFailedRedriveIsFlaggedAgain(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		fake, router := routesFile(t, paymentRoutes)
		c := flaggedClaim(t, tdb, "refail")
		fake.FailKey(c.MessageID, 0, fakedownstream.FaultUnavailable)
		_, err := reconciler.Redrive(context.Background(), tdb.store, &reconciler.RedriveParams{ID: c.ID, By: "alice", Routes: reconciler.Routes{"": router},
			Retry: sideeffects.RetryPolicy{MaxAttempts: 1}})
		var ee *reconciler.EffectError
		if !errors.As(err, &ee) || !ee.Reflagged || ee.Outcome != sideeffects.OutcomeRetryable {
			t.Fatalf("err = %v, want an EffectError, flagged again", err)
		}
		got := mustGet(t, tdb.store, c.ID)
		if got.State != claim.StateFlagged || !strings.Contains(got.FlagReason, "redrive by alice failed") || got.TakeOvers != 1 {
			t.Errorf("after the failed redrive: %s %q take-overs %d", got.State, got.FlagReason, got.TakeOvers)
		}
	})
}
