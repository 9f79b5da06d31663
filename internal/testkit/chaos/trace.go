package chaos

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// history is a per-message log of what the harness saw happen to each
// dedup key: deliveries, store calls and their answers, downstream
// requests, kills, flags and redrives. A flagged claim that nothing
// explains is reported with its history, so the report says what the
// processor did instead of only that it went wrong.
type history struct {
	start time.Time

	mu     sync.Mutex
	events map[string][]string
	keys   map[int64]string // claim ID → dedup key
	ids    map[string]int64 // dedup key → claim ID
}

// maxEventsPerKey bounds one key's history (a key bouncing through many
// redeliveries keeps its first events, which are the interesting ones).
const maxEventsPerKey = 64

func newHistory() *history {
	return &history{start: time.Now(), events: map[string][]string{}, keys: map[int64]string{}, ids: map[string]int64{}}
}

func (t *history) add(key, format string, args ...any) {
	if key == "" {
		return
	}
	line := fmt.Sprintf("%7.3fs ", time.Since(t.start).Seconds()) + fmt.Sprintf(format, args...)
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.events[key]) < maxEventsPerKey {
		t.events[key] = append(t.events[key], line)
	}
}

func (t *history) setKey(id int64, key string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.keys[id] = key
	t.ids[key] = id
}

// idOf returns the claim ID of a dedup key (0 when none was seen).
func (t *history) idOf(key string) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ids[key]
}

// keyOf returns the dedup key of claim id ("" when no store call has
// returned that claim yet).
func (t *history) keyOf(id int64) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.keys[id]
}

// keyFor returns the dedup key of claim id for a store call that returned
// c (nil: none): c's own MessageID when it is that claim, which also
// files the claim's later calls under it, else the key recorded before.
// A claim can reach a holder without any ClaimBatch having returned it:
// the batch that inserted it committed on the server and then timed out
// on the client, and the reconciler found the claim stale.
func (t *history) keyFor(id int64, c *claim.Claim) string {
	if c != nil && c.ID == id && c.MessageID != "" {
		t.setKey(id, c.MessageID)
		return c.MessageID
	}
	return t.keyOf(id)
}

// of returns key's history, one event a line.
func (t *history) of(key string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.events[key], "\n    ")
}

// traceStore wraps a store for one holder (a replica, the reconciler, an
// operator): it records every call that decides or changes a claim, with
// what the store did, in the history (successful heartbeats are left out:
// there are too many), and the grants and signs of life in the ledger.
type traceStore struct {
	claim.Store
	host string
	hist *history
	led  *ledger
	// sess, in a session run, records when each claim reached a final
	// outcome (sessions.go); nil otherwise.
	sess *sessionBook
}

func errText(err error) string {
	if err == nil {
		return "ok"
	}
	return "error: " + err.Error()
}

func (s *traceStore) ClaimBatch(ctx context.Context, p *claim.ClaimBatchParams) ([]claim.ClaimResult, error) {
	start := time.Now()
	res, err := s.Store.ClaimBatch(ctx, p)
	end := time.Now()
	for i, c := range p.Claims {
		if err == nil && i < len(res) && res[i].Outcome == claim.OutcomeWon && res[i].Claim != nil && res[i].Claim.Owner == c.Owner {
			s.led.won(c.MessageID, s.host, c.Owner, start, end)
		}
		switch {
		case err != nil:
			s.led.maybeGranted(c.MessageID, s.host, c.Owner, err)
			s.hist.add(c.MessageID, "%s ClaimBatch (delivery %d): %s", s.host, c.DeliveryCount, errText(err))
		case i < len(res) && res[i].Claim != nil:
			r := res[i]
			s.hist.setKey(r.Claim.ID, c.MessageID)
			s.hist.add(c.MessageID, "%s ClaimBatch (delivery %d): %s claim %d (state %s, owner %.8s, claimed by %s)",
				s.host, c.DeliveryCount, r.Outcome, r.Claim.ID, r.Claim.State, r.Claim.Owner, r.Claim.ClaimedBy)
		case i < len(res):
			s.hist.add(c.MessageID, "%s ClaimBatch (delivery %d): %s (no claim returned)", s.host, c.DeliveryCount, res[i].Outcome)
		}
	}
	return res, err
}

