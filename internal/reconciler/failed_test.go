package reconciler_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/reconciler"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/sideeffects/routesfile"
	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
)

// stripeRoutes answers like a Stripe-style payment API: a decline is
// final, an idempotency_error a conflict, and a new key is allowed (the
// downstream stores a 500 under the key).
const stripeRoutes = `version: 1
routes:
  - name: payments
    key: raw
    match: {subject: payment}
    url: "%s/payments"
    timeout: 5s
    answers:
      - {status: 402, outcome: rejected}
      - {status: 400, field: /error/type, equals: idempotency_error, outcome: conflict}
    record:
      headers: [Request-Id]
      fields: [/id, /error/charge, /error/type]
    allowNewKey: true
`

func stripe(t *testing.T) (*fakedownstream.Server, sideeffects.Router) {
	t.Helper()
	fake, router, _ := stripeAt(t)
	return fake, router
}

// stripeAt is stripe, and also the same route on the same downstream
// without allowNewKey (the same fingerprint: allowNewKey is not part of
// it).
func stripeAt(t *testing.T) (*fakedownstream.Server, sideeffects.Router, sideeffects.Router) {
	t.Helper()
	fake := fakedownstream.New(fakedownstream.Options{ConflictStyle: fakedownstream.ConflictStripe})
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	parse := func(yml string) sideeffects.Router {
		router, err := routesfile.Parse([]byte(strings.ReplaceAll(yml, "%s", srv.URL)), func(string) string { return "" }, nil, testLogger(t))
		if err != nil {
			t.Fatalf("routes: %v", err)
		}
		return router
	}
	return fake, parse(stripeRoutes), parse(strings.Replace(stripeRoutes, "allowNewKey: true", "allowNewKey: false", 1))
}

// TestRecoveryFailsAFinalAnswer: a stale claim whose re-run gets a final
// answer that is not a success — a decline (rejected), Stripe's 400
// idempotency_error (conflict), a permanent refusal — is failed, not
// flagged, with the answer on it; nothing more happens to it.
func TestRecoveryFailsAFinalAnswer(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		fake, router := stripe(t)
		cs := claimN(t, tdb.store, "final", 3, nil)
		declined, conflicted, refused := cs[0], cs[1], cs[2]
		fake.SetKeyReply(declined.MessageID, fakedownstream.ReplyDecline)
		fake.SetKeyReply(conflicted.MessageID, fakedownstream.ReplyConflict)
		permanent := routerFunc(func(m *azservicebus.ReceivedMessage) (sideeffects.Handler, error) {
			if m.MessageID != refused.MessageID {
				return router.Route(m)
			}
			return sideeffects.Handler{Name: "payments", KeyForm: claim.KeyFormRaw, Effect: sideeffects.EffectFunc(func(ctx context.Context, _ *azservicebus.ReceivedMessage, _ string) error {
				sideeffects.ReportAnswer(ctx, sideeffects.Answer{Status: 400, Fields: map[string]string{"/error/code": "account_closed"}})
				return sideeffects.Permanent(errors.New("account closed"))
			})}, nil
		})
		tdb.backdateHeartbeat(t, time.Hour, ids(cs)...)
		reg := prometheus.NewRegistry()
		metrics := reconciler.NewMetrics(reg)
		rec := newRecWithMetrics(t, tdb.store, reconciler.Config{StaleAfter: time.Minute, HeartbeatInterval: 50 * time.Millisecond,
			Routes: reconciler.Routes{"": permanent}, RecoveryMaxAttempts: 2, RecoveryBackoff: 10 * time.Minute}, metrics)

		res, err := rec.RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.Failed != 3 || len(res.Flagged) != 0 || res.Recovered != 0 || res.Postponed != 0 {
			t.Fatalf("failed %d flagged %d recovered %d postponed %d; want 3 failed and nothing else", res.Failed, len(res.Flagged), res.Recovered, res.Postponed)
		}
		for c, want := range map[*claim.Claim]struct {
			reason string
			status int
		}{declined: {claim.FailRejected, 402}, conflicted: {claim.FailConflict, 400}, refused: {claim.FailPermanent, 400}} {
			got := mustGet(t, tdb.store, c.ID)
			if got.State != claim.StateFailed || got.FailReason != want.reason || got.FailedAt == nil || got.FlaggedAt != nil ||
				got.DeadLetterSeq != nil || got.Answer == nil || got.Answer.Status != want.status || !strings.Contains(got.LastError, "HTTP 4") {
				t.Errorf("%s: %s (%s) flagged at %v dead letter %v answer %+v last error %q; want failed %s with the %d",
					c.MessageID, got.State, got.FailReason, got.FlaggedAt, got.DeadLetterSeq, got.Answer, got.LastError, want.reason, want.status)
			}
		}
		if got := mustGet(t, tdb.store, declined.ID); got.Answer.Fields["/error/charge"] == "" || got.Answer.Headers["Request-Id"] == "" {
			t.Errorf("the decline's answer lacks the charge id or request id: %+v", got.Answer)
		}
		if n := fake.Rejections(declined.MessageID); n != 1 {
			t.Errorf("%d declines recorded downstream, want 1", n)
		}
		if got := testutil.ToFloat64(metrics.Failed); got != 3 {
			t.Errorf("sbclaim_reconciler_failed_total %v, want 3", got)
		}
		if got := testutil.ToFloat64(metrics.FailedNow); got != 3 {
			t.Errorf("sbclaim_claims_failed %v, want 3", got)
		}
		// Final: the next tick, however late, neither re-runs nor flags
		// them.
		tdb.backdateHeartbeat(t, 5*time.Hour, ids(cs)...)
		before := fake.TotalRequests()
		if res, err := rec.RunOnce(ctx); err != nil || res.Failed+res.Recovered+res.Postponed+len(res.Flagged) != 0 || res.Stats.Failed != 3 {
			t.Fatalf("the next tick: %+v %v; want nothing done, 3 failed", res, err)
		}
		if fake.TotalRequests() != before {
			t.Errorf("a failed claim was re-run")
		}
	})
}

