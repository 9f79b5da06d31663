package claimtest

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// historyTests check the audit history: every guarded write that changes
// a claim's owner or state appends exactly one history row in the same
// write, a refused write appends none, a heartbeat none, the batch paths
// the same as the single ones, and the purge takes a claim's history with
// it. And the key forms: new claims send a key scoped to the consumer
// that no dedup key can collide with; claims taken before keep theirs.
func (s *suite) historyTests() []struct {
	name string
	fn   func(t *testing.T)
} {
	return []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"HistoryOneRowPerGuardedWrite", s.historyEveryWrite},
		{"HistoryOfFailuresAndOperators", s.historyFailAndResolve},
		{"HistoryOfTheBatchPaths", s.historyBatch},
		{"HistoryIsPurgedWithItsClaim", s.historyPurged},
		{"HistorySwitchForTheBenchmark", s.historySwitch},
		{"KeyIsScopedToTheConsumer", s.keyScoped},
		{"KeyOfANewKeyRedriveCannotCollideWithAMessage", s.keyRevisionNoCollision},
		{"KeyOfAClaimTakenBeforeFormsStaysRaw", s.keyRawKept},
	}
}

// historyLog follows one claim's history: each step says what the last
// write should have appended (or that it appended nothing).
type historyLog struct {
	t  *testing.T
	st claim.Store
	id int64
	n  int // rows seen so far
}

func (s *suite) history(t *testing.T, st claim.Store, id int64) []claim.HistoryEntry {
	t.Helper()
	h, err := st.History(ctxT(t), id)
	if err != nil {
		t.Fatalf("History(%d): %v", id, err)
	}
	return h
}

// want checks that exactly one row was appended since the last check, and
// returns it after checking what, from, to and by (by "" is not checked).
func (l *historyLog) want(step string, what claim.Change, from, to claim.State, by string) claim.HistoryEntry {
	l.t.Helper()
	h, err := l.st.History(ctxT(l.t), l.id)
	if err != nil {
		l.t.Fatalf("%s: History: %v", step, err)
	}
	if len(h) != l.n+1 {
		l.t.Fatalf("%s: %d history rows, want %d: %+v", step, len(h), l.n+1, h)
	}
	l.n++
	e := h[len(h)-1]
	if e.ClaimID != l.id || e.What != what || e.From != from || e.To != to || (by != "" && e.By != by) {
		l.t.Fatalf("%s: history row %+v, want %s %s→%s by %q", step, e, what, from, to, by)
	}
	if e.At.IsZero() || e.Owner == uuid.Nil || e.Key == "" {
		l.t.Fatalf("%s: history row without a time, owner or key: %+v", step, e)
	}
	if l.n > 1 && (e.At.Before(h[len(h)-2].At) || e.ID <= h[len(h)-2].ID) {
		l.t.Fatalf("%s: history out of order: %+v after %+v", step, e, h[len(h)-2])
	}
	return e
}

// none checks that nothing was appended since the last check.
func (l *historyLog) none(step string) {
	l.t.Helper()
	h, err := l.st.History(ctxT(l.t), l.id)
	if err != nil {
		l.t.Fatalf("%s: History: %v", step, err)
	}
	if len(h) != l.n {
		l.t.Fatalf("%s changed nothing but left %d history rows, want %d: %+v", step, len(h), l.n, h[l.n:])
	}
}

