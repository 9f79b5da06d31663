package postgres

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/sqlstore"
	sqlfiles "github.com/sbclaim/sbclaim/sql"
)

var _ claim.Store = (*Store)(nil)

// ClaimsUniqueIndex is the name of the claims unique index: a unique
// violation of this constraint, and only this one, is a duplicate.
const ClaimsUniqueIndex = "ux_claims_message_consumer"

// Store is the PostgreSQL claims table.
type Store struct {
	db    *sql.DB
	races atomic.Int64
	// noHistory turns the history writes of ClaimBatch and WriteOutcomes
	// off (SetHistoryForBench).
	noHistory atomic.Bool
}

// SetHistoryForBench turns the history writes of ClaimBatch and
// WriteOutcomes on or off (on by default). It exists for the benchmark
// that measures what history costs: a store with history off breaks the
// audit promise (claim.HistorySwitch).
func (s *Store) SetHistoryForBench(on bool) { s.noHistory.Store(!on) }

// ClaimRaces returns how many claimed keys met another transaction's
// in-flight claim of the same key: the insert waited on the claims unique
// index for that transaction, which then committed, so ON CONFLICT skipped
// the row while the statement's snapshot could not see it, and a second
// statement read it (see the package doc). It only grows; the conformance
// suite's race tests check that it moved, which no run without a real race
// can make it do.
func (s *Store) ClaimRaces() int64 { return s.races.Load() }

// Option configures a Store. There are none yet; the parameter keeps New's
// signature the same across dialects.
type Option func(*Store)

// New wraps an open database whose driver is pgx's stdlib driver.
func New(db *sql.DB, opts ...Option) *Store {
	s := &Store{db: db}
	for _, o := range opts {
		o(s)
	}
	return s
}

// DB returns the database the store uses.
func (s *Store) DB() *sql.DB { return s.db }

