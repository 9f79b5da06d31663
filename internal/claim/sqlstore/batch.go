package sqlstore

import (
	"database/sql"
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// WriteValues are the values of one outcome write, whatever its kind
// (zero where the kind has none), for the dialects' batch statements.
type WriteValues struct {
	ID            int64
	Owner         uuid.UUID
	Error         string
	NextAttemptIn time.Duration
	Answer        *claim.Answer
}

// ValuesOf returns w's values.
func ValuesOf(w claim.OutcomeWrite) WriteValues {
	v := WriteValues{}
	v.ID, v.Owner = w.Target()
	switch w.Kind() {
	case claim.WriteRecordAttempt:
		v.Error, v.NextAttemptIn, v.Answer = w.RecordAttempt.Error, w.RecordAttempt.NextAttemptIn, w.RecordAttempt.Answer
	case claim.WriteRelease:
		v.Error, v.NextAttemptIn, v.Answer = w.Release.Error, w.Release.NextAttemptIn, w.Release.Answer
	case claim.WriteMarkProcessed:
		v.Answer = w.MarkProcessed.Answer
	}
	return v
}

// ScanIDs reads a result of one bigint column into a set, and closes rows.
func ScanIDs(rows *sql.Rows) (map[int64]bool, error) {
	defer rows.Close()
	done := map[int64]bool{}
	for rows.Next() {
		var id int64
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		done[id] = true
	}
	return done, rows.Err()
}

// BatchResults is WriteOutcomes' per-write result: nil for a write whose
// claim is in done (its guarded UPDATE changed the row), else the error
// the single write returns when its guard does not hold.
func BatchResults(writes []claim.OutcomeWrite, done map[int64]bool) []error {
	errs := make([]error, len(writes))
	for i, w := range writes {
		if id, _ := w.Target(); !done[id] {
			errs[i] = fmt.Errorf("%s claim %d: %w", w.Kind(), id, claim.ErrStateChanged)
		}
	}
	return errs
}
