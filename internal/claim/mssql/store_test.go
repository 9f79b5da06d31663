package mssql

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/claimtest"
	"github.com/sbclaim/sbclaim/internal/claim/sqlstore"
	"github.com/sbclaim/sbclaim/internal/testkit"
)

// URLEnv holds the SQL Server URL of the integration tests, e.g.
// sqlserver://sa:Passw0rd!@localhost:1433 (docker compose up sqlserver).
// The login needs CREATE DATABASE: each store gets a fresh database,
// dropped when its test ends.
const URLEnv = testkit.SQLServerEnv

// rcsiEnv set to "off" runs the suite with READ_COMMITTED_SNAPSHOT off
// (SQL Server's default); by default the test databases turn it on, like
// Azure SQL Database, which is the harder case for the claim insert.
const rcsiEnv = "SBCLAIM_TEST_SQLSERVER_RCSI"

func TestConformance(t *testing.T) {
	base := testkit.RequireOrSkip(t, "sqlserver", URLEnv)
	claimtest.Exercise(t, claimtest.Harness{
		NewStore: func(t *testing.T) claim.Store { return newTestStore(t, base) },
		DB:       func(t *testing.T, s claim.Store) *sql.DB { return s.(*Store).DB() },
		Features: sqlServerFeatures,
	})
}

// sqlServerFeatures is the SQL Server part of the conformance suite.
var sqlServerFeatures = claimtest.Features{
	// An uncommitted claim holds an exclusive lock on its key in
	// UX_Claims_MessageId_Consumer; a second insert of the key waits for it,
	// with or without READ_COMMITTED_SNAPSHOT.
	UncommittedInsertBlocks: true,
	// Subject is nvarchar(max), which cannot be an index key: index a
	// computed prefix of it. The CREATE INDEX runs in its own batch (EXEC)
	// because the batch that adds a column cannot also compile a statement
	// that uses it.
	ExtraUniqueIndexSQL: `ALTER TABLE dbo.Claims ADD SubjectKey AS CAST(Subject AS nvarchar(400));
EXEC (N'CREATE UNIQUE NONCLUSTERED INDEX UX_Claims_SubjectKey ON dbo.Claims (SubjectKey);');`,
	InsertClaimSQL: `INSERT INTO dbo.Claims (MessageId, Consumer, Owner, State, PayloadHash)
VALUES (@p1, @p2, CAST(@p3 AS uniqueidentifier), 'claimed', @p4);`,
	BackdateSQL: `UPDATE dbo.Claims SET
    ClaimedUtc   = DATEADD(second, -CAST(@p1 AS int), ClaimedUtc),
    HeartbeatUtc = DATEADD(second, -CAST(@p1 AS int), HeartbeatUtc),
    ProcessedUtc = DATEADD(second, -CAST(@p1 AS int), ProcessedUtc),
    ReleasedUtc  = DATEADD(second, -CAST(@p1 AS int), ReleasedUtc),
    FlaggedUtc   = DATEADD(second, -CAST(@p1 AS int), FlaggedUtc),
    ResolvedUtc  = DATEADD(second, -CAST(@p1 AS int), ResolvedUtc),
    TakenOverUtc   = DATEADD(second, -CAST(@p1 AS int), TakenOverUtc),
    NextAttemptUtc = DATEADD(second, -CAST(@p1 AS int), NextAttemptUtc),
    LateSuccessUtc = DATEADD(second, -CAST(@p1 AS int), LateSuccessUtc),
    FailedUtc      = DATEADD(second, -CAST(@p1 AS int), FailedUtc),
    AnswerUtc      = DATEADD(second, -CAST(@p1 AS int), AnswerUtc),
    KeyRevisedUtc  = DATEADD(second, -CAST(@p1 AS int), KeyRevisedUtc)
WHERE Id = @p2;`,
	BackdateFollowUpsSQL: `UPDATE dbo.ClaimFollowUps SET
    CreatedUtc     = DATEADD(second, -CAST(@p1 AS int), CreatedUtc),
    LeaseUntilUtc  = DATEADD(second, -CAST(@p1 AS int), LeaseUntilUtc),
    NextAttemptUtc = DATEADD(second, -CAST(@p1 AS int), NextAttemptUtc),
    SentUtc        = DATEADD(second, -CAST(@p1 AS int), SentUtc)
WHERE ClaimId = @p2;`,
	SessionIDSQL:  `SELECT CAST(@@SPID AS bigint);`,
	WaitingForSQL: `SELECT COUNT_BIG(*) FROM sys.dm_exec_requests WHERE blocking_session_id = @p1;`,
	LockClaimSQL:  `SELECT Id FROM dbo.Claims WITH (UPDLOCK, ROWLOCK) WHERE Id = @p1;`,
	// The raw transaction of the deadlock test survives; the store's
	// statement is the victim (error 1205).
	SurviveDeadlockSQL: `SET DEADLOCK_PRIORITY HIGH;`,
	ClaimRaces:         claimRaces,
	ReadOnly:           readOnlyDatabase,
	NoGrantsReason: "the SQL Server test login needs CREATE DATABASE and is usually sa, a sysadmin on whom DENY has no effect; " +
		"a missing grant (229) is covered by TestInterpretError",
}

