package postgres

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/sqlstore"
	"github.com/sbclaim/sbclaim/internal/testkit"
)

// countingQuerier counts the statements ClaimBatch sends.
type countingQuerier struct {
	q sqlstore.Querier
	n atomic.Int64
}

func (c *countingQuerier) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	c.n.Add(1)
	return c.q.QueryContext(ctx, query, args...)
}

// TestClaimBatchIsOneStatement: a batch of new keys costs one statement;
// one mixing new keys, duplicates, conflicts and intra-batch repeats costs
// two (the existing rows are read whole by the second).
func TestClaimBatchIsOneStatement(t *testing.T) {
	ctx := t.Context()
	s := schemaStore(t)

	msg := func(i int, body string) claim.ClaimParams {
		return claim.ClaimParams{Owner: uuid.New(), MessageID: fmt.Sprintf("m-%d", i), Consumer: "c", PayloadHash: claim.HashPayload([]byte(body)), Payload: []byte(body)}
	}
	var existing []claim.ClaimParams
	for i := range 50 {
		existing = append(existing, msg(i, "b"))
	}
	first, err := sqlstore.NewPlan(existing)
	if err != nil {
		t.Fatal(err)
	}
	cq := &countingQuerier{q: s.DB()}
	if won, _, err := s.insertClaims(ctx, cq, "h", first, claim.StateClaimed); err != nil || len(won) != 50 {
		t.Fatalf("first batch: %d won, %v", len(won), err)
	}
	if n := cq.n.Load(); n != 1 {
		t.Fatalf("ClaimBatch of %d new keys sent %d statements, want 1", len(existing), n)
	}
	var batch []claim.ClaimParams
	for i := range 100 { // 0..49 exist (even: duplicate, odd: conflict), 50..99 new
		body := "b"
		if i < 50 && i%2 == 1 {
			body = "other"
		}
		batch = append(batch, msg(i, body))
	}
	batch = append(batch, msg(75, "b")) // intra-batch repeat
	plan, err := sqlstore.NewPlan(batch)
	if err != nil {
		t.Fatal(err)
	}
	cq = &countingQuerier{q: s.DB()}
	won, found, err := s.insertClaims(ctx, cq, "h", plan, claim.StateClaimed)
	if err != nil {
		t.Fatal(err)
	}
	if n := cq.n.Load(); n != 2 {
		t.Fatalf("ClaimBatch of %d messages, some of them existing, sent %d statements, want 2", len(batch), n)
	}
	res, err := plan.Results(won, found)
	if err != nil {
		t.Fatal(err)
	}
	count := map[claim.Outcome]int{}
	for _, r := range res {
		count[r.Outcome]++
	}
	if count[claim.OutcomeWon] != 50 || count[claim.OutcomeDuplicate] != 26 || count[claim.OutcomeConflict] != 25 {
		t.Fatalf("outcomes %v, want 50 won, 26 duplicate, 25 conflict", count)
	}
}

// TestClaimBatchRaceCostsOneMoreStatement: when the key's row commits while
// the insert waits for it, the statement's snapshot cannot see the row, so
// ClaimBatch tries the key again with a second statement, which finds it,
// and reads it whole with a third, and reports a duplicate.
func TestClaimBatchRaceCostsOneMoreStatement(t *testing.T) {
	ctx := t.Context()
	s := schemaStore(t)

	p := claim.ClaimParams{Owner: uuid.New(), MessageID: "m", Consumer: "c", PayloadHash: claim.HashPayload([]byte("b"))}
	tx, err := s.DB().BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `INSERT INTO claims (message_id, consumer, owner, state, payload_hash)
		VALUES ($1, $2, $3::uuid, 'claimed', $4)`, p.MessageID, p.Consumer, uuid.NewString(), p.PayloadHash); err != nil {
		t.Fatal(err)
	}
	var txPID int
	if err := tx.QueryRowContext(ctx, "SELECT pg_backend_pid()").Scan(&txPID); err != nil {
		t.Fatal(err)
	}
	plan, err := sqlstore.NewPlan([]claim.ClaimParams{p})
	if err != nil {
		t.Fatal(err)
	}
	cq := &countingQuerier{q: s.DB()}
	type result struct {
		res []claim.ClaimResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		won, found, err := s.insertClaims(ctx, cq, "h", plan, claim.StateClaimed)
		if err != nil {
			done <- result{err: err}
			return
		}
		res, err := plan.Results(won, found)
		done <- result{res, err}
	}()
	// Wait until the insert is blocked on the uncommitted row.
	for {
		var waiting bool
		if err := s.DB().QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE $1 = ANY(pg_blocking_pids(pid)))`, txPID).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting {
			break
		}
		select {
		case r := <-done:
			t.Fatalf("claim returned before the other transaction committed: %+v", r)
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.res[0].Outcome != claim.OutcomeDuplicate {
		t.Fatalf("outcome %s, want duplicate", r.res[0].Outcome)
	}
	if n := cq.n.Load(); n != 3 {
		t.Fatalf("%d statements, want 3 (the snapshot did not see the racing row)", n)
	}
}

// schemaStore opens a migrated store on a fresh schema, dropped when the
// test ends. (This in-package test cannot use internal/testkit/testdb, which
// imports this package.)
func schemaStore(t *testing.T) *Store {
	t.Helper()
	base := testkit.PostgresURL(t)
	ctx := t.Context()
	admin, err := sql.Open("pgx", base)
	if err != nil {
		t.Fatal(err)
	}
	schema := "roundtrip_" + strings.ReplaceAll(uuid.NewString(), "-", "")[:16]
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		admin.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		defer admin.Close()
		if _, err := admin.ExecContext(context.Background(), "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Errorf("drop schema %s: %v", schema, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	s, err := Open(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := Migrate(ctx, s.DB()); err != nil {
		t.Fatal(err)
	}
	return s
}
