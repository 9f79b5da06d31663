package claim

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/uuid"
)

// BatchWriter is implemented by stores that write many claims' outcome
// writes in one round trip and one commit: the group commit of
// internal/groupcommit, which the processor puts in front of its store.
// Every dialect's store implements it; a store wrapper that embeds a
// Store does not (its own methods would be bypassed), and then outcome
// writes go one by one.
type BatchWriter interface {
	// WriteOutcomes performs writes (at most one per claim ID) as the
	// matching Store methods would, each with its own guard (owner,
	// state), in one transaction: one guarded statement per kind on
	// PostgreSQL and SQL Server, one statement per write on SQLite. It
	// returns one result per write, in order: nil, or an error wrapping
	// ErrStateChanged when that write's guard did not hold (only that
	// write is skipped). The second result is an error of the batch as a
	// whole (translated like any store error): nothing was written, or —
	// when the commit's answer was lost — possibly everything, which the
	// callers' retries settle as for a single write.
	WriteOutcomes(ctx context.Context, writes []OutcomeWrite) ([]error, error)
}

// OutcomeWrite is one write of a WriteOutcomes batch: exactly one field is
// set.
type OutcomeWrite struct {
	Heartbeat     *HeartbeatParams
	RecordAttempt *RecordAttemptParams
	Release       *ReleaseParams
	MarkProcessed *MarkProcessedParams
}

// WriteKind is what an OutcomeWrite does.
type WriteKind uint8

// The kinds of outcome writes.
const (
	WriteNone WriteKind = iota
	WriteHeartbeat
	WriteRecordAttempt
	WriteRelease
	WriteMarkProcessed
)

// String names the kind as errors and traces do ("mark processed").
func (k WriteKind) String() string {
	switch k {
	case WriteHeartbeat:
		return "heartbeat"
	case WriteRecordAttempt:
		return "record attempt"
	case WriteRelease:
		return "release"
	case WriteMarkProcessed:
		return "mark processed"
	}
	return "no write"
}

// Kind returns what the write does (WriteNone unless exactly one field
// is set).
func (w OutcomeWrite) Kind() WriteKind {
	k, n := WriteNone, 0
	if w.Heartbeat != nil {
		k, n = WriteHeartbeat, n+1
	}
	if w.RecordAttempt != nil {
		k, n = WriteRecordAttempt, n+1
	}
	if w.Release != nil {
		k, n = WriteRelease, n+1
	}
	if w.MarkProcessed != nil {
		k, n = WriteMarkProcessed, n+1
	}
	if n != 1 {
		return WriteNone
	}
	return k
}

// Target returns the claim and owner the write is guarded on.
func (w OutcomeWrite) Target() (id int64, owner uuid.UUID) {
	switch w.Kind() {
	case WriteHeartbeat:
		return w.Heartbeat.ID, w.Heartbeat.Owner
	case WriteRecordAttempt:
		return w.RecordAttempt.ID, w.RecordAttempt.Owner
	case WriteRelease:
		return w.Release.ID, w.Release.Owner
	case WriteMarkProcessed:
		return w.MarkProcessed.ID, w.MarkProcessed.Owner
	}
	return 0, uuid.Nil
}

// MaxOutcomeBatch bounds the writes of one WriteOutcomes call (SQL
// Server takes at most 2,100 parameters per statement, and a write sends
// seven).
const MaxOutcomeBatch = 250

// ErrBadBatch is wrapped by WriteOutcomes' error for a batch it refuses
// before writing anything: a write without exactly one kind, or two
// writes for one claim.
var ErrBadBatch = errors.New("claim: bad outcome batch")

// CheckBatch returns an error wrapping ErrBadBatch when writes is not a
// valid WriteOutcomes batch.
func CheckBatch(writes []OutcomeWrite) error {
	if len(writes) > MaxOutcomeBatch {
		return fmt.Errorf("%w: %d writes (at most %d)", ErrBadBatch, len(writes), MaxOutcomeBatch)
	}
	seen := make(map[int64]bool, len(writes))
	for i, w := range writes {
		if w.Kind() == WriteNone {
			return fmt.Errorf("%w: write %d sets no single kind", ErrBadBatch, i)
		}
		id, _ := w.Target()
		if seen[id] {
			return fmt.Errorf("%w: two writes for claim %d", ErrBadBatch, id)
		}
		if w.MarkProcessed != nil {
			if err := ValidateNumbered(id, w.MarkProcessed.FollowUps); err != nil {
				return fmt.Errorf("%w: write %d: %w", ErrBadBatch, i, err)
			}
		}
		seen[id] = true
	}
	return nil
}

// WriteEach performs writes one by one with s's own methods: the
// behaviour WriteOutcomes must match, for wrappers of a store that is not
// a BatchWriter. It never returns a batch error: each write's error is
// its own.
func WriteEach(ctx context.Context, s Store, writes []OutcomeWrite) []error {
	errs := make([]error, len(writes))
	for i, w := range writes {
		switch w.Kind() {
		case WriteHeartbeat:
			errs[i] = s.Heartbeat(ctx, w.Heartbeat)
		case WriteRecordAttempt:
			errs[i] = s.RecordAttempt(ctx, w.RecordAttempt)
		case WriteRelease:
			errs[i] = s.Release(ctx, w.Release)
		case WriteMarkProcessed:
			errs[i] = s.MarkProcessed(ctx, w.MarkProcessed)
		default:
			errs[i] = fmt.Errorf("%w: write %d sets no single kind", ErrBadBatch, i)
		}
	}
	return errs
}

// WriteLimit is a store that writes only so many transactions at once:
// SQLite, one (the database's write lock). A group commit keeps no more
// batches in flight than that: a second batch could not be written
// sooner, it would only wait for the writer, holding writes that would
// have joined the next batch. A store wrapper that forwards
// WriteOutcomes should forward it too (WriteLimitOf).
type WriteLimit interface {
	// MaxConcurrentWrites is how many write transactions the store runs
	// at once; 0: no limit of its own (a wrapper of a store without one).
	MaxConcurrentWrites() int
}

// WriteLimitOf is st's MaxConcurrentWrites, 0 when it has none.
func WriteLimitOf(st Store) int {
	if l, ok := st.(WriteLimit); ok {
		return l.MaxConcurrentWrites()
	}
	return 0
}
