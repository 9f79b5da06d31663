package mssql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf16"

	"github.com/google/uuid"
	mssqldb "github.com/microsoft/go-mssqldb"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/sqlstore"
)

var _ claim.Store = (*Store)(nil)

// Store is the SQL Server claims table (dbo.Claims).
type Store struct {
	db    *sql.DB
	races atomic.Int64
}

// ClaimRaces returns how many of ClaimBatch's set-based INSERTs failed with
// a violation of the claims unique index (2601/2627) and fell back to one
// INSERT per key: NOT EXISTS had filtered the keys already there, so the
// violation means another transaction's claim of one of the keys was in
// flight (uncommitted and, under READ_COMMITTED_SNAPSHOT, invisible to
// NOT EXISTS) and committed while the INSERT waited for it. It only grows;
// the conformance suite's race tests check that it moved. With
// READ_COMMITTED_SNAPSHOT off, NOT EXISTS itself waits for the in-flight
// claim and sees it, so a race shows as a wait, not as a violation.
func (s *Store) ClaimRaces() int64 { return s.races.Load() }

// New wraps an open database whose driver is go-mssqldb ("sqlserver" or
// "azuresql"). The caller owns the pool settings.
func New(db *sql.DB) *Store { return &Store{db: db} }

// DB returns the database the store uses.
func (s *Store) DB() *sql.DB { return s.db }

// Column widths the store checks or truncates to before sending (nvarchar
// lengths count UTF-16 code units).
const (
	maxEntity     = 400
	maxClaimedBy  = 256
	maxLastError  = 4000
	maxFlagReason = 400
	maxResolvedBy = 256
	maxNote       = 4000
)

// columnNames are the columns of dbo.Claims in scanClaim's order.
var columnNames = []string{
	"Id", "MessageId", "Consumer", "Owner", "State", "Entity", "Subject", "ContentType",
	"Properties", "PayloadHash", "Payload", "DeliveryCount", "ClaimedBy", "ClaimedUtc",
	"HeartbeatUtc", "ProcessedUtc", "ReleasedUtc", "Attempts", "LastError", "FlaggedUtc",
	"FlagReason", "ResolvedUtc", "ResolvedBy", "Resolution", "ResolutionNote",
	"Route", "Fingerprint", "TakeOvers", "TakenOverUtc", "TakeOverPath", "TakeOverReason",
	"PreviousOwner", "PreviousHolder", "Recoveries", "NextAttemptUtc", "LateSuccessUtc", "LateSuccessBy",
	"FailedUtc", "FailReason", "DeadLetterSeq", "Answer", "AnswerUtc",
	"KeyRevision", "EffectKey", "KeyRevisedBy", "KeyRevisedUtc", "KeyRevisionNote", "KeyForm",
	"DeferredSeq", "DueUtc", "Postponements", "PostponedUtc", "SessionId",
}

// cols returns the column list with each name prefixed ("c.", "INSERTED.").
func cols(prefix string) string {
	var b strings.Builder
	for i, c := range columnNames {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(prefix)
		b.WriteString(c)
	}
	return b.String()
}

var (
	columns         = cols("")
	insertedColumns = cols("INSERTED.")
	aliasedColumns  = cols("c.")
)

// Statements that write several times declare
//
//	DECLARE @now datetime2(7) = SYSUTCDATETIME();
//
// first: two SYSUTCDATETIME() calls in one statement are two readings of
// the clock, and the times of one event (ClaimedUtc and HeartbeatUtc of a
// new claim, ReleasedUtc and HeartbeatUtc of a release) must be equal.
const declareNow = "DECLARE @now datetime2(7) = SYSUTCDATETIME();\n"

// unfinished is the filter of IX_Claims_Unfinished. Queries over unfinished
// claims repeat it literally so the optimizer matches the filtered index.
const unfinished = "State IN ('claimed', 'released')"

func scanClaim(r interface{ Scan(...any) error }) (*claim.Claim, error) {
	var (
		c                                      claim.Claim
		owner                                  mssqldb.UniqueIdentifier
		previousOwner                          mssqldb.NullUniqueIdentifier
		state, props, resolution, path         string
		processed, released, flagged, resolved sql.NullTime
		takenOver, nextAttempt, lateSuccess    sql.NullTime
		failed, answerAt, keyRevised           sql.NullTime
		deadLetterSeq, deferredSeq             sql.NullInt64
		answer                                 sql.NullString
		due, postponed                         sql.NullTime
	)
	err := r.Scan(&c.ID, &c.MessageID, &c.Consumer, &owner, &state, &c.Entity, &c.Subject, &c.ContentType,
		&props, &c.PayloadHash, &c.Payload, &c.DeliveryCount, &c.ClaimedBy, &c.ClaimedAt,
		&c.HeartbeatAt, &processed, &released, &c.Attempts, &c.LastError, &flagged,
		&c.FlagReason, &resolved, &c.ResolvedBy, &resolution, &c.ResolutionNote,
		&c.Route, &c.Fingerprint, &c.TakeOvers, &takenOver, &path, &c.TakeOverReason,
		&previousOwner, &c.PreviousHolder, &c.Recoveries, &nextAttempt, &lateSuccess, &c.LateSuccessBy,
		&failed, &c.FailReason, &deadLetterSeq, &answer, &answerAt,
		&c.KeyRevision, &c.EffectKey, &c.KeyRevisedBy, &keyRevised, &c.KeyRevisionNote, &c.KeyForm,
		&deferredSeq, &due, &c.Postponements, &postponed, &c.SessionID)
	if err != nil {
		return nil, err
	}
	if deferredSeq.Valid {
		c.DeferredSeq = &deferredSeq.Int64
	}
	c.DueAt, c.PostponedAt = nullTime(due), nullTime(postponed)
	if answer.Valid {
		if c.Answer, err = sqlstore.DecodeAnswer(&answer.String); err != nil {
			return nil, fmt.Errorf("claim %d: %w", c.ID, err)
		}
	}
	if deadLetterSeq.Valid {
		c.DeadLetterSeq = &deadLetterSeq.Int64
	}
	// mssql.UniqueIdentifier holds the bytes in RFC 4122 (string) order,
	// having undone SQL Server's mixed-endian wire order in Scan, so it
	// converts to uuid.UUID as is.
	c.Owner = uuid.UUID(owner)
	if previousOwner.Valid {
		c.PreviousOwner = uuid.UUID(previousOwner.UUID)
	}
	c.State, c.Resolution, c.TakeOverPath = claim.State(state), claim.Resolution(resolution), claim.TakeOverPath(path)
	if c.Properties, err = sqlstore.DecodeProperties(props); err != nil {
		return nil, fmt.Errorf("claim %d: %w", c.ID, err)
	}
	c.ClaimedAt, c.HeartbeatAt = c.ClaimedAt.UTC(), c.HeartbeatAt.UTC()
	c.ProcessedAt, c.ReleasedAt = nullTime(processed), nullTime(released)
	c.FlaggedAt, c.ResolvedAt = nullTime(flagged), nullTime(resolved)
	c.TakenOverAt, c.NextAttemptAt, c.LateSuccessAt = nullTime(takenOver), nullTime(nextAttempt), nullTime(lateSuccess)
	c.FailedAt, c.AnswerAt, c.KeyRevisedAt = nullTime(failed), nullTime(answerAt), nullTime(keyRevised)
	return &c, nil
}