// TestRecoveryAfterANewKeyUsesIt: an operator's redrive under a new key
// died; a redelivery took the claim and died too; the recovery re-runs it
// with the recorded key, never the old one.
func TestRecoveryAfterANewKeyUsesIt(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		fake, router := stripe(t)
		c := flaggedClaim(t, tdb, "rekeyed")
		held, err := tdb.store.TakeOver(ctx, &claim.TakeOverParams{ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(), Path: claim.PathOperator,
			By: "operator:alice", Reason: "checked the PSP", NewKey: true})
		if err != nil {
			t.Fatal(err)
		}
		tdb.backdateHeartbeat(t, time.Hour, c.ID)
		again, err := tdb.store.TakeOver(ctx, &claim.TakeOverParams{ID: c.ID, PreviousOwner: held.Owner, Owner: uuid.New(), Path: claim.PathRedelivery,
			SilentFor: time.Minute, By: "host-b", Reason: "holder silent"})
		if err != nil {
			t.Fatal(err)
		}
		tdb.backdateHeartbeat(t, time.Hour, c.ID)
		res, err := recoveryRec(t, tdb.store, reconciler.Routes{"": router}).RunOnce(ctx)
		if err != nil || res.Recovered != 1 {
			t.Fatalf("recovered %d (%v), want 1", res.Recovered, err)
		}
		newKey := c.MessageID + ":r1"
		if again.Key() != newKey || fake.Effects(newKey) != 1 || fake.Requests(c.MessageID) != 0 {
			t.Errorf("key %q: %d effect(s) under the new key, %d request(s) under the old; want 1 and 0",
				again.Key(), fake.Effects(newKey), fake.Requests(c.MessageID))
		}
		if got := mustGet(t, tdb.store, c.ID); got.State != claim.StateProcessed || got.Answer == nil || got.Answer.Fields["/id"] == "" {
			t.Errorf("after the recovery: %s answer %+v", got.State, got.Answer)
		}
	})
}

