package mssql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	mssqldb "github.com/microsoft/go-mssqldb"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// TestDeclaredParameterTypesAreStable runs every Store method twice, once
// with the shortest values and once with the longest the store accepts,
// and records the parameter declarations of every statement it sends (the
// fake driver unwraps the sp_executesql call, checks that every request
// with parameters comes through it, and that every value fits its declared
// type). The declarations of a statement must not depend on its values:
// SQL Server caches one plan per statement text and declaration list, and
// go-mssqldb's own declarations (nvarchar(<length>), varbinary(<length>))
// would give every ClaimBatch its own.
func TestDeclaredParameterTypesAreStable(t *testing.T) {
	short := declarationsOfEveryMethod(t, false)
	long := declarationsOfEveryMethod(t, true)
	if len(short) < 28 { // every parameterised statement the store has
		t.Fatalf("only %d distinct parameterised statements recorded", len(short))
	}
	for q, d := range short {
		l, ok := long[q]
		if !ok {
			t.Errorf("statement sent with short values only:\n%s", q)
			continue
		}
		if d != l {
			t.Errorf("declarations differ with the values' lengths:\n short: %s\n  long: %s\nstatement:\n%s", d, l, q)
		}
	}
	for q := range long {
		if _, ok := short[q]; !ok {
			t.Errorf("statement sent with long values only:\n%s", q)
		}
	}
	// The key columns are declared at their widths, the payload as
	// varbinary(max): the ClaimBatch statement's declarations show it.
	for q, d := range short {
		if strings.Contains(q, "WHERE NOT EXISTS") {
			decls := strings.Split(d, ", ")
			for i, want := range map[int]string{1: "nvarchar(256)", 2: "nvarchar(128)", 3: "nvarchar(200)", 9: "varbinary(32)", 10: "varbinary(max)", 11: "int"} {
				if decls[i-1] != want {
					t.Errorf("ClaimBatch declares @p%d %s, want %s", i, decls[i-1], want)
				}
			}
		}
	}
}

