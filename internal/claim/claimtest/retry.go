package claimtest

import (
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// An operator's retry of a failed claim: TakeOver on the operator path
// with Retry, guarded on the claim being failed, audited as "retried".

func (s *suite) retryTests() []struct {
	name string
	fn   func(t *testing.T)
} {
	return []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"RetryTakesAFailedClaimWithOneHistoryRow", s.retryTakesFailed},
		{"RetryWithANewKey", s.retryNewKey},
		{"RetryIsRefusedWhenNotFailed", s.retryRefused},
		{"ConcurrentRetriesHaveOneWinner", s.retryOnce},
	}
}

func retryParams(f *claim.Claim, by string) *claim.TakeOverParams {
	return &claim.TakeOverParams{ID: f.ID, PreviousOwner: f.Owner, Owner: uuid.New(), Path: claim.PathOperator, Retry: true,
		By: by, Reason: "retry by " + by + ": API key fixed", Route: f.Route, Fingerprint: f.Fingerprint}
}

func (s *suite) retryTakesFailed(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	c := mustWin(t, st, msg("", "billing", "b"))
	seq := int64(42)
	if err := st.Fail(ctx, &claim.FailParams{ID: c.ID, Owner: c.Owner, Reason: claim.FailRejected, Error: "HTTP 401: no Bearer", DeadLetterSeq: &seq}); err != nil {
		t.Fatal(err)
	}
	f := mustGet(t, st, c.ID)
	log := &historyLog{t: t, st: st, id: f.ID, n: len(s.history(t, st, f.ID))}
	p := retryParams(f, "operator:ann")
	got, err := st.TakeOver(ctx, p)
	if err != nil {
		t.Fatalf("retry of a failed claim: %v", err)
	}
	if got.State != claim.StateClaimed || got.Owner != p.Owner || got.ClaimedBy != "operator:ann" || got.TakeOverPath != claim.PathOperator ||
		got.PreviousOwner != f.Owner || got.DeadLetterSeq != nil || got.Payload == nil || got.KeyRevision != 0 {
		t.Fatalf("retried claim %+v", got)
	}
	if got.FailedAt == nil || got.FailReason != claim.FailRejected {
		t.Fatalf("retry lost FailedAt/FailReason: %v %q", got.FailedAt, got.FailReason)
	}
	e := log.want("retry", claim.ChangeRetried, claim.StateFailed, claim.StateClaimed, "operator:ann")
	if e.Path != claim.PathOperator || e.PreviousOwner != f.Owner || e.Owner != p.Owner || e.Key != f.Key() || !strings.Contains(e.Reason, "API key fixed") {
		t.Fatalf("retry history row %+v", e)
	}
	// The retried claim can fail again and dead-letter a new delivery.
	if err := st.Fail(ctx, &claim.FailParams{ID: got.ID, Owner: got.Owner, Reason: claim.FailRejected, Error: "again"}); err != nil {
		t.Fatalf("Fail after a retry: %v", err)
	}
	log.want("fail again", claim.ChangeFailed, claim.StateClaimed, claim.StateFailed, "")
	if err := st.TakeDeadLetter(ctx, &claim.TakeDeadLetterParams{ID: got.ID, Seq: 43}); err != nil {
		t.Fatalf("TakeDeadLetter after a retry failed again: %v", err)
	}
}

func (s *suite) retryNewKey(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	f := s.failed(t, st, msg("", "billing", "b"))
	log := &historyLog{t: t, st: st, id: f.ID, n: len(s.history(t, st, f.ID))}
	p := retryParams(f, "operator:bob")
	p.NewKey = true
	got, err := st.TakeOver(ctx, p)
	if err != nil {
		t.Fatalf("retry with a new key: %v", err)
	}
	if got.KeyRevision != 1 || got.Key() != f.NextKey() || got.KeyRevisedBy != "operator:bob" {
		t.Fatalf("new key: revision %d key %q (want %q) by %q", got.KeyRevision, got.Key(), f.NextKey(), got.KeyRevisedBy)
	}
	e := log.want("retry new key", claim.ChangeRetried, claim.StateFailed, claim.StateClaimed, "operator:bob")
	if e.Key != f.NextKey() {
		t.Fatalf("history key %q, want %q", e.Key, f.NextKey())
	}
}

func (s *suite) retryRefused(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	// Claimed, released, flagged, processed: not failed.
	claimed := mustWin(t, st, msg("", "billing", "c"))
	released := mustWin(t, st, msg("", "billing", "r"))
	if err := st.Release(ctx, &claim.ReleaseParams{ID: released.ID, Owner: released.Owner, Error: "x"}); err != nil {
		t.Fatal(err)
	}
	flagged := mustWin(t, st, msg("", "billing", "f"))
	if _, err := st.Flag(ctx, &claim.FlagParams{ID: flagged.ID, Owner: flagged.Owner, State: claim.StateClaimed, Reason: "x"}); err != nil {
		t.Fatal(err)
	}
	processed := mustWin(t, st, msg("", "billing", "p"))
	if err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: processed.ID, Owner: processed.Owner}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*claim.Claim{claimed, released, flagged, processed} {
		c = mustGet(t, st, c.ID)
		n := len(s.history(t, st, c.ID))
		now, err := st.TakeOver(ctx, retryParams(c, "operator:ann"))
		wantErr(t, "retry of a "+string(c.State)+" claim", err, claim.ErrStateChanged)
		if now == nil || now.State != c.State || now.Owner != c.Owner {
			t.Fatalf("refused retry of a %s claim returned %+v", c.State, now)
		}
		if h := s.history(t, st, c.ID); len(h) != n {
			t.Fatalf("refused retry of a %s claim wrote history %+v", c.State, h[n:])
		}
	}
	// Retry is only on the operator path.
	f := s.failed(t, st, msg("", "billing", "x"))
	p := retryParams(f, "operator:ann")
	p.Path, p.SilentFor = claim.PathRedelivery, 1
	if _, err := st.TakeOver(ctx, p); err == nil {
		t.Fatal("Retry on the redelivery path was accepted")
	}
}

func (s *suite) retryOnce(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	f := s.failed(t, st, msg("", "billing", "b"))
	n := len(s.history(t, st, f.ID))
	const racers = 8
	var wg sync.WaitGroup
	var mu sync.Mutex
	won, refused := 0, 0
	for i := range racers {
		wg.Go(func() {
			p := retryParams(f, "operator:o"+string(rune('a'+i)))
			p.NewKey = i%2 == 0
			_, err := st.TakeOver(ctx, p)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won++
			case strings.Contains(err.Error(), claim.ErrStateChanged.Error()):
				refused++
			default:
				t.Errorf("racer %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if won != 1 || refused != racers-1 {
		t.Fatalf("%d retries won, %d refused; want 1 and %d", won, refused, racers-1)
	}
	if h := s.history(t, st, f.ID); len(h) != n+1 || h[n].What != claim.ChangeRetried {
		t.Fatalf("history after concurrent retries: %+v", h[n:])
	}
}
