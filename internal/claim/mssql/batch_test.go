package mssql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	mssqldb "github.com/microsoft/go-mssqldb"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// fakeTable simulates dbo.Claims behind the fake driver, just enough for
// ClaimBatch / ClaimTx: rows by key, owners as the server stores them
// (the wire bytes it received), and an optional race: keys that another
// session commits while our set-based INSERT waits (the INSERT then fails
// with 2601 naming the claims index, and its SELECT still returns rows).
type fakeTable struct {
	mu     sync.Mutex
	nextID int64
	rows   map[[2]string][]driver.Value
	race   map[[2]string][]byte // key → payload hash of the racing claim
	setErr error                // error of the set-based INSERT (after racing)
}

func newFakeTable() *fakeTable {
	return &fakeTable{nextID: 1, rows: map[[2]string][]driver.Value{}, race: map[[2]string][]byte{}}
}

var dbNow = time.Date(2026, 11, 30, 10, 0, 0, 123456700, time.UTC)

// put stores a row as the server would return it.
func (ft *fakeTable) put(mid, cons string, owner mssqldb.UniqueIdentifier, hash []byte, state string) {
	wire, _ := owner.Value()
	ft.rows[[2]string{mid, cons}] = []driver.Value{
		ft.nextID, mid, cons, wire, state, "orders", "subj", "application/json", `{"k":"v"}`,
		hash, []byte("payload"), int64(1), "host", dbNow, dbNow, nil, nil, int64(0), "", nil, "", nil, "", "", "",
		"route", "fp", int64(0), nil, "", "", nil, "", int64(0), nil, nil, "",
		nil, "", nil, nil, nil, int64(0), "", "", nil, "", "scoped",
		nil, nil, int64(0), nil, "",
	}
	ft.nextID++
}

func (ft *fakeTable) existing(t *testing.T, mid, cons string, hash []byte) {
	t.Helper()
	ft.mu.Lock()
	defer ft.mu.Unlock()
	ft.put(mid, cons, mssqldb.UniqueIdentifier(uuid.New()), hash, "claimed")
}

// groups splits a claim INSERT's arguments (host, then 15 per row).
func groups(a []any) [][]any {
	var out [][]any
	for i := 1; i+15 <= len(a); i += 15 {
		out = append(out, a[i:i+15])
	}
	return out
}

func (ft *fakeTable) handle(req fakeRequest) fakeResult {
	ft.mu.Lock()
	defer ft.mu.Unlock()
	dup := func(mid, cons string) error {
		return mssqldb.Error{Number: 2601, Class: 14, Message: fmt.Sprintf(
			"Cannot insert duplicate key row in object 'dbo.Claims' with unique index 'UX_Claims_MessageId_Consumer'. The duplicate key value is (%s, %s).", mid, cons)}
	}
	var keys [][2]string
	var err error
	switch {
	case strings.Contains(req.Query, "INSERT INTO dbo.Claims"):
		setBased := strings.Contains(req.Query, "NOT EXISTS")
		if setBased {
			for k, hash := range ft.race {
				ft.put(k[0], k[1], mssqldb.UniqueIdentifier(uuid.New()), hash, "claimed")
				err = dup(k[0], k[1])
			}
			ft.race = map[[2]string][]byte{}
			if ft.setErr != nil {
				err = ft.setErr
			}
		}
		state := "claimed"
		if strings.Contains(req.Query, "'processed'") {
			state = "processed"
		}
		for _, g := range groups(req.Args) {
			k := [2]string{g[0].(string), g[1].(string)}
			keys = append(keys, k)
			if _, ok := ft.rows[k]; ok {
				if !setBased && err == nil {
					err = dup(k[0], k[1])
				}
				continue
			}
			if err == nil {
				ft.put(k[0], k[1], g[2].(mssqldb.UniqueIdentifier), g[7].([]byte), state)
			}
		}
		if !setBased {
			if req.Exec || err != nil {
				return fakeResult{Err: err}
			}
			return fakeResult{Sets: [][][]driver.Value{{ft.rows[keys[0]]}}}
		}
	default: // the SELECT of keys: pairs of (MessageId, Consumer)
		for i := 0; i+1 < len(req.Args); i += 2 {
			keys = append(keys, [2]string{req.Args[i].(string), req.Args[i+1].(string)})
		}
	}
	var set [][]driver.Value
	for _, k := range keys {
		if r, ok := ft.rows[k]; ok {
			set = append(set, r)
		}
	}
	return fakeResult{Sets: [][][]driver.Value{set}, Err: err}
}