// claimRaces is nil with READ_COMMITTED_SNAPSHOT off: NOT EXISTS then
// waits for an in-flight claim and sees it, and the race leaves no
// violation to count (see Store.ClaimRaces).
var claimRaces = func() func(claim.Store) int64 {
	if strings.EqualFold(os.Getenv(rcsiEnv), "off") {
		return nil
	}
	return func(s claim.Store) int64 { return s.(*Store).ClaimRaces() }
}()

// readOnlyDatabase sets st's database READ_ONLY (as a geo-secondary is):
// every write then fails with error 3906. The ALTER ends the store's
// sessions; the pool opens new ones.
func readOnlyDatabase(t *testing.T, st claim.Store) claim.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var name string
	if err := st.(*Store).DB().QueryRowContext(ctx, "SELECT DB_NAME();").Scan(&name); err != nil {
		t.Fatal(err)
	}
	admin, err := Open(ctx, testkit.RequireOrSkip(t, "sqlserver", URLEnv))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	quoted := "[" + strings.ReplaceAll(name, "]", "]]") + "]"
	if _, err := admin.DB().ExecContext(ctx, "ALTER DATABASE "+quoted+" SET READ_ONLY WITH ROLLBACK IMMEDIATE;"); err != nil {
		t.Fatalf("set %s read-only: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_, _ = admin.DB().ExecContext(ctx, "ALTER DATABASE "+quoted+" SET READ_WRITE WITH ROLLBACK IMMEDIATE;")
	})
	// The ALTER ended the pooled sessions: close them, so the writes under
	// test run on new sessions and meet the read-only database, not a
	// broken connection.
	db := st.(*Store).DB()
	db.SetMaxIdleConns(0)
	db.SetMaxIdleConns(sqlstore.MaxOpenConns)
	return st
}

// newTestStore creates a uniquely named database on the server of base,
// migrates it, and opens a store on it; t.Cleanup drops the database.
func newTestStore(t *testing.T, base string) *Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	admin, err := Open(ctx, base)
	if err != nil {
		t.Fatalf("%s: open admin connection: %v", URLEnv, err)
	}
	t.Cleanup(func() { admin.Close() })

	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	name := "sbclaim_test_" + hex.EncodeToString(rnd[:])
	quoted := "[" + name + "]"
	if _, err := admin.DB().ExecContext(ctx, "CREATE DATABASE "+quoted+";"); err != nil {
		t.Fatalf("create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// Ends sessions still in the database (a test's open transaction);
		// not supported on Azure SQL Database, where the DROP alone works
		// once the store's pool is closed.
		_, _ = admin.DB().ExecContext(ctx, "ALTER DATABASE "+quoted+" SET SINGLE_USER WITH ROLLBACK IMMEDIATE;")
		if _, err := admin.DB().ExecContext(ctx, "DROP DATABASE "+quoted+";"); err != nil {
			t.Logf("drop database %s: %v", name, err)
		}
	})
	if !strings.EqualFold(os.Getenv(rcsiEnv), "off") {
		if _, err := admin.DB().ExecContext(ctx, "ALTER DATABASE "+quoted+" SET READ_COMMITTED_SNAPSHOT ON WITH ROLLBACK IMMEDIATE;"); err != nil {
			t.Fatalf("turn on READ_COMMITTED_SNAPSHOT: %v", err)
		}
	}

	u, err := withDatabase(base, name)
	if err != nil {
		t.Fatal(err)
	}
	st, err := Open(ctx, u)
	if err != nil {
		t.Fatalf("open store on %s: %v", name, err)
	}
	// Registered after the DROP cleanup, so it runs before it.
	t.Cleanup(func() { st.Close() })
	if err := Migrate(ctx, st.DB()); err != nil {
		t.Fatalf("migrate %s: %v", name, err)
	}
	return st
}