func (s *suite) historyEveryWrite(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	c := mustWin(t, st, msg("", "billing", "a"))
	l := &historyLog{t: t, st: st, id: c.ID}
	e := l.want("ClaimBatch", claim.ChangeClaimed, "", claim.StateClaimed, "host-a")
	if e.Owner != c.Owner || e.Key != c.Key() || e.PreviousOwner != uuid.Nil {
		t.Fatalf("claimed row %+v, claim owner %s key %q", e, c.Owner, c.Key())
	}
	if res := claimOne(t, st, msg(c.MessageID, "billing", "a")); res.Outcome != claim.OutcomeDuplicate {
		t.Fatalf("second claim: %s", res.Outcome)
	}
	l.none("a duplicate ClaimBatch")

	if err := st.Heartbeat(ctx, &claim.HeartbeatParams{ID: c.ID, Owner: c.Owner}); err != nil {
		t.Fatal(err)
	}
	l.none("a heartbeat")
	if err := st.RecordLateSuccess(ctx, &claim.LateSuccessParams{ID: c.ID, Owner: uuid.New(), By: "host-z"}); err != nil {
		t.Fatal(err)
	}
	l.none("a late success note")

	if err := st.RecordAttempt(ctx, &claim.RecordAttemptParams{ID: c.ID, Owner: c.Owner, Error: "502 from the PSP"}); err != nil {
		t.Fatal(err)
	}
	if e := l.want("RecordAttempt", claim.ChangeAttempt, claim.StateClaimed, claim.StateClaimed, "host-a"); e.Reason != "502 from the PSP" {
		t.Fatalf("attempt reason %q", e.Reason)
	}
	wantErr(t, "RecordAttempt by another owner", st.RecordAttempt(ctx, &claim.RecordAttemptParams{ID: c.ID, Owner: uuid.New(), Error: "x"}), claim.ErrStateChanged)
	l.none("a refused RecordAttempt")

	if err := st.Release(ctx, &claim.ReleaseParams{ID: c.ID, Owner: c.Owner, Error: "connection refused"}); err != nil {
		t.Fatal(err)
	}
	if e := l.want("Release", claim.ChangeReleased, claim.StateClaimed, claim.StateReleased, "host-a"); e.Reason != "connection refused" {
		t.Fatalf("release reason %q", e.Reason)
	}
	wantErr(t, "a second Release", st.Release(ctx, &claim.ReleaseParams{ID: c.ID, Owner: c.Owner}), claim.ErrStateChanged)
	l.none("a refused Release")

	taker := uuid.New()
	if _, err := st.TakeOver(ctx, &claim.TakeOverParams{ID: c.ID, PreviousOwner: uuid.New(), Owner: uuid.New(), Path: claim.PathRedelivery,
		SilentFor: time.Minute, By: "host-x", Reason: "released", Route: c.Route, Fingerprint: c.Fingerprint}); !errors.Is(err, claim.ErrStateChanged) {
		t.Fatalf("TakeOver from the wrong owner: %v", err)
	}
	l.none("a refused TakeOver")
	taken, err := st.TakeOver(ctx, &claim.TakeOverParams{ID: c.ID, PreviousOwner: c.Owner, Owner: taker, Path: claim.PathRedelivery,
		SilentFor: time.Minute, By: "host-b", Reason: "released by its holder", Route: c.Route, Fingerprint: c.Fingerprint, DeliveryCount: 2})
	if err != nil {
		t.Fatal(err)
	}
	e = l.want("TakeOver", claim.ChangeTakenOver, claim.StateReleased, claim.StateClaimed, "host-b")
	if e.Path != claim.PathRedelivery || e.Reason != "released by its holder" || e.PreviousOwner != c.Owner || e.Owner != taker || e.Key != taken.Key() {
		t.Fatalf("take-over row %+v", e)
	}

	// A silent holder's claim is taken over from claimed.
	s.backdate(t, st, c.ID, time.Hour)
	second := uuid.New()
	rec, err := st.TakeOver(ctx, &claim.TakeOverParams{ID: c.ID, PreviousOwner: taker, Owner: second, Path: claim.PathReconciler,
		SilentFor: time.Minute, By: "reconciler-1", Reason: "recovery", Route: c.Route, Fingerprint: c.Fingerprint})
	if err != nil {
		t.Fatal(err)
	}
	e = l.want("TakeOver by the reconciler", claim.ChangeTakenOver, claim.StateClaimed, claim.StateClaimed, "reconciler-1")
	if e.Path != claim.PathReconciler || e.PreviousOwner != taker || e.Owner != second {
		t.Fatalf("recovery row %+v", e)
	}

	if _, err := st.Flag(ctx, &claim.FlagParams{ID: c.ID, Owner: uuid.New(), State: claim.StateClaimed, Reason: "x", By: "reconciler"}); !errors.Is(err, claim.ErrStateChanged) {
		t.Fatalf("Flag by another owner: %v", err)
	}
	l.none("a refused Flag")
	if _, err := st.Flag(ctx, &claim.FlagParams{ID: c.ID, Owner: rec.Owner, State: claim.StateClaimed, Reason: "manual route", By: "reconciler"}); err != nil {
		t.Fatal(err)
	}
	if e := l.want("Flag", claim.ChangeFlagged, claim.StateClaimed, claim.StateFlagged, "reconciler"); e.Reason != "manual route" {
		t.Fatalf("flag reason %q", e.Reason)
	}

	// An operator's redrive under a new key: the row carries the new key.
	op := uuid.New()
	held, err := st.TakeOver(ctx, &claim.TakeOverParams{ID: c.ID, PreviousOwner: rec.Owner, Owner: op, Path: claim.PathOperator,
		By: "operator:ann", Reason: "the PSP holds a 500 under the key", Route: c.Route, Fingerprint: c.Fingerprint, NewKey: true})
	if err != nil {
		t.Fatal(err)
	}
	e = l.want("redrive", claim.ChangeRedriven, claim.StateFlagged, claim.StateClaimed, "operator:ann")
	if e.Path != claim.PathOperator || e.Key != held.Key() || e.Key == c.Key() || e.PreviousOwner != rec.Owner {
		t.Fatalf("redrive row %+v (key before %q)", e, c.Key())
	}
	if err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: c.ID, Owner: rec.Owner}); !errors.Is(err, claim.ErrStateChanged) {
		t.Fatalf("MarkProcessed by the previous owner: %v", err)
	}
	l.none("a refused MarkProcessed")
	if _, err := st.Resolve(ctx, &claim.ResolveParams{ID: c.ID, Resolution: claim.ResolutionRedriven, By: "operator:ann", Note: "paid", Owner: op}); err != nil {
		t.Fatal(err)
	}
	if e := l.want("Resolve (redriven)", claim.ChangeResolved, claim.StateClaimed, claim.StateResolved, "operator:ann"); !strings.Contains(e.Reason, "redriven") || !strings.Contains(e.Reason, "paid") {
		t.Fatalf("resolve reason %q", e.Reason)
	}
	if _, err := st.Resolve(ctx, &claim.ResolveParams{ID: c.ID, Resolution: claim.ResolutionDone, By: "operator:bob", Note: "again"}); !errors.Is(err, claim.ErrStateChanged) {
		t.Fatalf("second Resolve: %v", err)
	}
	l.none("a refused Resolve")

	// Every row names the whole path: nobody's action is lost.
	h := s.history(t, st, c.ID)
	var by []string
	for _, e := range h {
		by = append(by, e.By)
	}
	if got := strings.Join(by, ","); got != "host-a,host-a,host-a,host-b,reconciler-1,reconciler,operator:ann,operator:ann" {
		t.Fatalf("history by %s", got)
	}
	if _, err := st.History(ctx, c.ID+1_000_000); !errors.Is(err, claim.ErrNotFound) {
		t.Fatalf("History of a missing claim: %v, want ErrNotFound", err)
	}
}