func params(id, cons, body string) claim.ClaimParams {
	return claim.ClaimParams{
		Owner:     uuid.New(),
		MessageID: id, Consumer: cons, Entity: "orders", Subject: "s",
		PayloadHash: claim.HashPayload([]byte(body)), Payload: []byte(body), DeliveryCount: 1,
	}
}

func outcomes(res []claim.ClaimResult) string {
	var b strings.Builder
	for i, r := range res {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(r.Outcome.String())
	}
	return b.String()
}

func TestClaimBatchHappyPathIsOneRoundTrip(t *testing.T) {
	ft := newFakeTable()
	db, rec := newFakeDB(t, ft.handle)
	st := New(db)
	ft.existing(t, "dup", "c", claim.HashPayload([]byte("dup")))
	ft.existing(t, "conf", "c", claim.HashPayload([]byte("first")))

	batch := []claim.ClaimParams{params("x", "c", "x"), params("dup", "c", "dup"), params("conf", "c", "second"), params("x", "c", "x"), params("y", "c", "y")}
	res, err := st.ClaimBatch(context.Background(), &claim.ClaimBatchParams{Host: "h", Claims: batch})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := outcomes(res), "won duplicate conflict duplicate won"; got != want {
		t.Fatalf("outcomes %q, want %q", got, want)
	}
	reqs := rec.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want 1 round trip", len(reqs))
	}
	q := reqs[0].Query
	for _, want := range []string{"DECLARE @now datetime2(7) = SYSUTCDATETIME();", "INSERT INTO dbo.Claims", "WHERE NOT EXISTS", "INNER JOIN dbo.Claims AS c"} {
		if !strings.Contains(q, want) {
			t.Errorf("request lacks %q:\n%s", want, q)
		}
	}
	for _, banned := range []string{"MERGE", "HOLDLOCK", "IGNORE_DUP_KEY", "SERIALIZABLE"} {
		if strings.Contains(strings.ToUpper(q), banned) {
			t.Errorf("request uses %s:\n%s", banned, q)
		}
	}
	// 4 distinct keys: host + 4 × 15 parameters.
	if n := len(reqs[0].Args); n != 61 {
		t.Errorf("%d parameters, want 61", n)
	}
	// The won claims carry the owner token the store generated: the
	// uniqueidentifier survived SQL Server's mixed-endian byte order.
	if res[0].Claim.Owner == uuid.Nil || res[0].Claim.ID == res[4].Claim.ID {
		t.Errorf("won claims: %+v / %+v", res[0].Claim, res[4].Claim)
	}
	sent := map[string]uuid.UUID{}
	for _, g := range groups(reqs[0].Args) {
		sent[g[0].(string)] = uuid.UUID(g[2].(mssqldb.UniqueIdentifier))
	}
	if res[0].Claim.Owner != sent["x"] || res[4].Claim.Owner != sent["y"] {
		t.Errorf("owners %s/%s, sent %s/%s", res[0].Claim.Owner, res[4].Claim.Owner, sent["x"], sent["y"])
	}
	if res[0].Claim.ClaimedAt.Location() != time.UTC || !res[0].Claim.ClaimedAt.Equal(dbNow) {
		t.Errorf("ClaimedAt %v", res[0].Claim.ClaimedAt)
	}
	// Types the driver declares: a stable nvarchar(max) for free text, a
	// typed varbinary for the payload.
	g := groups(reqs[0].Args)[0]
	if _, ok := g[4].(mssqldb.NVarCharMax); !ok {
		t.Errorf("Subject sent as %T", g[4])
	}
	if _, ok := g[8].([]byte); !ok {
		t.Errorf("Payload sent as %T", g[8])
	}
}