// withDatabase returns the URL with its database parameter set to name.
func withDatabase(base, name string) (string, error) {
	u, err := url.Parse(base)
	if err != nil {
		return "", err
	}
	q := u.Query()
	for k := range q {
		if strings.EqualFold(k, "database") || strings.EqualFold(k, "initial catalog") {
			q.Del(k)
		}
	}
	q.Set("database", name)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// TestMigrateIsIdempotent runs the migrations twice, concurrently, on one
// fresh database: the application lock serialises them, and the second run
// finds nothing to do.
func TestMigrateIsIdempotent(t *testing.T) {
	base := testkit.RequireOrSkip(t, "sqlserver", URLEnv)
	st := newTestStore(t, base) // migrated once
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := make(chan error, 2)
	for range 2 {
		go func() { errs <- Migrate(ctx, st.DB()) }()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := st.DB().QueryRowContext(ctx, "SELECT COUNT(*) FROM sys.indexes WHERE object_id = OBJECT_ID(N'dbo.Claims') AND name = N'"+claimsIndex+"' AND is_unique = 1;").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("%s: %d unique indexes with that name, want 1", claimsIndex, n)
	}
}

// TestLargeBatchIsChunked claims more distinct keys than one statement
// takes and checks every outcome, across the chunks: a third of the keys
// were already claimed by other deliveries (duplicates); some were
// claimed by an earlier try of this same batch, with its owner tokens
// (won again, the same claim: a retried batch), and some of those are
// processed since (duplicates: a row with the caller's own token is won
// only while it is still claimed).
func TestLargeBatchIsChunked(t *testing.T) {
	base := testkit.RequireOrSkip(t, "sqlserver", URLEnv)
	st := newTestStore(t, base)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const n = 2*maxRowsPerStatement + 17
	batch := make([]claim.ClaimParams, n)
	for i := range batch {
		body := []byte("body-" + strings.Repeat("x", i))
		batch[i] = claim.ClaimParams{
			Owner:     uuid.New(),
			MessageID: "m-" + hex.EncodeToString([]byte{byte(i >> 8), byte(i)}), Consumer: "c",
			PayloadHash: claim.HashPayload(body), Payload: body,
		}
	}
	const (
		otherDelivery = iota + 1
		ownClaimed
		ownProcessed
	)
	pre := map[int]int{} // message index → how its key was claimed before
	var others, own []claim.ClaimParams
	for i := range batch {
		switch {
		case i%3 == 0:
			pre[i] = otherDelivery
			p := batch[i]
			p.Owner = uuid.New()
			others = append(others, p)
		case i%5 == 0:
			pre[i] = ownClaimed
			if i%10 == 0 {
				pre[i] = ownProcessed
			}
			own = append(own, batch[i])
		}
	}
	first := map[string]int64{} // message ID → claim ID of the earlier try
	for _, b := range [][]claim.ClaimParams{others, own} {
		res, err := st.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "h", Claims: b})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if r.Outcome != claim.OutcomeWon {
				t.Fatalf("pre-claim of %s: %s", r.Claim.MessageID, r.Outcome)
			}
			first[r.Claim.MessageID] = r.Claim.ID
		}
	}
	for i, how := range pre {
		if how == ownProcessed {
			if err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: first[batch[i].MessageID], Owner: batch[i].Owner}); err != nil {
				t.Fatal(err)
			}
		}
	}
	res, err := st.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "h", Claims: batch})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		want := claim.OutcomeWon
		if how := pre[i]; how == otherDelivery || how == ownProcessed {
			want = claim.OutcomeDuplicate
		}
		if r.Outcome != want || r.Claim.MessageID != batch[i].MessageID {
			t.Fatalf("message %d: %s for %s, want %s", i, r.Outcome, r.Claim.MessageID, want)
		}
		if id, ok := first[batch[i].MessageID]; ok && r.Claim.ID != id {
			t.Fatalf("message %d: claim %d, want the existing claim %d", i, r.Claim.ID, id)
		}
	}
}
