package claimtest

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// The failed state (a final answer that is not a success) and its guards,
// the answer every outcome write records, the dead letter one delivery
// takes, and the operator's new key.

func (s *suite) failedTests() []struct {
	name string
	fn   func(t *testing.T)
} {
	return []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"FailIsByTheOwnerOfAClaimedClaim", s.failByOwner},
		{"FailIsRefusedOnReleasedProcessedFlaggedResolved", s.failRefused},
		{"FailedClaimIsADuplicateToALaterClaim", s.failedIsDuplicate},
		{"FailedClaimIsNeverTakenOver", s.failedNeverTakenOver},
		{"FailedClaimIsNeverStaleNorFlagged", s.failedNeverFlagged},
		{"FailedClaimIsPurgedAfterTheRetention", s.failedPurged},
		{"FailedClaimsAreCounted", s.failedStats},
		{"TakeDeadLetterHasOneTaker", s.takeDeadLetter},
		{"OutcomeWritesKeepTheAnswer", s.answerKept},
		{"AnswerIsStoredBoundedAndStorable", s.answerStorable},
		{"OperatorTakeOverWithANewKey", s.newKey},
	}
}

// failed returns a claim in state failed (no dead-letter delivery).
func (s *suite) failed(t *testing.T, st claim.Store, p claim.ClaimParams) *claim.Claim {
	t.Helper()
	c := mustWin(t, st, p)
	if err := st.Fail(ctxT(t), &claim.FailParams{ID: c.ID, Owner: c.Owner, Reason: claim.FailRejected, Error: "HTTP 402: declined"}); err != nil {
		t.Fatalf("Fail: %v", err)
	}
	return mustGet(t, st, c.ID)
}

func (s *suite) failByOwner(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	c := mustWin(t, st, msg("", "billing", "b"))
	answer := &claim.Answer{Status: 402, Headers: map[string]string{"Request-Id": "req_1"}, Fields: map[string]string{"/error/charge": "ch_9"}}
	wantErr(t, "Fail by another owner", st.Fail(ctx, &claim.FailParams{ID: c.ID, Owner: uuid.New(), Reason: claim.FailRejected}), claim.ErrStateChanged)
	wantErr(t, "Fail of a missing claim", st.Fail(ctx, &claim.FailParams{ID: c.ID + 1000, Owner: c.Owner, Reason: claim.FailRejected}), claim.ErrStateChanged)
	for name, p := range map[string]*claim.FailParams{
		"no reason":        {ID: c.ID, Owner: c.Owner},
		"no owner":         {ID: c.ID, Reason: claim.FailRejected},
		"reason too long":  {ID: c.ID, Owner: c.Owner, Reason: strings.Repeat("r", claim.MaxFailReasonLength+1)},
		"reason too long2": {ID: c.ID, Owner: c.Owner, Reason: strings.Repeat("é", claim.MaxFailReasonLength+1)},
	} {
		if err := st.Fail(ctx, p); err == nil || errors.Is(err, claim.ErrStateChanged) {
			t.Errorf("Fail with %s: %v, want a validation error", name, err)
		}
	}
	if got := mustGet(t, st, c.ID); got.State != claim.StateClaimed || got.FailedAt != nil {
		t.Fatalf("refused Fail changed the claim: %+v", got)
	}
	seq := int64(1234567890123)
	if err := st.Fail(ctx, &claim.FailParams{ID: c.ID, Owner: c.Owner, Reason: claim.FailRejected, Error: "HTTP 402: card_declined",
		Answer: answer, DeadLetterSeq: &seq}); err != nil {
		t.Fatalf("Fail by the owner: %v", err)
	}
	got := mustGet(t, st, c.ID)
	if got.State != claim.StateFailed || got.FailedAt == nil || got.FailReason != claim.FailRejected || got.LastError != "HTTP 402: card_declined" ||
		got.Owner != c.Owner || got.Payload == nil || got.ProcessedAt != nil || got.DeadLetterSeq == nil || *got.DeadLetterSeq != seq {
		t.Fatalf("failed: state %s at %v reason %q error %q owner %s payload %q dead letter %v",
			got.State, got.FailedAt, got.FailReason, got.LastError, got.Owner, got.Payload, got.DeadLetterSeq)
	}
	if got.Answer == nil || got.Answer.Status != 402 || got.Answer.Headers["Request-Id"] != "req_1" ||
		got.Answer.Fields["/error/charge"] != "ch_9" || got.AnswerAt == nil || !got.AnswerAt.Equal(*got.FailedAt) {
		t.Fatalf("answer %+v at %v (failed at %v)", got.Answer, got.AnswerAt, got.FailedAt)
	}
	if got.FailedAt.Before(got.ClaimedAt) {
		t.Fatalf("FailedAt %v before ClaimedAt %v", got.FailedAt, got.ClaimedAt)
	}
	// Final: the owner can do nothing more with it.
	for op, err := range map[string]error{
		"Heartbeat":     st.Heartbeat(ctx, &claim.HeartbeatParams{ID: c.ID, Owner: c.Owner}),
		"MarkProcessed": st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: c.ID, Owner: c.Owner}),
		"Release":       st.Release(ctx, &claim.ReleaseParams{ID: c.ID, Owner: c.Owner}),
		"RecordAttempt": st.RecordAttempt(ctx, &claim.RecordAttemptParams{ID: c.ID, Owner: c.Owner}),
		"Fail again":    st.Fail(ctx, &claim.FailParams{ID: c.ID, Owner: c.Owner, Reason: claim.FailPermanent}),
	} {
		wantErr(t, op+" on a failed claim", err, claim.ErrStateChanged)
	}
	_, err := st.Resolve(ctx, &claim.ResolveParams{ID: c.ID, Resolution: claim.ResolutionDone, By: "op", Note: "n"})
	wantErr(t, "Resolve of a failed claim", err, claim.ErrStateChanged)
	_, err = st.Resolve(ctx, &claim.ResolveParams{ID: c.ID, Resolution: claim.ResolutionRedriven, By: "op", Owner: c.Owner})
	wantErr(t, "Resolve redriven of a failed claim by its owner", err, claim.ErrStateChanged)
	if again := mustGet(t, st, c.ID); again.State != claim.StateFailed || again.FailReason != claim.FailRejected {
		t.Fatalf("refused writes changed the failed claim: %+v", again)
	}
}

