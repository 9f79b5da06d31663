package mssql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	mssqldb "github.com/microsoft/go-mssqldb"
)

// A fake database/sql driver that records every request the store sends
// and answers with what the test's handler returns. It cannot check T-SQL
// (there is no SQL Server here); it checks what can be checked without
// one: parameter numbering, the number of round trips, the control flow
// on driver errors, and scanning of the driver's value types.

type fakeRequest struct {
	Query string // the statement (unwrapped from the sp_executesql call)
	Args  []any  // its parameter values
	// Decls are the declared types of the parameters, as the store wrote
	// them in sp_executesql's @params ("bigint", "nvarchar(128)", ...).
	Decls []string
	Exec  bool // ExecContext rather than QueryContext
	InTx  bool
}

// fakeResult is one answer: result sets of rows (each row in column
// order), or an error.
type fakeResult struct {
	Sets [][][]driver.Value
	Err  error
}

type fakeHandler func(req fakeRequest) fakeResult

type fakeDB struct {
	t       *testing.T
	mu      sync.Mutex
	handler fakeHandler
	reqs    []fakeRequest
}

var (
	fakeSeq     atomic.Int64
	fakeDrivers sync.Map // name → *fakeDB
)

// newFakeDB returns a *sql.DB on the fake driver and the recorder.
func newFakeDB(t *testing.T, h fakeHandler) (*sql.DB, *fakeDB) {
	t.Helper()
	f := &fakeDB{t: t, handler: h}
	name := "fakemssql" + strconv.FormatInt(fakeSeq.Add(1), 10)
	fakeDrivers.Store(name, f)
	sql.Register(name, fakeDriver{f})
	db, err := sql.Open(name, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db, f
}

func (f *fakeDB) requests() []fakeRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]fakeRequest(nil), f.reqs...)
}

var placeholder = regexp.MustCompile(`@p(\d+)\b`)

// declRE is one parameter declaration the store writes.
var declRE = regexp.MustCompile(`^@p(\d+) (bigint|int|uniqueidentifier|n?varchar\((\d+|max)\)|varbinary\((\d+|max)\))$`)

// unwrap turns the store's sp_executesql call back into the statement, its
// declarations and its values. A request with parameters that does not
// come through sp_executesql fails the test: go-mssqldb would declare its
// parameters from the values' lengths.
func (f *fakeDB) unwrap(q string, args []any) (string, []string, []any) {
	f.t.Helper()
	if q != spExecuteSQL {
		if len(args) > 0 {
			f.t.Errorf("request with %d parameters not sent through sp_executesql (the driver would declare them from the values):\n%s", len(args), q)
		}
		return q, nil, args
	}
	if len(args) < 2 {
		f.t.Errorf("sp_executesql with %d arguments", len(args))
		return q, nil, nil
	}
	stmt, ok1 := args[0].(mssqldb.NVarCharMax)
	decl, ok2 := args[1].(mssqldb.NVarCharMax)
	if !ok1 || !ok2 {
		f.t.Errorf("sp_executesql's @stmt and @params are %T and %T, want nvarchar(max)", args[0], args[1])
	}
	vals := args[2:]
	parts := strings.Split(string(decl), ", ")
	if len(parts) != len(vals) {
		f.t.Errorf("%d declarations for %d values: %q", len(parts), len(vals), decl)
	}
	types := make([]string, len(parts))
	for i, p := range parts {
		m := declRE.FindStringSubmatch(p)
		if m == nil || m[1] != strconv.Itoa(i+1) {
			f.t.Errorf("declaration %d is %q", i+1, p)
			continue
		}
		types[i] = strings.TrimPrefix(p, "@p"+m[1]+" ")
		if i < len(vals) {
			checkFits(f.t, i+1, types[i], vals[i])
		}
	}
	return string(stmt), types, vals
}

// checkFits fails the test unless value v can be bound to a parameter
// declared decl without being cut: sp_executesql silently truncates a
// longer string or binary value to the declared length.
func checkFits(t *testing.T, n int, decl string, v any) {
	t.Helper()
	width := -1 // max
	if i := strings.IndexByte(decl, '('); i >= 0 && !strings.HasSuffix(decl, "(max)") {
		width, _ = strconv.Atoi(decl[i+1 : len(decl)-1])
	}
	size, kind := 0, ""
	switch v := v.(type) {
	case string:
		size, kind = utf16Len(v), "nvarchar"
	case mssqldb.NVarCharMax:
		size, kind = utf16Len(string(v)), "nvarchar"
	case mssqldb.VarChar:
		size, kind = len(v), "varchar"
	case []byte:
		size, kind = len(v), "varbinary"
	case int32:
		kind = "int"
	case int64:
		kind = "bigint"
	case mssqldb.UniqueIdentifier:
		kind = "uniqueidentifier"
	case sql.NullString: // a typed NULL (nvarchar)
		if v.Valid {
			t.Errorf("@p%d: a valid sql.NullString (send the text)", n)
		}
		kind = "nvarchar"
	case sql.NullInt64: // a typed NULL (bigint)
		if v.Valid {
			t.Errorf("@p%d: a valid sql.NullInt64 (send the int64)", n)
		}
		kind = "bigint"
	default:
		t.Errorf("@p%d: value of type %T", n, v)
		return
	}
	if base, _, _ := strings.Cut(decl, "("); base != kind {
		t.Errorf("@p%d: a %T declared %s", n, v, decl)
	}
	if width >= 0 && size > width {
		t.Errorf("@p%d: a value of %d units declared %s would be cut", n, size, decl)
	}
}