// A row that carries the caller's own owner token is won again only while
// it is still claimed with the same payload hash (a retried batch whose
// first try committed); in any other state it is a duplicate, and with
// another hash a conflict, as for anybody else's row (sqlstore.Plan.Results).
// The conformance suite holds every store to this rule
// (RetriedBatchWinsItsOwnRowOnlyWhileClaimed); this runs it without a
// server, through both the set-based path and the fallback after a race.
func TestClaimBatchOwnTokenWinsOnlyAClaimedRow(t *testing.T) {
	for _, path := range []string{"set-based", "fallback"} {
		t.Run(path, func(t *testing.T) {
			ft := newFakeTable()
			db, _ := newFakeDB(t, ft.handle)
			states := []string{"claimed", "released", "processed", "failed", "flagged", "resolved"}
			var batch []claim.ClaimParams
			var want []string
			for _, state := range states {
				p := params("own-"+state, "c", "body")
				ft.put(p.MessageID, p.Consumer, mssqldb.UniqueIdentifier(p.Owner), p.PayloadHash, state)
				other := p
				other.MessageID += "-other-hash"
				other.PayloadHash = claim.HashPayload([]byte("another body"))
				ft.put(other.MessageID, other.Consumer, mssqldb.UniqueIdentifier(other.Owner), p.PayloadHash, state)
				batch = append(batch, p, other)
				if state == "claimed" {
					want = append(want, "won", "conflict")
				} else {
					want = append(want, "duplicate", "conflict")
				}
			}
			batch = append(batch, params("new", "c", "new"))
			want = append(want, "won")
			if path == "fallback" {
				ft.race[[2]string{"raced", "c"}] = claim.HashPayload([]byte("raced"))
				batch = append(batch, params("raced", "c", "raced"))
				want = append(want, "duplicate")
			}
			res, err := New(db).ClaimBatch(context.Background(), &claim.ClaimBatchParams{Host: "h", Claims: batch})
			if err != nil {
				t.Fatal(err)
			}
			if got := outcomes(res); got != strings.Join(want, " ") {
				t.Fatalf("outcomes\n %s\nwant\n %s\n(per pair: own token same hash, own token other hash; states %v)", got, strings.Join(want, " "), states)
			}
			for i, r := range res[:2*len(states)] {
				if r.Claim.Owner != batch[i].Owner || string(r.Claim.State) != states[i/2] {
					t.Errorf("message %d: claim owner %s state %s, want the existing row (owner %s, %s)", i, r.Claim.Owner, r.Claim.State, batch[i].Owner, states[i/2])
				}
			}
		})
	}
}

func TestClaimBatchNilPayloadIsATypedNull(t *testing.T) {
	ft := newFakeTable()
	db, rec := newFakeDB(t, ft.handle)
	p := params("x", "c", "x")
	p.Payload = nil
	if _, err := New(db).ClaimBatch(context.Background(), &claim.ClaimBatchParams{Claims: []claim.ClaimParams{p}}); err != nil {
		t.Fatal(err)
	}
	v := groups(rec.requests()[0].Args)[0][8]
	if b, ok := v.([]byte); !ok || b != nil {
		t.Fatalf("nil payload sent as %T %v, want []byte(nil) (varbinary NULL)", v, v)
	}
}

