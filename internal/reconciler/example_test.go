package reconciler_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sbclaim/sbclaim/internal/claim/sqlite"
	"github.com/sbclaim/sbclaim/internal/reconciler"
)

// One tick on an empty store: the tick takes the lock, finds nothing stale
// and nothing to purge.
func ExampleReconciler_RunOnce() {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, "sqlite::memory:")
	if err != nil {
		panic(err)
	}
	defer st.Close()

	rec, err := reconciler.New(st, reconciler.Config{
		StaleAfter:     5 * time.Minute,
		Retention:      7 * 24 * time.Hour,
		FlagBatchSize:  100,
		PurgeBatchSize: 500,
	}, nil, nil)
	if err != nil {
		panic(err)
	}
	res, err := rec.RunOnce(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("locked:", res.Locked, "flagged:", len(res.Flagged), "purged:", res.Purged)
	// Output: locked: true flagged: 0 purged: 0
}
