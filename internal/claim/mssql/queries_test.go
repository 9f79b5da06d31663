package mssql

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	mssqldb "github.com/microsoft/go-mssqldb"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// claimRow is a row of dbo.Claims as go-mssqldb returns it.
func claimRow(id int64, state string) []driver.Value {
	wire, _ := mssqldb.UniqueIdentifier(uuid.MustParse("01020304-0506-0708-090a-0b0c0d0e0f10")).Value()
	return []driver.Value{
		id, "m", "c", wire, state, "orders", "s", "text/plain", "{}",
		[]byte{1}, nil, int64(2), "h", dbNow, dbNow, dbNow, nil, int64(1), "e", nil, "", nil, "", "", "",
		"route", "fp", int64(1), dbNow, "redelivery", "why", wire, "host-0", int64(0), nil, nil, "",
		nil, "", nil, `{"status":402,"fields":{"/id":"ch_1"}}`, dbNow, int64(1), "m:r1", "operator:ann", dbNow, "cached 500", "raw",
		int64(42), dbNow, int64(1), dbNow, "account-7",
	}
}

// TestEveryQueryNumbersItsParameters runs every Store method against the
// fake driver, which fails the test when a query's @pN placeholders and
// its arguments disagree (sp_executesql would reject the request), and
// checks the statements' guards.
func TestEveryQueryNumbersItsParameters(t *testing.T) {
	db, rec := newFakeDB(t, func(req fakeRequest) fakeResult {
		q := req.Query
		switch {
		case strings.Contains(q, "sp_getapplock"), strings.Contains(q, "sp_releaseapplock"):
			return fakeResult{Sets: [][][]driver.Value{{{int64(0)}}}}
		case strings.Contains(q, "DELETE TOP"):
			return fakeResult{Sets: [][][]driver.Value{{{int64(3)}}}}
		case strings.Contains(q, "COUNT_BIG"):
			return fakeResult{Sets: [][][]driver.Value{{{dbNow, int64(1), int64(2), int64(3), int64(4), dbNow}}}}
		case strings.HasPrefix(q, "SELECT SYSUTCDATETIME();"):
			return fakeResult{Sets: [][][]driver.Value{{{dbNow}}}}
		case strings.Contains(q, "OUTPUT INSERTED.Id\n"):
			return fakeResult{Sets: [][][]driver.Value{{{int64(7)}}}}
		default:
			return fakeResult{Sets: [][][]driver.Value{{claimRow(7, "flagged")}}}
		}
	})
	st := New(db)
	ctx := context.Background()
	owner := uuid.New()
	check := func(name string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	for _, path := range []claim.TakeOverPath{claim.PathRedelivery, claim.PathReconciler, claim.PathOperator} {
		_, err := st.TakeOver(ctx, &claim.TakeOverParams{ID: 7, PreviousOwner: owner, Owner: uuid.New(), Path: path,
			SilentFor: time.Minute, By: "h", Reason: "r", DeliveryCount: 2, Route: "route", Fingerprint: "fp"})
		check("TakeOver "+string(path), err)
	}
	_, err := st.Flag(ctx, &claim.FlagParams{ID: 7, Owner: owner, State: claim.StateClaimed, SilentFor: time.Minute, Reason: "r"})
	check("Flag", err)
	_, err = st.FindStale(ctx, &claim.FindStaleParams{StaleAfter: time.Minute, Limit: 5})
	check("FindStale", err)
	check("RecordLateSuccess", st.RecordLateSuccess(ctx, &claim.LateSuccessParams{ID: 7, Owner: owner, By: "h"}))
	check("Release with backoff", st.Release(ctx, &claim.ReleaseParams{ID: 7, Owner: owner, Error: "e", NextAttemptIn: time.Minute}))
	check("RecordAttempt with backoff", st.RecordAttempt(ctx, &claim.RecordAttemptParams{ID: 7, Owner: owner, Error: "e", NextAttemptIn: time.Minute}))
	_, err = st.Resolve(ctx, &claim.ResolveParams{ID: 7, Resolution: claim.ResolutionRedriven, By: "op", Note: "n", Owner: owner})
	check("Resolve by the redrive's owner", err)
	check("Heartbeat", st.Heartbeat(ctx, &claim.HeartbeatParams{ID: 7, Owner: owner}))
	check("MarkProcessed", st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: 7, Owner: owner}))
	check("Release", st.Release(ctx, &claim.ReleaseParams{ID: 7, Owner: owner, Error: "e"}))
	check("RecordAttempt", st.RecordAttempt(ctx, &claim.RecordAttemptParams{ID: 7, Owner: owner, Error: "e"}))
	answer := &claim.Answer{Status: 402, Headers: map[string]string{"Request-Id": "req_1"}}
	seq := int64(42)
	check("Fail", st.Fail(ctx, &claim.FailParams{ID: 7, Owner: owner, Reason: claim.FailRejected, Error: "declined", Answer: answer, DeadLetterSeq: &seq}))
	check("Fail without a delivery", st.Fail(ctx, &claim.FailParams{ID: 7, Owner: owner, Reason: claim.FailPermanent, Error: "e"}))
	check("TakeDeadLetter", st.TakeDeadLetter(ctx, &claim.TakeDeadLetterParams{ID: 7, Seq: 43}))
	check("MarkProcessed with an answer", st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: 7, Owner: owner, Answer: answer}))
	_, err = st.TakeOver(ctx, &claim.TakeOverParams{ID: 7, PreviousOwner: owner, Owner: uuid.New(), Path: claim.PathOperator,
		By: "operator:ann", Reason: "cached 500", Route: "route", Fingerprint: "fp", NewKey: true})
	check("TakeOver with a new key", err)
	_, err = st.TakeOver(ctx, &claim.TakeOverParams{ID: 7, PreviousOwner: owner, Owner: uuid.New(), Path: claim.PathOperator, Retry: true,
		By: "operator:ann", Reason: "retry: API key fixed", Route: "route", Fingerprint: "fp"})
	check("TakeOver retrying a failed claim", err)
	_, err = st.FlagStale(ctx, &claim.FlagStaleParams{StaleAfter: 90*time.Second + 1500*time.Microsecond, Limit: 5})
	check("FlagStale", err)
	_, err = st.List(ctx, &claim.ListParams{States: []claim.State{claim.StateFlagged, claim.StateReleased}, Consumer: "c", OlderThan: time.Hour, AfterID: 3, Limit: 10})
	check("List", err)
	_, err = st.List(ctx, &claim.ListParams{})
	check("List (no filters)", err)
	c, err := st.Get(ctx, 7)
	check("Get", err)
	_, err = st.Resolve(ctx, &claim.ResolveParams{ID: 7, Resolution: claim.ResolutionRedriven, By: "op", Note: "n"})
	check("Resolve redriven", err)
	_, err = st.Resolve(ctx, &claim.ResolveParams{ID: 7, Resolution: claim.ResolutionDone, By: "op"})
	check("Resolve done", err)
	n, err := st.PurgeProcessed(ctx, &claim.PurgeParams{OlderThan: 48 * time.Hour, Limit: 10})
	check("PurgeProcessed", err)
	stats, err := st.Stats(ctx)
	check("Stats", err)
	now, err := st.Now(ctx)
	check("Now", err)
	seq43 := int64(43)
	_, err = st.TakeOver(ctx, &claim.TakeOverParams{ID: 7, PreviousOwner: owner, Owner: uuid.New(), Path: claim.PathRedelivery,
		SilentFor: time.Minute, By: "h", Reason: "r", Route: "route", Fingerprint: "fp", Seq: &seq43})
	check("TakeOver by a delivery with a sequence number", err)
	check("Defer", st.Defer(ctx, &claim.DeferParams{ID: 7, Owner: owner, Seq: 43, DueIn: 90 * time.Second, Grace: time.Hour, Error: "e", Answer: answer}))
	check("SetDue", st.SetDue(ctx, &claim.SetDueParams{ID: 7, Owner: owner, Seq: 43, DueIn: 90 * time.Second}))
	_, err = st.FindDue(ctx, &claim.FindDueParams{Consumer: "c", Entity: "orders", SilentFor: time.Minute, Limit: 5})
	check("FindDue", err)
	_, err = st.TakeDeferred(ctx, &claim.TakeDeferredParams{ID: 7, PreviousOwner: owner, Owner: uuid.New(), Seq: 43, SilentFor: time.Minute, By: "h", Reason: "due"})
	check("TakeDeferred", err)
	unlock, ok, err := st.TryLock(ctx, "reconciler")
	check("TryLock", err)
	if ok {
		check("unlock", unlock(ctx))
	}

	if c == nil || c.Owner != uuid.MustParse("01020304-0506-0708-090a-0b0c0d0e0f10") || c.ClaimedAt.Location() != time.UTC ||
		c.ProcessedAt == nil || c.ReleasedAt != nil || c.Properties != nil || c.DeliveryCount != 2 || c.Attempts != 1 || c.SessionID != "account-7" {
		t.Errorf("scanned claim: %+v", c)
	}
	if c == nil || c.Answer == nil || c.Answer.Status != 402 || c.Answer.Fields["/id"] != "ch_1" || c.AnswerAt == nil ||
		c.KeyRevision != 1 || c.Key() != "m:r1" || c.KeyRevisedBy != "operator:ann" || c.KeyRevisedAt == nil || c.FailedAt != nil || c.DeadLetterSeq != nil {
		t.Errorf("scanned answer and key: %+v", c)
	}
	if n != 3 || stats == nil || stats.Claimed != 1 || stats.Released != 2 || stats.Flagged != 3 || stats.Failed != 4 || stats.OldestUnfinished == nil || !now.Equal(dbNow) || !ok {
		t.Errorf("purge %d, stats %+v, now %v, lock %v", n, stats, now, ok)
	}

	for _, r := range rec.requests() {
		q := r.Query
		if strings.HasPrefix(q, "DECLARE @now") || strings.Contains(q, "UPDATE dbo.Claims") {
			// Guarded writes name the state they expect.
			if strings.Contains(q, "UPDATE dbo.Claims") && !strings.Contains(q, "LateSuccessUtc =") && !strings.Contains(q, "State = '") {
				t.Errorf("UPDATE without a state guard:\n%s", q)
			}
		}
		if strings.Contains(q, "WITH stale AS") {
			for _, want := range []string{"WITH (ROWLOCK, UPDLOCK, READPAST, READCOMMITTEDLOCK)", "WHERE " + unfinished, "State IN ('claimed', 'released')", "HeartbeatUtc < DATEADD(microsecond, -@p2, DATEADD(second, -@p3, SYSUTCDATETIME()))", "ORDER BY HeartbeatUtc"} {
				if !strings.Contains(q, want) {
					t.Errorf("FlagStale lacks %q:\n%s", want, q)
				}
			}
			if r.Args[1] != int32(1500) || r.Args[2] != int32(90) {
				t.Errorf("FlagStale cutoff arguments %v %v, want 1500µs and 90s", r.Args[1], r.Args[2])
			}
		}
		if strings.Contains(q, "State = 'failed', FailedUtc = @now") {
			for _, want := range []string{"WHERE Id = @p1 AND Owner = @p2 AND State = 'claimed'", "Answer = COALESCE(@p6, Answer)"} {
				if !strings.Contains(q, want) {
					t.Errorf("Fail lacks %q:\n%s", want, q)
				}
			}
		}
		if strings.Contains(q, "TakenOverFrom = State") {
			// A take-over clears the dead letter of a failed claim (an
			// operator's retry), so a new failure dead-letters again.
			if !strings.Contains(q, "DeadLetterSeq = CASE WHEN State = 'failed' THEN NULL ELSE DeadLetterSeq END") {
				t.Errorf("TakeOver does not clear the dead letter of a retried claim:\n%s", q)
			}
			retry := false
			for _, a := range r.Args {
				if fmt.Sprint(a) == string(claim.ChangeRetried) {
					retry = true
				}
			}
			if retry != strings.Contains(q, "AND State = 'failed';") {
				t.Errorf("TakeOver records %q (retry %v) but its guard is:\n%s", claim.ChangeRetried, retry, q)
			}
			if !retry && !strings.Contains(q, "State = 'flagged'") && !strings.Contains(q, "State = 'released'") && !strings.Contains(q, "State IN") {
				t.Errorf("TakeOver without a state guard:\n%s", q)
			}
		}
		if strings.Contains(q, "SET DeadLetterSeq") && !strings.Contains(q, "State = 'failed' AND DeadLetterSeq IS NULL") {
			t.Errorf("TakeDeadLetter is not guarded on a failed claim without a dead letter:\n%s", q)
		}
		if strings.Contains(q, "DELETE TOP") {
			for _, want := range []string{"State = 'processed' AND DeferredSeq IS NULL AND ProcessedUtc < ",
				"State = 'failed' AND DeferredSeq IS NULL AND FailedUtc < ", "State = 'resolved' AND DeferredSeq IS NULL AND ResolvedUtc < "} {
				if !strings.Contains(q, want) {
					t.Errorf("PurgeProcessed does not purge by the time of the current state, sparing deferred messages (%s):\n%s", want, q)
				}
			}
		}
		if strings.Contains(q, "sp_getapplock") && !strings.Contains(q, "@LockOwner = 'Session', @LockTimeout = @p2") {
			t.Errorf("TryLock:\n%s", q)
		}
		for _, a := range r.Args {
			if s, ok := a.(string); ok && len(s) > 4000 {
				t.Errorf("a long string is sent as nvarchar(n): %d characters", len(s))
			}
		}
	}
}