func (s *suite) historyFailAndResolve(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)

	// Fail, then the dead letter taken by a later delivery.
	c := mustWin(t, st, msg("", "billing", "f"))
	l := &historyLog{t: t, st: st, id: c.ID}
	l.want("ClaimBatch", claim.ChangeClaimed, "", claim.StateClaimed, "host-a")
	wantErr(t, "Fail by another owner", st.Fail(ctx, &claim.FailParams{ID: c.ID, Owner: uuid.New(), Reason: claim.FailRejected, Error: "declined"}), claim.ErrStateChanged)
	l.none("a refused Fail")
	if err := st.Fail(ctx, &claim.FailParams{ID: c.ID, Owner: c.Owner, Reason: claim.FailRejected, Error: "card declined"}); err != nil {
		t.Fatal(err)
	}
	if e := l.want("Fail", claim.ChangeFailed, claim.StateClaimed, claim.StateFailed, "host-a"); !strings.Contains(e.Reason, claim.FailRejected) || !strings.Contains(e.Reason, "card declined") {
		t.Fatalf("fail reason %q", e.Reason)
	}
	if err := st.TakeDeadLetter(ctx, &claim.TakeDeadLetterParams{ID: c.ID, Seq: 42, By: "host-c"}); err != nil {
		t.Fatal(err)
	}
	if e := l.want("TakeDeadLetter", claim.ChangeDeadLetter, claim.StateFailed, claim.StateFailed, "host-c"); !strings.Contains(e.Reason, "42") {
		t.Fatalf("dead letter reason %q", e.Reason)
	}
	wantErr(t, "a second TakeDeadLetter", st.TakeDeadLetter(ctx, &claim.TakeDeadLetterParams{ID: c.ID, Seq: 43, By: "host-d"}), claim.ErrStateChanged)
	l.none("a refused TakeDeadLetter")

	// FlagStale, then an operator's resolution.
	f := s.flagged(t, st, msg("", "billing", "g"))
	l = &historyLog{t: t, st: st, id: f.ID, n: 1}
	if e := l.want("FlagStale", claim.ChangeFlagged, claim.StateClaimed, claim.StateFlagged, claim.ReconcilerBy); e.Reason != f.FlagReason {
		t.Fatalf("FlagStale reason %q, claim's %q", e.Reason, f.FlagReason)
	}
	if _, err := st.Resolve(ctx, &claim.ResolveParams{ID: f.ID, Resolution: claim.ResolutionDiscarded, By: "operator:bob", Note: "customer cancelled"}); err != nil {
		t.Fatal(err)
	}
	l.want("Resolve", claim.ChangeResolved, claim.StateFlagged, claim.StateResolved, "operator:bob")

	// A released claim nobody took over is flagged from released.
	r := mustWin(t, st, msg("", "billing", "r"))
	if err := st.Release(ctx, &claim.ReleaseParams{ID: r.ID, Owner: r.Owner, Error: "503"}); err != nil {
		t.Fatal(err)
	}
	s.backdate(t, st, r.ID, time.Hour)
	if _, err := st.FlagStale(ctx, &claim.FlagStaleParams{StaleAfter: 30 * time.Minute, Limit: 100, By: "reconciler-2"}); err != nil {
		t.Fatal(err)
	}
	h := s.history(t, st, r.ID)
	if len(h) != 3 || h[2].What != claim.ChangeFlagged || h[2].From != claim.StateReleased || h[2].By != "reconciler-2" {
		t.Fatalf("released then flagged: %+v", h)
	}

	// ClaimTx: one row, the claim inserted already processed; a duplicate
	// none.
	p := msg("", "ledger", "t")
	res, err := st.ClaimTx(ctx, &claim.ClaimTxParams{Host: "host-t", Claim: p}, noopTx)
	if err != nil || res.Outcome != claim.OutcomeWon {
		t.Fatalf("ClaimTx: %v %v", res.Outcome, err)
	}
	l = &historyLog{t: t, st: st, id: res.Claim.ID}
	l.want("ClaimTx", claim.ChangeClaimed, "", claim.StateProcessed, "host-t")
	p.Owner = uuid.New()
	if res, err := st.ClaimTx(ctx, &claim.ClaimTxParams{Host: "host-u", Claim: p}, noopTx); err != nil || res.Outcome != claim.OutcomeDuplicate {
		t.Fatalf("second ClaimTx: %v %v", res.Outcome, err)
	}
	l.none("a duplicate ClaimTx")
}

