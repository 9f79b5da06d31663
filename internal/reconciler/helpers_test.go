package reconciler_test

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/sqlite"
)

// testDB is a migrated claims database of one dialect, with the raw
// database for backdating rows.
type testDB struct {
	dialect string
	store   claim.Store
	db      *sql.DB
	// openAnother opens a second Store on the same database (another
	// "replica"); nil when the dialect cannot.
	openAnother func(t *testing.T) claim.Store
}

// dialects lists the databases the tests run against: SQLite always,
// PostgreSQL when SBCLAIM_TEST_POSTGRES_URL is set.
var dialects = []struct {
	name string
	open func(t *testing.T) *testDB
}{
	{"sqlite", openSQLite},
	{"postgres", openPostgres},
}

// eachDB runs fn as a subtest per dialect.
func eachDB(t *testing.T, fn func(t *testing.T, tdb *testDB)) {
	t.Helper()
	for _, d := range dialects {
		t.Run(d.name, func(t *testing.T) {
			fn(t, d.open(t))
		})
	}
}

func openSQLite(t *testing.T) *testDB {
	t.Helper()
	ctx := context.Background()
	url := "sqlite:" + filepath.Join(t.TempDir(), "claims.db")
	open := func(t *testing.T) claim.Store {
		st, err := sqlite.Open(ctx, url)
		if err != nil {
			t.Fatalf("open sqlite: %v", err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	st, err := sqlite.Open(ctx, url)
	if err != nil {
		t.Fatalf("open sqlite: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	if err := sqlite.Migrate(ctx, st.DB()); err != nil {
		t.Fatalf("migrate sqlite: %v", err)
	}
	return &testDB{dialect: "sqlite", store: st, db: st.DB(), openAnother: open}
}

// backdate moves a claim's heartbeat (and release time) d into the past,
// by the database clock.
func (tdb *testDB) backdateHeartbeat(t *testing.T, d time.Duration, ids ...int64) {
	t.Helper()
	for _, id := range ids {
		var q string
		var args []any
		switch tdb.dialect {
		case "sqlite":
			q = `UPDATE claims SET heartbeat_utc = strftime('%Y-%m-%dT%H:%M:%f','now',?1),
				released_utc = CASE WHEN released_utc IS NULL THEN NULL ELSE strftime('%Y-%m-%dT%H:%M:%f','now',?1) END
				WHERE id = ?2`
			args = []any{fmt.Sprintf("-%.3f seconds", d.Seconds()), id}
		default:
			q = `UPDATE claims SET heartbeat_utc = now() - $1 * interval '1 millisecond',
				released_utc = CASE WHEN released_utc IS NULL THEN NULL ELSE now() - $1 * interval '1 millisecond' END
				WHERE id = $2`
			args = []any{d.Milliseconds(), id}
		}
		if _, err := tdb.db.ExecContext(context.Background(), q, args...); err != nil {
			t.Fatalf("backdate heartbeat of claim %d: %v", id, err)
		}
	}
}

// backdateNextAttempt moves a claim's next attempt time d into the past.
func (tdb *testDB) backdateNextAttempt(t *testing.T, d time.Duration, ids ...int64) {
	t.Helper()
	for _, id := range ids {
		q := `UPDATE claims SET next_attempt_utc = strftime('%Y-%m-%dT%H:%M:%f', next_attempt_utc, ?1) WHERE id = ?2`
		args := []any{fmt.Sprintf("-%.3f seconds", d.Seconds()), id}
		if tdb.dialect != "sqlite" {
			q = `UPDATE claims SET next_attempt_utc = next_attempt_utc - $1 * interval '1 millisecond' WHERE id = $2`
			args = []any{d.Milliseconds(), id}
		}
		if _, err := tdb.db.ExecContext(context.Background(), q, args...); err != nil {
			t.Fatalf("backdate next attempt of claim %d: %v", id, err)
		}
	}
}

// markAllProcessedAgo turns every claimed claim whose message id starts
// with prefix into a processed claim finished d ago (one statement: fast
// for 10 000 rows).
func (tdb *testDB) markAllProcessedAgo(t *testing.T, prefix string, d time.Duration) int64 {
	t.Helper()
	var q string
	var args []any
	switch tdb.dialect {
	case "sqlite":
		q = `UPDATE claims SET state = 'processed', payload = NULL,
			processed_utc = strftime('%Y-%m-%dT%H:%M:%f','now',?1)
			WHERE state = 'claimed' AND message_id LIKE ?2`
		args = []any{fmt.Sprintf("-%.3f seconds", d.Seconds()), prefix + "%"}
	default:
		q = `UPDATE claims SET state = 'processed', payload = NULL,
			processed_utc = now() - $1 * interval '1 millisecond'
			WHERE state = 'claimed' AND message_id LIKE $2`
		args = []any{d.Milliseconds(), prefix + "%"}
	}
	res, err := tdb.db.ExecContext(context.Background(), q, args...)
	if err != nil {
		t.Fatalf("mark processed: %v", err)
	}
	n, _ := res.RowsAffected()
	return n
}

// claimN claims n new messages (in batches of 500) and returns them.
func claimN(t *testing.T, st claim.Store, prefix string, n int, payload []byte) []*claim.Claim {
	t.Helper()
	var out []*claim.Claim
	for start := 0; start < n; start += 500 {
		var params []claim.ClaimParams
		for i := start; i < min(n, start+500); i++ {
			body := payload
			if body == nil {
				body = fmt.Appendf(nil, `{"n":%d}`, i)
			}
			params = append(params, claim.ClaimParams{
				KeyForm:       claim.KeyFormRaw,
				Owner:         uuid.New(),
				MessageID:     fmt.Sprintf("%s-%05d", prefix, i),
				Consumer:      "billing",
				Entity:        "payments",
				Subject:       "payment",
				ContentType:   "application/json",
				Properties:    map[string]string{"tenant": "t1"},
				PayloadHash:   claim.HashPayload(body),
				Payload:       body,
				DeliveryCount: 1,
			})
		}
		res, err := st.ClaimBatch(context.Background(), &claim.ClaimBatchParams{Host: "host-a", Claims: params})
		if err != nil {
			t.Fatalf("claim batch: %v", err)
		}
		for i, r := range res {
			if r.Outcome != claim.OutcomeWon {
				t.Fatalf("claim %s: outcome %s, want won", params[i].MessageID, r.Outcome)
			}
			out = append(out, r.Claim)
		}
	}
	return out
}

func ids(claims []*claim.Claim) []int64 {
	out := make([]int64, len(claims))
	for i, c := range claims {
		out[i] = c.ID
	}
	return out
}

func mustGet(t *testing.T, st claim.Store, id int64) *claim.Claim {
	t.Helper()
	c, err := st.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("get claim %d: %v", id, err)
	}
	return c
}

// testLogger routes slog output to t.Log.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(p[:len(p)-1]))
	return len(p), nil
}

// noLock is a store whose TryLock always succeeds: it models a broken or
// absent lock, so the guarded updates alone must keep the tick correct.
type noLock struct{ claim.Store }

func (noLock) TryLock(context.Context, string) (func(context.Context) error, bool, error) {
	return func(context.Context) error { return nil }, true, nil
}

// countingStore counts PurgeProcessed and FlagStale calls and their limits.
type countingStore struct {
	claim.Store
	mu          sync.Mutex
	purgeLimits []int
	purged      []int64
	flagCalls   atomic.Int64
}

func (c *countingStore) PurgeProcessed(ctx context.Context, p *claim.PurgeParams) (int64, error) {
	n, err := c.Store.PurgeProcessed(ctx, p)
	c.mu.Lock()
	c.purgeLimits = append(c.purgeLimits, p.Limit)
	c.purged = append(c.purged, n)
	c.mu.Unlock()
	return n, err
}

func (c *countingStore) FlagStale(ctx context.Context, p *claim.FlagStaleParams) ([]*claim.Claim, error) {
	c.flagCalls.Add(1)
	return c.Store.FlagStale(ctx, p)
}