func TestClaimBatchFallsBackAfterARace(t *testing.T) {
	for _, tc := range []struct {
		name   string
		setErr error
	}{
		{"unique violation", nil},
		{"deadlock victim", mssqldb.Error{Number: 1205, Message: "Transaction (Process ID 52) was deadlocked"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ft := newFakeTable()
			db, rec := newFakeDB(t, ft.handle)
			st := New(db)
			ft.existing(t, "old", "c", claim.HashPayload([]byte("old")))
			// While our INSERT runs, another replica commits "y" (same body)
			// and "z" (another body).
			ft.race[[2]string{"y", "c"}] = claim.HashPayload([]byte("y"))
			ft.race[[2]string{"z", "c"}] = claim.HashPayload([]byte("other"))
			ft.setErr = tc.setErr

			batch := []claim.ClaimParams{params("z", "c", "z"), params("x", "c", "x"), params("old", "c", "old"), params("y", "c", "y")}
			res, err := st.ClaimBatch(context.Background(), &claim.ClaimBatchParams{Host: "h", Claims: batch})
			if err != nil {
				t.Fatal(err)
			}
			if got, want := outcomes(res), "conflict won duplicate duplicate"; got != want {
				t.Fatalf("outcomes %q, want %q", got, want)
			}
			// Only the index's violation is the race the counter counts.
			if got, want := st.ClaimRaces(), map[bool]int64{true: 1, false: 0}[tc.setErr == nil]; got != want {
				t.Errorf("ClaimRaces %d, want %d", got, want)
			}
			reqs := rec.requests()
			// set-based INSERT + one INSERT per key + one SELECT.
			if len(reqs) != 1+4+1 {
				t.Fatalf("%d requests, want 6", len(reqs))
			}
			for i, r := range reqs[1:5] {
				if !r.Exec || strings.Contains(r.Query, "NOT EXISTS") || len(groups(r.Args)) != 1 {
					t.Errorf("fallback request %d is not a single-row INSERT: %s", i, r.Query)
				}
			}
			// Keys are inserted in key order (the same lock order in every
			// replica).
			var order []string
			for _, r := range reqs[1:5] {
				order = append(order, groups(r.Args)[0][0].(string))
			}
			if got := strings.Join(order, ","); got != "old,x,y,z" {
				t.Errorf("fallback order %s, want old,x,y,z", got)
			}
		})
	}
}

func TestClaimBatchOtherErrorsDoNotFallBack(t *testing.T) {
	for _, tc := range []struct {
		name        string
		err         error
		unavailable bool
	}{
		{"other unique index", mssqldb.Error{Number: 2601, Message: "Cannot insert duplicate key row in object 'dbo.Claims' with unique index 'UX_Claims_SubjectKey'. The duplicate key value is (s)."}, false},
		{"connection lost", driver.ErrBadConn, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ft := newFakeTable()
			ft.setErr = tc.err
			db, rec := newFakeDB(t, ft.handle)
			_, err := New(db).ClaimBatch(context.Background(), &claim.ClaimBatchParams{Claims: []claim.ClaimParams{params("x", "c", "x")}})
			if err == nil || errors.Is(err, claim.ErrDuplicate) || errors.Is(err, claim.ErrUnavailable) != tc.unavailable {
				t.Fatalf("error %v", err)
			}
			if n := len(rec.requests()); n != 1 {
				t.Fatalf("%d requests, want 1 (no fallback)", n)
			}
		})
	}
}

func TestClaimBatchChunksLargeBatches(t *testing.T) {
	ft := newFakeTable()
	db, rec := newFakeDB(t, ft.handle)
	var batch []claim.ClaimParams
	for i := range 250 {
		batch = append(batch, params(fmt.Sprintf("m%03d", i), "c", "b"))
	}
	res, err := New(db).ClaimBatch(context.Background(), &claim.ClaimBatchParams{Claims: batch})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Outcome != claim.OutcomeWon || r.Claim.MessageID != batch[i].MessageID {
			t.Fatalf("message %d: %s %s", i, r.Outcome, r.Claim.MessageID)
		}
	}
	var sizes []int
	for _, r := range rec.requests() {
		sizes = append(sizes, len(groups(r.Args)))
	}
	if fmt.Sprint(sizes) != "[100 100 50]" {
		t.Fatalf("statements of %v rows, want [100 100 50]", sizes)
	}
}