// declarationsOfEveryMethod calls every Store method against the fake
// driver, with the shortest or the longest values, and returns the
// declarations of each parameterised statement, by statement text.
func declarationsOfEveryMethod(t *testing.T, long bool) map[string]string {
	t.Helper()
	size := func(shortN, longN int) int {
		if long {
			return longN
		}
		return shortN
	}
	str := func(prefix string, shortN, longN int) string {
		n := size(shortN, longN)
		if n <= len(prefix) {
			return prefix[:n]
		}
		return prefix + strings.Repeat("x", n-len(prefix))
	}
	ft := newFakeTable()
	db, rec := newFakeDB(t, func(req fakeRequest) fakeResult {
		q := req.Query
		switch {
		case strings.Contains(q, "INSERT INTO dbo.Claims"), strings.Contains(q, "AS k (MessageId, Consumer)"):
			return ft.handle(req)
		case strings.Contains(q, "sp_getapplock"), strings.Contains(q, "sp_releaseapplock"):
			return fakeResult{Sets: [][][]driver.Value{{{int64(0)}}}}
		case strings.Contains(q, "DELETE TOP"):
			return fakeResult{Sets: [][][]driver.Value{{{int64(1)}}}}
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
	check := func(name string, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s (long %v): %v", name, long, err)
		}
	}
	body := []byte(str("payload", 1, 9000)) // varbinary(1) vs beyond 8000 bytes
	hash := claim.HashPayload(body)[:size(16, 32)]
	mk := func(i int) claim.ClaimParams {
		return claim.ClaimParams{
			MessageID:   str(fmt.Sprintf("%d", i), 1, claim.MaxMessageIDLength),
			Consumer:    str(fmt.Sprintf("c%d", i), 2, 200),
			Entity:      str("e", 1, maxEntity),
			Subject:     str("s", 1, 5000),
			ContentType: str("t", 1, 300),
			Properties:  map[string]string{"k": str("v", 1, 3000)},
			PayloadHash: hash, Payload: body, DeliveryCount: size(1, 1<<20),
			Owner: uuid.New(), Route: str("r", 1, 64), Fingerprint: str("f", 1, 64),
		}
	}
	host := str("h", 1, maxClaimedBy)
	// The set-based path, then the per-key fallback after a racing commit.
	_, err := st.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: host, Claims: []claim.ClaimParams{mk(1), mk(2), mk(3)}})
	check("ClaimBatch", err)
	race := mk(4)
	ft.mu.Lock()
	ft.race[[2]string{race.MessageID, race.Consumer}] = race.PayloadHash
	ft.mu.Unlock()
	_, err = st.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: host, Claims: []claim.ClaimParams{race, mk(5), mk(6)}})
	check("ClaimBatch with a race", err)
	if st.ClaimRaces() != 1 {
		t.Errorf("the racing ClaimBatch did not fall back (ClaimRaces %d)", st.ClaimRaces())
	}
	_, err = st.ClaimTx(ctx, &claim.ClaimTxParams{Host: host, Claim: mk(7)}, func(context.Context, *sql.Tx) error { return nil })
	check("ClaimTx", err)
	_, err = st.ClaimTx(ctx, &claim.ClaimTxParams{Host: host, Claim: mk(7)}, func(context.Context, *sql.Tx) error { return nil })
	check("ClaimTx duplicate", err)

	owner := uuid.New()
	id := int64(size(1, 1<<40))
	errText := str("e", 1, maxLastError)
	route, print := str("r", 1, 64), str("f", 1, 64)
	silent := time.Duration(size(1, 1<<20)) * time.Second
	for _, path := range []claim.TakeOverPath{claim.PathRedelivery, claim.PathReconciler, claim.PathOperator} {
		_, err = st.TakeOver(ctx, &claim.TakeOverParams{ID: id, PreviousOwner: owner, Owner: uuid.New(), Path: path, SilentFor: silent,
			By: host, Reason: str("why", 1, maxFlagReason), DeliveryCount: size(2, 1<<20), Route: route, Fingerprint: print})
		check("TakeOver "+string(path), err)
	}
	_, err = st.Flag(ctx, &claim.FlagParams{ID: id, Owner: owner, State: claim.StateClaimed, SilentFor: silent, Reason: str("why", 1, maxFlagReason)})
	check("Flag", err)
	_, err = st.FindStale(ctx, &claim.FindStaleParams{StaleAfter: silent, Limit: size(1, 1000)})
	check("FindStale", err)
	check("RecordLateSuccess", st.RecordLateSuccess(ctx, &claim.LateSuccessParams{ID: id, Owner: owner, By: host}))
	check("Heartbeat", st.Heartbeat(ctx, &claim.HeartbeatParams{ID: id, Owner: owner}))
	check("MarkProcessed", st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: id, Owner: owner}))
	check("Release", st.Release(ctx, &claim.ReleaseParams{ID: id, Owner: owner, Error: errText}))
	check("Release later", st.Release(ctx, &claim.ReleaseParams{ID: id, Owner: owner, Error: errText, NextAttemptIn: silent}))
	check("RecordAttempt", st.RecordAttempt(ctx, &claim.RecordAttemptParams{ID: id, Owner: owner, Error: errText}))
	check("RecordAttempt later", st.RecordAttempt(ctx, &claim.RecordAttemptParams{ID: id, Owner: owner, Error: errText, NextAttemptIn: silent}))
	// Answers: none (a typed NULL) in the short run, the largest the store
	// keeps in the long one; the declarations are the same.
	var answer *claim.Answer
	var seq *int64
	if long {
		answer = &claim.Answer{Status: 599, Step: str("s", 1, 64), Headers: map[string]string{"Request-Id": str("r", 1, claim.MaxAnswerBytes-200)}}
		n := int64(1 << 62)
		seq = &n
	}
	check("MarkProcessed with an answer", st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: id, Owner: owner, Answer: answer}))
	check("Release with an answer", st.Release(ctx, &claim.ReleaseParams{ID: id, Owner: owner, Error: errText, Answer: answer}))
	check("RecordAttempt with an answer", st.RecordAttempt(ctx, &claim.RecordAttemptParams{ID: id, Owner: owner, Error: errText, Answer: answer}))
	check("Fail", st.Fail(ctx, &claim.FailParams{ID: id, Owner: owner, Reason: str("EffectRejected", 1, claim.MaxFailReasonLength),
		Error: errText, Answer: answer, DeadLetterSeq: seq}))
	check("TakeDeadLetter", st.TakeDeadLetter(ctx, &claim.TakeDeadLetterParams{ID: id, Seq: int64(size(1, 1<<40))}))
	_, err = st.TakeOver(ctx, &claim.TakeOverParams{ID: id, PreviousOwner: owner, Owner: uuid.New(), Path: claim.PathOperator,
		By: host, Reason: str("why", 1, maxFlagReason), Route: route, Fingerprint: print, NewKey: true})
	check("TakeOver with a new key", err)
	_, err = st.FlagStale(ctx, &claim.FlagStaleParams{StaleAfter: time.Duration(size(1, 1<<20)) * time.Second, Limit: size(1, 5000)})
	check("FlagStale", err)
	_, err = st.List(ctx, &claim.ListParams{States: []claim.State{claim.StateFlagged}, Consumer: str("c", 1, 200), OlderThan: time.Duration(size(1, 1<<20)) * time.Second, AfterID: id, Limit: size(1, 1000)})
	check("List", err)
	_, err = st.Get(ctx, id)
	check("Get", err)
	res := claim.ResolutionDone
	if long {
		res = claim.ResolutionDiscarded
	}
	_, err = st.Resolve(ctx, &claim.ResolveParams{ID: id, Resolution: res, By: str("o", 1, maxResolvedBy), Note: str("n", 0, maxNote)})
	check("Resolve", err)
	_, err = st.Resolve(ctx, &claim.ResolveParams{ID: id, Resolution: claim.ResolutionRedriven, By: str("o", 1, maxResolvedBy), Note: str("n", 1, maxNote)})
	check("Resolve redriven", err)
	_, err = st.Resolve(ctx, &claim.ResolveParams{ID: id, Resolution: claim.ResolutionRedriven, By: str("o", 1, maxResolvedBy), Note: str("n", 1, maxNote), Owner: owner, Answer: answer})
	check("Resolve by the redrive's owner", err)
	_, err = st.PurgeProcessed(ctx, &claim.PurgeParams{OlderThan: time.Duration(size(1, 1<<20)) * time.Second, Limit: size(1, 10000)})
	check("PurgeProcessed", err)
	unlock, ok, err := st.TryLock(ctx, str("l", 1, maxLockName))
	check("TryLock", err)
	if ok {
		check("unlock", unlock(ctx))
	}
	_, err = st.Stats(ctx)
	check("Stats", err)
	_, err = st.Now(ctx)
	check("Now", err)

	out := map[string]string{}
	for _, r := range rec.requests() {
		if r.Decls == nil {
			if len(r.Args) > 0 {
				t.Errorf("request with parameters but no declarations:\n%s", r.Query)
			}
			continue
		}
		d := strings.Join(r.Decls, ", ")
		if prev, ok := out[r.Query]; ok && prev != d {
			t.Errorf("one statement, two declaration lists in one run:\n%s\n%s\n%s", prev, d, r.Query)
		}
		out[r.Query] = d
	}
	return out
}

// TestCallWrapsParameterisedStatements: the request a parameterised
// statement becomes is a call of sp_executesql by name (go-mssqldb sends a
// one-word query with arguments as an RPC of that procedure), with the
// statement and declarations as nvarchar(max) and the values in order; a
// statement without parameters is a plain batch.
func TestCallWrapsParameterisedStatements(t *testing.T) {
	var a args
	p1 := a.add(int64(7), declID)
	p2 := a.add("m", declMessageID)
	q, vals := call("SELECT "+p1+", "+p2+";", a)
	if q != "sp_executesql" || len(vals) != 4 ||
		vals[0] != mssqldb.NVarCharMax("SELECT @p1, @p2;") ||
		vals[1] != mssqldb.NVarCharMax("@p1 bigint, @p2 nvarchar(128)") ||
		vals[2] != int64(7) || vals[3] != "m" {
		t.Fatalf("call: %q %#v", q, vals)
	}
	if q, vals := call("SELECT 1;", nil); q != "SELECT 1;" || vals != nil {
		t.Fatalf("call without parameters: %q %v", q, vals)
	}
}