func (s *traceStore) TakeOver(ctx context.Context, p *claim.TakeOverParams) (*claim.Claim, error) {
	start := time.Now()
	c, err := s.Store.TakeOver(ctx, p)
	end := time.Now()
	key := s.hist.keyFor(p.ID, c)
	if err == nil {
		s.led.tookOver(key, s.host, p, start, end)
		s.hist.add(key, "%s TakeOver claim %d (path %s, delivery %d, from %.8s): ok, new owner %.8s", s.host, p.ID, p.Path, p.DeliveryCount, p.PreviousOwner, p.Owner)
		return c, nil
	}
	s.led.maybeGranted(key, s.host, p.Owner, err)
	s.hist.add(key, "%s TakeOver claim %d (path %s, delivery %d, from %.8s): %s", s.host, p.ID, p.Path, p.DeliveryCount, p.PreviousOwner, errText(err))
	return c, err
}

func (s *traceStore) Heartbeat(ctx context.Context, p *claim.HeartbeatParams) error {
	start := time.Now()
	err := s.Store.Heartbeat(ctx, p)
	if err != nil {
		s.hist.add(s.hist.keyOf(p.ID), "%s Heartbeat claim %d (owner %.8s): %s", s.host, p.ID, p.Owner, errText(err))
		return err
	}
	s.led.alive(p.Owner, start, time.Now())
	return nil
}

func (s *traceStore) Flag(ctx context.Context, p *claim.FlagParams) (*claim.Claim, error) {
	c, err := s.Store.Flag(ctx, p)
	if err == nil {
		s.sess.finished(s.hist.keyFor(p.ID, c))
	}
	s.hist.add(s.hist.keyFor(p.ID, c), "%s Flag claim %d (owner %.8s, %s): %s: %s", s.host, p.ID, p.Owner, p.State, p.Reason, errText(err))
	return c, err
}

func (s *traceStore) Resolve(ctx context.Context, p *claim.ResolveParams) (*claim.Claim, error) {
	c, err := s.Store.Resolve(ctx, p)
	if err == nil {
		s.sess.finished(s.hist.keyFor(p.ID, c))
	}
	s.hist.add(s.hist.keyFor(p.ID, c), "%s Resolve claim %d as %s: %s", s.host, p.ID, p.Resolution, errText(err))
	return c, err
}

func (s *traceStore) MarkProcessed(ctx context.Context, p *claim.MarkProcessedParams) error {
	err := s.Store.MarkProcessed(ctx, p)
	if err == nil {
		s.sess.finished(s.hist.keyOf(p.ID))
	}
	s.hist.add(s.hist.keyOf(p.ID), "%s MarkProcessed claim %d (owner %.8s): %s", s.host, p.ID, p.Owner, errText(err))
	return err
}

func (s *traceStore) Release(ctx context.Context, p *claim.ReleaseParams) error {
	err := s.Store.Release(ctx, p)
	if err == nil {
		s.led.released(p.Owner)
	}
	s.hist.add(s.hist.keyOf(p.ID), "%s Release claim %d (owner %.8s, cause %q): %s", s.host, p.ID, p.Owner, p.Error, errText(err))
	return err
}

func (s *traceStore) Fail(ctx context.Context, p *claim.FailParams) error {
	err := s.Store.Fail(ctx, p)
	if err == nil {
		s.sess.finished(s.hist.keyOf(p.ID))
	}
	s.hist.add(s.hist.keyOf(p.ID), "%s Fail claim %d (owner %.8s, reason %s): %s", s.host, p.ID, p.Owner, p.Reason, errText(err))
	return err
}

func (s *traceStore) TakeDeadLetter(ctx context.Context, p *claim.TakeDeadLetterParams) error {
	err := s.Store.TakeDeadLetter(ctx, p)
	s.hist.add(s.hist.keyOf(p.ID), "%s TakeDeadLetter claim %d (seq %d): %s", s.host, p.ID, p.Seq, errText(err))
	return err
}

// MaxConcurrentWrites forwards the inner store's (claim.WriteLimit).
func (s *traceStore) MaxConcurrentWrites() int { return claim.WriteLimitOf(s.Store) }

