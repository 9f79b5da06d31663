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