func (s *suite) historyBatch(t *testing.T) {
	st := s.h.NewStore(t)
	bw := batchWriter(t, st)
	ctx := ctxT(t)

	// A batch of claims: one row per won claim, none for a duplicate.
	ps := []claim.ClaimParams{msg("", "billing", "1"), msg("", "billing", "2"), msg("", "billing", "3")}
	won := make([]*claim.Claim, len(ps))
	for i := range ps {
		ps[i].Owner = uuid.New()
	}
	dup := ps[0]
	dup.Owner = uuid.New()
	res, err := st.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "host-b", Claims: append(append([]claim.ClaimParams(nil), ps...), dup)})
	if err != nil {
		t.Fatal(err)
	}
	for i := range ps {
		if res[i].Outcome != claim.OutcomeWon {
			t.Fatalf("batch claim %d: %s", i, res[i].Outcome)
		}
		won[i] = res[i].Claim
		h := s.history(t, st, won[i].ID)
		if len(h) != 1 || h[0].What != claim.ChangeClaimed || h[0].By != "host-b" || h[0].Owner != ps[i].Owner || h[0].Key != won[i].Key() {
			t.Fatalf("history of batch claim %d: %+v", i, h)
		}
	}
	if res[3].Outcome != claim.OutcomeDuplicate {
		t.Fatalf("in-batch duplicate: %s", res[3].Outcome)
	}

	// Group commit's outcome writes: a heartbeat appends nothing, each
	// other write one row, a refused write none.
	hb := mustWin(t, st, msg("", "billing", "hb"))
	refused := mustWin(t, st, msg("", "billing", "refused"))
	errs, err := bw.WriteOutcomes(ctx, []claim.OutcomeWrite{
		{Heartbeat: &claim.HeartbeatParams{ID: hb.ID, Owner: hb.Owner}},
		{RecordAttempt: &claim.RecordAttemptParams{ID: won[0].ID, Owner: won[0].Owner, Error: "timeout"}},
		{Release: &claim.ReleaseParams{ID: won[1].ID, Owner: won[1].Owner, Error: "503"}},
		{MarkProcessed: &claim.MarkProcessedParams{ID: won[2].ID, Owner: won[2].Owner}},
		{MarkProcessed: &claim.MarkProcessedParams{ID: refused.ID, Owner: uuid.New()}},
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []error{nil, nil, nil, nil, claim.ErrStateChanged} {
		if !errors.Is(errs[i], want) && (want != nil || errs[i] != nil) {
			t.Fatalf("write %d: %v, want %v", i, errs[i], want)
		}
	}
	for _, tc := range []struct {
		id     int64
		n      int
		what   claim.Change
		to     claim.State
		reason string
	}{
		{hb.ID, 1, claim.ChangeClaimed, claim.StateClaimed, ""},
		{refused.ID, 1, claim.ChangeClaimed, claim.StateClaimed, ""},
		{won[0].ID, 2, claim.ChangeAttempt, claim.StateClaimed, "timeout"},
		{won[1].ID, 2, claim.ChangeReleased, claim.StateReleased, "503"},
		{won[2].ID, 2, claim.ChangeProcessed, claim.StateProcessed, ""},
	} {
		h := s.history(t, st, tc.id)
		if len(h) != tc.n {
			t.Fatalf("claim %d: %d history rows, want %d: %+v", tc.id, len(h), tc.n, h)
		}
		e := h[len(h)-1]
		if e.What != tc.what || e.To != tc.to || e.Reason != tc.reason || (tc.n == 2 && (e.From != claim.StateClaimed || e.By != "host-b")) {
			t.Fatalf("claim %d: last history row %+v, want %s to %s (%q)", tc.id, e, tc.what, tc.to, tc.reason)
		}
	}
	// The batch path and the single path write the same rows.
	single := mustWin(t, st, msg("", "billing", "single"))
	if err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: single.ID, Owner: single.Owner}); err != nil {
		t.Fatal(err)
	}
	a, b := s.history(t, st, single.ID)[1], s.history(t, st, won[2].ID)[1]
	if a.What != b.What || a.From != b.From || a.To != b.To || a.Reason != b.Reason || a.Path != b.Path {
		t.Fatalf("single %+v and batched %+v MarkProcessed differ", a, b)
	}
}

