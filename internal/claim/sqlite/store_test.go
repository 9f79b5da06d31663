package sqlite_test

import (
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/pressly/goose/v3"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/claimtest"
	"github.com/sbclaim/sbclaim/internal/claim/sqlite"
	sqlfiles "github.com/sbclaim/sbclaim/sql"
)

// harness is the SQLite conformance harness: a migrated temp-file
// database per store.
func harness() claimtest.Harness {
	return claimtest.Harness{
		NewStore: func(t *testing.T) claim.Store {
			t.Helper()
			s, err := sqlite.Open(t.Context(), "sqlite:"+filepath.Join(t.TempDir(), "claims.db"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			if err := sqlite.Migrate(t.Context(), s.DB()); err != nil {
				t.Fatal(err)
			}
			return s
		},
		DB: func(t *testing.T, s claim.Store) *sql.DB { return s.(*sqlite.Store).DB() },
		Features: claimtest.Features{
			UncommittedInsertBlocks: false, // one writer at a time; the store queues on one connection
			ExtraUniqueIndexSQL:     `CREATE UNIQUE INDEX ux_test_subject ON claims (subject)`,
			InsertClaimSQL: `INSERT INTO claims (message_id, consumer, owner, state, payload_hash, claimed_utc, heartbeat_utc)
				VALUES (?, ?, ?, 'claimed', ?, strftime('%Y-%m-%dT%H:%M:%f','now'), strftime('%Y-%m-%dT%H:%M:%f','now'))`,
			BackdateSQL: `UPDATE claims SET
				claimed_utc   = strftime('%Y-%m-%dT%H:%M:%f', claimed_utc,   '-' || ?1 || ' seconds'),
				heartbeat_utc = strftime('%Y-%m-%dT%H:%M:%f', heartbeat_utc, '-' || ?1 || ' seconds'),
				processed_utc = strftime('%Y-%m-%dT%H:%M:%f', processed_utc, '-' || ?1 || ' seconds'),
				released_utc  = strftime('%Y-%m-%dT%H:%M:%f', released_utc,  '-' || ?1 || ' seconds'),
				flagged_utc   = strftime('%Y-%m-%dT%H:%M:%f', flagged_utc,   '-' || ?1 || ' seconds'),
				resolved_utc  = strftime('%Y-%m-%dT%H:%M:%f', resolved_utc,  '-' || ?1 || ' seconds'),
				taken_over_utc   = strftime('%Y-%m-%dT%H:%M:%f', taken_over_utc,   '-' || ?1 || ' seconds'),
				next_attempt_utc = strftime('%Y-%m-%dT%H:%M:%f', next_attempt_utc, '-' || ?1 || ' seconds'),
				late_success_utc = strftime('%Y-%m-%dT%H:%M:%f', late_success_utc, '-' || ?1 || ' seconds'),
				failed_utc       = strftime('%Y-%m-%dT%H:%M:%f', failed_utc,       '-' || ?1 || ' seconds'),
				answer_utc       = strftime('%Y-%m-%dT%H:%M:%f', answer_utc,       '-' || ?1 || ' seconds'),
				key_revised_utc  = strftime('%Y-%m-%dT%H:%M:%f', key_revised_utc,  '-' || ?1 || ' seconds')
				WHERE id = ?2`,
			BackdateFollowUpsSQL: `UPDATE claim_followups SET
				created_utc      = strftime('%Y-%m-%dT%H:%M:%f', created_utc,      '-' || ?1 || ' seconds'),
				lease_until_utc  = strftime('%Y-%m-%dT%H:%M:%f', lease_until_utc,  '-' || ?1 || ' seconds'),
				next_attempt_utc = strftime('%Y-%m-%dT%H:%M:%f', next_attempt_utc, '-' || ?1 || ' seconds'),
				sent_utc         = strftime('%Y-%m-%dT%H:%M:%f', sent_utc,         '-' || ?1 || ' seconds')
				WHERE claim_id = ?2`,
			NoGrantsReason: "SQLite has no grants: a database file the process may not write opens read-only and is refused as read_only (ReadOnlyDatabaseRefusesEveryWrite)",
			ReadOnly:       readOnlyStore,
		},
	}
}

// readOnlyStore opens a second store on st's file through a query_only
// connection: SQLite refuses its writes with SQLITE_READONLY, as it does
// for a file the process may not write. (Taking the file's write bit away
// would not do: the tests run as root, which writes it anyway.)
func readOnlyStore(t *testing.T, st claim.Store) claim.Store {
	t.Helper()
	var (
		seq        int
		name, file string
	)
	if err := st.(*sqlite.Store).DB().QueryRowContext(t.Context(), "PRAGMA database_list").Scan(&seq, &name, &file); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", file+"?_pragma=query_only(1)&_pragma=busy_timeout(10000)")
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	return sqlite.New(db)
}

func TestConformance(t *testing.T) {
	claimtest.Exercise(t, harness())
}

func TestParseURL(t *testing.T) {
	for url, want := range map[string]string{
		"sqlite:/var/lib/claims.db":   "/var/lib/claims.db",
		"sqlite:///var/lib/claims.db": "/var/lib/claims.db",
		"sqlite:claims.db":            "claims.db",
		"sqlite::memory:":             ":memory:",
	} {
		got, err := sqlite.ParseURL(url)
		if err != nil || got != want {
			t.Errorf("ParseURL(%q) = %q, %v; want %q", url, got, err, want)
		}
	}
	for _, url := range []string{"sqlite:", "postgres://x", "sqlite:/x.db?mode=ro"} {
		if _, err := sqlite.ParseURL(url); err == nil {
			t.Errorf("ParseURL(%q) succeeded", url)
		}
	}
}

func TestOpenMemoryIsMigrated(t *testing.T) {
	ctx := t.Context()
	s, err := sqlite.Open(ctx, "sqlite::memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	res, err := s.ClaimBatch(ctx, &claim.ClaimBatchParams{Claims: []claim.ClaimParams{{
		Owner:     uuid.New(),
		MessageID: "m", Consumer: "c", PayloadHash: claim.HashPayload(nil),
	}}})
	if err != nil || res[0].Outcome != claim.OutcomeWon {
		t.Fatalf("claim on a memory store: %v %v", res, err)
	}
}

