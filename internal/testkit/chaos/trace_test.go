package chaos

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claimdb"
)

// commitThenTimeout is a slow database: its ClaimBatch commits on the
// server, and the client's deadline passes before the answer arrives.
type commitThenTimeout struct{ claim.Store }

func (s commitThenTimeout) ClaimBatch(ctx context.Context, p *claim.ClaimBatchParams) ([]claim.ClaimResult, error) {
	if _, err := s.Store.ClaimBatch(ctx, p); err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("claim batch: %w", claim.NewError(claim.ClassTimeout, context.DeadlineExceeded))
}

// A replica's ClaimBatch commits and then times out, so no store call has
// returned the claim when the reconciler finds it stale and takes it over.
// The ledger must file that take-over under the claim's key: the
// reconciler's request is then its own, not one "without ever having been
// granted the claim"; and a request by a replica that was never granted
// the claim (the one whose claim timed out among them) is still caught.
func TestLedgerFilesATakeOverOfAClaimWhoseBatchTimedOut(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	st, err := claimdb.Open(ctx, "sqlite::memory:")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	hist, led := newHistory(), newLedger(time.Second, 2*time.Second)
	replica := &traceStore{Store: commitThenTimeout{st}, host: "replica-1", hist: hist, led: led}
	rec := &traceStore{Store: st, host: reconcilerHost, hist: hist, led: led}

	const key = "m-000001"
	body := []byte(`{"n":1}`)
	p := claim.ClaimParams{MessageID: key, Consumer: Consumer, Owner: uuid.New(), Route: "chaos",
		PayloadHash: claim.HashPayload(body), Payload: body, DeliveryCount: 1}
	_, err = replica.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: replica.host, Claims: []claim.ClaimParams{p}})
	if !errors.Is(err, claim.ErrUnavailable) {
		t.Fatalf("the slow ClaimBatch: %v, want a timeout", err)
	}

	// The reconciler finds the claim once its holder has been silent for
	// a millisecond by the database clock, and takes it over.
	var c *claim.Claim
	for c == nil {
		stale, err := rec.FindStale(ctx, &claim.FindStaleParams{StaleAfter: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if len(stale) > 0 {
			c = stale[0]
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the committed claim never became stale")
		case <-time.After(time.Millisecond):
		}
	}
	if c.MessageID != key || c.Owner != p.Owner {
		t.Fatalf("stale claim %s owned by %s, want %s owned by the replica's token %s", c.MessageID, c.Owner, key, p.Owner)
	}
	if _, err := rec.TakeOver(ctx, &claim.TakeOverParams{ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(), Path: claim.PathReconciler,
		SilentFor: time.Millisecond, By: reconcilerHost, Route: c.Route, Fingerprint: c.Fingerprint}); err != nil {
		t.Fatal(err)
	}
	led.requested(key, reconcilerHost, time.Now())
	if problems, _ := led.check(); len(problems) != 0 {
		t.Fatalf("false violations after the reconciler's take-over of a claim whose batch timed out:\n%s", strings.Join(problems, "\n"))
	}
	if h := hist.of(key); !strings.Contains(h, "TakeOver claim") {
		t.Errorf("the key's history lacks the take-over:\n    %s", h)
	}

	// Requests by replicas that were never granted the claim: the one
	// whose ClaimBatch timed out (it must not act on a claim it was not
	// told it won) and another.
	led.requested(key, "replica-1", time.Now())
	led.requested(key, "replica-2", time.Now())
	problems, _ := led.check()
	for _, sender := range []string{"replica-1", "replica-2"} {
		want := key + ": " + sender + " sent a request that may have performed the effect without ever having been granted the claim"
		if !slices.Contains(problems, want) {
			t.Errorf("no violation %q in:\n%s", want, strings.Join(problems, "\n"))
		}
	}
	if len(problems) != 2 {
		t.Errorf("%d violations, want 2 (the replicas'):\n%s", len(problems), strings.Join(problems, "\n"))
	}
}

// The replicas write heartbeats through group commit: a heartbeat written
// in a WriteOutcomes batch is a sign of life to the ledger as a single
// Heartbeat is (else a holder working longer than TakeoverAfter looks
// silent, and a delivery it completes is reported), and one whose guard
// did not hold is not.
func TestLedgerCountsAGroupCommittedHeartbeat(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	st, err := claimdb.Open(ctx, "sqlite::memory:")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	hist, led := newHistory(), newLedger(time.Second, 2*time.Second)
	replica := &traceStore{Store: st, host: "replica-1", hist: hist, led: led}
	var claims []*claim.Claim
	for _, key := range []string{"m-000001", "m-000002"} {
		body := []byte(key)
		res, err := replica.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: replica.host, Claims: []claim.ClaimParams{{
			MessageID: key, Consumer: Consumer, Owner: uuid.New(), Route: "chaos", PayloadHash: claim.HashPayload(body), DeliveryCount: 1}}})
		if err != nil || res[0].Outcome != claim.OutcomeWon {
			t.Fatalf("claim %s: %v %v", key, res, err)
		}
		claims = append(claims, res[0].Claim)
	}
	live, done := claims[0], claims[1]
	if err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: done.ID, Owner: done.Owner}); err != nil {
		t.Fatal(err)
	}

	before := time.Now()
	errs, err := replica.WriteOutcomes(ctx, []claim.OutcomeWrite{
		{Heartbeat: &claim.HeartbeatParams{ID: live.ID, Owner: live.Owner}},
		{Heartbeat: &claim.HeartbeatParams{ID: done.ID, Owner: done.Owner}},
	})
	if err != nil || errs[0] != nil || !errors.Is(errs[1], claim.ErrStateChanged) {
		t.Fatalf("WriteOutcomes: %v %v", errs, err)
	}
	later := before.Add(time.Hour)
	if host, silent := led.holder(live.MessageID, later); host != "replica-1" || silent > time.Hour {
		t.Errorf("after a batched heartbeat: holder %q silent %s at a time one hour after it, want replica-1 silent at most 1h", host, silent)
	}
	if _, silent := led.holder(done.MessageID, later); silent <= time.Hour {
		t.Errorf("a refused batched heartbeat counted as a sign of life (silent %s)", silent)
	}
}

