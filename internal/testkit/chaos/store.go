package chaos

import (
	"context"
	"database/sql"
	"sync/atomic"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// gateStore wraps a claim.Store: every method call first asks gate, which
// may refuse it (a dead replica, a store outage), and every call that
// reaches the inner store counts as one database round trip.
type gateStore struct {
	inner claim.Store
	gate  func(ctx context.Context, op string, id int64) error // id: the claim the call is about, 0 if none
	calls *atomic.Int64                                        // round trips that reached inner (may be nil)
	// batches and batched count the group-committed batches that reached
	// inner and their writes (may be nil).
	batches, batched *atomic.Int64
	landed           func(op string, id int64, owner uuid.UUID) // owner writes that landed (may be nil)
}

var (
	_ claim.Store       = (*gateStore)(nil)
	_ claim.BatchWriter = (*gateStore)(nil)
)

// writeOutcomes is inner's WriteOutcomes, or its single writes one by one
// when it has none.
func writeOutcomes(ctx context.Context, inner claim.Store, writes []claim.OutcomeWrite) ([]error, error) {
	if bw, ok := inner.(claim.BatchWriter); ok {
		return bw.WriteOutcomes(ctx, writes)
	}
	return claim.WriteEach(ctx, inner, writes), nil
}

// opName is the method a batched write stands for (the names the gates
// and outage explanations use).
func opName(k claim.WriteKind) string {
	switch k {
	case claim.WriteHeartbeat:
		return "Heartbeat"
	case claim.WriteRecordAttempt:
		return "RecordAttempt"
	case claim.WriteRelease:
		return "Release"
	case claim.WriteMarkProcessed:
		return "MarkProcessed"
	}
	return "WriteOutcomes"
}

// MaxConcurrentWrites forwards the inner store's (claim.WriteLimit).
func (s *gateStore) MaxConcurrentWrites() int { return claim.WriteLimitOf(s.inner) }

// WriteOutcomes asks the gate about every write of the batch (an outage
// refuses them all, each noted on its claim) and counts one round trip.
func (s *gateStore) WriteOutcomes(ctx context.Context, writes []claim.OutcomeWrite) ([]error, error) {
	var refused error
	if s.gate != nil {
		for _, w := range writes {
			id, _ := w.Target()
			if err := s.gate(ctx, opName(w.Kind()), id); err != nil && refused == nil {
				refused = err
			}
		}
	}
	if refused != nil {
		return nil, refused
	}
	if s.calls != nil {
		s.calls.Add(1)
	}
	if s.batches != nil {
		s.batches.Add(1)
		s.batched.Add(int64(len(writes)))
	}
	errs, err := writeOutcomes(ctx, s.inner, writes)
	if s.landed != nil && err == nil {
		for i, w := range writes {
			if i < len(errs) && errs[i] == nil {
				id, owner := w.Target()
				s.landed(opName(w.Kind()), id, owner)
			}
		}
	}
	return errs, err
}

func (s *gateStore) pass(ctx context.Context, op string, id int64) error {
	if s.gate != nil {
		if err := s.gate(ctx, op, id); err != nil {
			return err
		}
	}
	if s.calls != nil {
		s.calls.Add(1)
	}
	return nil
}

// CountingStore wraps inner and counts every method call as one database
// round trip (the claim.Store methods are one statement or one short
// transaction each).
func CountingStore(inner claim.Store, calls *atomic.Int64) claim.Store {
	return &gateStore{inner: inner, calls: calls}
}

func (s *gateStore) ClaimBatch(ctx context.Context, p *claim.ClaimBatchParams) ([]claim.ClaimResult, error) {
	if err := s.pass(ctx, "ClaimBatch", 0); err != nil {
		return nil, err
	}
	return s.inner.ClaimBatch(ctx, p)
}

func (s *gateStore) ClaimTx(ctx context.Context, p *claim.ClaimTxParams, fn func(ctx context.Context, tx *sql.Tx) error) (claim.ClaimResult, error) {
	if err := s.pass(ctx, "ClaimTx", 0); err != nil {
		return claim.ClaimResult{}, err
	}
	return s.inner.ClaimTx(ctx, p, fn)
}

func (s *gateStore) TakeOver(ctx context.Context, p *claim.TakeOverParams) (*claim.Claim, error) {
	if err := s.pass(ctx, "TakeOver", p.ID); err != nil {
		return nil, err
	}
	return s.inner.TakeOver(ctx, p)
}

func (s *gateStore) Flag(ctx context.Context, p *claim.FlagParams) (*claim.Claim, error) {
	if err := s.pass(ctx, "Flag", p.ID); err != nil {
		return nil, err
	}
	return s.inner.Flag(ctx, p)
}

func (s *gateStore) FindStale(ctx context.Context, p *claim.FindStaleParams) ([]*claim.Claim, error) {
	if err := s.pass(ctx, "FindStale", 0); err != nil {
		return nil, err
	}
	return s.inner.FindStale(ctx, p)
}

func (s *gateStore) RecordLateSuccess(ctx context.Context, p *claim.LateSuccessParams) error {
	if err := s.pass(ctx, "RecordLateSuccess", p.ID); err != nil {
		return err
	}
	return s.inner.RecordLateSuccess(ctx, p)
}

func (s *gateStore) Heartbeat(ctx context.Context, p *claim.HeartbeatParams) error {
	if err := s.pass(ctx, "Heartbeat", p.ID); err != nil {
		return err
	}
	return s.land("Heartbeat", p.ID, p.Owner, s.inner.Heartbeat(ctx, p))
}

func (s *gateStore) MarkProcessed(ctx context.Context, p *claim.MarkProcessedParams) error {
	if err := s.pass(ctx, "MarkProcessed", p.ID); err != nil {
		return err
	}
	return s.land("MarkProcessed", p.ID, p.Owner, s.inner.MarkProcessed(ctx, p))
}

func (s *gateStore) Fail(ctx context.Context, p *claim.FailParams) error {
	if err := s.pass(ctx, "Fail", p.ID); err != nil {
		return err
	}
	return s.land("Fail", p.ID, p.Owner, s.inner.Fail(ctx, p))
}

func (s *gateStore) TakeDeadLetter(ctx context.Context, p *claim.TakeDeadLetterParams) error {
	if err := s.pass(ctx, "TakeDeadLetter", p.ID); err != nil {
		return err
	}
	return s.inner.TakeDeadLetter(ctx, p)
}

func (s *gateStore) Release(ctx context.Context, p *claim.ReleaseParams) error {
	if err := s.pass(ctx, "Release", p.ID); err != nil {
		return err
	}
	return s.land("Release", p.ID, p.Owner, s.inner.Release(ctx, p))
}

func (s *gateStore) RecordAttempt(ctx context.Context, p *claim.RecordAttemptParams) error {
	if err := s.pass(ctx, "RecordAttempt", p.ID); err != nil {
		return err
	}
	return s.land("RecordAttempt", p.ID, p.Owner, s.inner.RecordAttempt(ctx, p))
}

func (s *gateStore) FlagStale(ctx context.Context, p *claim.FlagStaleParams) ([]*claim.Claim, error) {
	if err := s.pass(ctx, "FlagStale", 0); err != nil {
		return nil, err
	}
	return s.inner.FlagStale(ctx, p)
}

func (s *gateStore) List(ctx context.Context, p *claim.ListParams) ([]*claim.Claim, error) {
	if err := s.pass(ctx, "List", 0); err != nil {
		return nil, err
	}
	return s.inner.List(ctx, p)
}

func (s *gateStore) Get(ctx context.Context, id int64) (*claim.Claim, error) {
	if err := s.pass(ctx, "Get", id); err != nil {
		return nil, err
	}
	return s.inner.Get(ctx, id)
}

func (s *gateStore) History(ctx context.Context, id int64) ([]claim.HistoryEntry, error) {
	if err := s.pass(ctx, "History", id); err != nil {
		return nil, err
	}
	return s.inner.History(ctx, id)
}

func (s *gateStore) Resolve(ctx context.Context, p *claim.ResolveParams) (*claim.Claim, error) {
	if err := s.pass(ctx, "Resolve", 0); err != nil {
		return nil, err
	}
	return s.inner.Resolve(ctx, p)
}

func (s *gateStore) PurgeProcessed(ctx context.Context, p *claim.PurgeParams) (int64, error) {
	if err := s.pass(ctx, "PurgeProcessed", 0); err != nil {
		return 0, err
	}
	return s.inner.PurgeProcessed(ctx, p)
}

func (s *gateStore) Stats(ctx context.Context) (*claim.Stats, error) {
	if err := s.pass(ctx, "Stats", 0); err != nil {
		return nil, err
	}
	return s.inner.Stats(ctx)
}

func (s *gateStore) TryLock(ctx context.Context, name string) (func(context.Context) error, bool, error) {
	if err := s.pass(ctx, "TryLock", 0); err != nil {
		return nil, false, err
	}
	return s.inner.TryLock(ctx, name)
}

func (s *gateStore) Now(ctx context.Context) (time.Time, error) {
	if err := s.pass(ctx, "Now", 0); err != nil {
		return time.Time{}, err
	}
	return s.inner.Now(ctx)
}

func (s *gateStore) Ping(ctx context.Context) error {
	if err := s.pass(ctx, "Ping", 0); err != nil {
		return err
	}
	return s.inner.Ping(ctx)
}

// Close does not close the inner store: wrappers share it.
func (s *gateStore) Close() error { return nil }

// GateStore wraps inner: every method call first asks gate, which may
// refuse it (an error: the call never reaches inner) or hold it (block
// until it returns: a frozen process, a slow database). The simulation
// (internal/testkit/sim) injects its store faults with it.
func GateStore(inner claim.Store, gate func(ctx context.Context, op string, id int64) error) claim.Store {
	return &gateStore{inner: inner, gate: gate}
}

// GateStoreLanded is GateStore that also reports every owner write that
// landed (Heartbeat, RecordAttempt, Release, MarkProcessed, Fail, Defer; alone
// or in a batch of writes) with its claim id and owner token: the
// simulation checks each take-over against the last sign of life of the
// owner it took the claim from, and each outcome against the owner the
// claim had then.
func GateStoreLanded(inner claim.Store, gate func(ctx context.Context, op string, id int64) error, landed func(op string, id int64, owner uuid.UUID)) claim.Store {
	return &gateStore{inner: inner, gate: gate, landed: landed}
}

// land reports a write that landed (err nil) and returns err.
func (s *gateStore) land(op string, id int64, owner uuid.UUID, err error) error {
	if err == nil && s.landed != nil {
		s.landed(op, id, owner)
	}
	return err
}