func (s *suite) failRefused(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	released := mustWin(t, st, msg("", "billing", "r"))
	if err := st.Release(ctx, &claim.ReleaseParams{ID: released.ID, Owner: released.Owner, Error: "503"}); err != nil {
		t.Fatal(err)
	}
	processed := mustWin(t, st, msg("", "billing", "p"))
	if err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: processed.ID, Owner: processed.Owner}); err != nil {
		t.Fatal(err)
	}
	flagged := s.flagged(t, st, msg("", "billing", "f"))
	resolved := s.flagged(t, st, msg("", "billing", "x"))
	if _, err := st.Resolve(ctx, &claim.ResolveParams{ID: resolved.ID, Resolution: claim.ResolutionDiscarded, By: "op"}); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]*claim.Claim{"released": released, "processed": processed, "flagged": flagged, "resolved": resolved} {
		before := mustGet(t, st, c.ID)
		err := st.Fail(ctx, &claim.FailParams{ID: c.ID, Owner: c.Owner, Reason: claim.FailPermanent, Error: "400"})
		wantErr(t, "Fail of a "+name+" claim by its owner", err, claim.ErrStateChanged)
		if after := mustGet(t, st, c.ID); after.State != before.State || after.FailedAt != nil || after.FailReason != "" {
			t.Fatalf("refused Fail changed the %s claim: %+v", name, after)
		}
	}
}