func nullTime(t sql.NullTime) *time.Time {
	if !t.Valid {
		return nil
	}
	u := t.Time.UTC()
	return &u
}

// guid converts a uuid to the driver's uniqueidentifier parameter, which
// sends the bytes in SQL Server's mixed-endian order.
func guid(u uuid.UUID) mssqldb.UniqueIdentifier { return mssqldb.UniqueIdentifier(u) }

// text sends free text as an nvarchar(max) value (the declared type of
// its parameter is call's business: see args).
func text(s string) mssqldb.NVarCharMax { return mssqldb.NVarCharMax(s) }

// truncate shortens s to at most n UTF-16 code units (the unit of an
// nvarchar(n) column), never splitting a surrogate pair.
func truncate(s string, n int) string {
	units := 0
	for i, r := range s {
		w := utf16.RuneLen(r)
		if w < 0 {
			w = 1 // invalid rune: sent as U+FFFD
		}
		if units+w > n {
			return s[:i]
		}
		units += w
	}
	return s
}

// utf16Len is the nvarchar length of s.
func utf16Len(s string) int { return len(utf16.Encode([]rune(s))) }

// SQL Server declared types of the parameters, one per column or value
// kind. Every parameter of every statement is declared with one of these,
// never with a length taken from its value (see call).
const (
	declID          = "bigint"
	declInt         = "int"
	declGUID        = "uniqueidentifier"
	declMessageID   = "nvarchar(128)" // MessageId; claim.MaxMessageIDLength
	declConsumer    = "nvarchar(200)" // Consumer; sqlstore.MaxConsumerLength
	declEntity      = "nvarchar(400)" // Entity; maxEntity
	declText        = "nvarchar(max)" // Subject, ContentType, Properties
	declHost        = "nvarchar(256)" // ClaimedBy, ResolvedBy
	declLongText    = "nvarchar(4000)"
	declFlagReason  = "nvarchar(400)"
	declResolution  = "varchar(16)"
	declPayloadHash = "varbinary(32)"
	declPayload     = "varbinary(max)"
	declLockName    = "nvarchar(255)" // sp_getapplock's @Resource
	// Route is nvarchar(64): route names are at most 64 characters
	// (sqlstore.MaxRouteLength counts runes), which is at most 128 UTF-16
	// code units; a declaration wider than the column never cuts a value
	// (an over-long one fails the INSERT instead).
	declRoute       = "nvarchar(128)"
	declFingerprint = "varchar(64)"   // Fingerprint; sqlstore.MaxFingerprintLength bytes
	declPath        = "varchar(16)"   // TakeOverPath
	declFailReason  = "nvarchar(64)"  // FailReason; claim.MaxFailReasonLength
	declAnswer      = "nvarchar(max)" // Answer (JSON text, at most claim.MaxAnswerBytes)
	declKey         = "nvarchar(255)" // EffectKey; claim.MaxKeyLength
	declKeyForm     = "varchar(8)"    // KeyForm
	declSessionID   = "nvarchar(128)" // SessionId
	declWhat        = "varchar(32)"   // ClaimHistory.What
)

// historyInto is the OUTPUT ... INTO dbo.ClaimHistory clause of a guarded
// write: the statement appends one history row per row it changed, in the
// same statement (an OUTPUT INTO target may have no trigger, foreign key
// or CHECK constraint, and dbo.ClaimHistory has none). what, from, by,
// path, reason and previous are expressions over INSERTED / DELETED and
// the statement's parameters; the new state, owner and key are the
// changed row's.
func historyInto(what, from, by, path, reason, previous string) string {
	return `OUTPUT INSERTED.Id, SYSUTCDATETIME(), ` + what + `, ` + from + `, INSERTED.State, ` + by + `, ` + path + `,
    LEFT(` + reason + `, ` + strconv.Itoa(claim.MaxHistoryReason) + `), ` + previous + `, INSERTED.Owner,
    CASE WHEN INSERTED.EffectKey <> N'' THEN INSERTED.EffectKey ELSE INSERTED.MessageId END
INTO dbo.ClaimHistory (ClaimId, AtUtc, What, FromState, ToState, ByWhom, Path, Reason, PreviousOwner, Owner, IdempotencyKey)
`
}

// simpleHistory is historyInto for a write that is no take-over, from a
// known state.
func simpleHistory(what claim.Change, from, by, reason string) string {
	return historyInto("'"+string(what)+"'", from, by, "''", reason, "NULL")
}

// answerParam is an answer as a parameter: its JSON text, or a typed
// NULL (nvarchar) for none.
func answerParam(a *claim.Answer) (any, error) {
	s, err := sqlstore.EncodeAnswer(a)
	if err != nil || !s.Valid {
		return sql.NullString{}, err
	}
	return text(s.String), nil
}

// setAnswer is the SET clause that records the answer in placeholder p:
// a NULL keeps the claim's. It uses @now (declareNow).
func setAnswer(p string) string {
	return "Answer = COALESCE(" + p + ", Answer), AnswerUtc = CASE WHEN " + p + " IS NULL THEN AnswerUtc ELSE @now END"
}

// param is one statement parameter: its value, and the SQL type the
// statement declares it with.
type param struct {
	v    any
	decl string
}

// args collects positional parameters; add returns the placeholder
// (@p1, @p2, ...) of the parameter.
type args []param

func (a *args) add(v any, decl string) string {
	*a = append(*a, param{v, decl})
	return "@p" + strconv.Itoa(len(*a))
}

// call returns what to hand database/sql for statement q with parameters
// a: the name of the procedure sp_executesql, then the statement, its
// parameter declarations ("@p1 bigint, @p2 nvarchar(128), ...") and the
// values. go-mssqldb sends a query name alone on its line as an RPC call
// of that procedure with the arguments as positional parameters, which is
// the call it would make itself for q, except that it would write the
// declarations from the values: nvarchar(<its length>) for a string,
// varbinary(<its length>) for a []byte. SQL Server caches a plan per
// statement text AND declaration list, so those would make a new plan per
// combination of lengths (a compile per ClaimBatch, a bloated plan cache);
// these declarations depend on the statement only. A value longer than
// its declared type would be cut to it: every caller checks or truncates
// values to their column's width first. A statement without parameters is
// sent as a plain batch.
func call(q string, a args) (string, []any) {
	if len(a) == 0 {
		return q, nil
	}
	decls := make([]string, len(a))
	vals := make([]any, 0, len(a)+2)
	vals = append(vals, mssqldb.NVarCharMax(q), nil)
	for i, p := range a {
		decls[i] = "@p" + strconv.Itoa(i+1) + " " + p.decl
		vals = append(vals, p.v)
	}
	vals[1] = mssqldb.NVarCharMax(strings.Join(decls, ", "))
	return spExecuteSQL, vals
}