// On a slow database a call that proves its owner alive can take longer
// than the windows. Each check must read that call on its own safe side:
// a take-over is judged from the call's start (the database wrote the sign
// of life no earlier: a taker is not blamed for a write it could not have
// seen), a holder's silence from the call's end (no later: a holder is not
// reported silent for the time its own write took).
func TestLedgerReadsASlowCallOnTheSafeSideOfEachCheck(t *testing.T) {
	const key = "m-000001"
	led := newLedger(time.Second, 2*time.Second)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	o := uuid.New()
	led.won(key, "replica-1", o, t0, t0.Add(2*time.Second)) // a ClaimBatch that took 2s
	if _, silent := led.holder(key, t0.Add(2100*time.Millisecond)); silent != 100*time.Millisecond {
		t.Errorf("silent %s 100ms after a slow claim returned, want 100ms", silent)
	}
	led.alive(o, t0.Add(3*time.Second), t0.Add(4500*time.Millisecond)) // a heartbeat that took 1.5s
	if _, silent := led.holder(key, t0.Add(4600*time.Millisecond)); silent != 100*time.Millisecond {
		t.Errorf("silent %s 100ms after a slow heartbeat returned, want 100ms", silent)
	}
	// A take-over that returned 1.2s after the heartbeat's call started:
	// the heartbeat may have been written then, 1.2s before, outside the
	// 1s window. Not a violation.
	led.tookOver(key, "replica-2", &claim.TakeOverParams{ID: 1, PreviousOwner: o, Owner: uuid.New(), Path: claim.PathRedelivery},
		t0.Add(4000*time.Millisecond), t0.Add(4200*time.Millisecond))
	if problems, _ := led.check(); len(problems) != 0 {
		t.Errorf("violations: %q", problems)
	}
	// Within the window of the start of a heartbeat: a live holder taken over.
	o2 := uuid.New()
	led.won("m-000002", "replica-1", o2, t0, t0)
	led.alive(o2, t0.Add(3*time.Second), t0.Add(3100*time.Millisecond))
	led.tookOver("m-000002", "replica-2", &claim.TakeOverParams{ID: 2, PreviousOwner: o2, Owner: uuid.New(), Path: claim.PathRedelivery},
		t0.Add(3500*time.Millisecond), t0.Add(3600*time.Millisecond))
	if problems, _ := led.check(); len(problems) != 1 || !strings.Contains(problems[0], "a live holder was taken over") {
		t.Errorf("violations: %q, want the live holder's take-over", problems)
	}
}