func (s *suite) failedIsDuplicate(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	p := msg("", "billing", "b")
	c := mustWin(t, st, p)
	if err := st.Fail(ctx, &claim.FailParams{ID: c.ID, Owner: c.Owner, Reason: claim.FailRejected, Error: "declined"}); err != nil {
		t.Fatal(err)
	}
	// A later delivery: a duplicate, with the failed claim to complete on.
	res := claimOne(t, st, p)
	if res.Outcome != claim.OutcomeDuplicate || res.Claim.ID != c.ID || res.Claim.State != claim.StateFailed || res.Claim.FailReason != claim.FailRejected {
		t.Fatalf("a later claim of a failed key: %s %+v, want a duplicate of the failed claim", res.Outcome, res.Claim)
	}
	// The same attempt's own token (a retried batch after the claim
	// failed) is a duplicate too: only a claimed row is its own. (mustWin
	// claimed with a token of its own: send the row's.)
	p.Owner = c.Owner
	own, err := st.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "h", Claims: []claim.ClaimParams{p}})
	if err != nil {
		t.Fatal(err)
	}
	if own[0].Outcome != claim.OutcomeDuplicate || own[0].Claim.State != claim.StateFailed {
		t.Fatalf("own token, failed row: %s %+v, want duplicate", own[0].Outcome, own[0].Claim)
	}
	// Another payload under the key is still a conflict.
	other := msg(p.MessageID, "billing", "other body")
	if res := claimOne(t, st, other); res.Outcome != claim.OutcomeConflict {
		t.Fatalf("another payload under a failed key: %s, want conflict", res.Outcome)
	}
	if got := mustGet(t, st, c.ID); got.State != claim.StateFailed || got.Owner != c.Owner {
		t.Fatalf("claims of a failed key changed it: %+v", got)
	}
}

func (s *suite) failedNeverTakenOver(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	f := s.failed(t, st, msg("", "billing", "b"))
	s.backdate(t, st, f.ID, 10*time.Hour)
	for _, path := range []claim.TakeOverPath{claim.PathRedelivery, claim.PathReconciler, claim.PathOperator} {
		p := &claim.TakeOverParams{ID: f.ID, PreviousOwner: f.Owner, Owner: uuid.New(), Path: path, SilentFor: time.Second,
			By: "x", Reason: "r", Route: f.Route, Fingerprint: f.Fingerprint, NewKey: path == claim.PathOperator}
		now, err := st.TakeOver(ctx, p)
		wantErr(t, string(path)+" take-over of a failed claim", err, claim.ErrStateChanged)
		if now == nil || now.State != claim.StateFailed || now.Owner != f.Owner || now.TakeOvers != 0 || now.KeyRevision != 0 {
			t.Fatalf("%s: refused take-over returned %+v, want the failed claim unchanged", path, now)
		}
		if !strings.Contains(err.Error(), "failed") {
			t.Errorf("%s: the refusal %q does not say the claim is failed", path, err)
		}
	}
}

func (s *suite) failedNeverFlagged(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	f := s.failed(t, st, msg("", "billing", "b"))
	stale := mustWin(t, st, msg("", "billing", "stale"))
	s.backdate(t, st, f.ID, 10*time.Hour)
	s.backdate(t, st, stale.ID, 10*time.Hour)
	if found := findStale(t, st, time.Minute); containsID(found, f.ID) || !containsID(found, stale.ID) {
		t.Fatalf("FindStale = %v: the failed claim %d must not be listed, the stale claimed one %d must", ids(found), f.ID, stale.ID)
	}
	flagged, err := st.FlagStale(ctx, &claim.FlagStaleParams{StaleAfter: time.Minute, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	if containsID(flagged, f.ID) || !containsID(flagged, stale.ID) {
		t.Fatalf("FlagStale flagged %v: the failed claim %d must not be, the stale claimed one %d must", ids(flagged), f.ID, stale.ID)
	}
	for _, state := range []claim.State{claim.StateClaimed, claim.StateReleased} {
		_, err := st.Flag(ctx, &claim.FlagParams{ID: f.ID, Owner: f.Owner, State: state, Reason: "r"})
		wantErr(t, "Flag of a failed claim as "+string(state), err, claim.ErrStateChanged)
	}
	if _, err := st.Flag(ctx, &claim.FlagParams{ID: f.ID, Owner: f.Owner, State: claim.StateFailed, Reason: "r"}); err == nil || errors.Is(err, claim.ErrStateChanged) {
		t.Fatalf("Flag with State failed: %v, want a validation error (only claimed or released claims are flagged)", err)
	}
	if got := mustGet(t, st, f.ID); got.State != claim.StateFailed || got.FlaggedAt != nil {
		t.Fatalf("the failed claim was flagged: %+v", got)
	}
}

func (s *suite) failedPurged(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	old := s.failed(t, st, msg("", "billing", "old"))
	recent := s.failed(t, st, msg("", "billing", "recent"))
	flagged := s.flagged(t, st, msg("", "billing", "flagged"))
	claimed := mustWin(t, st, msg("", "billing", "claimed"))
	processed := mustWin(t, st, msg("", "billing", "processed"))
	if err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: processed.ID, Owner: processed.Owner}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*claim.Claim{old, flagged, claimed, processed} {
		s.backdate(t, st, c.ID, 10*time.Hour)
	}
	var got []int64
	for range 3 {
		n, err := st.PurgeProcessed(ctx, &claim.PurgeParams{OlderThan: 5 * time.Hour, Limit: 1})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, n)
	}
	if fmt.Sprint(got) != "[1 1 0]" {
		t.Fatalf("purge batches deleted %v, want [1 1 0] (the old processed and the old failed claim)", got)
	}
	for _, c := range []*claim.Claim{old, processed} {
		if _, err := st.Get(ctx, c.ID); !errors.Is(err, claim.ErrNotFound) {
			t.Fatalf("claim %d survived the purge: %v", c.ID, err)
		}
	}
	for _, c := range []*claim.Claim{recent, flagged, claimed} {
		mustGet(t, st, c.ID)
	}
	// Within the retention, by FailedAt: failed 1h ago, retention 2h.
	s.backdate(t, st, recent.ID, time.Hour)
	if n, err := st.PurgeProcessed(ctx, &claim.PurgeParams{OlderThan: 2 * time.Hour, Limit: 100}); err != nil || n != 0 {
		t.Fatalf("purge of a failed claim within the retention: %d %v, want 0", n, err)
	}
	if n, err := st.PurgeProcessed(ctx, &claim.PurgeParams{OlderThan: 30 * time.Minute, Limit: 100}); err != nil || n != 1 {
		t.Fatalf("purge of a failed claim after the retention: %d %v, want 1", n, err)
	}
}

