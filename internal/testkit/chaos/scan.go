package chaos

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claimdb"
)

// ScanResult is the reconciler's stale scan (FlagStale with nothing
// stale) timed over a claims table of Rows finished claims.
type ScanResult struct {
	Rows      int
	BuildTime time.Duration // bulk-inserting the rows added for this size
	Median    time.Duration // median FlagStale call
}

// scanUnfinished is how many fresh (not stale) unfinished claims the scan
// table holds besides the finished ones: the partial index is never empty.
const scanUnfinished = 100

// BenchScan grows the claims table of db (a fresh run database) to each
// size in sizes (ascending) with finished claims, bulk-inserted with raw
// SQL in large batches, and times FlagStale at each size.
func BenchScan(ctx context.Context, db *Database, sizes []int, reps int) ([]ScanResult, error) {
	if !slices.IsSorted(sizes) {
		return nil, fmt.Errorf("scan sizes must ascend: %v", sizes)
	}
	reps = max(reps, 5)
	sqldb, err := db.OpenDB(1)
	if err != nil {
		return nil, err
	}
	defer sqldb.Close()

	// Fresh unfinished claims through the product's store.
	params := &claim.ClaimBatchParams{Host: "scan"}
	for i := range scanUnfinished {
		params.Claims = append(params.Claims, claim.ClaimParams{
			MessageID: fmt.Sprintf("fresh-%04d", i), Consumer: "scan", Owner: uuid.New(), PayloadHash: claim.HashPayload(nil),
		})
	}
	if _, err := db.Store.ClaimBatch(ctx, params); err != nil {
		return nil, fmt.Errorf("scan: fresh claims: %w", err)
	}

	const batch = 200_000
	var insert, analyze string
	switch db.Dialect {
	case claimdb.SQLite:
		insert = `WITH RECURSIVE seq(x) AS (SELECT ?1 UNION ALL SELECT x + 1 FROM seq WHERE x < ?2)
			INSERT INTO claims (message_id, consumer, owner, state, payload_hash, claimed_utc, heartbeat_utc, processed_utc)
			SELECT 'done-' || x, 'scan', '00000000-0000-0000-0000-000000000000', 'processed', x'00',
				strftime('%Y-%m-%dT%H:%M:%f','now','-1 hour'), strftime('%Y-%m-%dT%H:%M:%f','now','-1 hour'),
				strftime('%Y-%m-%dT%H:%M:%f','now','-1 hour')
			FROM seq`
		analyze = "ANALYZE"
	case claimdb.Postgres:
		insert = `INSERT INTO claims (message_id, consumer, owner, state, payload_hash, claimed_utc, heartbeat_utc, processed_utc)
			SELECT 'done-' || x, 'scan', '00000000-0000-0000-0000-000000000000', 'processed', '\x00'::bytea,
				now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 hour'
			FROM generate_series($1::bigint, $2::bigint) AS x`
		analyze = "ANALYZE claims"
	case claimdb.SQLServer:
		// Rows have..to numbered from a cross join of a catalog view
		// (thousands of rows squared: more than a batch).
		insert = `INSERT INTO dbo.Claims (MessageId, Consumer, Owner, State, PayloadHash, ClaimedUtc, HeartbeatUtc, ProcessedUtc)
			SELECT CONCAT(N'done-', x), N'scan', '00000000-0000-0000-0000-000000000000', 'processed', 0x00,
				DATEADD(hour, -1, SYSUTCDATETIME()), DATEADD(hour, -1, SYSUTCDATETIME()), DATEADD(hour, -1, SYSUTCDATETIME())
			FROM (SELECT TOP (@p2 - @p1 + 1) @p1 - 1 + ROW_NUMBER() OVER (ORDER BY (SELECT NULL)) AS x
				FROM sys.all_columns AS a CROSS JOIN sys.all_columns AS b) AS seq`
		analyze = "UPDATE STATISTICS dbo.Claims"
	default:
		return nil, fmt.Errorf("scan: unsupported dialect %s", db.Dialect)
	}

	var out []ScanResult
	have := 0
	for _, size := range sizes {
		start := time.Now()
		for have < size {
			to := min(have+batch, size)
			if _, err := sqldb.ExecContext(ctx, insert, have+1, to); err != nil {
				return nil, fmt.Errorf("scan: insert rows %d..%d: %w", have+1, to, err)
			}
			have = to
		}
		if _, err := sqldb.ExecContext(ctx, analyze); err != nil {
			return nil, fmt.Errorf("scan: %s: %w", analyze, err)
		}
		build := time.Since(start)

		times := make([]time.Duration, 0, reps)
		for i := range reps + 2 {
			t0 := time.Now()
			flagged, err := db.Store.FlagStale(ctx, &claim.FlagStaleParams{StaleAfter: time.Hour, Limit: 100})
			d := time.Since(t0)
			if err != nil {
				return nil, fmt.Errorf("scan: FlagStale at %d rows: %w", size, err)
			}
			if len(flagged) > 0 {
				return nil, fmt.Errorf("scan: FlagStale flagged %d claims; nothing should be stale", len(flagged))
			}
			if i >= 2 { // two warm-up calls
				times = append(times, d)
			}
		}
		slices.Sort(times)
		out = append(out, ScanResult{Rows: size, BuildTime: build, Median: times[len(times)/2]})
	}
	return out, nil
}