// Open opens a PostgreSQL claims store from a postgres:// or postgresql://
// URL (libpq parameters such as sslmode, and runtime parameters such as
// search_path, go in the query string). It checks the database answers
// but does not migrate: call Migrate.
func Open(ctx context.Context, url string) (*Store, error) {
	if !strings.HasPrefix(url, "postgres://") && !strings.HasPrefix(url, "postgresql://") {
		return nil, errors.New("postgres: URL must start with postgres:// or postgresql://")
	}
	db, err := sql.Open("pgx", url)
	if err != nil {
		// pgx's parse errors can quote the URL, password included.
		return nil, errors.New("postgres: invalid connection URL")
	}
	sqlstore.LimitPool(db)
	s := New(db)
	if err := s.Ping(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// Migrate applies the embedded PostgreSQL migrations (sql/postgres) to the
// current schema of db, holding a session advisory lock keyed by that
// schema so replicas starting together migrate once.
func Migrate(ctx context.Context, db *sql.DB) error {
	var current string
	if err := db.QueryRowContext(ctx, "SELECT current_schema()").Scan(&current); err != nil {
		return fmt.Errorf("migrate postgres: %w", translate(err))
	}
	h := fnv.New64a()
	h.Write([]byte("sbclaim-migrate:" + current))
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(int64(h.Sum64())), lock.WithLockTimeout(1, 600))
	if err != nil {
		return fmt.Errorf("migrate postgres: %w", err)
	}
	fsys, err := sqlfiles.Dialect("postgres")
	if err != nil {
		return fmt.Errorf("migrate postgres: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, fsys, goose.WithSessionLocker(locker))
	if err != nil {
		return fmt.Errorf("migrate postgres: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate postgres: %w", translate(err))
	}
	return nil
}

var columnNames = []string{"id", "message_id", "consumer", "owner", "state", "entity", "subject", "content_type",
	"properties", "payload_hash", "payload", "delivery_count", "claimed_by", "claimed_utc",
	"heartbeat_utc", "processed_utc", "released_utc", "attempts", "last_error", "flagged_utc",
	"flag_reason", "resolved_utc", "resolved_by", "resolution", "resolution_note",
	"route", "fingerprint", "take_overs", "taken_over_utc", "take_over_path", "take_over_reason",
	"previous_owner", "previous_holder", "recoveries", "next_attempt_utc", "late_success_utc", "late_success_by",
	"failed_utc", "fail_reason", "dead_letter_seq", "answer", "answer_utc",
	"key_revision", "effect_key", "key_revised_by", "key_revised_utc", "key_revision_note", "key_form",
	"deferred_seq", "due_utc", "postponements", "postponed_utc", "session_id"}

// cols returns the select list scanClaim reads, each column prefixed.
func cols(prefix string) string {
	out := make([]string, len(columnNames))
	for i, c := range columnNames {
		out[i] = prefix + c
		if c == "properties" || c == "answer" {
			out[i] += "::text"
		}
	}
	return strings.Join(out, ", ")
}

var columns = cols("")

// historySQL is the INSERT of one history row per row of src (a CTE of
// rows a guarded write changed, RETURNING *): what, from, by, path,
// reason and previous are SQL expressions (src's columns are "src.").
// The owner, the new state and the key are the changed row's.
func historySQL(src, what, from, by, path, reason, previous string) string {
	return `INSERT INTO claim_history (claim_id, what, from_state, to_state, by_whom, path, reason, previous_owner, owner, idempotency_key)
	SELECT ` + src + `.id, ` + what + `, ` + from + `, ` + src + `.state, ` + by + `, ` + path + `, left(` + reason + `, ` +
		strconv.Itoa(claim.MaxHistoryReason) + `), ` + previous + `, ` + src + `.owner,
		CASE WHEN ` + src + `.effect_key <> '' THEN ` + src + `.effect_key ELSE ` + src + `.message_id END
	FROM ` + src
}

// guardedSQL wraps a guarded UPDATE (without RETURNING) so that the
// statement also writes one history row per row it changed, and returns
// the number of changed rows as its rows affected (ExecGuarded).
func guardedSQL(update, what, from, by, reason string) string {
	return `WITH u AS (` + update + ` RETURNING *) ` + historySQL("u", "'"+what+"'", from, by, "''", reason, "NULL")
}

// scanned is the scratch of one scan: the claim's scanned columns, the
// NULL-able values they come as, and the Scan destinations pointing at
// them. It is pooled: a
// scan allocates the claim it returns, and what the driver hands over,
// but no destinations.
type scanned struct {
	c                                      claim.Claim
	state, props, resolution, path         string
	processed, released, flagged, resolved sql.NullTime
	takenOver, nextAttempt, lateSuccess    sql.NullTime
	failed, answerAt, keyRevised           sql.NullTime
	previousOwner                          uuid.NullUUID
	deadLetterSeq, deferredSeq             sql.NullInt64
	answer                                 sql.NullString
	due, postponed                         sql.NullTime
	dest                                   []any
}

var scans = sync.Pool{New: func() any {
	s := &scanned{}
	c := &s.c
	s.dest = []any{&c.ID, &c.MessageID, &c.Consumer, &c.Owner, &s.state, &c.Entity, &c.Subject, &c.ContentType,
		&s.props, &c.PayloadHash, &c.Payload, &c.DeliveryCount, &c.ClaimedBy, &c.ClaimedAt,
		&c.HeartbeatAt, &s.processed, &s.released, &c.Attempts, &c.LastError, &s.flagged,
		&c.FlagReason, &s.resolved, &c.ResolvedBy, &s.resolution, &c.ResolutionNote,
		&c.Route, &c.Fingerprint, &c.TakeOvers, &s.takenOver, &s.path, &c.TakeOverReason,
		&s.previousOwner, &c.PreviousHolder, &c.Recoveries, &s.nextAttempt, &s.lateSuccess, &c.LateSuccessBy,
		&s.failed, &c.FailReason, &s.deadLetterSeq, &s.answer, &s.answerAt,
		&c.KeyRevision, &c.EffectKey, &c.KeyRevisedBy, &s.keyRevised, &c.KeyRevisionNote, &c.KeyForm,
		&s.deferredSeq, &s.due, &c.Postponements, &s.postponed, &c.SessionID}
	return s
}}

// scanClaim reads a claim's columns.
func scanClaim(r sqlstore.Scanner) (*claim.Claim, error) {
	s := scans.Get().(*scanned)
	defer scans.Put(s)
	// Every destination is overwritten by the scan; the claim's other
	// fields are set below, on the copy, never on the scratch.
	if err := r.Scan(s.dest...); err != nil {
		return nil, err
	}
	c := new(claim.Claim)
	*c = s.c
	s.c = claim.Claim{} // the pooled scratch keeps no payload alive
	var err error
	if s.answer.Valid {
		if c.Answer, err = sqlstore.DecodeAnswer(&s.answer.String); err != nil {
			return nil, fmt.Errorf("claim %d: %w", c.ID, err)
		}
	}
	if s.deadLetterSeq.Valid {
		seq := s.deadLetterSeq.Int64
		c.DeadLetterSeq = &seq
	}
	if s.deferredSeq.Valid {
		seq := s.deferredSeq.Int64
		c.DeferredSeq = &seq
	}
	c.DueAt, c.PostponedAt = utc(s.due), utc(s.postponed)
	c.State, c.Resolution, c.TakeOverPath = claim.State(s.state), claim.Resolution(s.resolution), claim.TakeOverPath(s.path)
	if c.Properties, err = sqlstore.DecodeProperties(s.props); err != nil {
		return nil, fmt.Errorf("claim %d: %w", c.ID, err)
	}
	if s.previousOwner.Valid {
		c.PreviousOwner = s.previousOwner.UUID
	}
	c.ClaimedAt, c.HeartbeatAt = c.ClaimedAt.UTC(), c.HeartbeatAt.UTC()
	c.ProcessedAt, c.ReleasedAt, c.FlaggedAt, c.ResolvedAt = utc(s.processed), utc(s.released), utc(s.flagged), utc(s.resolved)
	c.TakenOverAt, c.NextAttemptAt, c.LateSuccessAt = utc(s.takenOver), utc(s.nextAttempt), utc(s.lateSuccess)
	c.FailedAt, c.AnswerAt, c.KeyRevisedAt = utc(s.failed), utc(s.answerAt), utc(s.keyRevised)
	return c, nil
}

func utc(t sql.NullTime) *time.Time {
	if !t.Valid {
		return nil
	}
	u := t.Time.UTC()
	return &u
}

// secs is the parameter form of a duration: seconds as float8, used with
// make_interval(secs => $n).
func secs(d time.Duration) float64 { return d.Seconds() }

// claimSQL inserts the batch and returns, in one statement, the rows it
// inserted (inserted = true) and the existing rows of the keys it did not
// insert that the statement's snapshot can see (inserted = false): their
// key, id and clock columns only (insertedCols). An inserted row holds the
// insert's values (sqlstore.Inserted); an existing row, rare (a
// redelivery), is read whole by a second statement.
var claimSQL, claimSQLNoHistory = claimStatement(true), claimStatement(false)

func claimStatement(history bool) string {
	return `WITH input AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::uuid[], $4::text[], $5::text[], $6::text[],
		$7::text[], $8::bytea[], $9::bytea[], $10::int[], $11::text[], $12::text[], $15::text[], $16::text[], $17::text[])
		WITH ORDINALITY AS i(message_id, consumer, owner, entity, subject, content_type,
			properties, payload_hash, payload, delivery_count, route, fingerprint, key_form, effect_key, session_id, ord)
), ins AS (
	INSERT INTO claims (message_id, consumer, owner, state, entity, subject, content_type,
		properties, payload_hash, payload, delivery_count, route, fingerprint, key_form, effect_key, session_id,
		claimed_by, claimed_utc, heartbeat_utc, processed_utc)
	SELECT message_id, consumer, owner, $13, entity, subject, content_type,
		properties::jsonb, payload_hash, payload, delivery_count, route, fingerprint, key_form, effect_key, session_id, $14, now(), now(),
		CASE WHEN $13 = 'processed' THEN now() END
	FROM input ORDER BY ord
	ON CONFLICT (message_id, consumer) DO NOTHING
	RETURNING *
), h AS (
	` + maybeHistory(history, historySQL("ins", "'"+string(claim.ChangeClaimed)+"'", "''", "ins.claimed_by", "''", "''", "NULL")) + `
)
SELECT true, ` + insertedCols("ins.") + ` FROM ins
UNION ALL
SELECT false, ` + insertedCols("c.") + `
FROM claims c JOIN input i ON c.message_id = i.message_id AND c.consumer = i.consumer
WHERE NOT EXISTS (SELECT 1 FROM ins WHERE ins.message_id = i.message_id AND ins.consumer = i.consumer)`
}

// insertedCols are the columns claimSQL returns of each row, after the
// inserted flag.
func insertedCols(prefix string) string {
	return prefix + "id, " + prefix + "message_id, " + prefix + "consumer, " + prefix + "claimed_utc, " +
		prefix + "heartbeat_utc, " + prefix + "processed_utc"
}

// maybeHistory is insert, or with history off a SELECT in its place (a
// CTE nobody reads is not run).
func maybeHistory(history bool, insert string) string {
	if !history {
		return "SELECT 1"
	}
	return insert
}

// ClaimBatch claims the batch in one statement (see the package doc).
func (s *Store) ClaimBatch(ctx context.Context, params *claim.ClaimBatchParams) ([]claim.ClaimResult, error) {
	plan, err := sqlstore.NewPlan(params.Claims)
	if err != nil {
		return nil, err
	}
	if len(plan.First) == 0 {
		return nil, nil
	}
	won, existing, err := s.insertClaims(ctx, s.db, params.Host, plan, claim.StateClaimed)
	if err != nil {
		return nil, err
	}
	return plan.Results(won, existing)
}

// maxClaimAttempts bounds the statements one ClaimBatch sends: the first,
// plus one more per race in which a key's row committed after the
// statement's snapshot (in practice at most one more).
const maxClaimAttempts = 3

func (s *Store) insertClaims(ctx context.Context, q sqlstore.Querier, host string, plan *sqlstore.Plan, state claim.State) (won, existing map[sqlstore.Key]*claim.Claim, err error) {
	won = make(map[sqlstore.Key]*claim.Claim, len(plan.First))
	existing = make(map[sqlstore.Key]*claim.Claim)
	pending := plan.First
	for attempt := 1; len(pending) > 0; attempt++ {
		if attempt > maxClaimAttempts {
			c := &plan.Claims[pending[0]]
			return nil, nil, fmt.Errorf("claim %s/%s: row neither inserted nor found after %d attempts", c.MessageID, c.Consumer, maxClaimAttempts)
		}
		// One allocation per column, of the rows' size.
		n := len(pending)
		var (
			ids, consumers, entities    = make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
			subjects, types, props      = make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
			routes, prints, forms, keys = make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
			owners                      = make([]pgtype.UUID, 0, n)
			hashes, payloads            = make([][]byte, 0, n), make([][]byte, 0, n)
			counts                      = make([]int32, 0, n)
			sessions                    = make([]string, 0, n)
		)
		for _, i := range pending {
			c := &plan.Claims[i]
			p, err := sqlstore.EncodeProperties(c.Properties)
			if err != nil {
				return nil, nil, fmt.Errorf("claim %s/%s: %w", c.MessageID, c.Consumer, err)
			}
			payload := c.Payload
			if state == claim.StateProcessed {
				payload = nil
			}
			ids, consumers, owners = append(ids, c.MessageID), append(consumers, c.Consumer), append(owners, pgtype.UUID{Bytes: c.Owner, Valid: true})
			entities, subjects, types = append(entities, c.Entity), append(subjects, c.Subject), append(types, c.ContentType)
			props, hashes, payloads = append(props, p), append(hashes, c.PayloadHash), append(payloads, payload)
			counts = append(counts, int32(c.DeliveryCount))
			routes, prints = append(routes, c.Route), append(prints, c.Fingerprint)
			forms, keys = append(forms, string(sqlstore.FormOf(c))), append(keys, sqlstore.EffectKeyOf(c))
			sessions = append(sessions, c.SessionID)
		}
		query := claimSQL
		if s.noHistory.Load() {
			query = claimSQLNoHistory
		}
		rows, err := q.QueryContext(ctx, query, ids, consumers, owners, entities, subjects, types,
			props, hashes, payloads, counts, routes, prints, string(state), host, forms, keys, sessions)
		if err != nil {
			return nil, nil, fmt.Errorf("claim batch: %w", translate(err))
		}
		var (
			inserted               bool
			id                     int64
			mid, consumer          string
			claimedAt, heartbeatAt time.Time
			processedAt            sql.NullTime
			hint                   int
			found                  []int64
		)
		for rows.Next() {
			if err := rows.Scan(&inserted, &id, &mid, &consumer, &claimedAt, &heartbeatAt, &processedAt); err != nil {
				rows.Close()
				return nil, nil, fmt.Errorf("claim batch: %w", translate(err))
			}
			if !inserted {
				found = append(found, id)
				continue
			}
			i := plan.FirstOf(&hint, mid, consumer)
			if i < 0 {
				rows.Close()
				return nil, nil, fmt.Errorf("claim batch: claim %d: inserted %s/%s, which the batch does not hold", id, mid, consumer)
			}
			p := &plan.Claims[i]
			won[sqlstore.Key{MessageID: p.MessageID, Consumer: p.Consumer}] = sqlstore.Inserted(p, id, state, host, claimedAt.UTC(), heartbeatAt.UTC(), utc(processedAt))
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, nil, fmt.Errorf("claim batch: %w", translate(err))
		}
		if len(found) > 0 {
			// The existing rows, whole. One that is gone by now (purged)
			// is neither won nor found: its key is tried again below.
			if err := queryClaims(ctx, q, `SELECT `+cols("")+` FROM claims WHERE id = ANY($1)`, []any{found},
				func(c *claim.Claim) { existing[sqlstore.KeyOf(c)] = c }); err != nil {
				return nil, nil, fmt.Errorf("claim batch: read existing: %w", err)
			}
		}
		var next []int
		for _, i := range pending {
			k := sqlstore.Key{MessageID: plan.Claims[i].MessageID, Consumer: plan.Claims[i].Consumer}
			if won[k] == nil && existing[k] == nil {
				next = append(next, i)
			}
		}
		s.races.Add(int64(len(next)))
		pending = next
	}
	return won, existing, nil
}

func queryClaims(ctx context.Context, q sqlstore.Querier, query string, args []any, each func(*claim.Claim)) error {
	scan := func(r sqlstore.Scanner) (*claim.Claim, error) { return scanClaim(r) }
	return sqlstore.QueryClaims(ctx, q, translate, scan, query, args, each)
}

// ClaimTx inserts the marker already processed and runs fn in the same
// transaction.
func (s *Store) ClaimTx(ctx context.Context, params *claim.ClaimTxParams, fn func(ctx context.Context, tx *sql.Tx) error) (claim.ClaimResult, error) {
	plan, err := sqlstore.NewPlan([]claim.ClaimParams{params.Claim})
	if err != nil {
		return claim.ClaimResult{}, err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return claim.ClaimResult{}, fmt.Errorf("claim tx: begin: %w", translate(err))
	}
	defer tx.Rollback()

	won, existing, err := s.insertClaims(ctx, tx, params.Host, plan, claim.StateProcessed)
	if err != nil {
		return claim.ClaimResult{}, err
	}
	res, err := plan.Results(won, existing)
	if err != nil {
		return claim.ClaimResult{}, err
	}
	if res[0].Outcome != claim.OutcomeWon {
		return res[0], nil // the deferred rollback ends the transaction
	}
	fctx, sink := claim.CollectFollowUps(ctx)
	if err := fn(claim.WithTxClaim(fctx, res[0].Claim), tx); err != nil {
		return claim.ClaimResult{}, err
	}
	c := res[0].Claim
	if err := insertFollowUps(ctx, tx, c.ID, claim.NumberFollowUps(c.Consumer, c.MessageID, sink.List())); err != nil {
		return claim.ClaimResult{}, fmt.Errorf("claim tx %s/%s: %w", params.Claim.MessageID, params.Claim.Consumer, err)
	}
	if err := tx.Commit(); err != nil {
		return claim.ClaimResult{}, fmt.Errorf("claim tx %s/%s: commit: %w", params.Claim.MessageID, params.Claim.Consumer, translate(err))
	}
	return res[0], nil
}

// takeOverPaths is the precondition of each take-over path beyond owner
// and route; $8 is SilentFor in seconds. The staleness tests are in the
// UPDATE's own WHERE, so READ COMMITTED re-checks them on the latest row
// version when a concurrent writer (a heartbeat) committed first.
var takeOverPaths = map[claim.TakeOverPath]string{
	claim.PathRedelivery: `(state = 'released' OR (state = 'claimed' AND heartbeat_utc < now() - make_interval(secs => $8)))
		AND (deferred_seq IS NULL OR deferred_seq = $15::bigint)`,
	claim.PathReconciler: `state IN ('claimed', 'released') AND heartbeat_utc < now() - make_interval(secs => $8)
		AND (next_attempt_utc IS NULL OR next_attempt_utc <= now())`,
	// The operator path does not test silence; the cast only gives the
	// unused $8 a type (PostgreSQL refuses a parameter it cannot type).
	claim.PathOperator: `state = 'flagged' AND $8::float8 IS NOT NULL`,
}

// seqParam gives the take-over's $15 (Seq) a type on the paths that do not
// test it.
var seqParam = map[claim.TakeOverPath]string{
	claim.PathReconciler: ` AND ($15::bigint IS NULL OR true)`,
	claim.PathOperator:   ` AND ($15::bigint IS NULL OR true)`,
}

// takeOverGuard is the precondition of params' take-over: its path's, or
// for an operator's retry the claim being failed.
func takeOverGuard(params *claim.TakeOverParams) string {
	if params.Retry {
		return `state = 'failed' AND $8::float8 IS NOT NULL`
	}
	return takeOverPaths[params.Path]
}

// TakeOver gives the claim to a new owner if it still qualifies (see
// claim.Store).
func (s *Store) TakeOver(ctx context.Context, params *claim.TakeOverParams) (*claim.Claim, error) {
	if err := sqlstore.ValidateTakeOver(params); err != nil {
		return nil, err
	}
	newKey, revision, err := sqlstore.NextKey(ctx, s.Get, params)
	if err != nil {
		return nil, err
	}
	row := s.db.QueryRowContext(ctx, `WITH u AS (UPDATE claims SET state = 'claimed', owner = $1, claimed_by = $2, taken_over_from = state,
		delivery_count = CASE WHEN $3::int > 0 THEN $3::int ELSE delivery_count END,
		heartbeat_utc = now(), taken_over_utc = now(), take_overs = take_overs + 1,
		take_over_path = $4, take_over_reason = $5, previous_owner = owner, previous_holder = claimed_by,
		recoveries = recoveries + CASE WHEN $4::text = 'reconciler' THEN 1 ELSE 0 END, next_attempt_utc = NULL,
		dead_letter_seq = CASE WHEN state = 'failed' THEN NULL ELSE dead_letter_seq END,
		route = CASE WHEN route = '' THEN $6 ELSE route END,
		fingerprint = CASE WHEN route = '' THEN $7 ELSE fingerprint END,
		key_revision = key_revision + CASE WHEN $11::bool THEN 1 ELSE 0 END,
		effect_key = CASE WHEN $11::bool THEN $12 ELSE effect_key END,
		key_revised_by = CASE WHEN $11::bool THEN $2 ELSE key_revised_by END,
		key_revised_utc = CASE WHEN $11::bool THEN now() ELSE key_revised_utc END,
		key_revision_note = CASE WHEN $11::bool THEN $5 ELSE key_revision_note END,
		deferred_seq = CASE WHEN $4::text = 'redelivery' THEN NULL ELSE deferred_seq END, due_utc = NULL
		WHERE id = $9 AND owner = $10 AND (route = '' OR (route = $6 AND fingerprint = $7))
		AND (NOT $11::bool OR key_revision = $13)
		AND `+takeOverGuard(params)+seqParam[params.Path]+`
		RETURNING *
	), h AS (
		`+historySQL("u", "$14", "u.taken_over_from", "u.claimed_by", "u.take_over_path", "u.take_over_reason", "u.previous_owner")+`
	)
	SELECT `+cols("u.")+` FROM u`,
		params.Owner, params.By, params.DeliveryCount, string(params.Path), sqlstore.Bound(params.Reason, sqlstore.MaxReasonLength),
		params.Route, params.Fingerprint, secs(params.SilentFor), params.ID, params.PreviousOwner, params.NewKey,
		newKey, revision, string(sqlstore.TakeOverChange(params)), sqlstore.NullInt64(params.Seq))
	c, err := scanClaim(row)
	if errors.Is(err, sql.ErrNoRows) {
		now, gerr := s.Get(ctx, params.ID)
		if gerr != nil && !errors.Is(gerr, claim.ErrNotFound) {
			return nil, fmt.Errorf("take over claim %d: refused, then: %w", params.ID, gerr)
		}
		return now, sqlstore.TakeOverRefused(params, now)
	}
	if err != nil {
		return nil, fmt.Errorf("take over claim %d: %w", params.ID, translate(err))
	}
	return c, nil
}

// Flag hands a claim to operators, guarded on owner, state and silence.
func (s *Store) Flag(ctx context.Context, params *claim.FlagParams) (*claim.Claim, error) {
	if err := sqlstore.ValidateFlagOne(params); err != nil {
		return nil, err
	}
	row := s.db.QueryRowContext(ctx, `WITH u AS (
		UPDATE claims SET state = 'flagged', flagged_utc = now(), flag_reason = $1, flagged_from = state
		WHERE id = $2 AND owner = $3 AND state = $4
		AND ($5::float8 <= 0 OR heartbeat_utc < now() - make_interval(secs => $5::float8))
		RETURNING *
	), h AS (
		`+historySQL("u", "'"+string(claim.ChangeFlagged)+"'", "u.flagged_from", "coalesce(nullif($6, ''), u.claimed_by)", "''", "u.flag_reason", "NULL")+`
	)
	SELECT `+cols("u.")+` FROM u`,
		sqlstore.Bound(params.Reason, sqlstore.MaxReasonLength), params.ID, params.Owner, string(params.State), secs(params.SilentFor),
		sqlstore.Bound(params.By, 256))
	c, err := scanClaim(row)
	if errors.Is(err, sql.ErrNoRows) {
		if _, gerr := s.Get(ctx, params.ID); gerr != nil {
			return nil, fmt.Errorf("flag: %w", gerr)
		}
		return nil, fmt.Errorf("flag claim %d: %w", params.ID, claim.ErrStateChanged)
	}
	if err != nil {
		return nil, fmt.Errorf("flag claim %d: %w", params.ID, translate(err))
	}
	return c, nil
}

// FindStale lists recovery candidates, oldest heartbeat first (served by
// ix_claims_unfinished).
func (s *Store) FindStale(ctx context.Context, params *claim.FindStaleParams) ([]*claim.Claim, error) {
	staleAfter, limit, err := sqlstore.ValidateFindStale(params)
	if err != nil {
		return nil, err
	}
	q := `SELECT ` + columns + ` FROM claims WHERE ` + stalePredicate + `
		AND (next_attempt_utc IS NULL OR next_attempt_utc <= now())
		ORDER BY heartbeat_utc LIMIT $2`
	var out []*claim.Claim
	if err := queryClaims(ctx, s.db, q, []any{secs(staleAfter), limit}, func(c *claim.Claim) { out = append(out, c) }); err != nil {
		return nil, fmt.Errorf("find stale claims: %w", err)
	}
	return out, nil
}

// RecordLateSuccess notes a late success on the claim.
func (s *Store) RecordLateSuccess(ctx context.Context, params *claim.LateSuccessParams) error {
	res, err := s.db.ExecContext(ctx, `UPDATE claims SET late_success_utc = now(), late_success_by = $1 WHERE id = $2`,
		sqlstore.LateSuccessBy(params), params.ID)
	if err != nil {
		return fmt.Errorf("record late success of claim %d: %w", params.ID, translate(err))
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return fmt.Errorf("record late success of claim %d: %w", params.ID, cmp.Or(translate(err), claim.ErrNotFound))
	}
	return nil
}

// execGuarded runs an UPDATE guarded on id, owner and state and reports
// ErrStateChanged when it matched no row.
func (s *Store) execGuarded(ctx context.Context, op string, id int64, query string, args ...any) error {
	return sqlstore.ExecGuarded(ctx, s.db, translate, op, id, query, args...)
}

// Heartbeat refreshes the heartbeat of a claimed claim held by Owner.
func (s *Store) Heartbeat(ctx context.Context, params *claim.HeartbeatParams) error {
	return s.execGuarded(ctx, "heartbeat", params.ID,
		`UPDATE claims SET `+setHeartbeat+` WHERE id = $1 AND owner = $2 AND state = 'claimed'`,
		params.ID, params.Owner.String())
}

// The SET clauses of the outcome writes, shared by the single writes and
// WriteOutcomes so that both do the same. err, next (seconds; > 0 sets the
// next attempt's time) and answer (JSON; NULL keeps the claim's) are the
// expressions that hold the write's values.
const setHeartbeat = `heartbeat_utc = now()`

func setAnswerTo(answer string) string {
	return `answer = coalesce(` + answer + `, answer), answer_utc = CASE WHEN ` + answer + ` IS NULL THEN answer_utc ELSE now() END`
}

// setAnswer records the answer in parameter $n (JSON text).
func setAnswer(n int) string { return setAnswerTo(fmt.Sprintf("$%d::jsonb", n)) }

func setProcessed(answer string) string {
	return `state = 'processed', processed_utc = now(), payload = NULL, ` + setAnswerTo(answer)
}

func setReleased(err, next, answer string) string {
	return `state = 'released', released_utc = now(), heartbeat_utc = now(), last_error = ` + err + `,
		next_attempt_utc = CASE WHEN ` + next + ` > 0 THEN now() + make_interval(secs => ` + next + `) END,
		due_utc = NULL, ` + setAnswerTo(answer)
}

func setAttempt(err, next, answer string) string {
	return `attempts = attempts + 1, last_error = ` + err + `,
		next_attempt_utc = CASE WHEN ` + next + ` > 0 THEN now() + make_interval(secs => ` + next + `) ELSE next_attempt_utc END, ` + setAnswerTo(answer)
}

// MarkProcessed moves a claimed claim held by Owner to processed.
func (s *Store) MarkProcessed(ctx context.Context, params *claim.MarkProcessedParams) error {
	answer, err := sqlstore.EncodeAnswer(params.Answer)
	if err != nil {
		return fmt.Errorf("mark processed claim %d: %w", params.ID, err)
	}
	query := guardedSQL(`UPDATE claims SET `+setProcessed("$3::jsonb")+` WHERE id = $1 AND owner = $2 AND state = 'claimed'`,
		string(claim.ChangeProcessed), "'claimed'", "u.claimed_by", "''")
	if len(params.FollowUps) == 0 {
		return s.execGuarded(ctx, "mark processed", params.ID, query, params.ID, params.Owner.String(), answer)
	}
	// Its follow-ups in the same transaction, only when the guard held.
	if err := claim.ValidateNumbered(params.ID, params.FollowUps); err != nil {
		return err
	}
	return s.inTx(ctx, "mark processed", func(tx *sql.Tx) error {
		if err := sqlstore.ExecGuarded(ctx, tx, translate, "mark processed", params.ID, query, params.ID, params.Owner.String(), answer); err != nil {
			return err
		}
		return insertFollowUps(ctx, tx, params.ID, params.FollowUps)
	})
}

// inTx runs fn in a transaction and commits it when fn succeeds.
func (s *Store) inTx(ctx context.Context, op string, fn func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("%s: begin: %w", op, translate(err))
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("%s: commit: %w", op, translate(err))
	}
	return nil
}

// Release moves a claimed claim held by Owner to released; a positive
// NextAttemptIn ($4, seconds) sets the next attempt's time.
func (s *Store) Release(ctx context.Context, params *claim.ReleaseParams) error {
	answer, err := sqlstore.EncodeAnswer(params.Answer)
	if err != nil {
		return fmt.Errorf("release claim %d: %w", params.ID, err)
	}
	return s.execGuarded(ctx, "release", params.ID,
		guardedSQL(`UPDATE claims SET `+setReleased("$3", "$4::float8", "$5::jsonb")+` WHERE id = $1 AND owner = $2 AND state = 'claimed'`,
			string(claim.ChangeReleased), "'claimed'", "u.claimed_by", "u.last_error"),
		params.ID, params.Owner.String(), params.Error, secs(params.NextAttemptIn), answer)
}

// RecordAttempt counts an effect attempt on a claimed claim held by Owner;
// a positive NextAttemptIn ($4, seconds) sets the next attempt's time.
func (s *Store) RecordAttempt(ctx context.Context, params *claim.RecordAttemptParams) error {
	answer, err := sqlstore.EncodeAnswer(params.Answer)
	if err != nil {
		return fmt.Errorf("record attempt claim %d: %w", params.ID, err)
	}
	return s.execGuarded(ctx, "record attempt", params.ID,
		guardedSQL(`UPDATE claims SET `+setAttempt("$3", "$4::float8", "$5::jsonb")+` WHERE id = $1 AND owner = $2 AND state = 'claimed'`,
			string(claim.ChangeAttempt), "'claimed'", "u.claimed_by", "u.last_error"),
		params.ID, params.Owner.String(), params.Error, secs(params.NextAttemptIn), answer)
}

// writeOutcomesSQL performs a batch of outcome writes in one statement:
// the writes arrive as parallel arrays (kind, id, owner, error, next
// attempt in seconds, answer), each kind's UPDATE takes its rows, guarded
// on owner and state like the single write, and the ids changed come
// back. A batch has at most one write per claim, so no two UPDATEs touch
// one row.
var writeOutcomesSQL, writeOutcomesSQLNoHistory = writeOutcomesStatement(true), writeOutcomesStatement(false)

func writeOutcomesStatement(history bool) string {
	return `WITH w AS (
	SELECT * FROM unnest($1::int2[], $2::bigint[], $3::uuid[], $4::text[], $5::float8[], $6::text[])
		AS w(w_kind, w_id, w_owner, w_err, w_next, w_answer)
), hb AS (
	UPDATE claims SET ` + setHeartbeat + ` FROM w
	WHERE w.w_kind = ` + strconv.Itoa(int(claim.WriteHeartbeat)) + ` AND id = w.w_id AND owner = w.w_owner AND state = 'claimed' RETURNING id
), att AS (
	UPDATE claims SET ` + setAttempt("w.w_err", "w.w_next", "w.w_answer::jsonb") + ` FROM w
	WHERE w.w_kind = ` + strconv.Itoa(int(claim.WriteRecordAttempt)) + ` AND id = w.w_id AND owner = w.w_owner AND state = 'claimed' RETURNING claims.*
), rel AS (
	UPDATE claims SET ` + setReleased("w.w_err", "w.w_next", "w.w_answer::jsonb") + ` FROM w
	WHERE w.w_kind = ` + strconv.Itoa(int(claim.WriteRelease)) + ` AND id = w.w_id AND owner = w.w_owner AND state = 'claimed' RETURNING claims.*
), pro AS (
	UPDATE claims SET ` + setProcessed("w.w_answer::jsonb") + ` FROM w
	WHERE w.w_kind = ` + strconv.Itoa(int(claim.WriteMarkProcessed)) + ` AND id = w.w_id AND owner = w.w_owner AND state = 'claimed' RETURNING claims.*
), hatt AS (
	` + maybeHistory(history, historySQL("att", "'"+string(claim.ChangeAttempt)+"'", "'claimed'", "att.claimed_by", "''", "att.last_error", "NULL")) + `
), hrel AS (
	` + maybeHistory(history, historySQL("rel", "'"+string(claim.ChangeReleased)+"'", "'claimed'", "rel.claimed_by", "''", "rel.last_error", "NULL")) + `
), hpro AS (
	` + maybeHistory(history, historySQL("pro", "'"+string(claim.ChangeProcessed)+"'", "'claimed'", "pro.claimed_by", "''", "''", "NULL")) + `
)
SELECT id FROM hb UNION ALL SELECT id FROM att UNION ALL SELECT id FROM rel UNION ALL SELECT id FROM pro`
}

// WriteOutcomes performs a batch of outcome writes in one statement (see
// claim.BatchWriter).
func (s *Store) WriteOutcomes(ctx context.Context, writes []claim.OutcomeWrite) ([]error, error) {
	if err := claim.CheckBatch(writes); err != nil {
		return nil, err
	}
	if len(writes) == 0 {
		return nil, nil
	}
	var (
		kinds   = make([]int16, len(writes))
		ids     = make([]int64, len(writes))
		owners  = make([]pgtype.UUID, len(writes))
		errs    = make([]string, len(writes))
		nexts   = make([]float64, len(writes))
		answers = make([]*string, len(writes))
	)
	for i, w := range writes {
		v := sqlstore.ValuesOf(w)
		kinds[i], ids[i], owners[i] = int16(w.Kind()), v.ID, pgtype.UUID{Bytes: v.Owner, Valid: true}
		errs[i], nexts[i] = v.Error, secs(v.NextAttemptIn)
		enc, err := sqlstore.EncodeAnswer(v.Answer)
		if err != nil {
			return nil, fmt.Errorf("%s claim %d: %w", w.Kind(), v.ID, err)
		}
		if enc.Valid {
			answers[i] = &enc.String
		}
	}
	// One statement, or — when a write carries follow-ups — one
	// transaction: the statement, then the follow-ups of the claims it
	// marked processed.
	query := writeOutcomesSQL
	if s.noHistory.Load() {
		query = writeOutcomesSQLNoHistory
	}
	var done map[int64]bool
	run := func(q sqlstore.Querier) error {
		rows, err := q.QueryContext(ctx, query, kinds, ids, owners, errs, nexts, answers)
		if err != nil {
			return fmt.Errorf("write %d outcomes: %w", len(writes), translate(err))
		}
		if done, err = sqlstore.ScanIDs(rows); err != nil {
			return fmt.Errorf("write %d outcomes: %w", len(writes), translate(err))
		}
		return nil
	}
	if !slices.ContainsFunc(writes, func(w claim.OutcomeWrite) bool { return w.MarkProcessed != nil && len(w.MarkProcessed.FollowUps) > 0 }) {
		if err := run(s.db); err != nil {
			return nil, err
		}
		return sqlstore.BatchResults(writes, done), nil
	}
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

// Fail moves a claimed claim held by Owner to failed.
func (s *Store) Fail(ctx context.Context, params *claim.FailParams) error {
	if err := sqlstore.ValidateFail(params); err != nil {
		return err
	}
	answer, err := sqlstore.EncodeAnswer(params.Answer)
	if err != nil {
		return fmt.Errorf("fail claim %d: %w", params.ID, err)
	}
	return s.execGuarded(ctx, "fail", params.ID,
		guardedSQL(`UPDATE claims SET state = 'failed', failed_utc = now(), fail_reason = $3, last_error = $4,
		dead_letter_seq = $5, `+setAnswer(6)+`
		WHERE id = $1 AND owner = $2 AND state = 'claimed'`,
			string(claim.ChangeFailed), "'claimed'", "u.claimed_by", "u.fail_reason || ': ' || u.last_error"),
		params.ID, params.Owner.String(), params.Reason, params.Error, sqlstore.NullInt64(params.DeadLetterSeq), answer)
}

// TakeDeadLetter records the delivery that dead-letters a failed claim's
// message, when none does yet.
func (s *Store) TakeDeadLetter(ctx context.Context, params *claim.TakeDeadLetterParams) error {
	err := s.execGuarded(ctx, "take the dead letter of", params.ID,
		guardedSQL(`UPDATE claims SET dead_letter_seq = $2 WHERE id = $1 AND state = 'failed' AND dead_letter_seq IS NULL`,
			string(claim.ChangeDeadLetter), "'failed'", "coalesce(nullif($3, ''), u.claimed_by)", "'sequence number ' || u.dead_letter_seq"),
		params.ID, params.Seq, sqlstore.Bound(params.By, 256))
	if errors.Is(err, claim.ErrStateChanged) {
		if _, gerr := s.Get(ctx, params.ID); gerr != nil {
			return fmt.Errorf("take the dead letter: %w", gerr)
		}
	}
	return err
}

// stalePredicate is the staleness test, in the UPDATE's own WHERE (so READ
// COMMITTED re-checks it on the latest row version) and in its candidate
// scan (which the partial index ix_claims_unfinished serves). $1 is
// StaleAfter in seconds.
//
// A claim whose message is deferred (deferred_seq set) is left to its
// message until its grace ran out (next_attempt_utc: claim.Deferrer).
const stalePredicate = `state IN ('claimed', 'released') AND heartbeat_utc < now() - make_interval(secs => $1)
	AND (deferred_seq IS NULL OR next_attempt_utc IS NULL OR next_attempt_utc <= now())`

// FlagStale flags at most Limit stale claims in one UPDATE.
func (s *Store) FlagStale(ctx context.Context, params *claim.FlagStaleParams) ([]*claim.Claim, error) {
	staleAfter, limit, err := sqlstore.ValidateFlag(params)
	if err != nil {
		return nil, err
	}
	q := `WITH u AS (UPDATE claims SET state = 'flagged', flagged_utc = now(), flagged_from = state,
		flag_reason = CASE state WHEN 'released' THEN '` + sqlstore.ReasonReleased + `' ELSE '` + sqlstore.ReasonNoHeartbeat + `' END
			|| to_char(heartbeat_utc AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"')
		WHERE id IN (SELECT id FROM claims WHERE ` + stalePredicate + ` ORDER BY heartbeat_utc LIMIT $2)
		AND ` + stalePredicate + `
		RETURNING *
	), h AS (
		` + historySQL("u", "'"+string(claim.ChangeFlagged)+"'", "u.flagged_from", "$3", "''", "u.flag_reason", "NULL") + `
	)
	SELECT ` + cols("u.") + ` FROM u`
	var out []*claim.Claim
	if err := queryClaims(ctx, s.db, q, []any{secs(staleAfter), limit, sqlstore.StaleBy(params)}, func(c *claim.Claim) { out = append(out, c) }); err != nil {
		return nil, fmt.Errorf("flag stale claims: %w", err)
	}
	return out, nil
}

// List returns claims oldest ID first.
func (s *Store) List(ctx context.Context, params *claim.ListParams) ([]*claim.Claim, error) {
	if err := sqlstore.ValidateList(params); err != nil {
		return nil, err
	}
	args := []any{params.AfterID}
	where := []string{"id > $1"}
	if len(params.States) > 0 {
		states := make([]string, len(params.States))
		for i, st := range params.States {
			states[i] = string(st)
		}
		args = append(args, states)
		where = append(where, fmt.Sprintf("state = ANY($%d::text[])", len(args)))
	}
	if params.Consumer != "" {
		args = append(args, params.Consumer)
		where = append(where, fmt.Sprintf("consumer = $%d", len(args)))
	}
	if params.OlderThan > 0 {
		args = append(args, secs(params.OlderThan))
		where = append(where, fmt.Sprintf("claimed_utc < now() - make_interval(secs => $%d)", len(args)))
	}
	where, args, err := listFilters(params, where, args)
	if err != nil {
		return nil, err
	}
	args = append(args, sqlstore.Limit(params.Limit, sqlstore.DefaultListLimit))
	q := fmt.Sprintf("SELECT %s FROM claims WHERE %s ORDER BY id LIMIT $%d", columns, strings.Join(where, " AND "), len(args))
	var out []*claim.Claim
	if err := queryClaims(ctx, s.db, q, args, func(c *claim.Claim) { out = append(out, c) }); err != nil {
		return nil, fmt.Errorf("list claims: %w", err)
	}
	return out, nil
}

// Get returns one claim by ID.
func (s *Store) Get(ctx context.Context, id int64) (*claim.Claim, error) {
	c, err := scanClaim(s.db.QueryRowContext(ctx, "SELECT "+columns+" FROM claims WHERE id = $1", id))
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("get claim %d: %w", id, claim.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("get claim %d: %w", id, translate(err))
	}
	return c, nil
}

// History returns a claim's history, oldest first.
func (s *Store) History(ctx context.Context, id int64) ([]claim.HistoryEntry, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, claim_id, at_utc, what, from_state, to_state, by_whom, path, reason,
		previous_owner, owner, idempotency_key FROM claim_history WHERE claim_id = $1 ORDER BY id`, id)
	if err != nil {
		return nil, fmt.Errorf("history of claim %d: %w", id, translate(err))
	}
	out, err := sqlstore.ScanHistory(rows, func(r *sql.Rows, e *claim.HistoryEntry) error {
		var prev uuid.NullUUID
		err := r.Scan(&e.ID, &e.ClaimID, &e.At, &e.What, &e.From, &e.To, &e.By, &e.Path, &e.Reason, &prev, &e.Owner, &e.Key)
		e.PreviousOwner = prev.UUID
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("history of claim %d: %w", id, translate(err))
	}
	if len(out) == 0 {
		if _, err := s.Get(ctx, id); err != nil {
			return nil, fmt.Errorf("history: %w", err)
		}
	}
	return out, nil
}

// Resolve closes a flagged claim.
func (s *Store) Resolve(ctx context.Context, params *claim.ResolveParams) (*claim.Claim, error) {
	if err := sqlstore.ValidateResolve(params); err != nil {
		return nil, err
	}
	// $5 is the redrive's owner token, or NULL to resolve a flagged claim.
	var owner *uuid.UUID
	if params.Owner != uuid.Nil {
		owner = &params.Owner
	}
	answer, err := sqlstore.EncodeAnswer(params.Answer)
	if err != nil {
		return nil, fmt.Errorf("resolve claim %d: %w", params.ID, err)
	}
	var c *claim.Claim
	err = s.inTx(ctx, fmt.Sprintf("resolve claim %d", params.ID), func(tx *sql.Tx) error {
		c, err = s.resolve(ctx, tx, params, owner, answer)
		if err != nil || len(params.FollowUps) == 0 {
			return err
		}
		return insertFollowUps(ctx, tx, params.ID, params.FollowUps)
	})
	return c, err
}

// resolve is Resolve's guarded UPDATE, in tx.
func (s *Store) resolve(ctx context.Context, tx *sql.Tx, params *claim.ResolveParams, owner *uuid.UUID, answer sql.NullString) (*claim.Claim, error) {
	row := tx.QueryRowContext(ctx, `WITH u AS (UPDATE claims SET state = 'resolved', resolved_utc = now(),
		resolved_by = $1, resolution = $2, resolution_note = $3,
		processed_utc = CASE WHEN $2 = 'redriven' THEN now() ELSE processed_utc END,
		payload = CASE WHEN $2 = 'redriven' THEN NULL ELSE payload END, `+setAnswer(6)+`
		WHERE id = $4 AND CASE WHEN $5::uuid IS NULL THEN state = 'flagged' ELSE state = 'claimed' AND owner = $5 END
		RETURNING *
	), h AS (
		`+historySQL("u", "'"+string(claim.ChangeResolved)+"'", "CASE WHEN $5::uuid IS NULL THEN 'flagged' ELSE 'claimed' END",
		"u.resolved_by", "''", "u.resolution || CASE WHEN u.resolution_note <> '' THEN ': ' || u.resolution_note ELSE '' END", "NULL")+`
	)
	SELECT `+cols("u.")+` FROM u`,
		params.By, string(params.Resolution), params.Note, params.ID, owner, answer)
	c, err := scanClaim(row)
	if errors.Is(err, sql.ErrNoRows) {
		if _, gerr := s.Get(ctx, params.ID); gerr != nil {
			return nil, fmt.Errorf("resolve: %w", gerr)
		}
		return nil, fmt.Errorf("resolve claim %d: %w", params.ID, claim.ErrStateChanged)
	}
	if err != nil {
		return nil, fmt.Errorf("resolve claim %d: %w", params.ID, translate(err))
	}
	return c, nil
}

// PurgeProcessed deletes at most Limit finished claims older than OlderThan.
func (s *Store) PurgeProcessed(ctx context.Context, params *claim.PurgeParams) (int64, error) {
	olderThan, limit, err := sqlstore.ValidatePurge(params)
	if err != nil {
		return 0, err
	}
	// Each claim is as old as the state it is in (a retried claim that
	// failed long ago and was processed a moment ago is new); one that
	// still names a deferred message waits for the stranded sweep. The
	// expressions match the partial index ix_claims_purge.
	const (
		finishedAt = `(CASE state WHEN 'processed' THEN processed_utc WHEN 'failed' THEN failed_utc ELSE resolved_utc END)`
		finished   = `state IN ('processed', 'failed', 'resolved') AND deferred_seq IS NULL
		AND ` + finishedAt + ` < now() - make_interval(secs => $1)
		AND NOT EXISTS (SELECT 1 FROM claim_followups f WHERE f.claim_id = claims.id AND f.state = 'pending')`
	)
	// A claim's history and follow-ups go with it, in the same statement.
	var n int64
	err = s.db.QueryRowContext(ctx, `WITH d AS (DELETE FROM claims WHERE id IN (
			SELECT id FROM claims WHERE `+finished+` ORDER BY `+finishedAt+` LIMIT $2)
		AND `+finished+` RETURNING id
	), h AS (
		DELETE FROM claim_history WHERE claim_id IN (SELECT id FROM d)
	), f AS (
		DELETE FROM claim_followups WHERE claim_id IN (SELECT id FROM d)
	)
	SELECT count(*) FROM d`, secs(olderThan), limit).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("purge claims: %w", translate(err))
	}
	return n, nil
}

// Stats summarises the table; each count is served by a partial index.
func (s *Store) Stats(ctx context.Context) (*claim.Stats, error) {
	var (
		st     claim.Stats
		oldest sql.NullTime
	)
	err := s.db.QueryRowContext(ctx, `SELECT now(),
		(SELECT count(*) FROM claims WHERE state IN ('claimed', 'released') AND state = 'claimed'),
		(SELECT count(*) FROM claims WHERE state IN ('claimed', 'released') AND state = 'released'),
		(SELECT count(*) FROM claims WHERE state = 'flagged'),
		(SELECT count(*) FROM claims WHERE state = 'failed'),
		(SELECT min(claimed_utc) FROM claims WHERE state IN ('claimed', 'released'))`).
		Scan(&st.Now, &st.Claimed, &st.Released, &st.Flagged, &st.Failed, &oldest)
	if err != nil {
		return nil, fmt.Errorf("claim stats: %w", translate(err))
	}
	st.Now = st.Now.UTC()
	st.OldestUnfinished = utc(oldest)
	return &st, nil
}

// lockNamespace is the first key of sbclaim's two-key advisory locks, so
// TryLock names never collide with single-key locks (goose's migration
// lock) or other applications' locks keyed on hashtext alone.
const lockNamespace = 0x5bc1

// TryLock takes a session advisory lock on a dedicated connection, held
// until unlock. The lock is scoped to the current schema, so deployments
// that keep their claims in different schemas of one database do not
// block each other's reconcilers.
func (s *Store) TryLock(ctx context.Context, name string) (func(context.Context) error, bool, error) {
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("try lock %q: %w", name, translate(err))
	}
	var ok bool
	if err := conn.QueryRowContext(ctx, "SELECT pg_try_advisory_lock($1, hashtext(current_schema() || '.' || $2))", lockNamespace, name).Scan(&ok); err != nil {
		discard(conn)
		return nil, false, fmt.Errorf("try lock %q: %w", name, translate(err))
	}
	if !ok {
		conn.Close()
		return nil, false, nil
	}
	var (
		once      sync.Once
		unlockErr error
	)
	unlock := func(ctx context.Context) error {
		once.Do(func() {
			var released bool
			err := conn.QueryRowContext(ctx, "SELECT pg_advisory_unlock($1, hashtext(current_schema() || '.' || $2))", lockNamespace, name).Scan(&released)
			if err != nil || !released {
				// Never return a connection that may still hold the lock
				// to the pool: closing the session releases it.
				discard(conn)
				if err != nil {
					unlockErr = fmt.Errorf("unlock %q: %w", name, translate(err))
				}
				return
			}
			conn.Close()
		})
		return unlockErr
	}
	return unlock, true, nil
}

// discard closes conn's underlying session instead of returning it to the
// pool.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	conn.Close()
}

// Now returns the database clock.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	var now time.Time
	if err := s.db.QueryRowContext(ctx, "SELECT now()").Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("database clock: %w", translate(err))
	}
	return now.UTC(), nil
}

// Ping checks the database answers a query.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.db.PingContext(ctx); err != nil {
		return fmt.Errorf("ping postgres: %w", translate(err))
	}
	return nil
}

// Close closes the connection pool.
func (s *Store) Close() error { return s.db.Close() }

// sqlStateClasses classifies server errors by SQLSTATE (see the error
// contract in package claim). Codes not listed, and every other class 08
// code, are looked up in sqlStateClass.
var sqlStateClasses = map[string]claim.Class{
	"57P05": claim.ClassConnection, // idle_session_timeout: the server closed the session

	"53000": claim.ClassBusy, // insufficient_resources
	"53200": claim.ClassBusy, // out_of_memory
	"53300": claim.ClassBusy, // too_many_connections

	"57P01": claim.ClassFailover, // admin_shutdown (a restart, a failover)
	"57P02": claim.ClassFailover, // crash_shutdown
	"57P03": claim.ClassFailover, // cannot_connect_now (starting up, in recovery)

	"40P01": claim.ClassDeadlock, // deadlock_detected: this transaction was rolled back
	"40001": claim.ClassDeadlock, // serialization_failure

	"55P03": claim.ClassLockTimeout, // lock_not_available (lock_timeout, NOWAIT)
	"57014": claim.ClassLockTimeout, // query_canceled (statement_timeout; a cancel request)

	"25006": claim.ClassReadOnly, // read_only_sql_transaction (a standby, default_transaction_read_only)

	"53100": claim.ClassNoSpace, // disk_full

	"42501": claim.ClassPermission, // insufficient_privilege (a missing grant)
	"28000": claim.ClassPermission, // invalid_authorization_specification (pg_hba, no such role)
	"28P01": claim.ClassPermission, // invalid_password
}

// sqlStateClass returns the class of a SQLSTATE: the table above, or
// connection for any class 08 (connection exception) code.
func sqlStateClass(code string) claim.Class {
	if c, ok := sqlStateClasses[code]; ok {
		return c
	}
	if strings.HasPrefix(code, "08") {
		return claim.ClassConnection
	}
	return claim.ClassNone
}

// translate maps driver errors to the claim sentinels, keeping the driver
// error in the chain: SQLSTATE 23505 on the claims unique index is
// ErrDuplicate (any other unique violation stays a plain error); a server
// error is classified by its SQLSTATE (sqlStateClasses); a deadline that
// expired is claim.ClassTimeout; failures to connect, broken connections
// and a closed pool are claim.ClassConnection. A cancelled context (the
// caller gave up) and everything else stay plain errors.
func translate(err error) error {
	if err == nil {
		return nil
	}
	var ce *claim.Error
	if errors.As(err, &ce) || errors.Is(err, claim.ErrDuplicate) {
		return err // already translated
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		if pgErr.Code == "23505" {
			if pgErr.ConstraintName == ClaimsUniqueIndex {
				return fmt.Errorf("%w: %w", claim.ErrDuplicate, err)
			}
			return err
		}
		return claim.NewError(sqlStateClass(pgErr.Code), err)
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	var (
		connectErr *pgconn.ConnectError
		netErr     net.Error
	)
	if errors.Is(err, context.DeadlineExceeded) || pgconn.Timeout(err) || (errors.As(err, &netErr) && netErr.Timeout()) {
		return claim.NewError(claim.ClassTimeout, err)
	}
	if errors.As(err, &connectErr) || errors.As(err, &netErr) ||
		errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		sqlstore.ErrClosedDB(err) || pgconn.SafeToRetry(err) {
		return claim.NewError(claim.ClassConnection, err)
	}
	return err
}