func (s *suite) failedStats(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	s.failed(t, st, msg("", "billing", "a"))
	s.failed(t, st, msg("", "billing", "b"))
	mustWin(t, st, msg("", "billing", "c"))
	s.flagged(t, st, msg("", "billing", "d"))
	got, err := st.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got.Failed != 2 || got.Claimed != 1 || got.Flagged != 1 || got.Released != 0 {
		t.Fatalf("stats %+v, want 2 failed, 1 claimed, 1 flagged", got)
	}
	rows, err := st.List(ctx, &claim.ListParams{States: []claim.State{claim.StateFailed}})
	if err != nil || len(rows) != 2 || rows[0].State != claim.StateFailed || rows[1].State != claim.StateFailed {
		t.Fatalf("List of failed claims: %v %v", ids(rows), err)
	}
}

func (s *suite) takeDeadLetter(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	f := s.failed(t, st, msg("", "billing", "b"))
	if f.DeadLetterSeq != nil {
		t.Fatalf("a claim failed without a delivery has dead letter %d", *f.DeadLetterSeq)
	}
	if err := st.TakeDeadLetter(ctx, &claim.TakeDeadLetterParams{ID: f.ID, Seq: 7}); err != nil {
		t.Fatalf("the first TakeDeadLetter: %v", err)
	}
	wantErr(t, "a second TakeDeadLetter", st.TakeDeadLetter(ctx, &claim.TakeDeadLetterParams{ID: f.ID, Seq: 8}), claim.ErrStateChanged)
	if got := mustGet(t, st, f.ID); got.DeadLetterSeq == nil || *got.DeadLetterSeq != 7 || got.State != claim.StateFailed {
		t.Fatalf("after two takes: %+v, want the first's sequence number", got)
	}
	// A claim failed by a delivery already has its dead letter.
	c := mustWin(t, st, msg("", "billing", "c"))
	seq := int64(3)
	if err := st.Fail(ctx, &claim.FailParams{ID: c.ID, Owner: c.Owner, Reason: claim.FailConflict, DeadLetterSeq: &seq}); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "TakeDeadLetter of a claim its delivery failed", st.TakeDeadLetter(ctx, &claim.TakeDeadLetterParams{ID: c.ID, Seq: 4}), claim.ErrStateChanged)
	// Only failed claims have a dead letter to take.
	claimed := mustWin(t, st, msg("", "billing", "d"))
	wantErr(t, "TakeDeadLetter of a claimed claim", st.TakeDeadLetter(ctx, &claim.TakeDeadLetterParams{ID: claimed.ID, Seq: 5}), claim.ErrStateChanged)
	wantErr(t, "TakeDeadLetter of a missing claim", st.TakeDeadLetter(ctx, &claim.TakeDeadLetterParams{ID: f.ID + 1000, Seq: 5}), claim.ErrNotFound)
	if got := mustGet(t, st, claimed.ID); got.DeadLetterSeq != nil {
		t.Fatalf("a refused TakeDeadLetter wrote %d", *got.DeadLetterSeq)
	}
}