func TestGuardedUpdatesReportStateChanged(t *testing.T) {
	db, _ := newFakeDB(t, func(req fakeRequest) fakeResult {
		if strings.HasPrefix(req.Query, "SELECT") {
			return fakeResult{Sets: [][][]driver.Value{{claimRow(7, "claimed")}}}
		}
		return fakeResult{} // the guard matched no row
	})
	st := New(db)
	ctx := context.Background()
	for name, err := range map[string]error{
		"Heartbeat":      st.Heartbeat(ctx, &claim.HeartbeatParams{ID: 7}),
		"MarkProcessed":  st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: 7}),
		"Release":        st.Release(ctx, &claim.ReleaseParams{ID: 7}),
		"RecordAttempt":  st.RecordAttempt(ctx, &claim.RecordAttemptParams{ID: 7}),
		"Fail":           st.Fail(ctx, &claim.FailParams{ID: 7, Owner: uuid.New(), Reason: claim.FailRejected}),
		"TakeDeadLetter": st.TakeDeadLetter(ctx, &claim.TakeDeadLetterParams{ID: 7, Seq: 1}),
	} {
		if !errors.Is(err, claim.ErrStateChanged) {
			t.Errorf("%s: %v, want ErrStateChanged", name, err)
		}
	}
	if _, err := st.TakeOver(ctx, &claim.TakeOverParams{ID: 7, PreviousOwner: uuid.New(), Owner: uuid.New(),
		Path: claim.PathRedelivery, SilentFor: time.Minute, By: "h"}); !errors.Is(err, claim.ErrStateChanged) {
		t.Errorf("TakeOver: %v", err)
	}
	if _, err := st.Flag(ctx, &claim.FlagParams{ID: 7, Owner: uuid.New(), State: claim.StateClaimed, Reason: "r"}); !errors.Is(err, claim.ErrStateChanged) {
		t.Errorf("Flag: %v", err)
	}
	if _, err := st.Resolve(ctx, &claim.ResolveParams{ID: 7, Resolution: claim.ResolutionDone, By: "op"}); !errors.Is(err, claim.ErrStateChanged) {
		t.Errorf("Resolve: %v", err)
	}
}

