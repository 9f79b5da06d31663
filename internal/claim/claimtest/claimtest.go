// Package claimtest is the conformance suite every claim.Store must pass.
// Each dialect package calls Exercise once with a Harness that creates
// fresh, migrated, empty stores, and a Features value that says what
// differs between databases (the dialect-specific SQL the suite needs).
//
// The tests are grouped by area, one file each: claim.go (claims, races,
// conflicts, ClaimTx), takeover.go, outcomes.go (the holder's guarded
// writes), batch.go (group-committed outcome writes), failed.go, flag.go,
// resolve.go, purge.go, locks.go, stats.go (listing, stats, the database
// clock), overview.go (the console's queries) and errors.go (the store
// error contract). This file holds the harness and the helpers they share.
package claimtest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// Harness tells the suite how to get stores of one dialect.
type Harness struct {
	// NewStore returns a fresh, migrated, EMPTY store for one test
	// (t.Cleanup closes it).
	NewStore func(t *testing.T) claim.Store
	// DB returns the *sql.DB behind a store from NewStore (for raw SQL in
	// tests).
	DB       func(t *testing.T, s claim.Store) *sql.DB
	Features Features
}

// Features describes what differs between databases. The SQL strings use
// the dialect's own placeholders; the suite passes arguments in the order
// documented on each field.
type Features struct {
	// UncommittedInsertBlocks: an uncommitted claim in tx A makes tx B's
	// insert wait (PostgreSQL, SQL Server). SQLite serialises writers and
	// cannot run this test.
	UncommittedInsertBlocks bool

	// ExtraUniqueIndexSQL creates a second unique index on the claims
	// table's subject column (no arguments). The suite uses it to prove
	// that a unique violation of any index but the claims index is an
	// error, not a duplicate.
	ExtraUniqueIndexSQL string

	// InsertClaimSQL inserts a bare claimed row (the other columns take
	// their defaults or the database clock). Arguments: message id,
	// consumer, owner (uuid as a string), payload hash ([]byte).
	InsertClaimSQL string

	// BackdateSQL moves every time column of one claim (claimed,
	// heartbeat, processed, released, flagged, resolved, taken over, next
	// attempt, late success, failed, answer, key revised; NULLs stay NULL)
	// back by a number of seconds, so staleness tests do not sleep.
	// Arguments: seconds (int64), claim id (int64).
	BackdateSQL string

	// BackdateFollowUpsSQL moves every time column of one claim's
	// follow-ups (created, lease until, next attempt, sent; NULLs stay
	// NULL) back by a number of seconds. Arguments: seconds (int64), claim
	// id (int64).
	BackdateFollowUpsSQL string

	// Locks and races (the concurrency tests, and the deadlock test of
	// errors.go). Empty or nil on a database that serialises writers
	// (SQLite): the assertions that need two writers at once skip, saying
	// so.

	// SessionIDSQL returns the id of the session that runs it (no
	// arguments; one integer column).
	SessionIDSQL string
	// WaitingForSQL counts the sessions waiting for a lock that a session
	// holds (argument: that session's id from SessionIDSQL; one integer
	// column).
	WaitingForSQL string
	// LockClaimSQL takes a row lock on one claim without changing anything
	// the store reads (argument: claim id).
	LockClaimSQL string
	// SurviveDeadlockSQL, run first in a raw transaction, makes the
	// database pick the other session as the victim of a deadlock (SQL
	// Server: SET DEADLOCK_PRIORITY HIGH). Empty: the database aborts the
	// session whose deadlock check runs first, the one that waited first
	// (PostgreSQL); the deadlock test arranges for that to be the store's.
	SurviveDeadlockSQL string
	// ClaimRaces returns the store's count of claims that met another
	// transaction's in-flight claim of the same key in the claims unique
	// index (see postgres.Store.ClaimRaces, mssql.Store.ClaimRaces). The
	// race tests assert that it moved: without it they could pass without
	// racing. nil: the database serialises writers.
	ClaimRaces func(s claim.Store) int64

	// Error classes (errors.go).

	// ReadOnly returns a store on st's database whose writes the database
	// refuses as read-only while its reads work (PostgreSQL: a pool with
	// default_transaction_read_only=on; SQLite: a query_only connection;
	// SQL Server: the database set READ_ONLY). It may return st itself.
	// nil skips the test.
	ReadOnly func(t *testing.T, st claim.Store) claim.Store
	// RevokeWritesSQL takes INSERT, UPDATE and DELETE on the claims table
	// away from the store's own identity (no arguments), so every write is
	// refused for a missing grant while reads work. Empty skips the test,
	// with NoGrantsReason.
	RevokeWritesSQL string
	NoGrantsReason  string
}