func (s *suite) answerKept(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	first := &claim.Answer{Status: 500, Headers: map[string]string{"Request-Id": "req_1"}}
	second := &claim.Answer{Status: 201, Step: "charge", Fields: map[string]string{"/id": "ch_1", "/amount": "1000"}}

	c := mustWin(t, st, msg("", "billing", "b"))
	if c.Answer != nil || c.AnswerAt != nil {
		t.Fatalf("a new claim has an answer: %+v", c.Answer)
	}
	if err := st.RecordAttempt(ctx, &claim.RecordAttemptParams{ID: c.ID, Owner: c.Owner, Error: "HTTP 500", Answer: first}); err != nil {
		t.Fatal(err)
	}
	got := mustGet(t, st, c.ID)
	if got.Answer == nil || got.Answer.Status != 500 || got.Answer.Headers["Request-Id"] != "req_1" || got.AnswerAt == nil {
		t.Fatalf("after RecordAttempt: answer %+v at %v", got.Answer, got.AnswerAt)
	}
	at := *got.AnswerAt
	// An attempt without an answer (a timeout) keeps the last one.
	s.backdate(t, st, c.ID, time.Minute)
	at = at.Add(-time.Minute)
	if err := st.RecordAttempt(ctx, &claim.RecordAttemptParams{ID: c.ID, Owner: c.Owner, Error: "timeout"}); err != nil {
		t.Fatal(err)
	}
	if err := st.Release(ctx, &claim.ReleaseParams{ID: c.ID, Owner: c.Owner, Error: "503"}); err != nil {
		t.Fatal(err)
	}
	got = mustGet(t, st, c.ID)
	if got.Answer == nil || got.Answer.Status != 500 || got.AnswerAt == nil || !got.AnswerAt.Equal(at) || got.LastError != "503" {
		t.Fatalf("writes without an answer: answer %+v at %v (want kept, at %v), last error %q", got.Answer, got.AnswerAt, at, got.LastError)
	}
	taken, err := st.TakeOver(ctx, redelivery(got, "host-b", 2))
	if err != nil {
		t.Fatal(err)
	}
	if taken.Answer == nil || taken.Answer.Status != 500 {
		t.Fatalf("a take-over dropped the answer: %+v", taken.Answer)
	}
	if err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: c.ID, Owner: taken.Owner, Answer: second}); err != nil {
		t.Fatal(err)
	}
	got = mustGet(t, st, c.ID)
	if got.Answer == nil || got.Answer.Status != 201 || got.Answer.Step != "charge" || got.Answer.Fields["/id"] != "ch_1" ||
		got.Answer.Fields["/amount"] != "1000" || len(got.Answer.Headers) != 0 || got.AnswerAt == nil || !got.AnswerAt.Equal(*got.ProcessedAt) {
		t.Fatalf("after MarkProcessed with an answer: %+v at %v (processed at %v)", got.Answer, got.AnswerAt, got.ProcessedAt)
	}

	// Release with an answer; a redrive's resolution with one.
	r := mustWin(t, st, msg("", "billing", "r"))
	if err := st.Release(ctx, &claim.ReleaseParams{ID: r.ID, Owner: r.Owner, Error: "429", Answer: &claim.Answer{Status: 429}}); err != nil {
		t.Fatal(err)
	}
	if got := mustGet(t, st, r.ID); got.Answer == nil || got.Answer.Status != 429 || got.AnswerAt == nil {
		t.Fatalf("after Release with an answer: %+v", got.Answer)
	}
	f := s.flagged(t, st, msg("", "billing", "f"))
	held, err := st.TakeOver(ctx, &claim.TakeOverParams{ID: f.ID, PreviousOwner: f.Owner, Owner: uuid.New(), Path: claim.PathOperator,
		By: "operator:ann", Reason: "redrive", Route: f.Route, Fingerprint: f.Fingerprint})
	if err != nil {
		t.Fatal(err)
	}
	res, err := st.Resolve(ctx, &claim.ResolveParams{ID: f.ID, Resolution: claim.ResolutionRedriven, By: "ann", Owner: held.Owner,
		Answer: &claim.Answer{Status: 200, Fields: map[string]string{"/id": "ch_2"}}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Answer == nil || res.Answer.Fields["/id"] != "ch_2" || res.AnswerAt == nil {
		t.Fatalf("redriven with an answer: %+v", res.Answer)
	}
}

func (s *suite) answerStorable(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	// NUL and invalid UTF-8 (which PostgreSQL refuses in JSON, and no
	// column takes) are made storable; nothing fails the outcome write.
	c := mustWin(t, st, msg("", "billing", "b"))
	odd := &claim.Answer{Status: 402, Step: "s\x00", Headers: map[string]string{"X-Odd\x00": "a\x00b\xffc"}, Fields: map[string]string{"/e": "日本\x00"}}
	if err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: c.ID, Owner: c.Owner, Answer: odd}); err != nil {
		t.Fatalf("MarkProcessed with NUL and invalid UTF-8 in the answer: %v", err)
	}
	got := mustGet(t, st, c.ID)
	if got.Answer == nil || got.Answer.Status != 402 || got.Answer.Headers["X-Odd\uFFFD"] != "a\uFFFDb\uFFFDc" || got.Answer.Fields["/e"] != "日本\uFFFD" {
		t.Fatalf("stored answer %+v", got.Answer)
	}
	// An answer over MaxAnswerBytes keeps its status, marked truncated.
	big := mustWin(t, st, msg("", "billing", "big"))
	huge := &claim.Answer{Status: 500, Step: "charge", Fields: map[string]string{"/body": strings.Repeat("x", 2*claim.MaxAnswerBytes)}}
	if err := st.Fail(ctx, &claim.FailParams{ID: big.ID, Owner: big.Owner, Reason: claim.FailPermanent, Answer: huge}); err != nil {
		t.Fatalf("Fail with a huge answer: %v", err)
	}
	got = mustGet(t, st, big.ID)
	if got.Answer == nil || got.Answer.Status != 500 || got.Answer.Step != "charge" || !got.Answer.Truncated || len(got.Answer.Fields) != 0 {
		t.Fatalf("stored huge answer %+v", got.Answer)
	}
}

