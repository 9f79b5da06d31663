package mssql

import (
	"context"
	"database/sql/driver"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// TestGuardedWritesAppendTheirHistoryInTheStatement checks the SQL text
// (no SQL Server runs here; the conformance suite's history tests run
// against one when SBCLAIM_TEST_SQLSERVER_URL is set): every guarded
// write that changes a claim's owner or state carries its history row in
// the same statement, OUTPUT ... INTO dbo.ClaimHistory, so the row exists
// exactly when the guard held; the batch path inserts it from @done in
// its transaction; a heartbeat and a late-success note write none; the
// purge deletes a claim's history in the transaction that deletes it.
func TestGuardedWritesAppendTheirHistoryInTheStatement(t *testing.T) {
	db, rec := newFakeDB(t, func(req fakeRequest) fakeResult {
		q := req.Query
		switch {
		case strings.Contains(q, "DELETE TOP"):
			return fakeResult{Sets: [][][]driver.Value{{{int64(3)}}}}
		case strings.Contains(q, "FROM dbo.ClaimHistory WHERE ClaimId"):
			wire, _ := guid(uuid.New()).Value()
			return fakeResult{Sets: [][][]driver.Value{{{int64(1), int64(7), dbNow, "claimed", "", "claimed", "h", "", "", nil, wire, "c/m"}}}}
		case strings.Contains(q, "OUTPUT INSERTED.Id\n"), strings.Contains(q, "SELECT Id FROM @done"):
			return fakeResult{Sets: [][][]driver.Value{{{int64(7)}}}}
		default:
			return fakeResult{Sets: [][][]driver.Value{{claimRow(7, "flagged")}}}
		}
	})
	st := New(db)
	ctx := context.Background()
	owner := uuid.New()
	last := func() string {
		r := rec.requests()
		return r[len(r)-1].Query
	}
	into := "INTO dbo.ClaimHistory (ClaimId, AtUtc, What, FromState, ToState, ByWhom, Path, Reason, PreviousOwner, Owner, IdempotencyKey)"
	for _, tc := range []struct {
		name string
		run  func() error
		what string // the change the statement records ("" : none)
	}{
		{"Heartbeat", func() error { return st.Heartbeat(ctx, &claim.HeartbeatParams{ID: 7, Owner: owner}) }, ""},
		{"RecordLateSuccess", func() error { return st.RecordLateSuccess(ctx, &claim.LateSuccessParams{ID: 7, Owner: owner, By: "h"}) }, ""},
		{"MarkProcessed", func() error { return st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: 7, Owner: owner}) }, "'processed'"},
		{"Release", func() error { return st.Release(ctx, &claim.ReleaseParams{ID: 7, Owner: owner, Error: "e"}) }, "'released'"},
		{"RecordAttempt", func() error {
			return st.RecordAttempt(ctx, &claim.RecordAttemptParams{ID: 7, Owner: owner, Error: "e"})
		}, "'attempt'"},
		{"Fail", func() error {
			return st.Fail(ctx, &claim.FailParams{ID: 7, Owner: owner, Reason: claim.FailRejected, Error: "declined"})
		}, "'failed'"},
		{"TakeDeadLetter", func() error { return st.TakeDeadLetter(ctx, &claim.TakeDeadLetterParams{ID: 7, Seq: 4, By: "h"}) }, "'dead letter taken'"},
		{"Flag", func() error {
			_, err := st.Flag(ctx, &claim.FlagParams{ID: 7, Owner: owner, State: claim.StateClaimed, Reason: "r", By: "reconciler"})
			return err
		}, "'flagged'"},
		{"FlagStale", func() error {
			_, err := st.FlagStale(ctx, &claim.FlagStaleParams{StaleAfter: time.Minute, Limit: 5})
			return err
		}, "'flagged'"},
		{"TakeOver", func() error {
			_, err := st.TakeOver(ctx, &claim.TakeOverParams{ID: 7, PreviousOwner: owner, Owner: uuid.New(), Path: claim.PathRedelivery,
				SilentFor: time.Minute, By: "h", Reason: "r", Route: "route", Fingerprint: "fp"})
			return err
		}, "DELETED.Owner"},
		{"Resolve", func() error {
			_, err := st.Resolve(ctx, &claim.ResolveParams{ID: 7, Resolution: claim.ResolutionDone, By: "op"})
			return err
		}, "'resolved'"},
		{"ClaimBatch", func() error {
			_, err := st.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "h", Claims: []claim.ClaimParams{{MessageID: "m", Consumer: "c",
				Owner: uuid.New(), PayloadHash: claim.HashPayload(nil)}}})
			return err
		}, "'claimed'"},
	} {
		err := tc.run()
		if err != nil && !strings.Contains(err.Error(), "state changed") && !strings.Contains(err.Error(), "another") && tc.name != "ClaimBatch" {
			t.Errorf("%s: %v", tc.name, err)
		}
		q := last()
		if tc.name == "ClaimBatch" {
			for _, r := range rec.requests() {
				if strings.Contains(r.Query, "INSERT INTO dbo.Claims") {
					q = r.Query
				}
			}
		}
		switch {
		case tc.what == "" && strings.Contains(q, "ClaimHistory"):
			t.Errorf("%s writes history (it changes neither owner nor state):\n%s", tc.name, q)
		case tc.what != "" && (!strings.Contains(q, into) || !strings.Contains(q, tc.what)):
			t.Errorf("%s does not append its history (%s) in the statement:\n%s", tc.name, tc.what, q)
		case tc.what != "" && strings.Index(q, into) > strings.Index(q, "WHERE") && !strings.Contains(q, "INSERT INTO dbo.Claims") &&
			!strings.Contains(q, "WITH stale AS"):
			t.Errorf("%s: the OUTPUT INTO is not part of the UPDATE:\n%s", tc.name, q)
		}
	}

	// The batch: history from @done, in the transaction, heartbeats
	// excluded.
	if _, err := st.WriteOutcomes(ctx, []claim.OutcomeWrite{
		{Heartbeat: &claim.HeartbeatParams{ID: 1, Owner: owner}},
		{MarkProcessed: &claim.MarkProcessedParams{ID: 2, Owner: owner}},
	}); err != nil {
		t.Fatal(err)
	}
	q := last()
	ins, commit := strings.Index(q, "INSERT INTO dbo.ClaimHistory"), strings.Index(q, "COMMIT TRANSACTION")
	if ins < 0 || commit < ins || strings.Index(q, "BEGIN TRANSACTION") > ins || !strings.Contains(q, "FROM @done WHERE What IS NOT NULL") ||
		!strings.Contains(q, "OUTPUT INSERTED.Id INTO @done (Id)") {
		t.Errorf("WriteOutcomes' history:\n%s", q)
	}

	// The purge: the claims' history goes in the same transaction.
	if _, err := st.PurgeProcessed(ctx, &claim.PurgeParams{OlderThan: 48 * time.Hour, Limit: 10}); err != nil {
		t.Fatal(err)
	}
	q = last()
	del, commit := strings.Index(q, "DELETE h FROM dbo.ClaimHistory"), strings.Index(q, "COMMIT TRANSACTION")
	if del < 0 || commit < del || strings.Count(q, "OUTPUT DELETED.Id INTO @purged") != 3 || !strings.Contains(q, "SET XACT_ABORT ON") {
		t.Errorf("PurgeProcessed does not delete the history with the claims in one transaction:\n%s", q)
	}

	h, err := st.History(ctx, 7)
	if err != nil || len(h) != 1 || h[0].What != claim.ChangeClaimed || h[0].Key != "c/m" || h[0].At.Location() != time.UTC {
		t.Fatalf("History: %+v %v", h, err)
	}
}