func TestClaimTx(t *testing.T) {
	ft := newFakeTable()
	db, rec := newFakeDB(t, ft.handle)
	st := New(db)
	p := params("x", "ledger", "credit")
	called := false
	res, err := st.ClaimTx(context.Background(), &claim.ClaimTxParams{Host: "h", Claim: p}, func(_ context.Context, tx *sql.Tx) error {
		called = true
		return nil
	})
	if err != nil || !called || res.Outcome != claim.OutcomeWon || res.Claim.State != claim.StateProcessed {
		t.Fatalf("ClaimTx: %v called=%v %+v", err, called, res)
	}
	first := rec.requests()[0]
	if !first.InTx || !strings.Contains(first.Query, "OUTPUT INSERTED.Id") || strings.Contains(first.Query, "NOT EXISTS") {
		t.Errorf("ClaimTx insert:\n%s", first.Query)
	}
	if v := groups(first.Args)[0][8]; v.([]byte) != nil {
		t.Errorf("ClaimTx stored the payload: %v", v)
	}

	// Duplicate: fn not called, the existing claim is read outside the
	// transaction.
	called = false
	res, err = st.ClaimTx(context.Background(), &claim.ClaimTxParams{Host: "h", Claim: p}, func(context.Context, *sql.Tx) error {
		called = true
		return nil
	})
	if err != nil || called || res.Outcome != claim.OutcomeDuplicate {
		t.Fatalf("ClaimTx again: %v called=%v %s", err, called, res.Outcome)
	}
	reqs := rec.requests()
	if last := reqs[len(reqs)-1]; last.InTx || !strings.HasPrefix(last.Query, "SELECT") {
		t.Errorf("existing claim read in the transaction or not by SELECT:\n%s", last.Query)
	}

	// fn's error comes back as is.
	boom := errors.New("boom")
	_, err = st.ClaimTx(context.Background(), &claim.ClaimTxParams{Claim: params("y", "ledger", "b")}, func(context.Context, *sql.Tx) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("fn error: %v", err)
	}
}

// A key within MaxMessageIDLength runes but wider than nvarchar(128) in
// UTF-16 code units (characters outside the BMP take two) is refused
// before any request, instead of failing the INSERT with error 2628.
func TestClaimBatchChecksWidthsInUTF16(t *testing.T) {
	wide := strings.Repeat("😀", claim.MaxMessageIDLength/2+1) // 65 runes, 130 code units
	for name, p := range map[string]claim.ClaimParams{
		"message id": params(wide, "c", "b"),
		"consumer":   params("m", strings.Repeat("😀", 101), "b"),
	} {
		t.Run(name, func(t *testing.T) {
			ft := newFakeTable()
			db, rec := newFakeDB(t, ft.handle)
			if _, err := New(db).ClaimBatch(context.Background(), &claim.ClaimBatchParams{Claims: []claim.ClaimParams{p}}); err == nil {
				t.Fatal("no error")
			}
			if n := len(rec.requests()); n != 0 {
				t.Fatalf("%d requests, want none", n)
			}
		})
	}
	// 128 code units exactly is accepted.
	ft := newFakeTable()
	db, _ := newFakeDB(t, ft.handle)
	if _, err := New(db).ClaimBatch(context.Background(), &claim.ClaimBatchParams{Claims: []claim.ClaimParams{params(strings.Repeat("😀", 64), "c", "b")}}); err != nil {
		t.Fatal(err)
	}
}