// historySwitch: a store the benchmark can switch writes no history rows
// in the batch paths while switched off, and writes them again once
// switched back on.
func (s *suite) historySwitch(t *testing.T) {
	st := s.h.NewStore(t)
	sw, ok := st.(claim.HistorySwitch)
	if !ok {
		t.Skipf("%T has no history switch", st)
	}
	ctx := ctxT(t)
	batch := func(key string) int64 {
		t.Helper()
		p := msg("", "billing", key)
		p.Owner = uuid.New()
		res, err := st.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "host-b", Claims: []claim.ClaimParams{p}})
		if err != nil || res[0].Outcome != claim.OutcomeWon {
			t.Fatalf("claim %s: %v %v", key, res, err)
		}
		c := res[0].Claim
		errs, err := batchWriter(t, st).WriteOutcomes(ctx, []claim.OutcomeWrite{{MarkProcessed: &claim.MarkProcessedParams{ID: c.ID, Owner: c.Owner}}})
		if err != nil || errs[0] != nil {
			t.Fatalf("mark %s processed: %v %v", key, errs, err)
		}
		return c.ID
	}
	sw.SetHistoryForBench(false)
	off := batch("off")
	sw.SetHistoryForBench(true)
	on := batch("on")
	if h, err := st.History(ctx, off); err != nil || len(h) != 0 {
		t.Errorf("history off: %d rows (%v), want none", len(h), err)
	}
	if h := s.history(t, st, on); len(h) != 2 || h[0].What != claim.ChangeClaimed || h[1].What != claim.ChangeProcessed {
		t.Errorf("history back on: %+v, want claimed and processed", h)
	}
}

