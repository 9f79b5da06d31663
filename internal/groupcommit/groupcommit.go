package groupcommit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// Options tune the group commit. The zero value is the defaults.
type Options struct {
	// MaxBatch bounds the writes of one batch [DefaultMaxBatch; at most
	// claim.MaxOutcomeBatch].
	MaxBatch int
	// MaxInFlight bounds the batches written at once [DefaultMaxInFlight],
	// and so does the store's claim.WriteLimit (SQLite: one). A write
	// waits only while this many batches are being written.
	MaxInFlight int
	// Window, when positive, is how long a batch that starts while another
	// is being written waits for more writes [0]. A write that finds no
	// batch running is never delayed.
	Window time.Duration
	// Timeout bounds each batch's statement [DefaultTimeout]. A batch is
	// never cut short by its writes' deadlines (one spent deadline would
	// fail everyone's writes), yet no caller waits past its own: a write
	// that has waited in the queue longer than it has left is dropped from
	// its batch, unwritten, with its own context's error (claim.ErrAborted,
	// not store-wide), like one whose context ends while it waits; a caller
	// whose context ends while its batch runs returns at once with a
	// timeout (the batch may still commit), as a single write would.
	Timeout time.Duration
}

// Defaults of Options.
const (
	DefaultMaxBatch    = 128
	DefaultMaxInFlight = 2
	DefaultTimeout     = 5 * time.Second
)

// Validate reports a setting out of its range.
func (o Options) Validate() error {
	switch {
	case o.MaxBatch < 0 || o.MaxBatch > claim.MaxOutcomeBatch:
		return fmt.Errorf("groupcommit: MaxBatch must be between 1 and %d (got %d)", claim.MaxOutcomeBatch, o.MaxBatch)
	case o.MaxInFlight < 0:
		return fmt.Errorf("groupcommit: MaxInFlight cannot be negative (got %d)", o.MaxInFlight)
	case o.Window < 0 || o.Window > time.Second:
		return fmt.Errorf("groupcommit: Window must be between 0 and 1s (got %s): a write may wait that long", o.Window)
	case o.Timeout < 0:
		return fmt.Errorf("groupcommit: Timeout cannot be negative (got %s)", o.Timeout)
	}
	return nil
}

// Store is a claim.Store whose outcome writes (Heartbeat, RecordAttempt,
// Release, MarkProcessed) are group-committed through the inner store's
// WriteOutcomes; every other method is the inner store's. Each caller
// gets its own write's result: nil, ErrStateChanged when its guard did not
// hold, or the batch's error when the batch failed as a whole. A caller
// returns only once its write's batch has committed (or failed).
type Store struct {
	claim.Store
	b *batcher[claim.OutcomeWrite]
}

// New puts a group commit in front of inner, which must be a
// claim.BatchWriter (every dialect's store is; see Wrap).
func New(inner claim.Store, opts Options) (*Store, error) {
	bw, ok := inner.(claim.BatchWriter)
	if !ok {
		return nil, fmt.Errorf("groupcommit: %T cannot write outcomes in batches (not a claim.BatchWriter)", inner)
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	flush := func(ctx context.Context, writes []claim.OutcomeWrite) []error {
		errs, err := bw.WriteOutcomes(ctx, writes)
		if err != nil {
			errs = make([]error, len(writes))
			for i := range errs {
				errs[i] = err
			}
		}
		return errs
	}
	key := func(w claim.OutcomeWrite) int64 { id, _ := w.Target(); return id }
	inFlight := cmp.Or(opts.MaxInFlight, DefaultMaxInFlight)
	if l, ok := inner.(claim.WriteLimit); ok && l.MaxConcurrentWrites() > 0 {
		inFlight = min(inFlight, l.MaxConcurrentWrites())
	}
	return &Store{Store: inner, b: newBatcher(flush, key,
		cmp.Or(opts.MaxBatch, DefaultMaxBatch), inFlight,
		opts.Window, cmp.Or(opts.Timeout, DefaultTimeout))}, nil
}

// Wrap returns inner behind a group commit when inner is a
// claim.BatchWriter, and inner itself otherwise (a test's wrapper of a
// store, whose own methods a batch would bypass).
func Wrap(inner claim.Store, opts Options) (claim.Store, error) {
	if _, ok := inner.(claim.BatchWriter); !ok {
		return inner, opts.Validate()
	}
	return New(inner, opts)
}

func (s *Store) write(ctx context.Context, w claim.OutcomeWrite) error {
	err := s.b.do(ctx, w)
	id, _ := w.Target()
	var spent *spentError
	var left *leftError
	switch {
	case errors.As(err, &spent):
		// Not written: the caller's own deadline was spent in the queue.
		// Nothing is known about the store (the batches that did run
		// report on it), so this is one call aborted, not a store-wide
		// failure: retried, it is expected to succeed.
		return fmt.Errorf("%s claim %d: %w (%w)", w.Kind(), id, err, claim.ErrAborted)
	case errors.As(err, &left) && errors.Is(left.err, context.Canceled):
		// The caller gave up (a shutdown): nothing is known about the
		// store, so this is not a store-wide failure; the outcome of the
		// write is unknown, as any cancelled call's.
		return fmt.Errorf("%s claim %d: %w", w.Kind(), id, err)
	case errors.As(err, &left):
		// Written in a batch that outlived the caller's deadline, which
		// had at least as long as it waited: as a single write whose
		// statement outlives its deadline, the outcome is unknown.
		return fmt.Errorf("%s claim %d: %w", w.Kind(), id, claim.NewError(claim.ClassTimeout, err))
	}
	return err
}

// Heartbeat is the inner store's Heartbeat, group-committed.
func (s *Store) Heartbeat(ctx context.Context, p *claim.HeartbeatParams) error {
	return s.write(ctx, claim.OutcomeWrite{Heartbeat: p})
}

// RecordAttempt is the inner store's RecordAttempt, group-committed.
func (s *Store) RecordAttempt(ctx context.Context, p *claim.RecordAttemptParams) error {
	return s.write(ctx, claim.OutcomeWrite{RecordAttempt: p})
}

// Release is the inner store's Release, group-committed.
func (s *Store) Release(ctx context.Context, p *claim.ReleaseParams) error {
	return s.write(ctx, claim.OutcomeWrite{Release: p})
}

// MarkProcessed is the inner store's MarkProcessed, group-committed.
func (s *Store) MarkProcessed(ctx context.Context, p *claim.MarkProcessedParams) error {
	return s.write(ctx, claim.OutcomeWrite{MarkProcessed: p})
}

// Pending returns how many writes wait for a batch (for tests and
// metrics).
func (s *Store) Pending() int {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	return len(s.b.pending)
}

// Wait waits for the batches being written (a batch outlives the callers
// whose contexts ended while it ran). Call it once no more writes come:
// the processor does, before Run returns, so that a program that closes
// the store after Run finds no batch still holding a connection.
func (s *Store) Wait() { s.b.wg.Wait() }

// Close waits for the batches being written, then closes the inner
// store.
func (s *Store) Close() error {
	s.b.close()
	return s.Store.Close()
}
