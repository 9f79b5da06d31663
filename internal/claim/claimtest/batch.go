package claimtest

import (
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// batchTests are the conformance tests of WriteOutcomes, the group
// commit's batch.
func (s *suite) batchTests() []struct {
	name string
	fn   func(t *testing.T)
} {
	return []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"WriteOutcomesDoesWhatTheSingleWritesDo", s.batchMatchesSingles},
		{"WriteOutcomesGuardsEachWriteOnItsOwner", s.batchMixedOwners},
		{"WriteOutcomesSkipsOnlyTheRowThatChangedState", s.batchRowChangedUnderIt},
		{"WriteOutcomesRefusesABadBatch", s.batchBad},
	}
}

// batchWriter returns st as a claim.BatchWriter: every dialect's store is
// one.
func batchWriter(t *testing.T, st claim.Store) claim.BatchWriter {
	t.Helper()
	bw, ok := st.(claim.BatchWriter)
	if !ok {
		t.Fatalf("%T is not a claim.BatchWriter", st)
	}
	return bw
}

// batchMatchesSingles performs each kind of write once alone and once in a
// batch with the others, on twin claims, and compares the rows.
func (s *suite) batchMatchesSingles(t *testing.T) {
	st := s.h.NewStore(t)
	bw := batchWriter(t, st)
	ctx := ctxT(t)
	answer := &claim.Answer{Status: 201, Headers: map[string]string{"Request-Id": "req_1"}, Fields: map[string]string{"/id": "ch_1"}}
	kinds := []func(c *claim.Claim) claim.OutcomeWrite{
		func(c *claim.Claim) claim.OutcomeWrite {
			return claim.OutcomeWrite{Heartbeat: &claim.HeartbeatParams{ID: c.ID, Owner: c.Owner}}
		},
		func(c *claim.Claim) claim.OutcomeWrite {
			return claim.OutcomeWrite{RecordAttempt: &claim.RecordAttemptParams{ID: c.ID, Owner: c.Owner, Error: "HTTP 503", NextAttemptIn: time.Hour, Answer: answer}}
		},
		func(c *claim.Claim) claim.OutcomeWrite {
			return claim.OutcomeWrite{RecordAttempt: &claim.RecordAttemptParams{ID: c.ID, Owner: c.Owner, Error: "timeout"}}
		},
		func(c *claim.Claim) claim.OutcomeWrite {
			return claim.OutcomeWrite{Release: &claim.ReleaseParams{ID: c.ID, Owner: c.Owner, Error: "HTTP 429", NextAttemptIn: 2 * time.Hour, Answer: answer}}
		},
		func(c *claim.Claim) claim.OutcomeWrite {
			return claim.OutcomeWrite{Release: &claim.ReleaseParams{ID: c.ID, Owner: c.Owner, Error: "refused"}}
		},
		func(c *claim.Claim) claim.OutcomeWrite {
			return claim.OutcomeWrite{MarkProcessed: &claim.MarkProcessedParams{ID: c.ID, Owner: c.Owner, Answer: answer}}
		},
		func(c *claim.Claim) claim.OutcomeWrite {
			return claim.OutcomeWrite{MarkProcessed: &claim.MarkProcessedParams{ID: c.ID, Owner: c.Owner}}
		},
	}
	var singles, batched []*claim.Claim
	var batch []claim.OutcomeWrite
	for _, kind := range kinds {
		a, b := mustWin(t, st, msg("", "billing", "b")), mustWin(t, st, msg("", "billing", "b"))
		// Both twins start with an answer and old times, so keeping the
		// answer and moving the times can be seen.
		for _, c := range []*claim.Claim{a, b} {
			if err := st.RecordAttempt(ctx, &claim.RecordAttemptParams{ID: c.ID, Owner: c.Owner, Error: "first", NextAttemptIn: 3 * time.Hour,
				Answer: &claim.Answer{Status: 500}}); err != nil {
				t.Fatal(err)
			}
			s.backdate(t, st, c.ID, time.Hour)
		}
		singles, batched = append(singles, a), append(batched, b)
		batch = append(batch, kind(b))
	}
	for i, kind := range kinds {
		w := kind(singles[i])
		if errs := claim.WriteEach(ctx, st, []claim.OutcomeWrite{w}); errs[0] != nil {
			t.Fatalf("single %s: %v", w.Kind(), errs[0])
		}
	}
	errs, err := bw.WriteOutcomes(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range errs {
		if e != nil {
			t.Errorf("batched %s: %v", batch[i].Kind(), e)
		}
	}
	for i := range kinds {
		a, b := mustGet(t, st, singles[i].ID), mustGet(t, st, batched[i].ID)
		if d := compareOutcome(a, b); d != "" {
			t.Errorf("%s: the batch differs from the single write: %s", batch[i].Kind(), d)
		}
	}
}

// compareOutcome names the first outcome field in which a and b differ;
// times are compared by being set and by moving (the twins' times differ
// by the milliseconds between the writes).
func compareOutcome(a, b *claim.Claim) string {
	set := func(t *time.Time) bool { return t != nil }
	near := func(x, y *time.Time) bool {
		if x == nil || y == nil {
			return x == y
		}
		return x.Sub(*y).Abs() < time.Minute
	}
	switch {
	case a.State != b.State:
		return "state " + string(a.State) + " / " + string(b.State)
	case a.Attempts != b.Attempts:
		return "attempts"
	case a.LastError != b.LastError:
		return "last error " + a.LastError + " / " + b.LastError
	case set(a.ProcessedAt) != set(b.ProcessedAt), set(a.ReleasedAt) != set(b.ReleasedAt):
		return "processed or released time"
	case !near(a.NextAttemptAt, b.NextAttemptAt):
		return "next attempt"
	case !near(&a.HeartbeatAt, &b.HeartbeatAt):
		return "heartbeat"
	case (a.Payload == nil) != (b.Payload == nil):
		return "payload"
	case (a.Answer == nil) != (b.Answer == nil), a.Answer != nil && (a.Answer.Status != b.Answer.Status || a.Answer.Headers["Request-Id"] != b.Answer.Headers["Request-Id"] || a.Answer.Fields["/id"] != b.Answer.Fields["/id"]):
		return "answer"
	case !near(a.AnswerAt, b.AnswerAt):
		return "answer time"
	}
	return ""
}

// batchMixedOwners: in one batch, writes by the claims' owners apply and
// writes by another owner are refused, each on its own.
func (s *suite) batchMixedOwners(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	var batch []claim.OutcomeWrite
	var claims []*claim.Claim
	for i := range 6 {
		c := mustWin(t, st, msg("", "billing", "b"))
		claims = append(claims, c)
		owner := c.Owner
		if i%2 == 1 {
			owner = uuid.New() // an attempt that lost the claim
		}
		switch i % 3 {
		case 0:
			batch = append(batch, claim.OutcomeWrite{MarkProcessed: &claim.MarkProcessedParams{ID: c.ID, Owner: owner}})
		case 1:
			batch = append(batch, claim.OutcomeWrite{Release: &claim.ReleaseParams{ID: c.ID, Owner: owner, Error: "e"}})
		default:
			batch = append(batch, claim.OutcomeWrite{RecordAttempt: &claim.RecordAttemptParams{ID: c.ID, Owner: owner, Error: "e"}})
		}
	}
	errs, err := batchWriter(t, st).WriteOutcomes(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if len(errs) != len(batch) {
		t.Fatalf("%d results for %d writes", len(errs), len(batch))
	}
	// The even writes are the owners': processed, an attempt, released.
	want := []claim.State{claim.StateProcessed, claim.StateClaimed, claim.StateClaimed, claim.StateClaimed, claim.StateReleased, claim.StateClaimed}
	attempts := []int{0, 0, 1, 0, 0, 0}
	for i, c := range claims {
		if i%2 == 1 {
			wantErr(t, batch[i].Kind().String()+" by another owner", errs[i], claim.ErrStateChanged)
		} else if errs[i] != nil {
			t.Errorf("%s by the owner: %v", batch[i].Kind(), errs[i])
		}
		got := mustGet(t, st, c.ID)
		if got.State != want[i] || got.Attempts != attempts[i] {
			t.Errorf("claim %d (write %d, %s): %s with %d attempts, want %s with %d", c.ID, i, batch[i].Kind(), got.State, got.Attempts, want[i], attempts[i])
		}
	}
}

// batchRowChangedUnderIt: a claim taken over between its holder's last
// look and the batch is skipped (ErrStateChanged for its write alone);
// the take-over's owner keeps it.
func (s *suite) batchRowChangedUnderIt(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	a, b, c := mustWin(t, st, msg("", "billing", "b")), mustWin(t, st, msg("", "billing", "b")), mustWin(t, st, msg("", "billing", "b"))
	if err := st.Release(ctx, &claim.ReleaseParams{ID: b.ID, Owner: b.Owner, Error: "e"}); err != nil {
		t.Fatal(err)
	}
	taker, err := st.TakeOver(ctx, redelivery(b, "other", 2))
	if err != nil {
		t.Fatal(err)
	}
	errs, err := batchWriter(t, st).WriteOutcomes(ctx, []claim.OutcomeWrite{
		{MarkProcessed: &claim.MarkProcessedParams{ID: a.ID, Owner: a.Owner}},
		{MarkProcessed: &claim.MarkProcessedParams{ID: b.ID, Owner: b.Owner}}, // b's old holder, late
		{Heartbeat: &claim.HeartbeatParams{ID: c.ID, Owner: c.Owner}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if errs[0] != nil || errs[2] != nil {
		t.Errorf("unaffected writes: %v, %v", errs[0], errs[2])
	}
	wantErr(t, "a late holder's MarkProcessed", errs[1], claim.ErrStateChanged)
	if got := mustGet(t, st, b.ID); got.State != claim.StateClaimed || got.Owner != taker.Owner {
		t.Errorf("taken-over claim %s owned by %s, want claimed by the taker %s", got.State, got.Owner, taker.Owner)
	}
	if got := mustGet(t, st, a.ID); got.State != claim.StateProcessed {
		t.Errorf("claim a %s, want processed", got.State)
	}
}

// batchBad: a batch with two writes for one claim, or a write of no
// single kind, is refused before anything is written.
func (s *suite) batchBad(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	c := mustWin(t, st, msg("", "billing", "b"))
	for name, batch := range map[string][]claim.OutcomeWrite{
		"two writes for one claim": {{MarkProcessed: &claim.MarkProcessedParams{ID: c.ID, Owner: c.Owner}}, {Heartbeat: &claim.HeartbeatParams{ID: c.ID, Owner: c.Owner}}},
		"no kind":                  {{}},
		"too many":                 make([]claim.OutcomeWrite, claim.MaxOutcomeBatch+1),
	} {
		if _, err := batchWriter(t, st).WriteOutcomes(ctx, batch); !errors.Is(err, claim.ErrBadBatch) {
			t.Errorf("%s: %v, want ErrBadBatch", name, err)
		}
	}
	if got := mustGet(t, st, c.ID); got.State != claim.StateClaimed {
		t.Errorf("a refused batch changed the claim: %s", got.State)
	}
	if errs, err := batchWriter(t, st).WriteOutcomes(ctx, nil); err != nil || len(errs) != 0 {
		t.Errorf("empty batch: %v, %v", errs, err)
	}
}