// Exercise runs the conformance suite against h.
func Exercise(t *testing.T, h Harness) {
	for _, f := range []struct {
		name string
		sql  string
	}{{"ExtraUniqueIndexSQL", h.Features.ExtraUniqueIndexSQL}, {"InsertClaimSQL", h.Features.InsertClaimSQL}, {"BackdateSQL", h.Features.BackdateSQL}} {
		if f.sql == "" {
			t.Fatalf("Harness.Features.%s is empty", f.name)
		}
	}
	s := &suite{h: h}
	tests := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"ClaimWinsAndRoundTrips", s.claimWinsAndRoundTrips},
		{"ClaimBatchReturnsTheRowItWrote", s.claimReturnsItsRow},
		{"InvalidClaimIsRejected", s.invalidClaim},
		{"ConcurrentClaimsOfOneKeyHaveOneWinner", s.concurrentClaims},
		{"SameKeyUnderTwoConsumersIsTwoClaims", s.twoConsumers},
		{"KeysDifferingOnlyInCaseAreTwoClaims", s.caseSensitiveKeys},
		{"SameKeyOtherPayloadIsConflict", s.conflict},
		{"UncommittedInsertBlocksSecondClaim", s.uncommittedInsertBlocks},
		{"OtherUniqueViolationIsAnErrorNotADuplicate", s.otherUniqueViolation},
		{"BatchClassifiesEveryMessageInOrder", s.batchMixed},
		{"ClaimTx", s.claimTx},
		{"LifecycleClaimReleaseTakeOverProcess", s.lifecycle},
		{"GuardedOpsRefuseWrongOwnerOrState", s.guardedOps},
		{"TakeOverHasExactlyOneWinner", s.takeOverOnce},
		{"FlagStaleSkipsFreshHeartbeat", s.flagSkipsFresh},
		{"FlagStaleFlagsReleasedNotTakenOver", s.flagReleased},
		{"FlagStaleIsBounded", s.flagBounded},
		{"FlagStaleVersusMarkProcessedNeverBoth", s.flagVersusProcess},
		{"Resolve", s.resolve},
		{"ListFiltersAndPages", s.list},
		{"PurgeProcessed", s.purge},
		{"PurgeOrdersByTheTimeOfTheCurrentState", s.purgeByCurrentState},
		{"PurgeKeepsAClaimThatNamesADeferredMessage", s.purgeKeepsDeferred},
		{"Stats", s.stats},
		{"TimesComeFromTheDatabaseClock", s.dbClock},
		{"TryLock", s.tryLock},
		{"ClosedStoreIsUnavailable", s.closed},
		{"DeadlockIsAbortedForTheCallOnly", s.deadlock},
		{"ReadOnlyDatabaseRefusesEveryWrite", s.readOnly},
		{"MissingGrantRefusesEveryWrite", s.noGrants},
	}
	tests = append(tests, s.takeOverTests()...)
	tests = append(tests, s.failedTests()...)
	tests = append(tests, s.consoleTests()...)
	tests = append(tests, s.batchTests()...)
	tests = append(tests, s.historyTests()...)
	tests = append(tests, s.deferralTests()...)
	tests = append(tests, s.retryTests()...)
	tests = append(tests, s.outboxTests()...)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.fn(t)
		})
	}
}

type suite struct{ h Harness }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

var seq atomic.Int64

// msg returns claim params for a fresh key (unless id is given) and body.
func msg(id, consumer, body string) claim.ClaimParams {
	if id == "" {
		id = fmt.Sprintf("msg-%d-%s", seq.Add(1), uuid.NewString()[:8])
	}
	return claim.ClaimParams{
		MessageID:     id,
		Consumer:      consumer,
		Owner:         uuid.New(),
		Route:         "route-" + consumer,
		Fingerprint:   "fp-1",
		Entity:        "orders/billing",
		Subject:       "subject-" + id,
		ContentType:   "application/json",
		Properties:    map[string]string{"ce_source": "test", "k": id},
		PayloadHash:   claim.HashPayload([]byte(body)),
		Payload:       []byte(body),
		DeliveryCount: 1,
	}
}

// claimOne claims p as a new delivery would: with a fresh owner token.
func claimOne(t *testing.T, s claim.Store, p claim.ClaimParams) claim.ClaimResult {
	t.Helper()
	p.Owner = uuid.New()
	res, err := s.ClaimBatch(ctxT(t), &claim.ClaimBatchParams{Host: "host-a", Claims: []claim.ClaimParams{p}})
	if err != nil {
		t.Fatalf("ClaimBatch(%s/%s): %v", p.MessageID, p.Consumer, err)
	}
	if len(res) != 1 {
		t.Fatalf("ClaimBatch returned %d results for 1 message", len(res))
	}
	return res[0]
}

func mustWin(t *testing.T, s claim.Store, p claim.ClaimParams) *claim.Claim {
	t.Helper()
	res := claimOne(t, s, p)
	if res.Outcome != claim.OutcomeWon {
		t.Fatalf("claim %s/%s: outcome %s, want won", p.MessageID, p.Consumer, res.Outcome)
	}
	return res.Claim
}

func mustGet(t *testing.T, s claim.Store, id int64) *claim.Claim {
	t.Helper()
	c, err := s.Get(ctxT(t), id)
	if err != nil {
		t.Fatalf("Get(%d): %v", id, err)
	}
	return c
}

func (s *suite) backdate(t *testing.T, st claim.Store, id int64, by time.Duration) {
	t.Helper()
	if _, err := s.h.DB(t, st).ExecContext(ctxT(t), s.h.Features.BackdateSQL, int64(by/time.Second), id); err != nil {
		t.Fatalf("backdate claim %d: %v", id, err)
	}
}

func wantErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: error %v, want %v", what, err, want)
	}
}