// TestRedriveWithANewKeySettlesACachedFailure: the downstream stored a 500
// under the key and replays it. Recovery repeats it until it gives up and
// flags the claim; a plain redrive replays it again; a redrive under a new
// key — refused without a note and on a route that does not allow it —
// performs the effect once, resolves the claim and records the key, the
// operator and the answer.
func TestRedriveWithANewKeySettlesACachedFailure(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		fake, router, noNewKey := stripeAt(t)
		routes := reconciler.Routes{"": router}
		c := claimN(t, tdb.store, "cached", 1, nil)[0]
		fake.SetKeyReply(c.MessageID, fakedownstream.ReplyCachedFailure)
		tdb.backdateHeartbeat(t, time.Hour, c.ID)
		rec := recoveryRec(t, tdb.store, routes)
		if res, err := rec.RunOnce(ctx); err != nil || res.Postponed != 1 {
			t.Fatalf("tick 1: %+v %v, want postponed (unknown)", res, err)
		}
		tdb.backdateHeartbeat(t, time.Hour, c.ID)
		tdb.backdateNextAttempt(t, time.Hour, c.ID)
		res, err := rec.RunOnce(ctx)
		if err != nil || len(res.Flagged) != 1 || !strings.Contains(res.Flagged[0].FlagReason, "still unknown") {
			t.Fatalf("tick 2: %+v %v, want flagged (still unknown)", res, err)
		}
		if n := fake.CachedFailures(c.MessageID); n != 1 {
			t.Fatalf("%d failures stored downstream, want 1 (replayed since)", n)
		}

		_, err = reconciler.Redrive(ctx, tdb.store, &reconciler.RedriveParams{ID: c.ID, By: "alice", Routes: routes, Retry: fastRetry})
		var ee *reconciler.EffectError
		if !errors.As(err, &ee) || ee.Outcome != sideeffects.OutcomeUnknown || !ee.Reflagged || ee.Failed || ee.Key != c.MessageID {
			t.Fatalf("a same-key redrive: %v, want an unknown outcome, flagged again", err)
		}
		if _, err := reconciler.Redrive(ctx, tdb.store, &reconciler.RedriveParams{ID: c.ID, By: "alice", Routes: routes, Retry: fastRetry, NewKey: true}); err == nil ||
			!strings.Contains(err.Error(), "Note") {
			t.Fatalf("a new key without a note: %v, want refused", err)
		}
		_, err = reconciler.Redrive(ctx, tdb.store, &reconciler.RedriveParams{ID: c.ID, By: "alice", Note: "n", Routes: reconciler.Routes{"": noNewKey},
			Retry: fastRetry, NewKey: true})
		var refused *reconciler.RefusedError
		if !errors.As(err, &refused) || !errors.Is(err, reconciler.ErrNewKeyNotAllowed) || !strings.Contains(err.Error(), "allowNewKey") {
			t.Fatalf("a new key on a route that does not allow it: %v, want refused naming allowNewKey", err)
		}
		before := fake.Requests(c.MessageID)
		got, err := reconciler.Redrive(ctx, tdb.store, &reconciler.RedriveParams{ID: c.ID, By: "alice", Routes: routes, Retry: fastRetry,
			NewKey: true, Note: "no charge under the old key in the dashboard"})
		if err != nil {
			t.Fatalf("redrive with a new key: %v", err)
		}
		newKey := c.MessageID + ":r1"
		if fake.Effects(newKey) != 1 || fake.Effects(c.MessageID) != 0 || fake.Requests(c.MessageID) != before {
			t.Errorf("effects under %s %d, under the old key %d (requests %d → %d); want 1, 0, no new request under the old key",
				newKey, fake.Effects(newKey), fake.Effects(c.MessageID), before, fake.Requests(c.MessageID))
		}
		if got.State != claim.StateResolved || got.Resolution != claim.ResolutionRedriven || got.Key() != newKey || got.KeyRevision != 1 ||
			got.KeyRevisedBy != "operator:alice" || got.KeyRevisionNote != "redrive by alice with a new key ("+newKey+"): no charge under the old key in the dashboard" ||
			got.KeyRevisedAt == nil || got.ResolutionNote != "no charge under the old key in the dashboard" {
			t.Errorf("after the redrive: %s/%s key %q revision %d by %q note %q resolution note %q", got.State, got.Resolution, got.Key(),
				got.KeyRevision, got.KeyRevisedBy, got.KeyRevisionNote, got.ResolutionNote)
		}
		if got.Answer == nil || got.Answer.Status != 201 || got.Answer.Fields["/id"] == "" {
			t.Errorf("the redrive's answer %+v, want the 201 with the id", got.Answer)
		}
	})
}