func TestMigrateIsIdempotent(t *testing.T) {
	ctx := t.Context()
	s, err := sqlite.Open(ctx, "sqlite:"+filepath.Join(t.TempDir(), "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for range 2 {
		if err := sqlite.Migrate(ctx, s.DB()); err != nil {
			t.Fatal(err)
		}
	}
}

func TestOpenUnopenableFileIsUnavailable(t *testing.T) {
	_, err := sqlite.Open(t.Context(), "sqlite:"+filepath.Join(t.TempDir(), "missing-dir", "c.db"))
	if !errors.Is(err, claim.ErrUnavailable) {
		t.Fatalf("Open in a missing directory: %v, want ErrUnavailable", err)
	}
}

// TestUpgradeFromTheFirstSchema: a database created by migration 00001,
// with claims in it, upgrades through 00002; its claims read, take over
// (recording the taker's route) and finish; 00002 goes down and up again.
func TestUpgradeFromTheFirstSchema(t *testing.T) {
	ctx := t.Context()
	s, err := sqlite.Open(ctx, "sqlite:"+filepath.Join(t.TempDir(), "old.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fsys, err := sqlfiles.Dialect("sqlite")
	if err != nil {
		t.Fatal(err)
	}
	p, err := goose.NewProvider(goose.DialectSQLite3, s.DB(), fsys)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 1); err != nil {
		t.Fatal(err)
	}
	owner := uuid.New()
	if _, err := s.DB().ExecContext(ctx, `INSERT INTO claims (message_id, consumer, owner, state, payload_hash, payload, claimed_by, claimed_utc, heartbeat_utc)
		VALUES ('old-1', 'billing', ?, 'claimed', x'01', x'7b7d', 'host-old', '2026-01-01T00:00:00.000', '2026-01-01T00:00:00.000')`, owner.String()); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("upgrade: %v", err)
	}
	stale, err := s.FindStale(ctx, &claim.FindStaleParams{StaleAfter: time.Minute})
	if err != nil || len(stale) != 1 || stale[0].Route != "" || stale[0].TakeOvers != 0 || stale[0].Owner != owner {
		t.Fatalf("the old claim after the upgrade: %+v %v", stale, err)
	}
	taken, err := s.TakeOver(ctx, &claim.TakeOverParams{ID: stale[0].ID, PreviousOwner: owner, Owner: uuid.New(),
		Path: claim.PathReconciler, SilentFor: time.Minute, By: "reconciler", Route: "invoice", Fingerprint: "fp"})
	if err != nil || taken.Route != "invoice" || taken.PreviousHolder != "host-old" {
		t.Fatalf("take-over of the old claim: %+v %v", taken, err)
	}
	if err := s.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: taken.ID, Owner: taken.Owner}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.DownTo(ctx, 1); err != nil {
		t.Fatalf("down to 1: %v", err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
	if got, err := s.Get(ctx, taken.ID); err != nil || got.State != claim.StateProcessed {
		t.Fatalf("after down and up: %+v %v", got, err)
	}
}

// TestUpgradeToTheFailedState: a database at migration 00002, with claims
// in every state it knows (and the highest ID purged), upgrades through
// 00003, which rebuilds the table; its claims read unchanged, fail, take a
// new key and count; the ID counter survives the rebuild. 00003 goes down
// (a failed claim becomes flagged, with its reason) and up again.
func TestUpgradeToTheFailedState(t *testing.T) {
	ctx := t.Context()
	s, err := sqlite.Open(ctx, "sqlite:"+filepath.Join(t.TempDir(), "v2.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	fsys, err := sqlfiles.Dialect("sqlite")
	if err != nil {
		t.Fatal(err)
	}
	p, err := goose.NewProvider(goose.DialectSQLite3, s.DB(), fsys)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.UpTo(ctx, 2); err != nil {
		t.Fatal(err)
	}
	owner := uuid.New()
	insert := func(id int, mid, state string) {
		t.Helper()
		if _, err := s.DB().ExecContext(ctx, `INSERT INTO claims (id, message_id, consumer, owner, state, payload_hash, payload, claimed_by,
			claimed_utc, heartbeat_utc, processed_utc, flagged_utc, flag_reason, route, fingerprint)
			VALUES (?, ?, 'billing', ?, ?, x'01', x'7b7d', 'host-old', '2026-01-01T00:00:00.000', '2026-01-01T00:00:00.000',
			CASE WHEN ?4 = 'processed' THEN '2026-01-01T00:00:01.000' END, CASE WHEN ?4 = 'flagged' THEN '2026-01-01T00:00:02.000' END,
			CASE WHEN ?4 = 'flagged' THEN 'no heartbeat' ELSE '' END, 'payments', 'fp')`, id, mid, owner.String(), state); err != nil {
			t.Fatal(err)
		}
	}
	insert(1, "old-claimed", "claimed")
	insert(2, "old-processed", "processed")
	insert(3, "old-flagged", "flagged")
	insert(100, "old-purged", "processed")
	if _, err := s.DB().ExecContext(ctx, `DELETE FROM claims WHERE id = 100`); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("upgrade: %v", err)
	}

	stale, err := s.FindStale(ctx, &claim.FindStaleParams{StaleAfter: time.Minute})
	if err != nil || len(stale) != 1 || stale[0].MessageID != "old-claimed" || stale[0].Owner != owner || stale[0].Answer != nil ||
		stale[0].FailedAt != nil || stale[0].Key() != "old-claimed" || stale[0].KeyRevision != 0 || stale[0].DeadLetterSeq != nil {
		t.Fatalf("the old claimed claim after the upgrade: %+v %v", stale, err)
	}
	if got, err := s.Get(ctx, 2); err != nil || got.State != claim.StateProcessed || got.ProcessedAt == nil {
		t.Fatalf("the old processed claim: %+v %v", got, err)
	}
	taken, err := s.TakeOver(ctx, &claim.TakeOverParams{ID: 1, PreviousOwner: owner, Owner: uuid.New(),
		Path: claim.PathReconciler, SilentFor: time.Minute, By: "reconciler", Route: "payments", Fingerprint: "fp"})
	if err != nil {
		t.Fatal(err)
	}
	seq := int64(9)
	if err := s.Fail(ctx, &claim.FailParams{ID: 1, Owner: taken.Owner, Reason: claim.FailRejected, Error: "HTTP 402: declined",
		Answer: &claim.Answer{Status: 402}, DeadLetterSeq: &seq}); err != nil {
		t.Fatalf("fail the old claim: %v", err)
	}
	if _, err := s.TakeOver(ctx, &claim.TakeOverParams{ID: 3, PreviousOwner: owner, Owner: uuid.New(), Path: claim.PathOperator,
		By: "operator:ann", Reason: "cached 500", Route: "payments", Fingerprint: "fp", NewKey: true}); err != nil {
		t.Fatalf("new key for the old flagged claim: %v", err)
	}
	st, err := s.Stats(ctx)
	if err != nil || st.Failed != 1 || st.Claimed != 1 {
		t.Fatalf("stats after the upgrade: %+v %v", st, err)
	}
	res, err := s.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "h", Claims: []claim.ClaimParams{{MessageID: "new-1", Consumer: "billing",
		Owner: uuid.New(), PayloadHash: claim.HashPayload(nil)}}})
	if err != nil || res[0].Outcome != claim.OutcomeWon || res[0].Claim.ID <= 100 {
		t.Fatalf("a new claim after the rebuild: %+v %v (its ID must follow the purged 100)", res, err)
	}

	if _, err := p.DownTo(ctx, 2); err != nil {
		t.Fatalf("down to 2: %v", err)
	}
	var state, reason string
	if err := s.DB().QueryRowContext(ctx, `SELECT state, flag_reason FROM claims WHERE id = 1`).Scan(&state, &reason); err != nil {
		t.Fatal(err)
	}
	if state != "flagged" || !strings.Contains(reason, claim.FailRejected) || !strings.Contains(reason, "HTTP 402: declined") {
		t.Fatalf("a failed claim after the downgrade: %s %q, want flagged with its reason", state, reason)
	}
	if _, err := s.DB().ExecContext(ctx, `INSERT INTO claims (message_id, consumer, owner, state, payload_hash, claimed_utc, heartbeat_utc)
		VALUES ('bad', 'c', 'o', 'failed', x'01', '2026-01-01T00:00:00.000', '2026-01-01T00:00:00.000')`); err == nil {
		t.Fatal("schema 00002 took a failed claim")
	}
	if _, err := p.Up(ctx); err != nil {
		t.Fatalf("up again: %v", err)
	}
	if got, err := s.Get(ctx, 1); err != nil || got.State != claim.StateFlagged || got.FailedAt != nil {
		t.Fatalf("after down and up: %+v %v", got, err)
	}
	res2, err := s.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "h", Claims: []claim.ClaimParams{{MessageID: "new-2", Consumer: "billing",
		Owner: uuid.New(), PayloadHash: claim.HashPayload(nil)}}})
	if err != nil || res2[0].Claim.ID <= res[0].Claim.ID {
		t.Fatalf("a new claim after down and up: %+v %v (IDs are never reused)", res2, err)
	}
}