// WriteOutcomes sends a batch of mixed writes in one round trip, with
// seven declared parameters per write, and reports per write: a claim the
// statement did not return gets ErrStateChanged, the others nil.
func TestWriteOutcomesIsOneRoundTrip(t *testing.T) {
	db, rec := newFakeDB(t, func(req fakeRequest) fakeResult {
		// Claims 1, 2 and 4 changed; 3's guard did not hold.
		return fakeResult{Sets: [][][]driver.Value{{{int64(1)}, {int64(2)}, {int64(4)}}}}
	})
	st := New(db)
	owner := uuid.New()
	writes := []claim.OutcomeWrite{
		{Heartbeat: &claim.HeartbeatParams{ID: 1, Owner: owner}},
		{RecordAttempt: &claim.RecordAttemptParams{ID: 2, Owner: owner, Error: "503", NextAttemptIn: 1500 * time.Millisecond}},
		{Release: &claim.ReleaseParams{ID: 3, Owner: owner, Error: "refused"}},
		{MarkProcessed: &claim.MarkProcessedParams{ID: 4, Owner: owner, Answer: &claim.Answer{Status: 201}}},
	}
	errs, err := st.WriteOutcomes(context.Background(), writes)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{false, false, true, false} {
		if got := errors.Is(errs[i], claim.ErrStateChanged); got != want || (!want && errs[i] != nil) {
			t.Errorf("write %d: %v", i, errs[i])
		}
	}
	reqs := rec.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want 1 round trip", len(reqs))
	}
	q := reqs[0].Query
	for _, want := range []string{"SET XACT_ABORT ON;", "BEGIN TRANSACTION;", "COMMIT TRANSACTION;", "OUTPUT INSERTED.Id INTO @done", "SELECT Id FROM @done;"} {
		if !strings.Contains(q, want) {
			t.Errorf("request lacks %q:\n%s", want, q)
		}
	}
	if n := strings.Count(q, "c.State = 'claimed'"); n != 4 {
		t.Errorf("%d guarded UPDATEs, want 4:\n%s", n, q)
	}
	if len(reqs[0].Args) != 4*7 || len(reqs[0].Decls) != 4*7 {
		t.Fatalf("%d parameters (%d declared), want 28", len(reqs[0].Args), len(reqs[0].Decls))
	}
	// The attempt's next attempt in 1.5s: 1 second and 500000 µs.
	if sec, us := reqs[0].Args[7+4], reqs[0].Args[7+5]; sec != int32(1) || us != int32(500000) {
		t.Errorf("next attempt sent as %v s + %v µs", sec, us)
	}
	if a, ok := reqs[0].Args[3*7+6].(mssqldb.NVarCharMax); !ok || !strings.Contains(string(a), `"status":201`) {
		t.Errorf("the processed write's answer sent as %T %v, want its JSON text", reqs[0].Args[3*7+6], reqs[0].Args[3*7+6])
	}
	if a, ok := reqs[0].Args[6].(sql.NullString); !ok || a.Valid {
		t.Errorf("the heartbeat's answer sent as %T %v, want a typed NULL", reqs[0].Args[6], reqs[0].Args[6])
	}
}

func TestWriteOutcomesRefusesABadBatch(t *testing.T) {
	db, rec := newFakeDB(t, func(fakeRequest) fakeResult { return fakeResult{} })
	st := New(db)
	owner := uuid.New()
	for name, writes := range map[string][]claim.OutcomeWrite{
		"two writes for one claim": {{Heartbeat: &claim.HeartbeatParams{ID: 1, Owner: owner}}, {MarkProcessed: &claim.MarkProcessedParams{ID: 1, Owner: owner}}},
		"a write of no kind":       {{}},
		"a write of two kinds":     {{Heartbeat: &claim.HeartbeatParams{ID: 1}, Release: &claim.ReleaseParams{ID: 1}}},
	} {
		if _, err := st.WriteOutcomes(context.Background(), writes); !errors.Is(err, claim.ErrBadBatch) {
			t.Errorf("%s: %v, want ErrBadBatch", name, err)
		}
	}
	if n := len(rec.requests()); n != 0 {
		t.Errorf("%d requests for refused batches", n)
	}
}