// WriteOutcomes records each write of a group-committed batch as the
// single write would be: a heartbeat written is a sign of life (the
// replicas' heartbeats come this way), a release a release.
func (s *traceStore) WriteOutcomes(ctx context.Context, writes []claim.OutcomeWrite) ([]error, error) {
	start := time.Now()
	errs, err := writeOutcomes(ctx, s.Store, writes)
	end := time.Now()
	for i, w := range writes {
		id, owner := w.Target()
		werr := err
		if err == nil {
			werr = errs[i]
		}
		switch {
		case werr != nil:
		case w.Kind() == claim.WriteHeartbeat:
			s.led.alive(owner, start, end)
		case w.Kind() == claim.WriteRelease:
			s.led.released(owner)
		case w.Kind() == claim.WriteMarkProcessed:
			s.sess.finished(s.hist.keyOf(id))
		}
		if w.Kind() != claim.WriteHeartbeat {
			s.hist.add(s.hist.keyOf(id), "%s %s claim %d (owner %.8s, batch of %d): %s", s.host, opName(w.Kind()), id, owner, len(writes), errText(werr))
		}
	}
	return errs, err
}

func (s *traceStore) RecordAttempt(ctx context.Context, p *claim.RecordAttemptParams) error {
	err := s.Store.RecordAttempt(ctx, p)
	s.hist.add(s.hist.keyOf(p.ID), "%s RecordAttempt claim %d (owner %.8s, attempt error %q): %s", s.host, p.ID, p.Owner, p.Error, errText(err))
	return err
}

// lostAckStore injects FaultAckLost: for a message planned for it, the
// first MarkProcessed, Release or Fail runs and commits, and then the store
// answers claim.ErrUnavailable, as when a connection breaks after COMMIT
// reached the server but before its answer came back.
type lostAckStore struct {
	claim.Store
	h *harness
}

func (s *lostAckStore) lose(op string, id int64, run func() error) error {
	key := s.h.hist.keyOf(id)
	// The fault is spent only on a write that committed: one the store
	// refused (an outage, a dead replica) would lose nothing.
	if err := run(); err != nil || key == "" || !s.h.book.fire(key, FaultAckLost) {
		return err
	}
	s.h.book.count(FaultAckLost, 1)
	s.h.book.markHit(key, FaultAckLost)
	s.h.hist.add(key, "fault %s: %s of claim %d committed, answer replaced by ErrUnavailable", FaultAckLost, op, id)
	return fmt.Errorf("chaos: %s committed but its answer was lost: %w", op, claim.ErrUnavailable)
}

func (s *lostAckStore) MarkProcessed(ctx context.Context, p *claim.MarkProcessedParams) error {
	return s.lose("MarkProcessed", p.ID, func() error { return s.Store.MarkProcessed(ctx, p) })
}

func (s *lostAckStore) Fail(ctx context.Context, p *claim.FailParams) error {
	return s.lose("Fail", p.ID, func() error { return s.Store.Fail(ctx, p) })
}

// MaxConcurrentWrites forwards the inner store's (claim.WriteLimit).
func (s *lostAckStore) MaxConcurrentWrites() int { return claim.WriteLimitOf(s.Store) }

// WriteOutcomes loses the answer of a committed batch that holds the
// first MarkProcessed or Release of a message planned for FaultAckLost:
// every caller of the batch gets ErrUnavailable, as when the connection
// breaks after the COMMIT.

func (s *lostAckStore) WriteOutcomes(ctx context.Context, writes []claim.OutcomeWrite) ([]error, error) {
	errs, err := writeOutcomes(ctx, s.Store, writes)
	if err != nil {
		return errs, err
	}
	for i, w := range writes {
		if k := w.Kind(); errs[i] != nil || (k != claim.WriteMarkProcessed && k != claim.WriteRelease) {
			continue
		}
		id, _ := w.Target()
		if lost := s.lose(opName(w.Kind()), id, func() error { return nil }); lost != nil {
			return nil, fmt.Errorf("batch of %d: %w", len(writes), lost)
		}
	}
	return errs, nil
}

func (s *lostAckStore) Release(ctx context.Context, p *claim.ReleaseParams) error {
	return s.lose("Release", p.ID, func() error { return s.Store.Release(ctx, p) })
}