func (s *suite) newKey(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	f := s.flagged(t, st, msg("", "billing", "b"))
	if f.Key() != claim.KeyFor(claim.KeyFormScoped, f.Consumer, f.MessageID, 0) || f.KeyRevision != 0 || f.KeyForm != claim.KeyFormScoped {
		t.Fatalf("a new claim's key %q revision %d form %q, want its scoped key", f.Key(), f.KeyRevision, f.KeyForm)
	}
	// Only the operator path takes a new key, and only with a note.
	for name, p := range map[string]*claim.TakeOverParams{
		"redelivery": {ID: f.ID, PreviousOwner: f.Owner, Owner: uuid.New(), Path: claim.PathRedelivery, SilentFor: time.Second, By: "x", Reason: "r", NewKey: true},
		"reconciler": {ID: f.ID, PreviousOwner: f.Owner, Owner: uuid.New(), Path: claim.PathReconciler, SilentFor: time.Second, By: "x", Reason: "r", NewKey: true},
		"no note":    {ID: f.ID, PreviousOwner: f.Owner, Owner: uuid.New(), Path: claim.PathOperator, By: "operator:ann", NewKey: true},
	} {
		if _, err := st.TakeOver(ctx, p); err == nil || errors.Is(err, claim.ErrStateChanged) {
			t.Errorf("TakeOver with a new key, %s: %v, want a validation error", name, err)
		}
	}
	op := &claim.TakeOverParams{ID: f.ID, PreviousOwner: f.Owner, Owner: uuid.New(), Path: claim.PathOperator,
		By: "operator:ann", Reason: "checked the PSP: nothing under the old key", Route: f.Route, Fingerprint: f.Fingerprint, NewKey: true}
	held, err := st.TakeOver(ctx, op)
	if err != nil {
		t.Fatalf("operator take-over with a new key: %v", err)
	}
	want := claim.KeyFor(claim.KeyFormScoped, f.Consumer, f.MessageID, 1)
	if want != f.Key()+":r1" || held.KeyRevision != 1 || held.EffectKey != want || held.Key() != want || held.KeyRevisedBy != "operator:ann" ||
		held.KeyRevisionNote != op.Reason || held.KeyRevisedAt == nil || !held.KeyRevisedAt.Equal(*held.TakenOverAt) || held.MessageID != f.MessageID {
		t.Fatalf("new key: revision %d key %q by %q note %q at %v (taken over at %v)",
			held.KeyRevision, held.Key(), held.KeyRevisedBy, held.KeyRevisionNote, held.KeyRevisedAt, held.TakenOverAt)
	}
	if got := mustGet(t, st, f.ID); got.Key() != want {
		t.Fatalf("stored key %q, want %q", got.Key(), want)
	}
	// The redrive stopped: a later take-over (the reconciler's recovery, a
	// redelivery) keeps the new key; a second --new-key takes the next.
	s.backdate(t, st, f.ID, time.Hour)
	rec, err := st.TakeOver(ctx, &claim.TakeOverParams{ID: f.ID, PreviousOwner: held.Owner, Owner: uuid.New(), Path: claim.PathReconciler,
		SilentFor: time.Minute, By: "reconciler", Reason: "recovery", Route: f.Route, Fingerprint: f.Fingerprint})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Key() != want || rec.KeyRevision != 1 || rec.KeyRevisedBy != "operator:ann" {
		t.Fatalf("a recovery after a new key uses key %q revision %d (by %q), want %q", rec.Key(), rec.KeyRevision, rec.KeyRevisedBy, want)
	}
	back, err := st.Flag(ctx, &claim.FlagParams{ID: f.ID, Owner: rec.Owner, State: claim.StateClaimed, Reason: "still 500"})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := st.TakeOver(ctx, &claim.TakeOverParams{ID: f.ID, PreviousOwner: back.Owner, Owner: uuid.New(), Path: claim.PathOperator,
		By: "operator:bob", Reason: "redrive", Route: f.Route, Fingerprint: f.Fingerprint})
	if err != nil {
		t.Fatal(err)
	}
	if plain.Key() != want || plain.KeyRevisedBy != "operator:ann" {
		t.Fatalf("a redrive without a new key changed the key to %q (by %q)", plain.Key(), plain.KeyRevisedBy)
	}
	back, err = st.Flag(ctx, &claim.FlagParams{ID: f.ID, Owner: plain.Owner, State: claim.StateClaimed, Reason: "still 500"})
	if err != nil {
		t.Fatal(err)
	}
	again, err := st.TakeOver(ctx, &claim.TakeOverParams{ID: f.ID, PreviousOwner: back.Owner, Owner: uuid.New(), Path: claim.PathOperator,
		By: "operator:bob", Reason: "second new key", Route: f.Route, Fingerprint: f.Fingerprint, NewKey: true})
	if err != nil {
		t.Fatal(err)
	}
	if again.KeyRevision != 2 || again.Key() != f.Key()+":r2" || again.KeyRevisedBy != "operator:bob" || again.KeyRevisionNote != "second new key" {
		t.Fatalf("second new key: revision %d key %q by %q note %q", again.KeyRevision, again.Key(), again.KeyRevisedBy, again.KeyRevisionNote)
	}
	// The longest message id still fits its revised key.
	long := s.flagged(t, st, msg(strings.Repeat("é", claim.MaxMessageIDLength), "billing", "l"))
	lk, err := st.TakeOver(ctx, &claim.TakeOverParams{ID: long.ID, PreviousOwner: long.Owner, Owner: uuid.New(), Path: claim.PathOperator,
		By: "operator:ann", Reason: "n", Route: long.Route, Fingerprint: long.Fingerprint, NewKey: true})
	if err != nil {
		t.Fatalf("new key of the longest message id: %v", err)
	}
	if lk.Key() != claim.KeyFor(claim.KeyFormScoped, long.Consumer, long.MessageID, 1) || len(lk.Key()) > claim.MaxKeyLength {
		t.Fatalf("revised key %q", lk.Key())
	}
}