func TestTryLockHeldElsewhere(t *testing.T) {
	db, _ := newFakeDB(t, func(fakeRequest) fakeResult {
		return fakeResult{Sets: [][][]driver.Value{{{int64(-1)}}}} // sp_getapplock timed out
	})
	unlock, ok, err := New(db).TryLock(context.Background(), "reconciler")
	if err != nil || ok || unlock != nil {
		t.Fatalf("TryLock of a held lock: ok %v, err %v", ok, err)
	}
	if _, _, err := New(db).TryLock(context.Background(), strings.Repeat("x", 256)); err == nil {
		t.Fatal("TryLock accepted a name longer than sp_getapplock's 255")
	}
}

func TestTruncate(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"abc", 5, "abc"},
		{"abcdef", 3, "abc"},
		{"ééé", 2, "éé"},
		{"a😀b", 2, "a"}, // the emoji is a surrogate pair: 2 units, never split
		{"a😀b", 3, "a😀"},
	} {
		if got := truncate(tc.in, tc.n); got != tc.want {
			t.Errorf("truncate(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
	if utf16Len("a😀") != 3 {
		t.Error("utf16Len counts code units")
	}
}

func TestAgoSQL(t *testing.T) {
	var a args
	got := agoSQL(&a, 30*24*time.Hour+250*time.Millisecond)
	if got != "DATEADD(microsecond, -@p1, DATEADD(second, -@p2, SYSUTCDATETIME()))" {
		t.Fatalf("agoSQL: %s", got)
	}
	// 30 days in milliseconds overflows DATEADD's int; seconds do not.
	if a[0].v != int32(250000) || a[1].v != int32(30*24*3600) {
		t.Fatalf("arguments %v", a)
	}
	a = nil
	agoSQL(&a, 200*365*24*time.Hour)
	if a[1].v != int32(1<<31-1) {
		t.Fatalf("a huge duration is not capped: %v", a)
	}
}