// serve records a request, checks its parameters against its text the way
// sp_executesql would (every @pN declared, every argument used), and asks
// the handler.
func (f *fakeDB) serve(req fakeRequest) fakeResult {
	f.t.Helper()
	used := map[int]bool{}
	for _, m := range placeholder.FindAllStringSubmatch(req.Query, -1) {
		n, _ := strconv.Atoi(m[1])
		if n < 1 || n > len(req.Args) {
			f.t.Errorf("query uses @p%d but has %d arguments:\n%s", n, len(req.Args), req.Query)
		}
		used[n] = true
	}
	for i := range req.Args {
		if !used[i+1] {
			f.t.Errorf("argument @p%d (%v) is not used:\n%s", i+1, req.Args[i], req.Query)
		}
	}
	if len(req.Args) > 2100 {
		f.t.Errorf("%d parameters; SQL Server takes at most 2100", len(req.Args))
	}
	f.mu.Lock()
	f.reqs = append(f.reqs, req)
	h := f.handler
	f.mu.Unlock()
	if h == nil {
		return fakeResult{}
	}
	return h(req)
}

type fakeDriver struct{ f *fakeDB }

func (d fakeDriver) Open(string) (driver.Conn, error) { return &fakeConn{f: d.f}, nil }

type fakeConn struct {
	f    *fakeDB
	inTx bool
}

var (
	_ driver.QueryerContext    = (*fakeConn)(nil)
	_ driver.ExecerContext     = (*fakeConn)(nil)
	_ driver.ConnBeginTx       = (*fakeConn)(nil)
	_ driver.NamedValueChecker = (*fakeConn)(nil)
)

func (c *fakeConn) Prepare(string) (driver.Stmt, error) {
	return nil, fmt.Errorf("fake driver: Prepare is not supported")
}
func (c *fakeConn) Close() error { return nil }
func (c *fakeConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}
func (c *fakeConn) BeginTx(context.Context, driver.TxOptions) (driver.Tx, error) {
	c.inTx = true
	return fakeTx{c}, nil
}

// CheckNamedValue converts every value with go-mssqldb's own converter, so
// the handler sees what the driver would send (mssql.UniqueIdentifier,
// mssql.NVarCharMax, ...) and a value the driver refuses fails here too.
func (c *fakeConn) CheckNamedValue(nv *driver.NamedValue) error {
	var real mssqldb.Conn
	return real.CheckNamedValue(nv)
}

func namedArgs(nv []driver.NamedValue) []any {
	out := make([]any, len(nv))
	for i, v := range nv {
		out[i] = v.Value
	}
	return out
}

func (c *fakeConn) QueryContext(_ context.Context, q string, nv []driver.NamedValue) (driver.Rows, error) {
	stmt, decls, args := c.f.unwrap(q, namedArgs(nv))
	r := c.f.serve(fakeRequest{Query: stmt, Args: args, Decls: decls, InTx: c.inTx})
	if r.Err != nil && len(r.Sets) == 0 {
		return nil, r.Err
	}
	return &fakeRows{sets: r.Sets, err: r.Err}, nil
}

func (c *fakeConn) ExecContext(_ context.Context, q string, nv []driver.NamedValue) (driver.Result, error) {
	stmt, decls, args := c.f.unwrap(q, namedArgs(nv))
	r := c.f.serve(fakeRequest{Query: stmt, Args: args, Decls: decls, Exec: true, InTx: c.inTx})
	if r.Err != nil {
		return nil, r.Err
	}
	return driver.RowsAffected(0), nil
}

type fakeTx struct{ c *fakeConn }

func (t fakeTx) Commit() error   { t.c.inTx = false; return nil }
func (t fakeTx) Rollback() error { t.c.inTx = false; return nil }

// fakeRows serves result sets; err (if any) comes after the last row of
// the last set, the way go-mssqldb reports an error raised by an earlier
// statement of the batch.
type fakeRows struct {
	sets [][][]driver.Value
	set  int
	row  int
	err  error
}

func (r *fakeRows) Columns() []string {
	if r.set < len(r.sets) && len(r.sets[r.set]) > 0 {
		cols := make([]string, len(r.sets[r.set][0]))
		for i := range cols {
			cols[i] = "c" + strconv.Itoa(i)
		}
		return cols
	}
	return columnNames
}
func (r *fakeRows) Close() error { return nil }
func (r *fakeRows) Next(dest []driver.Value) error {
	if r.set < len(r.sets) && r.row < len(r.sets[r.set]) {
		copy(dest, r.sets[r.set][r.row])
		r.row++
		return nil
	}
	if r.set >= len(r.sets)-1 && r.err != nil {
		err := r.err
		r.err = nil
		return err
	}
	return io.EOF
}
func (r *fakeRows) HasNextResultSet() bool { return r.set+1 < len(r.sets) }
func (r *fakeRows) NextResultSet() error {
	if !r.HasNextResultSet() {
		return io.EOF
	}
	r.set++
	r.row = 0
	return nil
}