// spExecuteSQL is the procedure every parameterised statement is sent
// through (see call).
const spExecuteSQL = "sp_executesql"

// agoSQL returns the SQL for "the database clock minus d", adding its
// parameters to a. DATEADD takes an int, so d is split into seconds
// (capped at 68 years) and the microsecond remainder.
func agoSQL(a *args, d time.Duration) string {
	if d < 0 {
		d = 0
	}
	sec := min(int64(d/time.Second), math.MaxInt32)
	us := int32((d % time.Second) / time.Microsecond)
	return "DATEADD(microsecond, -" + a.add(us, declInt) + ", DATEADD(second, -" + a.add(int32(sec), declInt) + ", SYSUTCDATETIME()))"
}

// querier is *sql.DB, *sql.Tx or *sql.Conn.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// query runs q and calls each for every row of every result set. It always
// reads the response to its end: go-mssqldb reports an error raised by
// any statement of a batch only with the batch's last DONE token, and
// closing rows early cancels the request (it sends an attention), so a
// caller that stopped after the first row could miss an error or cancel a
// statement that had not finished. Never use QueryRow for writes here.
func query(ctx context.Context, q querier, query string, a args, each func(*sql.Rows) error) error {
	text, vals := call(query, a)
	rows, err := q.QueryContext(ctx, text, vals...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for {
		for rows.Next() {
			if err := each(rows); err != nil {
				return err
			}
		}
		if !rows.NextResultSet() {
			break
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	return rows.Close()
}

// queryClaims runs q and scans every row as a claim.
func queryClaims(ctx context.Context, q querier, sqlText string, a args) ([]*claim.Claim, error) {
	var out []*claim.Claim
	err := query(ctx, q, sqlText, a, func(r *sql.Rows) error {
		c, err := scanClaim(r)
		if err != nil {
			return err
		}
		out = append(out, c)
		return nil
	})
	if err != nil {
		return nil, interpretError(err)
	}
	return out, nil
}

// execGuarded runs an UPDATE ... OUTPUT INSERTED.Id guarded on Id, Owner
// and State, and reports ErrStateChanged when it matched no row.
func (s *Store) execGuarded(ctx context.Context, op string, id int64, sqlText string, a ...param) error {
	n := 0
	err := query(ctx, s.db, sqlText, a, func(*sql.Rows) error { n++; return nil })
	if err != nil {
		return fmt.Errorf("%s claim %d: %w", op, id, interpretError(err))
	}
	if n == 0 {
		return fmt.Errorf("%s claim %d: %w", op, id, claim.ErrStateChanged)
	}
	return nil
}

// laterSQL returns the SQL for "the database clock plus d", adding its
// parameters to a (see agoSQL).
func laterSQL(a *args, d time.Duration) string {
	if d < 0 {
		d = 0
	}
	sec := min(int64(d/time.Second), math.MaxInt32)
	us := int32((d % time.Second) / time.Microsecond)
	return "DATEADD(microsecond, " + a.add(us, declInt) + ", DATEADD(second, " + a.add(int32(sec), declInt) + ", SYSUTCDATETIME()))"
}

// takeOverPath returns the precondition of a take-over path beyond owner
// and route, adding its parameters to a. The staleness tests are in the
// UPDATE's own WHERE: SQL Server reads the row under an update lock before
// it changes it, so a heartbeat that committed first is seen (under
// READ_COMMITTED_SNAPSHOT too: an UPDATE reads the latest committed
// version of the rows it modifies).
func takeOverPath(a *args, p *claim.TakeOverParams) string {
	switch p.Path {
	case claim.PathRedelivery:
		var seq any = sql.NullInt64{}
		if p.Seq != nil {
			seq = *p.Seq
		}
		return "(State = 'released' OR (State = 'claimed' AND HeartbeatUtc < " + agoSQL(a, p.SilentFor) + "))" +
			" AND (DeferredSeq IS NULL OR DeferredSeq = " + a.add(seq, declID) + ")"
	case claim.PathReconciler:
		return unfinished + " AND HeartbeatUtc < " + agoSQL(a, p.SilentFor) +
			" AND (NextAttemptUtc IS NULL OR NextAttemptUtc <= SYSUTCDATETIME())"
	}
	if p.Retry {
		return "State = 'failed'"
	}
	return "State = 'flagged'"
}

// TakeOver gives the claim to a new owner if it still qualifies (see
// claim.Store). Exactly one concurrent caller matches the guard.
func (s *Store) TakeOver(ctx context.Context, params *claim.TakeOverParams) (*claim.Claim, error) {
	if err := sqlstore.ValidateTakeOver(params); err != nil {
		return nil, err
	}
	var a args
	owner, by := a.add(guid(params.Owner), declGUID), a.add(text(truncate(params.By, maxClaimedBy)), declHost)
	count := a.add(int32(min(params.DeliveryCount, math.MaxInt32)), declInt)
	path, reason := a.add(mssqldb.VarChar(params.Path), declPath), a.add(text(truncate(params.Reason, maxFlagReason)), declFlagReason)
	route, print := a.add(text(params.Route), declRoute), a.add(mssqldb.VarChar(params.Fingerprint), declFingerprint)
	id, previous := a.add(params.ID, declID), a.add(guid(params.PreviousOwner), declGUID)
	nk := int32(0)
	if params.NewKey {
		nk = 1
	}
	newKey := a.add(nk, declInt)
	key, revision, err := sqlstore.NextKey(ctx, s.Get, params)
	if err != nil {
		return nil, err
	}
	keyP, revisionP := a.add(text(key), declKey), a.add(int32(revision), declInt)
	what := a.add(mssqldb.VarChar(sqlstore.TakeOverChange(params)), declWhat)
	guard := takeOverPath(&a, params)
	out, err := queryClaims(ctx, s.db, declareNow+`UPDATE dbo.Claims
SET State = 'claimed', Owner = `+owner+`, ClaimedBy = `+by+`, TakenOverFrom = State,
    DeliveryCount = CASE WHEN `+count+` > 0 THEN `+count+` ELSE DeliveryCount END,
    HeartbeatUtc = @now, TakenOverUtc = @now, TakeOvers = TakeOvers + 1,
    TakeOverPath = `+path+`, TakeOverReason = `+reason+`, PreviousOwner = Owner, PreviousHolder = ClaimedBy,
    Recoveries = Recoveries + CASE WHEN `+path+` = 'reconciler' THEN 1 ELSE 0 END, NextAttemptUtc = NULL,
    DeadLetterSeq = CASE WHEN State = 'failed' THEN NULL ELSE DeadLetterSeq END,
    Route = CASE WHEN Route = N'' THEN `+route+` ELSE Route END,
    Fingerprint = CASE WHEN Route = N'' THEN `+print+` ELSE Fingerprint END,
    KeyRevision = KeyRevision + `+newKey+`,
    EffectKey = CASE WHEN `+newKey+` = 1 THEN `+keyP+` ELSE EffectKey END,
    KeyRevisedBy = CASE WHEN `+newKey+` = 1 THEN `+by+` ELSE KeyRevisedBy END,
    KeyRevisedUtc = CASE WHEN `+newKey+` = 1 THEN @now ELSE KeyRevisedUtc END,
    KeyRevisionNote = CASE WHEN `+newKey+` = 1 THEN `+reason+` ELSE KeyRevisionNote END,
    DeferredSeq = CASE WHEN `+path+` = 'redelivery' THEN NULL ELSE DeferredSeq END, DueUtc = NULL
`+historyInto(what, "DELETED.State", "INSERTED.ClaimedBy", "INSERTED.TakeOverPath", "INSERTED.TakeOverReason", "DELETED.Owner")+
		`OUTPUT `+insertedColumns+`
WHERE Id = `+id+` AND Owner = `+previous+`
  AND (Route = N'' OR (Route = `+route+` AND Fingerprint = `+print+`))
  AND (`+newKey+` = 0 OR KeyRevision = `+revisionP+`)
  AND `+guard+`;`, a)
	if err != nil {
		return nil, fmt.Errorf("take over claim %d: %w", params.ID, err)
	}
	if len(out) == 0 {
		now, gerr := s.Get(ctx, params.ID)
		if gerr != nil && !errors.Is(gerr, claim.ErrNotFound) {
			return nil, fmt.Errorf("take over claim %d: refused, then: %w", params.ID, gerr)
		}
		return now, sqlstore.TakeOverRefused(params, now)
	}
	return out[0], nil
}

// Flag hands a claim to operators, guarded on owner, state and silence.
func (s *Store) Flag(ctx context.Context, params *claim.FlagParams) (*claim.Claim, error) {
	if err := sqlstore.ValidateFlagOne(params); err != nil {
		return nil, err
	}
	var a args
	reason := a.add(text(truncate(params.Reason, maxFlagReason)), declFlagReason)
	by := a.add(text(truncate(params.By, maxClaimedBy)), declHost)
	q := `UPDATE dbo.Claims SET State = 'flagged', FlaggedUtc = SYSUTCDATETIME(), FlagReason = ` + reason + `, FlaggedFrom = State
` + simpleHistory(claim.ChangeFlagged, "DELETED.State", "COALESCE(NULLIF("+by+", N''), INSERTED.ClaimedBy)", "INSERTED.FlagReason") +
		`OUTPUT ` + insertedColumns + `
WHERE Id = ` + a.add(params.ID, declID) + ` AND Owner = ` + a.add(guid(params.Owner), declGUID) + ` AND State = '` + string(params.State) + `'` // validated: claimed or released
	if params.SilentFor > 0 {
		q += " AND HeartbeatUtc < " + agoSQL(&a, params.SilentFor)
	}
	out, err := queryClaims(ctx, s.db, q+";", a)
	if err != nil {
		return nil, fmt.Errorf("flag claim %d: %w", params.ID, err)
	}
	if len(out) == 0 {
		if _, gerr := s.Get(ctx, params.ID); gerr != nil {
			return nil, fmt.Errorf("flag: %w", gerr)
		}
		return nil, fmt.Errorf("flag claim %d: %w", params.ID, claim.ErrStateChanged)
	}
	return out[0], nil
}

// FindStale lists recovery candidates, oldest heartbeat first, from the
// filtered index IX_Claims_Unfinished.
func (s *Store) FindStale(ctx context.Context, params *claim.FindStaleParams) ([]*claim.Claim, error) {
	staleAfter, limit, err := sqlstore.ValidateFindStale(params)
	if err != nil {
		return nil, err
	}
	var a args
	top := a.add(int64(limit), declID)
	q := `SELECT TOP (` + top + `) ` + columns + ` FROM dbo.Claims
WHERE ` + unfinished + ` AND HeartbeatUtc < ` + agoSQL(&a, staleAfter) + `
  AND (NextAttemptUtc IS NULL OR NextAttemptUtc <= SYSUTCDATETIME())
ORDER BY HeartbeatUtc;`
	out, err := queryClaims(ctx, s.db, q, a)
	if err != nil {
		return nil, fmt.Errorf("find stale claims: %w", err)
	}
	return out, nil
}

// RecordLateSuccess notes a late success on the claim.
func (s *Store) RecordLateSuccess(ctx context.Context, params *claim.LateSuccessParams) error {
	err := s.execGuarded(ctx, "record late success of", params.ID, `UPDATE dbo.Claims
SET LateSuccessUtc = SYSUTCDATETIME(), LateSuccessBy = @p1
OUTPUT INSERTED.Id
WHERE Id = @p2;`, param{text(truncate(sqlstore.LateSuccessBy(params), maxClaimedBy)), declHost}, param{params.ID, declID})
	if errors.Is(err, claim.ErrStateChanged) {
		return fmt.Errorf("record late success of claim %d: %w", params.ID, claim.ErrNotFound)
	}
	return err
}

// Heartbeat refreshes the heartbeat of a claimed claim held by Owner.
func (s *Store) Heartbeat(ctx context.Context, params *claim.HeartbeatParams) error {
	return s.execGuarded(ctx, "heartbeat", params.ID, `UPDATE dbo.Claims
SET HeartbeatUtc = SYSUTCDATETIME()
OUTPUT INSERTED.Id
WHERE Id = @p1 AND Owner = @p2 AND State = 'claimed';`,
		param{params.ID, declID}, param{guid(params.Owner), declGUID})
}

// MarkProcessed moves a claimed claim held by Owner to processed and
// drops its stored payload.
func (s *Store) MarkProcessed(ctx context.Context, params *claim.MarkProcessedParams) error {
	answer, err := answerParam(params.Answer)
	if err != nil {
		return fmt.Errorf("mark processed claim %d: %w", params.ID, err)
	}
	q := declareNow + `UPDATE dbo.Claims
SET State = 'processed', ProcessedUtc = @now, Payload = NULL, ` + setAnswer("@p3") + `
` + simpleHistory(claim.ChangeProcessed, "DELETED.State", "INSERTED.ClaimedBy", "N''") + `OUTPUT INSERTED.Id
WHERE Id = @p1 AND Owner = @p2 AND State = 'claimed';`
	a := args{param{params.ID, declID}, param{guid(params.Owner), declGUID}, param{answer, declAnswer}}
	if len(params.FollowUps) == 0 {
		return s.execGuarded(ctx, "mark processed", params.ID, q, a...)
	}
	// Its follow-ups in the same transaction, only when the guard held.
	if err := claim.ValidateNumbered(params.ID, params.FollowUps); err != nil {
		return err
	}
	return s.inTx(ctx, fmt.Sprintf("mark processed claim %d", params.ID), func(tx *sql.Tx) error {
		n := 0
		if err := query(ctx, tx, q, a, func(*sql.Rows) error { n++; return nil }); err != nil {
			return fmt.Errorf("mark processed claim %d: %w", params.ID, interpretError(err))
		}
		if n == 0 {
			return fmt.Errorf("mark processed claim %d: %w", params.ID, claim.ErrStateChanged)
		}
		return insertFollowUps(ctx, tx, params.ID, params.FollowUps)
	})
}

// Fail moves a claimed claim held by Owner to failed and drops its
// stored payload.
func (s *Store) Fail(ctx context.Context, params *claim.FailParams) error {
	if err := sqlstore.ValidateFail(params); err != nil {
		return err
	}
	answer, err := answerParam(params.Answer)
	if err != nil {
		return fmt.Errorf("fail claim %d: %w", params.ID, err)
	}
	var seq any = sql.NullInt64{}
	if params.DeadLetterSeq != nil {
		seq = *params.DeadLetterSeq
	}
	return s.execGuarded(ctx, "fail", params.ID, declareNow+`UPDATE dbo.Claims
SET State = 'failed', FailedUtc = @now, FailReason = @p3, LastError = @p4, DeadLetterSeq = @p5, `+setAnswer("@p6")+`
`+simpleHistory(claim.ChangeFailed, "DELETED.State", "INSERTED.ClaimedBy", "INSERTED.FailReason + N': ' + INSERTED.LastError")+`OUTPUT INSERTED.Id
WHERE Id = @p1 AND Owner = @p2 AND State = 'claimed';`,
		param{params.ID, declID}, param{guid(params.Owner), declGUID}, param{text(truncate(params.Reason, claim.MaxFailReasonLength)), declFailReason},
		param{text(truncate(params.Error, maxLastError)), declLongText}, param{seq, declID}, param{answer, declAnswer})
}

// TakeDeadLetter records the delivery that dead-letters a failed claim's
// message, when none does yet.
func (s *Store) TakeDeadLetter(ctx context.Context, params *claim.TakeDeadLetterParams) error {
	err := s.execGuarded(ctx, "take the dead letter of", params.ID, `UPDATE dbo.Claims
SET DeadLetterSeq = @p2
`+simpleHistory(claim.ChangeDeadLetter, "DELETED.State", "COALESCE(NULLIF(@p3, N''), INSERTED.ClaimedBy)",
		"N'sequence number ' + CAST(INSERTED.DeadLetterSeq AS nvarchar(20))")+`OUTPUT INSERTED.Id
WHERE Id = @p1 AND State = 'failed' AND DeadLetterSeq IS NULL;`,
		param{params.ID, declID}, param{params.Seq, declID}, param{text(truncate(params.By, maxClaimedBy)), declHost})
	if errors.Is(err, claim.ErrStateChanged) {
		if _, gerr := s.Get(ctx, params.ID); gerr != nil {
			return fmt.Errorf("take the dead letter: %w", gerr)
		}
	}
	return err
}

// Release moves a claimed claim held by Owner to released. HeartbeatUtc is
// set to the release time, so the reconciler's one predicate
// (HeartbeatUtc older than StaleAfter) finds a release nobody took over.
func (s *Store) Release(ctx context.Context, params *claim.ReleaseParams) error {
	answer, err := answerParam(params.Answer)
	if err != nil {
		return fmt.Errorf("release claim %d: %w", params.ID, err)
	}
	a := args{{params.ID, declID}, {guid(params.Owner), declGUID}, {text(truncate(params.Error, maxLastError)), declLongText}, {answer, declAnswer}}
	next := "NULL"
	if params.NextAttemptIn > 0 {
		next = laterSQL(&a, params.NextAttemptIn)
	}
	return s.execGuarded(ctx, "release", params.ID, declareNow+`UPDATE dbo.Claims
SET State = 'released', ReleasedUtc = @now, HeartbeatUtc = @now, LastError = @p3, NextAttemptUtc = `+next+`,
    DueUtc = NULL, `+setAnswer("@p4")+`
`+simpleHistory(claim.ChangeReleased, "DELETED.State", "INSERTED.ClaimedBy", "INSERTED.LastError")+`OUTPUT INSERTED.Id
WHERE Id = @p1 AND Owner = @p2 AND State = 'claimed';`, a...)
}

// RecordAttempt counts an effect attempt on a claimed claim held by Owner;
// a positive NextAttemptIn sets the next attempt's time.
func (s *Store) RecordAttempt(ctx context.Context, params *claim.RecordAttemptParams) error {
	answer, err := answerParam(params.Answer)
	if err != nil {
		return fmt.Errorf("record attempt claim %d: %w", params.ID, err)
	}
	a := args{{params.ID, declID}, {guid(params.Owner), declGUID}, {text(truncate(params.Error, maxLastError)), declLongText}, {answer, declAnswer}}
	next := "NextAttemptUtc"
	if params.NextAttemptIn > 0 {
		next = laterSQL(&a, params.NextAttemptIn)
	}
	return s.execGuarded(ctx, "record attempt", params.ID, declareNow+`UPDATE dbo.Claims
SET Attempts = Attempts + 1, LastError = @p3, NextAttemptUtc = `+next+`, `+setAnswer("@p4")+`
`+simpleHistory(claim.ChangeAttempt, "DELETED.State", "INSERTED.ClaimedBy", "INSERTED.LastError")+`OUTPUT INSERTED.Id
WHERE Id = @p1 AND Owner = @p2 AND State = 'claimed';`, a...)
}

// writeOutcomesSQL performs a batch of outcome writes in one round trip
// and one transaction: the writes (kind, id, owner, error, next attempt in
// seconds and microseconds, answer) go into a table variable from a
// VALUES list, each kind's UPDATE takes its rows, guarded on owner and
// state like the single write, and the ids it changed come back. A batch
// has at most one write per claim, so no two UPDATEs touch one row.
// XACT_ABORT rolls the whole batch back on any error. %s is the VALUES
// rows.
var writeOutcomesSQL = `SET XACT_ABORT ON;
` + declareNow + `DECLARE @w TABLE (Kind tinyint NOT NULL, Id bigint NOT NULL PRIMARY KEY, Owner uniqueidentifier NOT NULL,
	Err nvarchar(4000) NOT NULL, NextSec int NOT NULL, NextUs int NOT NULL, Answer nvarchar(max) NULL);
INSERT INTO @w (Kind, Id, Owner, Err, NextSec, NextUs, Answer) VALUES %s;
-- @done: the claims each UPDATE changed, with what their history records
-- (a heartbeat changes neither owner nor state: What NULL, no history).
DECLARE @done TABLE (Id bigint NOT NULL, What varchar(32) NULL, ToState varchar(16) NULL, ByWhom nvarchar(256) NULL,
	Reason nvarchar(4000) NULL, Owner uniqueidentifier NULL, IdempotencyKey nvarchar(255) NULL);
BEGIN TRANSACTION;
UPDATE c SET HeartbeatUtc = SYSUTCDATETIME()
OUTPUT INSERTED.Id INTO @done (Id)
FROM dbo.Claims AS c JOIN @w AS w ON w.Id = c.Id
WHERE w.Kind = ` + kindHeartbeat + ` AND c.Owner = w.Owner AND c.State = 'claimed';
UPDATE c SET Attempts = c.Attempts + 1, LastError = w.Err,
	NextAttemptUtc = CASE WHEN w.NextSec > 0 OR w.NextUs > 0 THEN DATEADD(microsecond, w.NextUs, DATEADD(second, w.NextSec, @now)) ELSE c.NextAttemptUtc END,
	Answer = COALESCE(w.Answer, c.Answer), AnswerUtc = CASE WHEN w.Answer IS NULL THEN c.AnswerUtc ELSE @now END
OUTPUT INSERTED.Id, 'attempt', INSERTED.State, INSERTED.ClaimedBy, INSERTED.LastError, INSERTED.Owner,
	CASE WHEN INSERTED.EffectKey <> N'' THEN INSERTED.EffectKey ELSE INSERTED.MessageId END
	INTO @done (Id, What, ToState, ByWhom, Reason, Owner, IdempotencyKey)
FROM dbo.Claims AS c JOIN @w AS w ON w.Id = c.Id
WHERE w.Kind = ` + kindAttempt + ` AND c.Owner = w.Owner AND c.State = 'claimed';
UPDATE c SET State = 'released', ReleasedUtc = @now, HeartbeatUtc = @now, LastError = w.Err,
	NextAttemptUtc = CASE WHEN w.NextSec > 0 OR w.NextUs > 0 THEN DATEADD(microsecond, w.NextUs, DATEADD(second, w.NextSec, @now)) END,
	DueUtc = NULL,
	Answer = COALESCE(w.Answer, c.Answer), AnswerUtc = CASE WHEN w.Answer IS NULL THEN c.AnswerUtc ELSE @now END
OUTPUT INSERTED.Id, 'released', INSERTED.State, INSERTED.ClaimedBy, INSERTED.LastError, INSERTED.Owner,
	CASE WHEN INSERTED.EffectKey <> N'' THEN INSERTED.EffectKey ELSE INSERTED.MessageId END
	INTO @done (Id, What, ToState, ByWhom, Reason, Owner, IdempotencyKey)
FROM dbo.Claims AS c JOIN @w AS w ON w.Id = c.Id
WHERE w.Kind = ` + kindRelease + ` AND c.Owner = w.Owner AND c.State = 'claimed';
UPDATE c SET State = 'processed', ProcessedUtc = @now, Payload = NULL,
	Answer = COALESCE(w.Answer, c.Answer), AnswerUtc = CASE WHEN w.Answer IS NULL THEN c.AnswerUtc ELSE @now END
OUTPUT INSERTED.Id, 'processed', INSERTED.State, INSERTED.ClaimedBy, N'', INSERTED.Owner,
	CASE WHEN INSERTED.EffectKey <> N'' THEN INSERTED.EffectKey ELSE INSERTED.MessageId END
	INTO @done (Id, What, ToState, ByWhom, Reason, Owner, IdempotencyKey)
FROM dbo.Claims AS c JOIN @w AS w ON w.Id = c.Id
WHERE w.Kind = ` + kindProcessed + ` AND c.Owner = w.Owner AND c.State = 'claimed';
INSERT INTO dbo.ClaimHistory (ClaimId, AtUtc, What, FromState, ToState, ByWhom, Path, Reason, PreviousOwner, Owner, IdempotencyKey)
SELECT Id, @now, What, 'claimed', ToState, ByWhom, '', LEFT(Reason, ` + strconv.Itoa(claim.MaxHistoryReason) + `), NULL, Owner, IdempotencyKey
FROM @done WHERE What IS NOT NULL;
COMMIT TRANSACTION;
SELECT Id FROM @done;`

// The kinds as the batch statement spells them.
var (
	kindHeartbeat = strconv.Itoa(int(claim.WriteHeartbeat))
	kindAttempt   = strconv.Itoa(int(claim.WriteRecordAttempt))
	kindRelease   = strconv.Itoa(int(claim.WriteRelease))
	kindProcessed = strconv.Itoa(int(claim.WriteMarkProcessed))
)

// WriteOutcomes performs a batch of outcome writes in one round trip and
// one transaction (see claim.BatchWriter).
func (s *Store) WriteOutcomes(ctx context.Context, writes []claim.OutcomeWrite) ([]error, error) {
	if err := claim.CheckBatch(writes); err != nil {
		return nil, err
	}
	if len(writes) == 0 {
		return nil, nil
	}
	var (
		a    args
		rows = make([]string, len(writes))
	)
	for i, w := range writes {
		v := sqlstore.ValuesOf(w)
		answer, err := answerParam(v.Answer)
		if err != nil {
			return nil, fmt.Errorf("%s claim %d: %w", w.Kind(), v.ID, err)
		}
		d := max(v.NextAttemptIn, 0)
		sec := int32(min(int64(d/time.Second), math.MaxInt32))
		us := int32((d % time.Second) / time.Microsecond)
		rows[i] = "(" + strings.Join([]string{
			a.add(int32(w.Kind()), declInt), a.add(v.ID, declID), a.add(guid(v.Owner), declGUID),
			a.add(text(truncate(v.Error, maxLastError)), declLongText), a.add(sec, declInt), a.add(us, declInt),
			a.add(answer, declAnswer),
		}, ", ") + ")"
	}
	done := map[int64]bool{}
	run := func(q querier) error {
		err := query(ctx, q, fmt.Sprintf(writeOutcomesSQL, strings.Join(rows, ",\n\t")), a, func(r *sql.Rows) error {
			var id int64
			if err := r.Scan(&id); err != nil {
				return err
			}
			done[id] = true
			return nil
		})
		if err != nil {
			return fmt.Errorf("write %d outcomes: %w", len(writes), interpretError(err))
		}
		return nil
	}
	if !slices.ContainsFunc(writes, func(w claim.OutcomeWrite) bool { return w.MarkProcessed != nil && len(w.MarkProcessed.FollowUps) > 0 }) {
		if err := run(s.db); err != nil {
			return nil, err
		}
		return sqlstore.BatchResults(writes, done), nil
	}
	// A write carries follow-ups: the batch, then the follow-ups of the
	// claims it marked processed, in one transaction.
	err := s.inTx(ctx, fmt.Sprintf("write %d outcomes", len(writes)), func(tx *sql.Tx) error {
		if err := run(tx); err != nil {
			return err
		}
		for _, w := range writes {
			if w.MarkProcessed != nil && done[w.MarkProcessed.ID] {
				if err := insertFollowUps(ctx, tx, w.MarkProcessed.ID, w.MarkProcessed.FollowUps); err != nil {
					return fmt.Errorf("write %d outcomes: %w", len(writes), err)
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return sqlstore.BatchResults(writes, done), nil
}

// FlagStale flags at most Limit stale claims, oldest heartbeat first, in
// one statement. The staleness test is part of that statement: the CTE
// reads the candidate rows with UPDLOCK, so each is locked and re-read at
// its latest committed version (also under READ_COMMITTED_SNAPSHOT) before
// the UPDATE changes it; a claim processed or heartbeated just before is
// not stale any more and is not flagged. READPAST skips rows another
// session holds locked (a heartbeat in flight, another reconciler's flag
// pass) instead of waiting for them; they are looked at on the next tick.
// READCOMMITTEDLOCK is there for READPAST's sake: the table hints
// reference says READPAST cannot be specified when READ_COMMITTED_SNAPSHOT
// is ON (Azure SQL's default) and the session is at READ COMMITTED, unless
// READCOMMITTEDLOCK is also given; with UPDLOCK it changes nothing else
// (UPDLOCK makes SQL Server ignore READCOMMITTEDLOCK as an isolation hint).
func (s *Store) FlagStale(ctx context.Context, params *claim.FlagStaleParams) ([]*claim.Claim, error) {
	staleAfter, limit, err := sqlstore.ValidateFlag(params)
	if err != nil {
		return nil, err
	}
	var a args
	top := a.add(int64(limit), declID)
	cutoff := agoSQL(&a, staleAfter)
	released := a.add(text(sqlstore.ReasonReleased), declFlagReason)
	noHeartbeat := a.add(text(sqlstore.ReasonNoHeartbeat), declFlagReason)
	q := `WITH stale AS (
    SELECT TOP (` + top + `) *
    FROM dbo.Claims WITH (ROWLOCK, UPDLOCK, READPAST, READCOMMITTEDLOCK)
    WHERE ` + unfinished + `
      AND HeartbeatUtc < ` + cutoff + `
      AND (DeferredSeq IS NULL OR NextAttemptUtc IS NULL OR NextAttemptUtc <= SYSUTCDATETIME()) -- a deferred message's grace (claim.Deferrer)
    ORDER BY HeartbeatUtc
)
UPDATE stale
SET State = 'flagged',
    FlaggedUtc = SYSUTCDATETIME(),
    FlagReason = CASE State WHEN 'released' THEN ` + released + ` ELSE ` + noHeartbeat + ` END
        + CONVERT(nvarchar(30), HeartbeatUtc, 126) + N'Z',
    FlaggedFrom = State
` + simpleHistory(claim.ChangeFlagged, "DELETED.State", a.add(text(sqlstore.StaleBy(params)), declHost), "INSERTED.FlagReason") +
		`OUTPUT ` + insertedColumns + `;`
	out, err := queryClaims(ctx, s.db, q, a)
	if err != nil {
		return nil, fmt.Errorf("flag stale claims: %w", err)
	}
	return out, nil
}

// List returns claims oldest ID first, keyset-paged on Id.
func (s *Store) List(ctx context.Context, params *claim.ListParams) ([]*claim.Claim, error) {
	if err := sqlstore.ValidateList(params); err != nil {
		return nil, err
	}
	var a args
	top := a.add(int64(sqlstore.Limit(params.Limit, sqlstore.DefaultListLimit)), declID)
	where := []string{"Id > " + a.add(params.AfterID, declID)}
	if len(params.States) > 0 {
		// States are literals, not parameters: they come from a fixed set
		// (ValidateList checked each), and a literal State = 'flagged'
		// lets the optimizer use the filtered index IX_Claims_Flagged,
		// which a parameter cannot match.
		lits := make([]string, len(params.States))
		for i, st := range params.States {
			if !st.Valid() {
				return nil, fmt.Errorf("list: unknown state %q", st)
			}
			lits[i] = "'" + string(st) + "'"
		}
		where = append(where, "State IN ("+strings.Join(lits, ", ")+")")
	}
	if params.Consumer != "" {
		if n := utf16Len(params.Consumer); n > sqlstore.MaxConsumerLength {
			return nil, fmt.Errorf("list: Consumer is %d UTF-16 code units, at most %d", n, sqlstore.MaxConsumerLength)
		}
		where = append(where, "Consumer = "+a.add(params.Consumer, declConsumer))
	}
	if params.OlderThan > 0 {
		where = append(where, "ClaimedUtc < "+agoSQL(&a, params.OlderThan))
	}
	where, err := listFilters(params, where, &a)
	if err != nil {
		return nil, err
	}
	q := "SELECT TOP (" + top + ") " + columns + " FROM dbo.Claims WHERE " + strings.Join(where, " AND ") + " ORDER BY Id;"
	out, err := queryClaims(ctx, s.db, q, a)
	if err != nil {
		return nil, fmt.Errorf("list claims: %w", err)
	}
	return out, nil
}

// Get returns one claim by ID.
func (s *Store) Get(ctx context.Context, id int64) (*claim.Claim, error) {
	out, err := queryClaims(ctx, s.db, "SELECT "+columns+" FROM dbo.Claims WHERE Id = @p1;", args{{id, declID}})
	if err != nil {
		return nil, fmt.Errorf("get claim %d: %w", id, err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("get claim %d: %w", id, claim.ErrNotFound)
	}
	return out[0], nil
}

// History returns a claim's history, oldest first.
func (s *Store) History(ctx context.Context, id int64) ([]claim.HistoryEntry, error) {
	var out []claim.HistoryEntry
	err := query(ctx, s.db, `SELECT Id, ClaimId, AtUtc, What, FromState, ToState, ByWhom, Path, Reason, PreviousOwner, Owner, IdempotencyKey
FROM dbo.ClaimHistory WHERE ClaimId = @p1 ORDER BY Id;`, args{{id, declID}}, func(r *sql.Rows) error {
		var (
			e          claim.HistoryEntry
			owner      mssqldb.UniqueIdentifier
			prev       mssqldb.NullUniqueIdentifier
			what, from string
			to, path   string
		)
		if err := r.Scan(&e.ID, &e.ClaimID, &e.At, &what, &from, &to, &e.By, &path, &e.Reason, &prev, &owner, &e.Key); err != nil {
			return err
		}
		e.What, e.From, e.To, e.Path = claim.Change(what), claim.State(from), claim.State(to), claim.TakeOverPath(path)
		e.At, e.Owner = e.At.UTC(), uuid.UUID(owner)
		if prev.Valid {
			e.PreviousOwner = uuid.UUID(prev.UUID)
		}
		out = append(out, e)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("history of claim %d: %w", id, interpretError(err))
	}
	if len(out) == 0 {
		if _, err := s.Get(ctx, id); err != nil {
			return nil, fmt.Errorf("history: %w", err)
		}
	}
	return out, nil
}

// Resolve closes a flagged claim with an audited resolution; a redrive
// also marks it processed and drops its payload.
func (s *Store) Resolve(ctx context.Context, params *claim.ResolveParams) (*claim.Claim, error) {
	if err := sqlstore.ValidateResolve(params); err != nil {
		return nil, err
	}
	if n := utf16Len(params.By); n > maxResolvedBy {
		return nil, fmt.Errorf("resolve claim %d: By is %d characters, at most %d", params.ID, n, maxResolvedBy)
	}
	if n := utf16Len(params.Note); n > maxNote {
		return nil, fmt.Errorf("resolve claim %d: Note is %d characters, at most %d", params.ID, n, maxNote)
	}
	redrive := ""
	if params.Resolution == claim.ResolutionRedriven {
		redrive = ", ProcessedUtc = @now, Payload = NULL"
	}
	answer, err := answerParam(params.Answer)
	if err != nil {
		return nil, fmt.Errorf("resolve claim %d: %w", params.ID, err)
	}
	a := args{{text(params.By), declHost}, {mssqldb.VarChar(params.Resolution), declResolution}, {text(params.Note), declLongText}, {params.ID, declID},
		{answer, declAnswer}}
	guard := "State = 'flagged'"
	if params.Owner != uuid.Nil {
		guard = "State = 'claimed' AND Owner = " + a.add(guid(params.Owner), declGUID)
	}
	q := declareNow + `UPDATE dbo.Claims
SET State = 'resolved', ResolvedUtc = @now, ResolvedBy = @p1, Resolution = @p2, ResolutionNote = @p3` + redrive + `, ` + setAnswer("@p5") + `
` + simpleHistory(claim.ChangeResolved, "DELETED.State", "INSERTED.ResolvedBy",
		"INSERTED.Resolution + CASE WHEN INSERTED.ResolutionNote <> N'' THEN N': ' + INSERTED.ResolutionNote ELSE N'' END") +
		`OUTPUT ` + insertedColumns + `
WHERE Id = @p4 AND ` + guard + `;`
	var out []*claim.Claim
	if len(params.FollowUps) == 0 {
		out, err = queryClaims(ctx, s.db, q, a)
	} else {
		// The redrive's follow-ups in the same transaction.
		err = s.inTx(ctx, fmt.Sprintf("resolve claim %d", params.ID), func(tx *sql.Tx) error {
			var err error
			if out, err = queryClaims(ctx, tx, q, a); err != nil || len(out) == 0 {
				return err
			}
			return insertFollowUps(ctx, tx, params.ID, params.FollowUps)
		})
	}
	if err != nil {
		return nil, fmt.Errorf("resolve claim %d: %w", params.ID, err)
	}
	if len(out) == 0 {
		if _, gerr := s.Get(ctx, params.ID); gerr != nil {
			return nil, fmt.Errorf("resolve: %w", gerr)
		}
		return nil, fmt.Errorf("resolve claim %d: %w", params.ID, claim.ErrStateChanged)
	}
	return out[0], nil
}

// PurgeProcessed deletes at most Limit finished claims older than
// OlderThan: processed claims by ProcessedUtc first, then failed claims by
// FailedUtc, then resolved claims by ResolvedUtc (each claim as old as the
// state it is in), each DELETE seeking its filtered index. Claimed,
// released and flagged claims never match, nor does a finished claim that
// still names a deferred message (the stranded sweep settles it first).
func (s *Store) PurgeProcessed(ctx context.Context, params *claim.PurgeParams) (int64, error) {
	olderThan, limit, err := sqlstore.ValidatePurge(params)
	if err != nil {
		return 0, err
	}
	var a args
	top := a.add(int64(limit), declID)
	cutoff := agoSQL(&a, olderThan)
	// A claim's history and follow-ups go with it, in the same
	// transaction; a claim with a follow-up still pending stays.
	const noPendingFollowUp = `NOT EXISTS (SELECT 1 FROM dbo.ClaimFollowUps AS f WHERE f.ClaimId = Claims.Id AND f.State = 'pending')`
	q := `SET XACT_ABORT ON;
DECLARE @processed bigint = 0, @failed bigint = 0, @resolved bigint = 0;
DECLARE @purged TABLE (Id bigint NOT NULL PRIMARY KEY);
BEGIN TRANSACTION;
DELETE TOP (` + top + `) FROM dbo.Claims
OUTPUT DELETED.Id INTO @purged
WHERE State = 'processed' AND DeferredSeq IS NULL AND ProcessedUtc < ` + cutoff + ` AND ` + noPendingFollowUp + `;
SET @processed = @@ROWCOUNT;
IF @processed < ` + top + `
BEGIN
    DELETE TOP (` + top + ` - @processed) FROM dbo.Claims
    OUTPUT DELETED.Id INTO @purged
    WHERE State = 'failed' AND DeferredSeq IS NULL AND FailedUtc < ` + cutoff + ` AND ` + noPendingFollowUp + `;
    SET @failed = @@ROWCOUNT;
END;
IF @processed + @failed < ` + top + `
BEGIN
    DELETE TOP (` + top + ` - @processed - @failed) FROM dbo.Claims
    OUTPUT DELETED.Id INTO @purged
    WHERE State = 'resolved' AND DeferredSeq IS NULL AND ResolvedUtc < ` + cutoff + ` AND ` + noPendingFollowUp + `;
    SET @resolved = @@ROWCOUNT;
END;
DELETE h FROM dbo.ClaimHistory AS h INNER JOIN @purged AS p ON p.Id = h.ClaimId;
DELETE f FROM dbo.ClaimFollowUps AS f INNER JOIN @purged AS p ON p.Id = f.ClaimId;
COMMIT TRANSACTION;
SELECT @processed + @failed + @resolved;`
	var n int64
	err = query(ctx, s.db, q, a, func(r *sql.Rows) error { return r.Scan(&n) })
	if err != nil {
		return 0, fmt.Errorf("purge claims: %w", interpretError(err))
	}
	return n, nil
}

// Stats summarises the table; each count reads a filtered index.
func (s *Store) Stats(ctx context.Context) (*claim.Stats, error) {
	var (
		st     claim.Stats
		oldest sql.NullTime
	)
	err := query(ctx, s.db, `SELECT SYSUTCDATETIME(),
    (SELECT COUNT_BIG(*) FROM dbo.Claims WHERE `+unfinished+` AND State = 'claimed'),
    (SELECT COUNT_BIG(*) FROM dbo.Claims WHERE `+unfinished+` AND State = 'released'),
    (SELECT COUNT_BIG(*) FROM dbo.Claims WHERE State = 'flagged'),
    (SELECT COUNT_BIG(*) FROM dbo.Claims WHERE State = 'failed'),
    (SELECT MIN(ClaimedUtc) FROM dbo.Claims WHERE `+unfinished+`);`, nil,
		func(r *sql.Rows) error {
			return r.Scan(&st.Now, &st.Claimed, &st.Released, &st.Flagged, &st.Failed, &oldest)
		})
	if err != nil {
		return nil, fmt.Errorf("claim stats: %w", interpretError(err))
	}
	st.Now = st.Now.UTC()
	st.OldestUnfinished = nullTime(oldest)
	return &st, nil
}

// Now returns the database clock (UTC).
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	var now time.Time
	err := query(ctx, s.db, "SELECT SYSUTCDATETIME();", nil, func(r *sql.Rows) error { return r.Scan(&now) })
	if err != nil {
		return time.Time{}, fmt.Errorf("database clock: %w", interpretError(err))
	}
	if now.IsZero() {
		return time.Time{}, errors.New("database clock: no row")
	}
	return now.UTC(), nil
}

// Ping checks the database answers a query.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.db.PingContext(ctx); err != nil {
		return fmt.Errorf("ping sql server: %w", interpretError(err))
	}
	return nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }
