package mssql

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/google/uuid"
	mssqldb "github.com/microsoft/go-mssqldb"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/sqlstore"
)

// maxRowsPerStatement bounds one ClaimBatch statement. Each row takes 15
// parameters and SQL Server accepts at most 2,100 per request; larger
// batches are sent as several statements.
const maxRowsPerStatement = 100

// newClaim is one distinct key of a batch, ready to insert.
type newClaim struct {
	p     *claim.ClaimParams
	owner uuid.UUID // the token this attempt's row gets if it wins
	props string
}

// ClaimBatch claims a batch in one round trip (per 100 distinct keys):
//
//	DECLARE @now datetime2(7) = SYSUTCDATETIME();
//	INSERT INTO dbo.Claims (...)
//	SELECT ... FROM (VALUES (...), (...)) AS v (...)
//	WHERE NOT EXISTS (SELECT 1 FROM dbo.Claims AS c WHERE c.MessageId = v.MessageId AND c.Consumer = v.Consumer);
//	SELECT ... FROM (VALUES (...), (...)) AS k (MessageId, Consumer)
//	JOIN dbo.Claims AS c ON c.MessageId = k.MessageId AND c.Consumer = k.Consumer;
//
// The SELECT cannot tell a row this call inserted from one an earlier try
// of the same attempt inserted (a retried batch whose first answer was
// lost): both carry the attempt's owner token. So every row read is
// handed to sqlstore.Plan.Results as existing, which applies the one rule
// all stores share: a row with the message's own token is won only while
// it is still claimed with the same payload hash; any other row is a
// duplicate, or a conflict when its payload hash differs.
//
// NOT EXISTS is only an optimisation that keeps known duplicates out of
// the INSERT; the unique index UX_Claims_MessageId_Consumer is the
// arbiter. Another session's uncommitted claim is invisible to NOT EXISTS
// under READ_COMMITTED_SNAPSHOT (Azure SQL's default), so the INSERT then
// waits on that key and fails with 2601 once it commits, and one violation
// fails the whole multi-row statement. In that case (and when the
// statement is a deadlock victim) ClaimBatch falls back to one INSERT per
// key, each catching its own 2601/2627, then reads all keys' rows.
//
// Deliberately not used:
//   - MERGE: a long record of concurrency bugs, and race-safe only with
//     HOLDLOCK.
//   - WITH (UPDLOCK, HOLDLOCK) on the NOT EXISTS: serializable key-range
//     locks that block inserts of unrelated keys (other consumers'
//     messages) that fall into the same range.
//   - IGNORE_DUP_KEY on the index: it turns the violation into a warning
//     and silently drops the row, removing the signal that makes the
//     index the arbiter (and hiding a violation the store must see).
func (s *Store) ClaimBatch(ctx context.Context, params *claim.ClaimBatchParams) ([]claim.ClaimResult, error) {
	plan, err := sqlstore.NewPlan(params.Claims)
	if err != nil {
		return nil, err
	}
	if len(plan.First) == 0 {
		return nil, nil
	}
	rows, err := prepare(plan)
	if err != nil {
		return nil, err
	}
	host := truncate(params.Host, maxClaimedBy)
	existing := make(map[sqlstore.Key]*claim.Claim, len(rows))
	for chunk := range slices.Chunk(rows, maxRowsPerStatement) {
		got, err := s.insertSet(ctx, host, chunk)
		if err != nil && (isClaimsDuplicate(err) || isDeadlock(err)) {
			if isClaimsDuplicate(err) {
				s.races.Add(1)
			}
			got, err = s.insertEach(ctx, host, chunk)
		}
		if err != nil {
			return nil, fmt.Errorf("claim batch: %w", interpretError(err))
		}
		// A key missing from got was neither inserted nor found (its row
		// was deleted between the INSERT and the SELECT): plan.Results
		// reports it.
		maps.Copy(existing, got)
	}
	return plan.Results(nil, existing)
}

// prepare turns the plan's distinct keys into rows to insert, sorted by
// key so that concurrent batches with overlapping keys lock them in the
// same order (fewer deadlocks).
func prepare(plan *sqlstore.Plan) ([]newClaim, error) {
	rows := make([]newClaim, 0, len(plan.First))
	for _, i := range plan.First {
		c := &plan.Claims[i]
		// sqlstore.ValidateClaim counts runes; nvarchar(n) counts UTF-16
		// code units, so a key with characters outside the BMP can pass it
		// and still be too wide for the column (error 2628, which fails
		// the whole multi-row INSERT).
		if n := utf16Len(c.MessageID); n > claim.MaxMessageIDLength {
			return nil, fmt.Errorf("claim %s/%s: MessageID is %d UTF-16 code units, at most %d", c.MessageID, c.Consumer, n, claim.MaxMessageIDLength)
		}
		if n := utf16Len(c.Consumer); n > sqlstore.MaxConsumerLength {
			return nil, fmt.Errorf("claim %s/%s: Consumer is %d UTF-16 code units, at most %d", c.MessageID, c.Consumer, n, sqlstore.MaxConsumerLength)
		}
		if n := utf16Len(c.Entity); n > maxEntity {
			return nil, fmt.Errorf("claim %s/%s: Entity is %d characters, at most %d", c.MessageID, c.Consumer, n, maxEntity)
		}
		if len(c.PayloadHash) > 32 {
			return nil, fmt.Errorf("claim %s/%s: PayloadHash is %d bytes, at most 32", c.MessageID, c.Consumer, len(c.PayloadHash))
		}
		props, err := sqlstore.EncodeProperties(c.Properties)
		if err != nil {
			return nil, fmt.Errorf("claim %s/%s: %w", c.MessageID, c.Consumer, err)
		}
		if n := utf16Len(c.Route); n > sqlstore.MaxRouteLength {
			return nil, fmt.Errorf("claim %s/%s: Route is %d UTF-16 code units, at most %d", c.MessageID, c.Consumer, n, sqlstore.MaxRouteLength)
		}
		rows = append(rows, newClaim{p: c, owner: c.Owner, props: props})
	}
	slices.SortFunc(rows, func(a, b newClaim) int {
		return cmp.Or(strings.Compare(a.p.MessageID, b.p.MessageID), strings.Compare(a.p.Consumer, b.p.Consumer))
	})
	return rows, nil
}

// insertColumns are the columns a claim insert writes; the rest take their
// defaults.
const insertColumns = `MessageId, Consumer, Owner, State, Entity, Subject, ContentType, Properties,
    PayloadHash, Payload, DeliveryCount, Route, Fingerprint, KeyForm, EffectKey, SessionId, ClaimedBy, ClaimedUtc, HeartbeatUtc, ProcessedUtc`

// values adds one row's parameters to a and returns its value list, in
// the order of insertColumns minus State, ClaimedBy and the times.
//
// A nil payload is sent as a typed NULL: go-mssqldb declares a nil []byte
// varbinary(max) (an untyped nil would be nvarchar, which SQL Server does
// not convert to varbinary implicitly).
func (r *newClaim) values(a *args, payload []byte) string {
	return "(" + strings.Join([]string{
		a.add(r.p.MessageID, declMessageID),
		a.add(r.p.Consumer, declConsumer),
		a.add(guid(r.owner), declGUID),
		a.add(text(r.p.Entity), declEntity),
		a.add(text(r.p.Subject), declText),
		a.add(text(r.p.ContentType), declText),
		a.add(text(r.props), declText),
		a.add(r.p.PayloadHash, declPayloadHash),
		// CAST keeps the VALUES column varbinary even if every row's
		// payload is NULL.
		"CAST(" + a.add(payload, declPayload) + " AS varbinary(max))",
		a.add(int32(min(r.p.DeliveryCount, 1<<31-1)), declInt),
		a.add(text(r.p.Route), declRoute),
		a.add(mssqldb.VarChar(r.p.Fingerprint), declFingerprint),
		a.add(mssqldb.VarChar(sqlstore.FormOf(r.p)), declKeyForm),
		a.add(text(sqlstore.EffectKeyOf(r.p)), declKey),
		a.add(text(r.p.SessionID), declSessionID),
	}, ", ") + ")"
}

// selectKeys returns the statement that reads the rows of rows' keys; its
// parameters are the first two of each row's values (MessageId, Consumer)
// when built after values, or new ones otherwise.
func selectKeys(keys []string) string {
	return "SELECT " + aliasedColumns + `
FROM (VALUES ` + strings.Join(keys, ", ") + `) AS k (MessageId, Consumer)
INNER JOIN dbo.Claims AS c ON c.MessageId = k.MessageId AND c.Consumer = k.Consumer;`
}

// insertSet is the happy path: one request with the set-based INSERT of
// the keys that do not exist yet, and the SELECT of every key's row.
func (s *Store) insertSet(ctx context.Context, host string, rows []newClaim) (map[sqlstore.Key]*claim.Claim, error) {
	q, a := insertSetSQL(host, rows)
	return s.keyed(ctx, s.db, q, a)
}

// insertSetSQL builds insertSet's request.
func insertSetSQL(host string, rows []newClaim) (string, args) {
	var a args
	hostP := a.add(text(host), declHost)
	vals := make([]string, len(rows))
	keys := make([]string, len(rows))
	for i := range rows {
		n := len(a)
		vals[i] = rows[i].values(&a, rows[i].p.Payload)
		// Reuse the row's MessageId and Consumer parameters.
		keys[i] = fmt.Sprintf("(@p%d, @p%d)", n+1, n+2)
	}
	return insertSQL(hostP, "'claimed'", "NULL", vals, "WHERE NOT EXISTS (\n"+
		"    SELECT 1 FROM dbo.Claims AS c\n"+
		"    WHERE c.MessageId = v.MessageId AND c.Consumer = v.Consumer);\n", "") + selectKeys(keys), a
}

// insertSQL is the INSERT of a claims request: vals are rows from
// newClaim.values; state and processed are SQL expressions; tail is what
// follows the FROM (a WHERE clause ending in ";", or "" for none); output
// is an OUTPUT column list, or "".
func insertSQL(hostP, state, processed string, vals []string, tail, output string) string {
	out := ""
	if output != "" {
		out = "OUTPUT " + output + "\n"
	}
	if tail == "" {
		tail = ";\n"
	}
	// Every inserted claim gets its "claimed" history row in the INSERT
	// itself.
	return declareNow + `INSERT INTO dbo.Claims (` + insertColumns + `)
` + simpleHistory(claim.ChangeClaimed, "''", "INSERTED.ClaimedBy", "N''") + out + `SELECT v.MessageId, v.Consumer, v.Owner, ` + state + `, v.Entity, v.Subject, v.ContentType, v.Properties,
    v.PayloadHash, v.Payload, v.DeliveryCount, v.Route, v.Fingerprint, v.KeyForm, v.EffectKey, v.SessionId, ` + hostP + `, @now, @now, ` + processed + `
FROM (VALUES ` + strings.Join(vals, ",\n    ") + `)
    AS v (MessageId, Consumer, Owner, Entity, Subject, ContentType, Properties, PayloadHash, Payload, DeliveryCount, Route, Fingerprint, KeyForm, EffectKey, SessionId)
` + tail
}

// insertEach is the fallback after a unique violation or deadlock in the
// set-based INSERT: one single-row INSERT per key, in key order, where a
// violation of the claims index only means this key lost; then one SELECT
// of every key's row.
func (s *Store) insertEach(ctx context.Context, host string, rows []newClaim) (map[sqlstore.Key]*claim.Claim, error) {
	for i := range rows {
		q, a := insertOneSQL(host, &rows[i])
		stmt, vals := call(q, a)
		if _, err := s.db.ExecContext(ctx, stmt, vals...); err != nil && !isClaimsDuplicate(err) {
			return nil, fmt.Errorf("claim %s/%s: %w", rows[i].p.MessageID, rows[i].p.Consumer, err)
		}
	}
	q, a := selectKeysSQL(rows)
	return s.keyed(ctx, s.db, q, a)
}

// insertOneSQL builds the fallback's single-row INSERT.
func insertOneSQL(host string, r *newClaim) (string, args) {
	var a args
	hostP := a.add(text(host), declHost)
	v := r.values(&a, r.p.Payload)
	return insertSQL(hostP, "'claimed'", "NULL", []string{v}, "", ""), a
}

// selectKeysSQL builds the SELECT of rows' keys with its own parameters.
func selectKeysSQL(rows []newClaim) (string, args) {
	var a args
	keys := make([]string, len(rows))
	for i := range rows {
		keys[i] = "(" + a.add(rows[i].p.MessageID, declMessageID) + ", " + a.add(rows[i].p.Consumer, declConsumer) + ")"
	}
	return selectKeys(keys), a
}

// claimTxSQL builds ClaimTx's INSERT: the marker is processed from the
// start, its payload is not kept, and the row comes back through OUTPUT.
func claimTxSQL(host string, r *newClaim) (string, args) {
	var a args
	hostP := a.add(text(host), declHost)
	v := r.values(&a, nil)
	return insertSQL(hostP, "'processed'", "@now", []string{v}, "", insertedColumns), a
}

// keyed runs q and returns its claims by key.
func (s *Store) keyed(ctx context.Context, q querier, sqlText string, a args) (map[sqlstore.Key]*claim.Claim, error) {
	out := make(map[sqlstore.Key]*claim.Claim)
	err := query(ctx, q, sqlText, a, func(r *sql.Rows) error {
		c, err := scanClaim(r)
		if err != nil {
			return err
		}
		out[sqlstore.KeyOf(c)] = c
		return nil
	})
	if err != nil {
		return nil, err // untranslated: the caller tests for the claims index first
	}
	return out, nil
}

// ClaimTx inserts the marker already processed and runs fn in the same
// transaction; a duplicate or conflict rolls back without calling fn.
//
// Under READ_COMMITTED_SNAPSHOT or not, a concurrent claim of the same key
// waits on this transaction's key lock in the unique index until it
// commits (then fails with 2601) or rolls back (then wins).
//
// fn must use only tx, and ctx should carry a deadline: go-mssqldb can
// hang inside a transaction on a broken connection without one.
func (s *Store) ClaimTx(ctx context.Context, params *claim.ClaimTxParams, fn func(ctx context.Context, tx *sql.Tx) error) (claim.ClaimResult, error) {
	plan, err := sqlstore.NewPlan([]claim.ClaimParams{params.Claim})
	if err != nil {
		return claim.ClaimResult{}, err
	}
	rows, err := prepare(plan)
	if err != nil {
		return claim.ClaimResult{}, err
	}
	r := &rows[0]
	key := sqlstore.Key{MessageID: r.p.MessageID, Consumer: r.p.Consumer}
	op := fmt.Sprintf("claim tx %s/%s", r.p.MessageID, r.p.Consumer)

	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return claim.ClaimResult{}, fmt.Errorf("%s: begin: %w", op, interpretError(err))
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it only reports ErrTxDone

	q, a := claimTxSQL(truncate(params.Host, maxClaimedBy), r)
	got, err := s.keyed(ctx, tx, q, a)
	switch {
	case err != nil && isClaimsDuplicate(err):
		_ = tx.Rollback()
		sq, sa := selectKeysSQL(rows)
		existing, err := s.keyed(ctx, s.db, sq, sa)
		if err != nil {
			return claim.ClaimResult{}, fmt.Errorf("%s: read existing: %w", op, interpretError(err))
		}
		res, err := plan.Results(nil, existing)
		if err != nil {
			return claim.ClaimResult{}, err
		}
		return res[0], nil
	case err != nil:
		return claim.ClaimResult{}, fmt.Errorf("%s: insert: %w", op, interpretError(err))
	case got[key] == nil || got[key].Owner != r.owner:
		return claim.ClaimResult{}, fmt.Errorf("%s: insert returned no row", op)
	}
	fctx, sink := claim.CollectFollowUps(ctx)
	if err := fn(claim.WithTxClaim(fctx, got[key]), tx); err != nil {
		return claim.ClaimResult{}, err
	}
	c := got[key]
	if err := insertFollowUps(ctx, tx, c.ID, claim.NumberFollowUps(c.Consumer, c.MessageID, sink.List())); err != nil {
		return claim.ClaimResult{}, fmt.Errorf("%s: %w", op, err)
	}
	if err := tx.Commit(); err != nil {
		return claim.ClaimResult{}, fmt.Errorf("%s: commit: %w", op, interpretError(err))
	}
	return claim.ClaimResult{Outcome: claim.OutcomeWon, Claim: got[key]}, nil
}