func (s *suite) historyPurged(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	done := mustWin(t, st, msg("", "billing", "done"))
	if err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: done.ID, Owner: done.Owner}); err != nil {
		t.Fatal(err)
	}
	open := mustWin(t, st, msg("", "billing", "open"))
	s.backdate(t, st, done.ID, 48*time.Hour)
	if n := len(s.history(t, st, done.ID)); n != 2 {
		t.Fatalf("%d history rows before the purge", n)
	}
	n, err := st.PurgeProcessed(ctx, &claim.PurgeParams{OlderThan: 24 * time.Hour, Limit: 10})
	if err != nil || n != 1 {
		t.Fatalf("purge: %d %v", n, err)
	}
	// History answers ErrNotFound only when no row is left: a history
	// row the purge left behind would be returned.
	if h, err := st.History(ctx, done.ID); !errors.Is(err, claim.ErrNotFound) {
		t.Fatalf("History of a purged claim: %+v %v, want ErrNotFound", h, err)
	}
	if h := s.history(t, st, open.ID); len(h) != 1 {
		t.Fatalf("the purge touched an open claim's history: %+v", h)
	}
}

// finding 8: two consumers of one message that call one API must not
// send it the same idempotency key.
func (s *suite) keyScoped(t *testing.T) {
	st := s.h.NewStore(t)
	id := "evt-" + uuid.NewString()[:8] + ":a/b%c d"
	a := mustWin(t, st, msg(id, "billing", "x"))
	b := mustWin(t, st, msg(id, "shipping", "x"))
	if a.Key() == b.Key() {
		t.Fatalf("two consumers of message %q send the same key %q", id, a.Key())
	}
	if a.KeyForm != claim.KeyFormScoped || a.Key() != claim.KeyFor(claim.KeyFormScoped, "billing", id, 0) || mustGet(t, st, a.ID).Key() != a.Key() {
		t.Fatalf("new claim: form %q key %q", a.KeyForm, a.Key())
	}
	if !strings.HasPrefix(a.Key(), "billing/") || strings.Count(a.Key(), "/") != 1 || strings.Contains(a.Key(), ":") {
		t.Fatalf("scoped key %q: want billing/<escaped id>", a.Key())
	}
	// Consumers whose names contain the separator stay apart.
	c := mustWin(t, st, msg("x/y", "a", "x"))
	d := mustWin(t, st, msg("y", "a/x", "x"))
	if c.Key() == d.Key() {
		t.Fatalf("claims (x/y, a) and (y, a/x) share the key %q", c.Key())
	}
	// The longest consumer and message id: a hashed key within the limit.
	lp := msg(strings.Repeat("é", claim.MaxMessageIDLength), strings.Repeat("c", 200), "x")
	lp.Route = "route-long"
	long := mustWin(t, st, lp)
	if k := long.Key(); len(k) > claim.MaxKeyLength || !strings.HasPrefix(k, "sha256:") {
		t.Fatalf("long key %q (%d bytes)", k, len(k))
	}
}

// finding 5: message "X:r1" and claim "X" redriven under a new key must
// not send the same key.
func (s *suite) keyRevisionNoCollision(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	x := "order-" + uuid.NewString()[:8]
	f := s.flagged(t, st, msg(x, "billing", "x"))
	other := mustWin(t, st, msg(x+":r1", "billing", "y"))
	held, err := st.TakeOver(ctx, &claim.TakeOverParams{ID: f.ID, PreviousOwner: f.Owner, Owner: uuid.New(), Path: claim.PathOperator,
		By: "operator:ann", Reason: "a 500 is cached under the key", Route: f.Route, Fingerprint: f.Fingerprint, NewKey: true})
	if err != nil {
		t.Fatal(err)
	}
	if held.Key() == other.Key() {
		t.Fatalf("claim %q under its new key and message %q send the same key %q", x, x+":r1", held.Key())
	}
	if held.Key() != claim.KeyFor(claim.KeyFormScoped, "billing", x, 1) || held.KeyRevision != 1 || held.Key() != f.NextKey() {
		t.Fatalf("revised key %q revision %d", held.Key(), held.KeyRevision)
	}
	// Steps extend keys the same way: a step of claim X never sends the
	// key of message "X/<step>" or of X's revision.
	step := claim.StepKey(claim.KeyFormScoped, f.Key(), "r1")
	for _, k := range []string{held.Key(), other.Key(), mustWin(t, st, msg(x+"/r1", "billing", "z")).Key()} {
		if step == k {
			t.Fatalf("step key %q collides with %q", step, k)
		}
	}
}

// Claims taken before key forms were recorded (the migration marks them
// raw) keep their key: the message id, ":r<n>" under a new key.
func (s *suite) keyRawKept(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	old := msg("", "billing", "old")
	if _, err := s.h.DB(t, st).ExecContext(ctx, s.h.Features.InsertClaimSQL, old.MessageID, old.Consumer, old.Owner.String(), old.PayloadHash); err != nil {
		t.Fatal(err)
	}
	rows, err := st.List(ctx, &claim.ListParams{Consumer: "billing", States: []claim.State{claim.StateClaimed}, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	var c *claim.Claim
	for _, r := range rows {
		if r.MessageID == old.MessageID {
			c = r
		}
	}
	if c == nil {
		t.Fatal("the raw row is not listed")
	}
	if c.KeyForm != claim.KeyFormRaw || c.Key() != old.MessageID {
		t.Fatalf("a claim from before key forms: form %q key %q, want raw %q", c.KeyForm, c.Key(), old.MessageID)
	}
	// A route that opts out gets the raw form for new claims too.
	p := msg("", "billing", "raw")
	p.KeyForm = claim.KeyFormRaw
	r := mustWin(t, st, p)
	if r.KeyForm != claim.KeyFormRaw || r.Key() != p.MessageID || mustGet(t, st, r.ID).Key() != p.MessageID {
		t.Fatalf("raw claim: form %q key %q", r.KeyForm, r.Key())
	}
	s.backdate(t, st, r.ID, time.Hour)
	if _, err := st.Flag(ctx, &claim.FlagParams{ID: r.ID, Owner: r.Owner, State: claim.StateClaimed, Reason: "x"}); err != nil {
		t.Fatal(err)
	}
	held, err := st.TakeOver(ctx, &claim.TakeOverParams{ID: r.ID, PreviousOwner: r.Owner, Owner: uuid.New(), Path: claim.PathOperator,
		By: "operator:ann", Reason: "new key", Route: r.Route, Fingerprint: r.Fingerprint, NewKey: true})
	if err != nil {
		t.Fatal(err)
	}
	if held.Key() != p.MessageID+":r1" {
		t.Fatalf("raw claim's new key %q, want %q", held.Key(), p.MessageID+":r1")
	}
	if h := s.history(t, st, r.ID); h[len(h)-1].Key != held.Key() || h[0].Key != p.MessageID {
		t.Fatalf("raw claim's history keys: %+v", h)
	}
}

func noopTx(context.Context, *sql.Tx) error { return nil }