// TestRedriveWithANewKeyKeepsTheStepSuffix: on a route with steps each
// step's key is the new key plus the step's name.
func TestRedriveWithANewKeyKeepsTheStepSuffix(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		fake, router := routesFile(t, `version: 1
routes:
  - name: payments
    key: raw
    match: {subject: payment}
    allowNewKey: true
    steps:
      - {name: charge, url: "%s/charges"}
      - {name: receipt, url: "%s/receipts"}
`)
		c := flaggedClaim(t, tdb, "steps")
		if _, err := reconciler.Redrive(context.Background(), tdb.store, &reconciler.RedriveParams{ID: c.ID, By: "alice", Note: "checked",
			Routes: reconciler.Routes{"": router}, Retry: fastRetry, NewKey: true}); err != nil {
			t.Fatal(err)
		}
		for _, step := range []string{"charge", "receipt"} {
			if k := c.MessageID + ":r1:" + step; fake.Effects(k) != 1 {
				t.Errorf("%d effects under %s, want 1 (keys seen: %v)", fake.Effects(k), k, fake.Keys())
			}
		}
	})
}

// TestRedriveThatGetsAFinalAnswerFailsTheClaim: a redrive whose effect
// gets a decline fails the claim (the downstream's final word, as on any
// path) and says so; it is never redriven or resolved again.
func TestRedriveThatGetsAFinalAnswerFailsTheClaim(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		fake, router := stripe(t)
		routes := reconciler.Routes{"": router}
		c := flaggedClaim(t, tdb, "declined")
		fake.SetKeyReply(c.MessageID, fakedownstream.ReplyDecline)
		_, err := reconciler.Redrive(ctx, tdb.store, &reconciler.RedriveParams{ID: c.ID, By: "alice", Routes: routes, Retry: fastRetry})
		var ee *reconciler.EffectError
		if !errors.As(err, &ee) || !ee.Failed || ee.Reflagged || ee.Outcome != sideeffects.OutcomeRejected || ee.Answer == nil || ee.Answer.Status != 402 {
			t.Fatalf("redrive of a declined key: %v, want an EffectError that failed the claim", err)
		}
		got := mustGet(t, tdb.store, c.ID)
		if got.State != claim.StateFailed || got.FailReason != claim.FailRejected || got.FlaggedAt == nil || got.ClaimedBy != "operator:alice" {
			t.Fatalf("after the redrive: %s (%s) flagged at %v by %q; want failed (its flag kept as history)", got.State, got.FailReason, got.FlaggedAt, got.ClaimedBy)
		}
		if fake.Requests(c.MessageID) != 1 {
			t.Errorf("%d requests, want 1 (a final answer is not retried)", fake.Requests(c.MessageID))
		}
		_, err = reconciler.Redrive(ctx, tdb.store, &reconciler.RedriveParams{ID: c.ID, By: "bob", Routes: routes, Retry: fastRetry, NewKey: true, Note: "n"})
		if !errors.Is(err, reconciler.ErrNotFlagged) || !strings.Contains(err.Error(), "failed") {
			t.Errorf("redrive of a failed claim: %v, want refused saying it is failed", err)
		}
		_, err = reconciler.Resolve(ctx, tdb.store, &reconciler.ResolveParams{ID: c.ID, Resolution: claim.ResolutionDone, By: "bob", Note: "n"})
		var refused *reconciler.RefusedError
		if !errors.As(err, &refused) || !strings.Contains(err.Error(), "is failed") {
			t.Errorf("resolve of a failed claim: %v, want refused saying it is failed", err)
		}
	})
}

func newRecWithMetrics(t *testing.T, st claim.Store, cfg reconciler.Config, m *reconciler.Metrics) *reconciler.Reconciler {
	t.Helper()
	r, err := reconciler.New(st, cfg, testLogger(t), m)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
