package sqlite

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/pressly/goose/v3"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/sqlstore"
	sqlfiles "github.com/sbclaim/sbclaim/sql"
)

var _ claim.Store = (*Store)(nil)

// Store is the SQLite claims table.
type Store struct {
	db      *sql.DB
	lockKey string
	// noHistory turns the history writes off (SetHistoryForBench).
	noHistory atomic.Bool
	// stmts keeps the message path's statements prepared.
	stmts stmtCache
}

// MaxConcurrentWrites is 1: SQLite writes one transaction at a time
// (claim.WriteLimit).
func (s *Store) MaxConcurrentWrites() int { return 1 }

// SetHistoryForBench turns the history writes on or off (on by default).
// It exists for the benchmark that measures what history costs: a store
// with history off breaks the audit promise (claim.HistorySwitch).
func (s *Store) SetHistoryForBench(on bool) { s.noHistory.Store(!on) }

// Option configures a Store.
type Option func(*Store)

// WithLockKey sets the key of the process-wide TryLock registry, normally
// the absolute path of the database file. Stores with the same key share
// their named locks. The default is unique to the *sql.DB.
func WithLockKey(key string) Option { return func(s *Store) { s.lockKey = key } }

// New wraps an open database. The caller owns the pool settings; Open sets
// the ones this package needs (one connection, busy timeout, WAL).
func New(db *sql.DB, opts ...Option) *Store {
	s := &Store{db: db, lockKey: fmt.Sprintf("db:%p", db)}
	for _, o := range opts {
		o(s)
	}
	return s
}

// DB returns the database the store uses.
func (s *Store) DB() *sql.DB { return s.db }

// busyTimeout is how long a statement waits for another process's write
// lock before failing with SQLITE_BUSY (reported as claim.ErrUnavailable,
// class busy).
const busyTimeout = 10 * time.Second

// Open opens a SQLite claims store from a URL: "sqlite:/path/file.db",
// "sqlite:relative.db", "sqlite:///abs/path.db" or "sqlite::memory:". A
// memory database is migrated on open (it starts empty and dies with the
// store); a file database is migrated by Migrate.
func Open(ctx context.Context, url string) (*Store, error) {
	path, err := ParseURL(url)
	if err != nil {
		return nil, err
	}
	memory := path == ":memory:"
	pragmas := fmt.Sprintf("_pragma=busy_timeout(%d)&_pragma=foreign_keys(1)&_txlock=immediate", busyTimeout.Milliseconds())
	if !memory {
		pragmas += "&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)"
	}
	db, err := sql.Open("sqlite", path+"?"+pragmas)
	if err != nil {
		return nil, fmt.Errorf("open sqlite: %w", err)
	}
	// One connection: SQLite has one writer anyway, queueing in
	// database/sql avoids SQLITE_BUSY between our own goroutines, and a
	// memory database lives exactly as long as its connection.
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	db.SetConnMaxLifetime(0)
	db.SetConnMaxIdleTime(0)

	key := "memory:" + fmt.Sprintf("%p", db)
	if !memory {
		if abs, err := filepath.Abs(path); err == nil {
			key = "file:" + abs
		} else {
			key = "file:" + path
		}
	}
	s := New(db, WithLockKey(key))
	if err := s.Ping(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("open sqlite %s: %w", path, err)
	}
	if memory {
		if err := Migrate(ctx, db); err != nil {
			db.Close()
			return nil, err
		}
	}
	return s, nil
}

// ParseURL returns the file path (or ":memory:") of a sqlite: URL.
func ParseURL(url string) (string, error) {
	rest, ok := strings.CutPrefix(url, "sqlite:")
	if !ok {
		return "", fmt.Errorf("sqlite: URL must start with \"sqlite:\"")
	}
	rest = strings.TrimPrefix(rest, "//") // sqlite:///abs/path → /abs/path
	if i := strings.IndexByte(rest, '?'); i >= 0 {
		return "", fmt.Errorf("sqlite: URL query parameters are not supported")
	}
	if rest == "" {
		return "", fmt.Errorf("sqlite: URL has no file path (use sqlite:/path/file.db or sqlite::memory:)")
	}
	return rest, nil
}

// Migrate applies the embedded SQLite migrations (sql/sqlite) to db.
func Migrate(ctx context.Context, db *sql.DB) error {
	fsys, err := sqlfiles.Dialect("sqlite")
	if err != nil {
		return fmt.Errorf("migrate sqlite: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectSQLite3, db, fsys)
	if err != nil {
		return fmt.Errorf("migrate sqlite: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate sqlite: %w", translate(err))
	}
	return nil
}

// SQL fragments for the database clock.
const (
	nowSQL = `strftime('%Y-%m-%dT%H:%M:%f',coalesce(sbclaim_now(),'now'))`
	// agoSQL is now minus the modifier in parameter ?1 (see ago).
	agoSQL = `strftime('%Y-%m-%dT%H:%M:%f',coalesce(sbclaim_now(),'now'),?1)`
	// timeLayout parses the text nowSQL writes.
	timeLayout = "2006-01-02T15:04:05.000"
)

// ago returns the strftime modifier that subtracts d.
func ago(d time.Duration) string { return fmt.Sprintf("-%.3f seconds", d.Seconds()) }

const columns = `id, message_id, consumer, owner, state, entity, subject, content_type,
	properties, payload_hash, payload, delivery_count, claimed_by, claimed_utc,
	heartbeat_utc, processed_utc, released_utc, attempts, last_error, flagged_utc,
	flag_reason, resolved_utc, resolved_by, resolution, resolution_note,
	route, fingerprint, take_overs, taken_over_utc, take_over_path, take_over_reason,
	previous_owner, previous_holder, recoveries, next_attempt_utc, late_success_utc, late_success_by,
	failed_utc, fail_reason, dead_letter_seq, answer, answer_utc,
	key_revision, effect_key, key_revised_by, key_revised_utc, key_revision_note, key_form,
	deferred_seq, due_utc, postponements, postponed_utc, session_id`

const insertColumns = `message_id, consumer, owner, state, entity, subject, content_type,
	properties, payload_hash, payload, delivery_count, route, fingerprint, key_form, effect_key,
	claimed_by, claimed_utc, heartbeat_utc, processed_utc, session_id`

// insertSQL inserts claims from VALUES rows of 15 columns; ?1 is the
// state, ?2 the host; the processed time and column15 (the session id)
// follow.
const insertSQL = `INSERT INTO claims (` + insertColumns + `)
	SELECT column1, column2, column3, ?1, column4, column5, column6, column7, column8, column9, column10,
		column11, column12, column13, column14, ?2, ` + nowSQL + `, ` + nowSQL + `, `

// scanned is the scratch of one scanClaim: the claim's scanned columns,
// the text and NULL-able values they come as, and the Scan destinations
// pointing at them. It is pooled: a scan allocates the claim it returns,
// and what the driver hands over, but no destinations.
type scanned struct {
	c                                                 claim.Claim
	owner, state, props, resolution, path             string
	claimed, heartbeat                                string
	processed, released, flagged, resolved, takenOver sql.NullString
	nextAttempt, lateSuccess, previousOwner, failed   sql.NullString
	answerAt, keyRevised, due, postponed              sql.NullString
	deadLetterSeq, deferredSeq                        sql.NullInt64
	answer                                            *string
	dest                                              []any
}

var scans = sync.Pool{New: func() any {
	s := &scanned{}
	c := &s.c
	s.dest = []any{&c.ID, &c.MessageID, &c.Consumer, &s.owner, &s.state, &c.Entity, &c.Subject, &c.ContentType,
		&s.props, &c.PayloadHash, &c.Payload, &c.DeliveryCount, &c.ClaimedBy, &s.claimed,
		&s.heartbeat, &s.processed, &s.released, &c.Attempts, &c.LastError, &s.flagged,
		&c.FlagReason, &s.resolved, &c.ResolvedBy, &s.resolution, &c.ResolutionNote,
		&c.Route, &c.Fingerprint, &c.TakeOvers, &s.takenOver, &s.path, &c.TakeOverReason,
		&s.previousOwner, &c.PreviousHolder, &c.Recoveries, &s.nextAttempt, &s.lateSuccess, &c.LateSuccessBy,
		&s.failed, &c.FailReason, &s.deadLetterSeq, &s.answer, &s.answerAt,
		&c.KeyRevision, &c.EffectKey, &c.KeyRevisedBy, &s.keyRevised, &c.KeyRevisionNote, &c.KeyForm,
		&s.deferredSeq, &s.due, &c.Postponements, &s.postponed, &c.SessionID}
	return s
}}

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
	if err := s.fill(c); err != nil {
		return nil, fmt.Errorf("claim %d: %w", c.ID, err)
	}
	return c, nil
}

// fill sets c's fields that need converting from the scratch.
func (s *scanned) fill(c *claim.Claim) error {
	var err error
	if s.deferredSeq.Valid {
		seq := s.deferredSeq.Int64
		c.DeferredSeq = &seq
	}
	if s.deadLetterSeq.Valid {
		seq := s.deadLetterSeq.Int64
		c.DeadLetterSeq = &seq
	}
	if c.Answer, err = sqlstore.DecodeAnswer(s.answer); err != nil {
		return err
	}
	if c.Owner, err = uuid.Parse(s.owner); err != nil {
		return fmt.Errorf("owner: %w", err)
	}
	if s.previousOwner.Valid {
		if c.PreviousOwner, err = uuid.Parse(s.previousOwner.String); err != nil {
			return fmt.Errorf("previous owner: %w", err)
		}
	}
	c.State, c.Resolution, c.TakeOverPath = claim.State(s.state), claim.Resolution(s.resolution), claim.TakeOverPath(s.path)
	if c.Properties, err = sqlstore.DecodeProperties(s.props); err != nil {
		return err
	}
	if c.ClaimedAt, err = parseTime(s.claimed); err != nil {
		return err
	}
	if c.HeartbeatAt, err = parseTime(s.heartbeat); err != nil {
		return err
	}
	for _, p := range [...]struct {
		dst **time.Time
		src *sql.NullString
	}{{&c.ProcessedAt, &s.processed}, {&c.ReleasedAt, &s.released}, {&c.FlaggedAt, &s.flagged}, {&c.ResolvedAt, &s.resolved},
		{&c.TakenOverAt, &s.takenOver}, {&c.NextAttemptAt, &s.nextAttempt}, {&c.LateSuccessAt, &s.lateSuccess},
		{&c.FailedAt, &s.failed}, {&c.AnswerAt, &s.answerAt}, {&c.KeyRevisedAt, &s.keyRevised},
		{&c.DueAt, &s.due}, {&c.PostponedAt, &s.postponed}} {
		if *p.dst, err = parseNullTime(*p.src); err != nil {
			return err
		}
	}
	return nil
}

func parseTime(s string) (time.Time, error) {
	t, err := time.ParseInLocation(timeLayout, s, time.UTC)
	if err != nil {
		return time.Time{}, fmt.Errorf("parse time %q: %w", s, err)
	}
	return t, nil
}

func parseNullTime(s sql.NullString) (*time.Time, error) {
	if !s.Valid {
		return nil, nil
	}
	t, err := parseTime(s.String)
	if err != nil {
		return nil, err
	}
	return &t, nil
}

// ClaimBatch inserts the batch's distinct keys in one multi-row
// INSERT ... ON CONFLICT DO NOTHING RETURNING and reads the rows of the
// keys that already existed, in one transaction.
func (s *Store) ClaimBatch(ctx context.Context, params *claim.ClaimBatchParams) ([]claim.ClaimResult, error) {
	plan, err := sqlstore.NewPlan(params.Claims)
	if err != nil {
		return nil, err
	}
	if len(plan.First) == 0 {
		return nil, nil
	}
	tx, err := s.begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("claim batch: begin: %w", translate(err))
	}
	defer tx.Rollback()

	won, existing, err := s.insertClaims(ctx, tx, params.Host, plan, claim.StateClaimed)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("claim batch: commit: %w", translate(err))
	}
	return plan.Results(won, existing)
}

// insertClaims inserts the plan's distinct keys in state (claimed, or
// processed for ClaimTx) and returns the rows it inserted and the rows
// that already existed for the other keys.
func (s *Store) insertClaims(ctx context.Context, tx *stx, host string, plan *sqlstore.Plan, state claim.State) (won, existing map[sqlstore.Key]*claim.Claim, err error) {
	processed := "NULL"
	if state == claim.StateProcessed {
		processed = nowSQL
	}
	// The state (?1) and the host (?2) once; each row's own values as the
	// VALUES' columns 1 to 15 (the session id last).
	args := make([]any, 0, 2+15*len(plan.First))
	args = append(args, string(state), host)
	for _, i := range plan.First {
		c := &plan.Claims[i]
		props, err := sqlstore.EncodeProperties(c.Properties)
		if err != nil {
			return nil, nil, fmt.Errorf("claim %s/%s: %w", c.MessageID, c.Consumer, err)
		}
		payload := c.Payload
		if state == claim.StateProcessed {
			payload = nil
		}
		args = append(args, c.MessageID, c.Consumer, c.Owner.String(), c.Entity, c.Subject,
			c.ContentType, props, c.PayloadHash, nullBytes(payload), c.DeliveryCount, c.Route, c.Fingerprint,
			string(sqlstore.FormOf(c)), sqlstore.EffectKeyOf(c), c.SessionID)
	}
	key := textKey{what: "insert", a: processed, n: len(plan.First)}
	text, ok := texts.get(key)
	if !ok {
		var q strings.Builder
		q.Grow(len(insertSQL) + len(processed) + 49*len(plan.First) + len(columns) + 112)
		q.WriteString(insertSQL)
		q.WriteString(processed)
		q.WriteString(", column15 FROM (VALUES ")
		for n := range plan.First {
			if n > 0 {
				q.WriteString(", ")
			}
			q.WriteString("(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
		}
		// WHERE true: an INSERT ... SELECT followed by ON CONFLICT needs a
		// WHERE (SQLite's parser would otherwise read ON as a join's).
		q.WriteString(") WHERE true ON CONFLICT (message_id, consumer) DO NOTHING RETURNING " + insertedColumns)
		text = texts.put(key, q.String())
	}

	won = make(map[sqlstore.Key]*claim.Claim, len(plan.First))
	if err := s.scanInserted(ctx, tx, text, args, plan, state, host, won); err != nil {
		return nil, nil, fmt.Errorf("claim batch: insert: %w", err)
	}
	ids := make([]int64, 0, len(won))
	for _, c := range won {
		ids = append(ids, c.ID)
	}
	if err := s.writeHistory(ctx, tx, ids, claim.ChangeClaimed, "''", host, "''"); err != nil {
		return nil, nil, fmt.Errorf("claim batch: %w", err)
	}
	if len(won) == len(plan.First) {
		return won, nil, nil
	}

	var q strings.Builder
	args = args[:0]
	q.WriteString("SELECT " + columns + " FROM claims WHERE (message_id, consumer) IN (VALUES ")
	n := 0
	for _, i := range plan.First {
		c := &plan.Claims[i]
		if _, ok := won[sqlstore.Key{MessageID: c.MessageID, Consumer: c.Consumer}]; ok {
			continue
		}
		if n > 0 {
			q.WriteString(", ")
		}
		n++
		q.WriteString("(?, ?)")
		args = append(args, c.MessageID, c.Consumer)
	}
	q.WriteString(")")
	existing = make(map[sqlstore.Key]*claim.Claim, n)
	if err := queryClaims(ctx, tx, q.String(), args, func(c *claim.Claim) { existing[sqlstore.KeyOf(c)] = c }); err != nil {
		return nil, nil, fmt.Errorf("claim batch: read existing: %w", err)
	}
	return won, existing, nil
}

// insertedColumns are what a claim insert returns of each row it
// inserted: the row's key and what the database chose; the rest is the
// insert's own values (sqlstore.Inserted).
const insertedColumns = `id, message_id, consumer, claimed_utc, heartbeat_utc, processed_utc`

// scanInserted runs a claim insert (text, args) and puts the rows it
// inserted into won.
func (s *Store) scanInserted(ctx context.Context, tx *stx, text string, args []any, plan *sqlstore.Plan, state claim.State, host string, won map[sqlstore.Key]*claim.Claim) error {
	rows, err := tx.QueryContext(ctx, text, args...)
	if err != nil {
		return translate(err)
	}
	defer rows.Close()
	var (
		id                 int64
		mid, consumer      string
		claimed, heartbeat string
		processed          sql.NullString
		next               int
	)
	for rows.Next() {
		if err := rows.Scan(&id, &mid, &consumer, &claimed, &heartbeat, &processed); err != nil {
			return translate(err)
		}
		i := plan.FirstOf(&next, mid, consumer)
		if i < 0 {
			return fmt.Errorf("claim %d: inserted %s/%s, which the batch does not hold", id, mid, consumer)
		}
		p := &plan.Claims[i]
		claimedAt, err := parseTime(claimed)
		if err != nil {
			return fmt.Errorf("claim %d: %w", id, err)
		}
		heartbeatAt, err := parseTime(heartbeat)
		if err != nil {
			return fmt.Errorf("claim %d: %w", id, err)
		}
		processedAt, err := parseNullTime(processed)
		if err != nil {
			return fmt.Errorf("claim %d: %w", id, err)
		}
		c := sqlstore.Inserted(p, id, state, host, claimedAt, heartbeatAt, processedAt)
		if len(c.Payload) == 0 {
			// The driver reads a zero-length blob back as nil, so every
			// later read says "no payload stored": the won claim must say
			// the same, or the processor and the reconciler would decide
			// on different claims (an empty body handed off as stored,
			// then flagged as payloadless).
			c.Payload = nil
		}
		won[sqlstore.Key{MessageID: p.MessageID, Consumer: p.Consumer}] = c
	}
	return translate(rows.Err())
}

// writeHistory appends the history rows of a change the guarded write in
// the same transaction made to the claims ids, in one statement: from and
// reason are SQL expressions over the changed row; by is who ("" for the
// claim's holder). Take-overs record their path and the previous owner.
func (s *Store) writeHistory(ctx context.Context, tx *stx, ids []int64, what claim.Change, from, by, reason string) error {
	if len(ids) == 0 || s.noHistory.Load() {
		return nil
	}
	text := historyText(what, from, by, reason, len(ids) == 1)
	if len(ids) == 1 {
		if _, err := tx.ExecContext(ctx, text, string(what), by, ids[0]); err != nil {
			return fmt.Errorf("history of claim %d: %w", ids[0], translate(err))
		}
		return nil
	}
	// The ids go as one JSON array: one parameter to bind and parse,
	// whatever their number.
	list := make([]byte, 0, 1+8*len(ids))
	list = append(list, '[')
	for i, id := range ids {
		if i > 0 {
			list = append(list, ',')
		}
		list = strconv.AppendInt(list, id, 10)
	}
	list = append(list, ']')
	if _, err := tx.ExecContext(ctx, text, string(what), by, string(list)); err != nil {
		return fmt.Errorf("history of %d claims: %w", len(ids), translate(err))
	}
	return nil
}

// texts holds the statement texts the batch paths build from a few small
// inputs (the expressions of a kind of change, the number of rows), so
// that a batch does not build its statement anew each time.
var texts textCache

// textKey names a statement text: what statement, its expressions a and
// b, and its number of rows n.
type textKey struct {
	what, a, b string
	n          int
}

// maxCachedRows bounds the rows of a cached text (bigger batches are
// rare: their texts are built each time).
const maxCachedRows = 64

type textCache struct {
	mu sync.RWMutex
	m  map[textKey]string
}

func (c *textCache) get(k textKey) (string, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	t, ok := c.m[k]
	return t, ok
}

// put keeps text for k (unless k has too many rows) and returns it.
func (c *textCache) put(k textKey, text string) string {
	if k.n > maxCachedRows {
		return text
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[textKey]string)
	}
	c.m[k] = text
	return text
}

// historyText is the history INSERT of a change (what) whose from and
// reason are SQL expressions over the changed row: ?1 is what, ?2 who
// (unused when by is "": the claim's holder), ?3 the ids (a JSON array).
// What is constant for the statement is decided here, not per row: the
// take-over path and previous owner of a take-over, redrive or retry
// (else an empty path and no owner), the holder as who, an empty reason.
// The database clock is read once for all the rows (t.now). For one claim
// (single), ?3 is its id and the statement a plain INSERT ... SELECT of
// its row.
func historyText(what claim.Change, from, by, reason string, single bool) string {
	takeOver := what == claim.ChangeTakenOver || what == claim.ChangeRedriven || what == claim.ChangeRetried
	key := textKey{what: "history", a: from, b: reason}
	if takeOver {
		key.n |= 1
	}
	if by == "" {
		key.n |= 2
	}
	if single {
		key.n |= 4
	}
	if t, ok := texts.get(key); ok {
		return t
	}
	who, path, previous := "?2", "''", "NULL"
	if by == "" {
		who = "claimed_by"
	}
	if takeOver {
		path, previous = "take_over_path", "previous_owner"
	}
	if reason != "''" {
		reason = "substr(" + reason + ", 1, " + strconv.Itoa(claim.MaxHistoryReason) + ")"
	}
	if single {
		return texts.put(key, `INSERT INTO claim_history (claim_id, at_utc, what, from_state, to_state, by_whom, path, reason,
		previous_owner, owner, idempotency_key)
		SELECT id, `+nowSQL+`, ?1, `+from+`, state, `+who+`, `+path+`, `+reason+`, `+previous+`,
			owner, CASE WHEN effect_key <> '' THEN effect_key ELSE message_id END
		FROM claims WHERE id = ?3`)
	}
	return texts.put(key, `WITH t (now) AS MATERIALIZED (SELECT `+nowSQL+`)
		INSERT INTO claim_history (claim_id, at_utc, what, from_state, to_state, by_whom, path, reason,
		previous_owner, owner, idempotency_key)
		SELECT id, t.now, ?1, `+from+`, state, `+who+`, `+path+`, `+reason+`, `+previous+`,
			owner, CASE WHEN effect_key <> '' THEN effect_key ELSE message_id END
		FROM claims, t WHERE id IN (SELECT value FROM json_each(?3))`)
}

// change runs a guarded write and its history row in one transaction
// (BEGIN IMMEDIATE: the store's one connection writes alone). write
// returns the ids of the claims it changed; each gets a history row.
func (s *Store) change(ctx context.Context, op string, write func(tx *stx) ([]int64, error), what claim.Change, from, by, reason string) error {
	tx, err := s.begin(ctx)
	if err != nil {
		return fmt.Errorf("%s: begin: %w", op, translate(err))
	}
	defer tx.Rollback()
	ids, err := write(tx)
	if err != nil {
		return err
	}
	if err := s.writeHistory(ctx, tx, ids, what, from, by, reason); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("%s: commit: %w", op, translate(err))
	}
	return nil
}

// changeOne runs a guarded UPDATE of claim id (without RETURNING) and its
// history row in one transaction; ErrStateChanged when it changed no row.
func (s *Store) changeOne(ctx context.Context, op string, id int64, what claim.Change, from, by, reason, query string, args ...any) error {
	return s.change(ctx, op, func(tx *stx) ([]int64, error) {
		if err := sqlstore.ExecGuarded(ctx, tx, translate, op, id, query, args...); err != nil {
			return nil, err
		}
		return []int64{id}, nil
	}, what, from, by, reason)
}

// changeClaims runs a guarded UPDATE ... RETURNING columns and the history
// rows of the claims it changed in one transaction, and returns them.
func (s *Store) changeClaims(ctx context.Context, op string, what claim.Change, from, by, reason, query string, args ...any) ([]*claim.Claim, error) {
	return s.changeClaimsThen(ctx, op, what, from, by, reason, nil, query, args...)
}

// changeClaimsThen is changeClaims that also runs then in the same
// transaction when the UPDATE changed a claim.
func (s *Store) changeClaimsThen(ctx context.Context, op string, what claim.Change, from, by, reason string, then func(tx *stx) error, query string, args ...any) ([]*claim.Claim, error) {
	var out []*claim.Claim
	err := s.change(ctx, op, func(tx *stx) ([]int64, error) {
		var ids []int64
		if err := queryClaims(ctx, tx, query, args, func(c *claim.Claim) { out, ids = append(out, c), append(ids, c.ID) }); err != nil {
			return nil, fmt.Errorf("%s: %w", op, err)
		}
		if len(ids) > 0 && then != nil {
			if err := then(tx); err != nil {
				return nil, fmt.Errorf("%s: %w", op, err)
			}
		}
		return ids, nil
	}, what, from, by, reason)
	if err != nil {
		return nil, err
	}
	return out, nil
}

func nullBytes(b []byte) any {
	if b == nil {
		return nil
	}
	return b
}

func queryClaims(ctx context.Context, q sqlstore.Querier, query string, args []any, each func(*claim.Claim)) error {
	scan := func(r sqlstore.Scanner) (*claim.Claim, error) { return scanClaim(r) }
	return sqlstore.QueryClaims(ctx, q, translate, scan, query, args, each)
}

// ClaimTx inserts the marker already processed and runs fn in the same
// transaction. fn must use only tx (see the package doc).
func (s *Store) ClaimTx(ctx context.Context, params *claim.ClaimTxParams, fn func(ctx context.Context, tx *sql.Tx) error) (claim.ClaimResult, error) {
	plan, err := sqlstore.NewPlan([]claim.ClaimParams{params.Claim})
	if err != nil {
		return claim.ClaimResult{}, err
	}
	tx, err := s.begin(ctx)
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
	if err := fn(claim.WithTxClaim(fctx, res[0].Claim), tx.Tx); err != nil {
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

// laterSQL is now plus the modifier in parameter ?n (see later).
func laterSQL(n int) string {
	return fmt.Sprintf(`strftime('%%Y-%%m-%%dT%%H:%%M:%%f',coalesce(sbclaim_now(),'now'),?%d)`, n)
}

// later returns the strftime modifier that adds d.
func later(d time.Duration) string { return fmt.Sprintf("+%.3f seconds", d.Seconds()) }

// takeOverPaths is the precondition of each take-over path beyond owner
// and route; ?8 is the SilentFor modifier (see ago).
var takeOverPaths = map[claim.TakeOverPath]string{
	claim.PathRedelivery: `(state = 'released' OR (state = 'claimed' AND heartbeat_utc < strftime('%Y-%m-%dT%H:%M:%f',coalesce(sbclaim_now(),'now'),?8)))
		AND (deferred_seq IS NULL OR deferred_seq = ?14)`,
	claim.PathReconciler: `state IN ('claimed', 'released') AND heartbeat_utc < strftime('%Y-%m-%dT%H:%M:%f',coalesce(sbclaim_now(),'now'),?8)
		AND (next_attempt_utc IS NULL OR next_attempt_utc <= ` + nowSQL + `)`,
	claim.PathOperator: `state = 'flagged'`,
}

// takeOverGuard is the precondition of params' take-over: its path's, or
// for an operator's retry the claim being failed.
func takeOverGuard(params *claim.TakeOverParams) string {
	if params.Retry {
		return `state = 'failed'`
	}
	return takeOverPaths[params.Path]
}

// TakeOver gives the claim to a new owner if it still qualifies (see
// claim.Store).
func (s *Store) TakeOver(ctx context.Context, params *claim.TakeOverParams) (*claim.Claim, error) {
	if err := sqlstore.ValidateTakeOver(params); err != nil {
		return nil, err
	}
	// A new key (?11, an operator's redrive): the next revision of the
	// key, and who chose it, in the same write.
	newKey, revision, err := sqlstore.NextKey(ctx, s.Get, params)
	if err != nil {
		return nil, err
	}
	out, err := s.changeClaims(ctx, fmt.Sprintf("take over claim %d", params.ID), sqlstore.TakeOverChange(params),
		"taken_over_from", params.By, "take_over_reason", `UPDATE claims SET state = 'claimed', owner = ?1, claimed_by = ?2, taken_over_from = state,
		delivery_count = CASE WHEN ?3 > 0 THEN ?3 ELSE delivery_count END,
		heartbeat_utc = `+nowSQL+`, taken_over_utc = `+nowSQL+`, take_overs = take_overs + 1,
		take_over_path = ?4, take_over_reason = ?5, previous_owner = owner, previous_holder = claimed_by,
		recoveries = recoveries + CASE WHEN ?4 = 'reconciler' THEN 1 ELSE 0 END, next_attempt_utc = NULL,
		dead_letter_seq = CASE WHEN state = 'failed' THEN NULL ELSE dead_letter_seq END,
		route = CASE WHEN route = '' THEN ?6 ELSE route END,
		fingerprint = CASE WHEN route = '' THEN ?7 ELSE fingerprint END,
		key_revision = key_revision + ?11,
		effect_key = CASE WHEN ?11 = 1 THEN ?12 ELSE effect_key END,
		key_revised_by = CASE WHEN ?11 = 1 THEN ?2 ELSE key_revised_by END,
		key_revised_utc = CASE WHEN ?11 = 1 THEN `+nowSQL+` ELSE key_revised_utc END,
		key_revision_note = CASE WHEN ?11 = 1 THEN ?5 ELSE key_revision_note END,
		deferred_seq = CASE WHEN ?4 = 'redelivery' THEN NULL ELSE deferred_seq END, due_utc = NULL
		WHERE id = ?9 AND owner = ?10 AND (route = '' OR (route = ?6 AND fingerprint = ?7))
		AND (?11 = 0 OR key_revision = ?13)
		AND `+takeOverGuard(params)+`
		RETURNING `+columns,
		params.Owner.String(), params.By, params.DeliveryCount, string(params.Path), sqlstore.Bound(params.Reason, sqlstore.MaxReasonLength),
		params.Route, params.Fingerprint, ago(params.SilentFor), params.ID, params.PreviousOwner.String(), boolInt(params.NewKey),
		newKey, revision, sqlstore.NullInt64(params.Seq))
	if err == nil && len(out) == 0 {
		now, gerr := s.Get(ctx, params.ID)
		if gerr != nil && !errors.Is(gerr, claim.ErrNotFound) {
			return nil, fmt.Errorf("take over claim %d: refused, then: %w", params.ID, gerr)
		}
		return now, sqlstore.TakeOverRefused(params, now)
	}
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

// Flag hands a claim to operators, guarded on owner, state and silence.
func (s *Store) Flag(ctx context.Context, params *claim.FlagParams) (*claim.Claim, error) {
	if err := sqlstore.ValidateFlagOne(params); err != nil {
		return nil, err
	}
	q := `UPDATE claims SET state = 'flagged', flagged_utc = ` + nowSQL + `, flag_reason = ?1, flagged_from = state
		WHERE id = ?2 AND owner = ?3 AND state = ?4`
	args := []any{params.Reason, params.ID, params.Owner.String(), string(params.State)}
	if params.SilentFor > 0 {
		q += ` AND heartbeat_utc < strftime('%Y-%m-%dT%H:%M:%f',coalesce(sbclaim_now(),'now'),?5)`
		args = append(args, ago(params.SilentFor))
	}
	out, err := s.changeClaims(ctx, fmt.Sprintf("flag claim %d", params.ID), claim.ChangeFlagged, "flagged_from",
		sqlstore.Bound(params.By, 256), "flag_reason", q+" RETURNING "+columns, args...)
	if err == nil && len(out) == 0 {
		if _, gerr := s.Get(ctx, params.ID); gerr != nil {
			return nil, fmt.Errorf("flag: %w", gerr)
		}
		return nil, fmt.Errorf("flag claim %d: %w", params.ID, claim.ErrStateChanged)
	}
	if err != nil {
		return nil, err
	}
	return out[0], nil
}

// FindStale lists recovery candidates, oldest heartbeat first.
func (s *Store) FindStale(ctx context.Context, params *claim.FindStaleParams) ([]*claim.Claim, error) {
	staleAfter, limit, err := sqlstore.ValidateFindStale(params)
	if err != nil {
		return nil, err
	}
	q := `SELECT ` + columns + ` FROM claims WHERE ` + stalePredicate + `
		AND (next_attempt_utc IS NULL OR next_attempt_utc <= ` + nowSQL + `)
		ORDER BY heartbeat_utc LIMIT ?2`
	var out []*claim.Claim
	if err := queryClaims(ctx, s.db, q, []any{ago(staleAfter), limit}, func(c *claim.Claim) { out = append(out, c) }); err != nil {
		return nil, fmt.Errorf("find stale claims: %w", err)
	}
	return out, nil
}

// RecordLateSuccess notes a late success on the claim.
func (s *Store) RecordLateSuccess(ctx context.Context, params *claim.LateSuccessParams) error {
	res, err := s.db.ExecContext(ctx, `UPDATE claims SET late_success_utc = `+nowSQL+`, late_success_by = ? WHERE id = ?`,
		sqlstore.LateSuccessBy(params), params.ID)
	if err != nil {
		return fmt.Errorf("record late success of claim %d: %w", params.ID, translate(err))
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return fmt.Errorf("record late success of claim %d: %w", params.ID, cmp.Or(translate(err), claim.ErrNotFound))
	}
	return nil
}

// execGuarded runs an UPDATE guarded on id and owner and reports
// ErrStateChanged when it matched no row.
func (s *Store) execGuarded(ctx context.Context, op string, id int64, query string, args ...any) error {
	return sqlstore.ExecGuarded(ctx, s.db, translate, op, id, query, args...)
}

// Heartbeat refreshes the heartbeat of a claimed claim held by Owner.
func (s *Store) Heartbeat(ctx context.Context, params *claim.HeartbeatParams) error {
	return s.execWrite(ctx, claim.OutcomeWrite{Heartbeat: params})
}

// MarkProcessed moves a claimed claim held by Owner to processed, with its
// follow-ups (the outbox) in the same transaction when the guard held.
func (s *Store) MarkProcessed(ctx context.Context, params *claim.MarkProcessedParams) error {
	if len(params.FollowUps) > 0 {
		if err := claim.ValidateNumbered(params.ID, params.FollowUps); err != nil {
			return err
		}
	}
	return s.execWrite(ctx, claim.OutcomeWrite{MarkProcessed: params})
}

// execWrite runs one outcome write: a heartbeat on its own (an implicit
// transaction), a change with its history row in one transaction.
func (s *Store) execWrite(ctx context.Context, w claim.OutcomeWrite) error {
	if err := claim.CheckBatch([]claim.OutcomeWrite{w}); err != nil {
		return err
	}
	id, _ := w.Target()
	var q sqlstore.Querier = sdb{s.db, &s.stmts}
	var tx *stx
	if w.Kind() != claim.WriteHeartbeat {
		var err error
		if tx, err = s.begin(ctx); err != nil {
			return fmt.Errorf("%s claim %d: begin: %w", w.Kind(), id, translate(err))
		}
		defer tx.Rollback()
		q = tx
	}
	done, err := s.writeOutcomes(ctx, q, tx, []claim.OutcomeWrite{w})
	if err != nil {
		return fmt.Errorf("%s claim %d: %w", w.Kind(), id, err)
	}
	if tx != nil {
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("%s claim %d: commit: %w", w.Kind(), id, translate(err))
		}
	}
	return sqlstore.BatchResults([]claim.OutcomeWrite{w}, done)[0]
}

// outcomeHistory is the history an outcome write records (ok false: a
// heartbeat, which changes neither owner nor state).
func outcomeHistory(k claim.WriteKind) (what claim.Change, reason string, ok bool) {
	switch k {
	case claim.WriteRecordAttempt:
		return claim.ChangeAttempt, "last_error", true
	case claim.WriteRelease:
		return claim.ChangeReleased, "last_error", true
	case claim.WriteMarkProcessed:
		return claim.ChangeProcessed, "''", true
	}
	return "", "", false
}

// outcomeKinds are the kinds of outcome write, in the order WriteOutcomes
// writes them (a batch has at most one write per claim, so the order
// changes nothing).
var outcomeKinds = [...]claim.WriteKind{claim.WriteHeartbeat, claim.WriteRecordAttempt, claim.WriteRelease, claim.WriteMarkProcessed}

// outcomeSets is the SET clause of each kind's guarded UPDATE over the
// batch's rows v: v.column3 is the error, v.column4 the answer (NULL
// keeps the claim's), v.column5 the next attempt's strftime modifier
// (NULL: none; see later).
var outcomeSets = func() map[claim.WriteKind]string {
	answer := `answer = coalesce(v.column4, answer), answer_utc = CASE WHEN v.column4 IS NULL THEN answer_utc ELSE ` + nowSQL + ` END`
	next := func(keep string) string {
		return `CASE WHEN v.column5 IS NULL THEN ` + keep + ` ELSE strftime('%Y-%m-%dT%H:%M:%f',coalesce(sbclaim_now(),'now'),v.column5) END`
	}
	return map[claim.WriteKind]string{
		claim.WriteHeartbeat:     `heartbeat_utc = ` + nowSQL,
		claim.WriteMarkProcessed: `state = 'processed', processed_utc = ` + nowSQL + `, payload = NULL, ` + answer,
		claim.WriteRelease: `state = 'released', released_utc = ` + nowSQL + `, heartbeat_utc = ` + nowSQL + `, last_error = v.column3,
		next_attempt_utc = ` + next("NULL") + `, due_utc = NULL, ` + answer,
		claim.WriteRecordAttempt: `attempts = attempts + 1, last_error = v.column3, next_attempt_utc = ` + next("next_attempt_utc") + `, ` + answer,
	}
}()

// outcomeText is the guarded UPDATE of n writes of kind (see outcomeSets).
func outcomeText(kind claim.WriteKind, n int) string {
	key := textKey{what: "outcome", a: kind.String(), n: n}
	if t, ok := texts.get(key); ok {
		return t
	}
	if n == 1 {
		// One write: a plain guarded UPDATE, its values ?1 to ?5.
		return texts.put(key, "UPDATE claims SET "+strings.ReplaceAll(outcomeSets[kind], "v.column", "?")+
			" WHERE id = ?1 AND owner = ?2 AND state = 'claimed' RETURNING id")
	}
	var b strings.Builder
	b.Grow(len(outcomeSets[kind]) + 160 + 17*n)
	b.WriteString("UPDATE claims SET ")
	b.WriteString(outcomeSets[kind])
	b.WriteString(" FROM (VALUES ")
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?, ?, ?, ?)")
	}
	b.WriteString(") AS v WHERE claims.id = v.column1 AND claims.owner = v.column2 AND claims.state = 'claimed' RETURNING id")
	return texts.put(key, b.String())
}

// writeOutcomes writes a checked batch of outcome writes on q (tx, when
// not nil, is q's transaction, which the history rows join): one guarded
// UPDATE ... FROM (VALUES ...) per kind present, and one history INSERT
// for the claims each changed. It returns the ids of the claims changed.
func (s *Store) writeOutcomes(ctx context.Context, q sqlstore.Querier, tx *stx, writes []claim.OutcomeWrite) (map[int64]bool, error) {
	done := make(map[int64]bool, len(writes))
	var (
		args []any
		ids  []int64
	)
	for _, kind := range outcomeKinds {
		args, ids = args[:0], ids[:0]
		for _, w := range writes {
			if w.Kind() != kind {
				continue
			}
			v := sqlstore.ValuesOf(w)
			answer, err := sqlstore.EncodeAnswer(v.Answer)
			if err != nil {
				return nil, fmt.Errorf("%s claim %d: %w", kind, v.ID, err)
			}
			var next any
			if v.NextAttemptIn > 0 {
				next = later(v.NextAttemptIn)
			}
			args = append(args, v.ID, v.Owner.String(), v.Error, answer, next)
		}
		if len(args) == 0 {
			continue
		}
		rows, err := q.QueryContext(ctx, outcomeText(kind, len(args)/5), args...)
		if err != nil {
			return nil, translate(err)
		}
		for rows.Next() {
			var id int64
			if err := rows.Scan(&id); err != nil {
				rows.Close()
				return nil, translate(err)
			}
			ids = append(ids, id)
			done[id] = true
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return nil, translate(err)
		}
		if what, reason, ok := outcomeHistory(kind); ok && tx != nil {
			if err := s.writeHistory(ctx, tx, ids, what, "'claimed'", "", reason); err != nil {
				return nil, err
			}
		}
		if kind == claim.WriteMarkProcessed && tx != nil {
			// The follow-ups of the claims it marked processed (the
			// outbox), in the same transaction: only where the guard held.
			for _, w := range writes {
				if mp := w.MarkProcessed; mp != nil && len(mp.FollowUps) > 0 && done[mp.ID] {
					if err := insertFollowUps(ctx, tx, mp.ID, mp.FollowUps); err != nil {
						return nil, fmt.Errorf("mark processed claim %d: %w", mp.ID, err)
					}
				}
			}
		}
	}
	return done, nil
}

// WriteOutcomes performs a batch of outcome writes in one transaction: one
// statement per kind of write present, and one for the history rows of
// each kind that records history, whatever the batch's size (see
// claim.BatchWriter).
func (s *Store) WriteOutcomes(ctx context.Context, writes []claim.OutcomeWrite) ([]error, error) {
	if err := claim.CheckBatch(writes); err != nil {
		return nil, err
	}
	if len(writes) == 0 {
		return nil, nil
	}
	tx, err := s.begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("write %d outcomes: begin: %w", len(writes), translate(err))
	}
	defer tx.Rollback()
	done, err := s.writeOutcomes(ctx, tx, tx, writes)
	if err != nil {
		return nil, fmt.Errorf("write %d outcomes: %w", len(writes), err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("write %d outcomes: commit: %w", len(writes), translate(err))
	}
	return sqlstore.BatchResults(writes, done), nil
}

// setAnswer is the SET clause that records the answer in parameter ?n:
// a NULL keeps the claim's.
func setAnswer(n int) string {
	return fmt.Sprintf(`answer = coalesce(?%d, answer), answer_utc = CASE WHEN ?%d IS NULL THEN answer_utc ELSE %s END`, n, n, nowSQL)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
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
	return s.changeOne(ctx, "fail", params.ID, claim.ChangeFailed, "'claimed'", "", "fail_reason || ': ' || last_error",
		`UPDATE claims SET state = 'failed', failed_utc = `+nowSQL+`, fail_reason = ?3, last_error = ?4,
		dead_letter_seq = ?5, `+setAnswer(6)+`
		WHERE id = ?1 AND owner = ?2 AND state = 'claimed'`,
		params.ID, params.Owner.String(), params.Reason, params.Error, sqlstore.NullInt64(params.DeadLetterSeq), answer)
}

// TakeDeadLetter records the delivery that dead-letters a failed claim's
// message, when none does yet.
func (s *Store) TakeDeadLetter(ctx context.Context, params *claim.TakeDeadLetterParams) error {
	err := s.changeOne(ctx, "take the dead letter of", params.ID, claim.ChangeDeadLetter, "'failed'", sqlstore.Bound(params.By, 256),
		"'sequence number ' || dead_letter_seq",
		`UPDATE claims SET dead_letter_seq = ?2 WHERE id = ?1 AND state = 'failed' AND dead_letter_seq IS NULL`,
		params.ID, params.Seq)
	if errors.Is(err, claim.ErrStateChanged) {
		if _, gerr := s.Get(ctx, params.ID); gerr != nil {
			return fmt.Errorf("take the dead letter: %w", gerr)
		}
	}
	return err
}

// Release moves a claimed claim held by Owner to released.
func (s *Store) Release(ctx context.Context, params *claim.ReleaseParams) error {
	return s.execWrite(ctx, claim.OutcomeWrite{Release: params})
}

// RecordAttempt counts an effect attempt on a claimed claim held by Owner.
func (s *Store) RecordAttempt(ctx context.Context, params *claim.RecordAttemptParams) error {
	return s.execWrite(ctx, claim.OutcomeWrite{RecordAttempt: params})
}

// stalePredicate is the staleness test, in the UPDATE itself and in its
// candidate scan (served by ix_claims_unfinished). ?1 is the StaleAfter
// modifier.
//
// A claim whose message is deferred (deferred_seq set) is left to its
// message until its grace ran out (next_attempt_utc: claim.Deferrer).
const stalePredicate = `state IN ('claimed', 'released') AND heartbeat_utc < ` + agoSQL + `
	AND (deferred_seq IS NULL OR next_attempt_utc IS NULL OR next_attempt_utc <= ` + nowSQL + `)`

// FlagStale flags at most Limit stale claims in one UPDATE.
func (s *Store) FlagStale(ctx context.Context, params *claim.FlagStaleParams) ([]*claim.Claim, error) {
	staleAfter, limit, err := sqlstore.ValidateFlag(params)
	if err != nil {
		return nil, err
	}
	q := `UPDATE claims SET state = 'flagged', flagged_utc = ` + nowSQL + `, flagged_from = state,
		flag_reason = CASE state WHEN 'released' THEN '` + sqlstore.ReasonReleased + `' ELSE '` + sqlstore.ReasonNoHeartbeat + `' END
			|| heartbeat_utc || 'Z'
		WHERE id IN (SELECT id FROM claims WHERE ` + stalePredicate + ` ORDER BY heartbeat_utc LIMIT ?2)
		AND ` + stalePredicate + `
		RETURNING ` + columns
	return s.changeClaims(ctx, "flag stale claims", claim.ChangeFlagged, "flagged_from", sqlstore.StaleBy(params), "flag_reason",
		q, ago(staleAfter), limit)
}

// List returns claims oldest ID first.
func (s *Store) List(ctx context.Context, params *claim.ListParams) ([]*claim.Claim, error) {
	if err := sqlstore.ValidateList(params); err != nil {
		return nil, err
	}
	where := []string{"id > ?2"}
	args := []any{ago(params.OlderThan), params.AfterID}
	if len(params.States) > 0 {
		ph := make([]string, len(params.States))
		for i, st := range params.States {
			args = append(args, string(st))
			ph[i] = fmt.Sprintf("?%d", len(args))
		}
		where = append(where, "state IN ("+strings.Join(ph, ", ")+")")
	}
	if params.Consumer != "" {
		args = append(args, params.Consumer)
		where = append(where, fmt.Sprintf("consumer = ?%d", len(args)))
	}
	if params.OlderThan > 0 {
		where = append(where, "claimed_utc < "+agoSQL)
	}
	where, args, err := listFilters(params, where, args)
	if err != nil {
		return nil, err
	}
	args = append(args, sqlstore.Limit(params.Limit, sqlstore.DefaultListLimit))
	q := fmt.Sprintf("SELECT %s FROM claims WHERE %s ORDER BY id LIMIT ?%d", columns, strings.Join(where, " AND "), len(args))
	var out []*claim.Claim
	if err := queryClaims(ctx, s.db, q, args, func(c *claim.Claim) { out = append(out, c) }); err != nil {
		return nil, fmt.Errorf("list claims: %w", err)
	}
	return out, nil
}

// Get returns one claim by ID.
func (s *Store) Get(ctx context.Context, id int64) (*claim.Claim, error) {
	c, err := scanClaim(s.db.QueryRowContext(ctx, "SELECT "+columns+" FROM claims WHERE id = ?", id))
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
		previous_owner, owner, idempotency_key FROM claim_history WHERE claim_id = ? ORDER BY id`, id)
	if err != nil {
		return nil, fmt.Errorf("history of claim %d: %w", id, translate(err))
	}
	out, err := sqlstore.ScanHistory(rows, func(r *sql.Rows, e *claim.HistoryEntry) error {
		var (
			at, owner string
			prev      sql.NullString
		)
		if err := r.Scan(&e.ID, &e.ClaimID, &at, &e.What, &e.From, &e.To, &e.By, &e.Path, &e.Reason, &prev, &owner, &e.Key); err != nil {
			return err
		}
		var err error
		if e.At, err = parseTime(at); err != nil {
			return err
		}
		if e.Owner, err = uuid.Parse(owner); err != nil {
			return fmt.Errorf("owner: %w", err)
		}
		if prev.Valid {
			if e.PreviousOwner, err = uuid.Parse(prev.String); err != nil {
				return fmt.Errorf("previous owner: %w", err)
			}
		}
		return nil
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
	answer, err := sqlstore.EncodeAnswer(params.Answer)
	if err != nil {
		return nil, fmt.Errorf("resolve claim %d: %w", params.ID, err)
	}
	guard := "state = 'flagged'"
	args := []any{params.By, string(params.Resolution), params.Note, params.ID, answer}
	if params.Owner != uuid.Nil {
		guard = "state = 'claimed' AND owner = ?6"
		args = append(args, params.Owner.String())
	}
	from := "'flagged'"
	if params.Owner != uuid.Nil {
		from = "'claimed'"
	}
	out, err := s.changeClaimsThen(ctx, fmt.Sprintf("resolve claim %d", params.ID), claim.ChangeResolved, from, params.By,
		"resolution || CASE WHEN resolution_note <> '' THEN ': ' || resolution_note ELSE '' END",
		func(tx *stx) error { return insertFollowUps(ctx, tx, params.ID, params.FollowUps) },
		`UPDATE claims SET state = 'resolved', resolved_utc = `+nowSQL+`,
		resolved_by = ?1, resolution = ?2, resolution_note = ?3,
		processed_utc = CASE WHEN ?2 = 'redriven' THEN `+nowSQL+` ELSE processed_utc END,
		payload = CASE WHEN ?2 = 'redriven' THEN NULL ELSE payload END, `+setAnswer(5)+`
		WHERE id = ?4 AND `+guard+` RETURNING `+columns, args...)
	if err == nil && len(out) == 0 {
		if _, gerr := s.Get(ctx, params.ID); gerr != nil {
			return nil, fmt.Errorf("resolve: %w", gerr)
		}
		return nil, fmt.Errorf("resolve claim %d: %w", params.ID, claim.ErrStateChanged)
	}
	if err != nil {
		return nil, err
	}
	return out[0], nil
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
	// expressions match the partial index ix_claims_finished.
	const (
		finishedAt = `(CASE state WHEN 'processed' THEN processed_utc WHEN 'failed' THEN failed_utc ELSE resolved_utc END)`
		finished   = `state IN ('processed', 'failed', 'resolved') AND deferred_seq IS NULL AND ` + finishedAt + ` < ` + agoSQL + `
		AND NOT EXISTS (SELECT 1 FROM claim_followups f WHERE f.claim_id = claims.id AND f.state = 'pending')`
	)
	// A claim's history goes with it, in the same transaction.
	tx, err := s.begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("purge claims: begin: %w", translate(err))
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `CREATE TEMP TABLE IF NOT EXISTS purged (id INTEGER PRIMARY KEY)`); err != nil {
		return 0, fmt.Errorf("purge claims: %w", translate(err))
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM purged`); err != nil {
		return 0, fmt.Errorf("purge claims: %w", translate(err))
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO purged (id)
		SELECT id FROM claims WHERE `+finished+` ORDER BY `+finishedAt+` LIMIT ?2`,
		ago(olderThan), limit); err != nil {
		return 0, fmt.Errorf("purge claims: %w", translate(err))
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM claim_history WHERE claim_id IN (SELECT id FROM purged)`); err != nil {
		return 0, fmt.Errorf("purge claims: history: %w", translate(err))
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM claim_followups WHERE claim_id IN (SELECT id FROM purged)`); err != nil {
		return 0, fmt.Errorf("purge claims: follow-ups: %w", translate(err))
	}
	res, err := tx.ExecContext(ctx, `DELETE FROM claims WHERE id IN (SELECT id FROM purged)`)
	if err != nil {
		return 0, fmt.Errorf("purge claims: %w", translate(err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("purge claims: %w", translate(err))
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("purge claims: commit: %w", translate(err))
	}
	return n, nil
}

// Stats summarises the table; the counts use the partial indexes.
func (s *Store) Stats(ctx context.Context) (*claim.Stats, error) {
	var (
		st     claim.Stats
		now    string
		oldest sql.NullString
	)
	err := s.db.QueryRowContext(ctx, `SELECT `+nowSQL+`,
		(SELECT count(*) FROM claims WHERE state IN ('claimed', 'released') AND state = 'claimed'),
		(SELECT count(*) FROM claims WHERE state IN ('claimed', 'released') AND state = 'released'),
		(SELECT count(*) FROM claims WHERE state = 'flagged'),
		(SELECT count(*) FROM claims WHERE state = 'failed'),
		(SELECT min(claimed_utc) FROM claims WHERE state IN ('claimed', 'released'))`).
		Scan(&now, &st.Claimed, &st.Released, &st.Flagged, &st.Failed, &oldest)
	if err != nil {
		return nil, fmt.Errorf("claim stats: %w", translate(err))
	}
	if st.Now, err = parseTime(now); err != nil {
		return nil, fmt.Errorf("claim stats: %w", err)
	}
	if st.OldestUnfinished, err = parseNullTime(oldest); err != nil {
		return nil, fmt.Errorf("claim stats: %w", err)
	}
	return &st, nil
}

// locks is the process-wide TryLock registry: lock key + name → held.
var locks struct {
	sync.Mutex
	held map[string]bool
}

// TryLock takes a process-wide named lock for this database file. SQLite
// has no session locks; one process per SQLite file is the supported
// deployment, so a process-wide lock is a database-wide lock.
func (s *Store) TryLock(ctx context.Context, name string) (func(context.Context) error, bool, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	key := s.lockKey + "\x00" + name
	locks.Lock()
	defer locks.Unlock()
	if locks.held[key] {
		return nil, false, nil
	}
	if locks.held == nil {
		locks.held = make(map[string]bool)
	}
	locks.held[key] = true
	var once sync.Once
	unlock := func(context.Context) error {
		once.Do(func() {
			locks.Lock()
			delete(locks.held, key)
			locks.Unlock()
		})
		return nil
	}
	return unlock, true, nil
}

// Now returns the database clock.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	var now string
	if err := s.db.QueryRowContext(ctx, "SELECT "+nowSQL).Scan(&now); err != nil {
		return time.Time{}, fmt.Errorf("database clock: %w", translate(err))
	}
	return parseTime(now)
}

// Ping checks the database answers a query.
func (s *Store) Ping(ctx context.Context) error {
	var one int
	if err := s.db.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
		return fmt.Errorf("ping sqlite: %w", translate(err))
	}
	return nil
}

// Close closes the database.
func (s *Store) Close() error {
	s.stmts.close()
	return s.db.Close()
}

// claimsUniqueColumns is how SQLite names the claims unique index in a
// constraint error ("UNIQUE constraint failed: claims.message_id,
// claims.consumer"): SQLite reports columns, not the index name.
const claimsUniqueColumns = "claims.message_id, claims.consumer"

// codeClass classifies a SQLite result code (extended codes first, then
// the primary code; see the error contract in package claim).
//
// SQLITE_BUSY is store-wide: the store runs every statement on its one
// connection, so BUSY means another process (or another pool on the same
// file) held the database's write lock for the whole busy timeout, and
// every write waits behind it the same way. SQLITE_BUSY_SNAPSHOT is a
// stale read snapshot that cannot be upgraded to a write: this call's
// serialization failure, retried at once it succeeds. SQLITE_LOCKED is a
// conflict inside one connection (a table another statement of the same
// connection holds): this call only. SQLite has no grants: a file the
// process cannot write opens read-only and refuses writes with
// SQLITE_READONLY, which is the read_only class; SQLITE_PERM and
// SQLITE_AUTH are the permission class.
func codeClass(code int) claim.Class {
	switch code {
	case sqlite3.SQLITE_BUSY_SNAPSHOT:
		return claim.ClassDeadlock
	}
	switch code & 0xff {
	case sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT:
		return claim.ClassConnection
	case sqlite3.SQLITE_BUSY, sqlite3.SQLITE_NOMEM, sqlite3.SQLITE_PROTOCOL:
		return claim.ClassBusy
	case sqlite3.SQLITE_LOCKED:
		return claim.ClassLockTimeout
	case sqlite3.SQLITE_READONLY:
		return claim.ClassReadOnly
	case sqlite3.SQLITE_FULL:
		return claim.ClassNoSpace
	case sqlite3.SQLITE_PERM, sqlite3.SQLITE_AUTH:
		return claim.ClassPermission
	}
	return claim.ClassNone
}

// translate maps driver errors to the claim sentinels, keeping the driver
// error in the chain: a unique violation of the claims index is
// ErrDuplicate (any other unique violation stays a plain error); a SQLite
// result code is classified by codeClass; a deadline that expired is
// claim.ClassTimeout; a closed or broken connection is
// claim.ClassConnection.
func translate(err error) error {
	if err == nil {
		return nil
	}
	var ce *claim.Error
	if errors.As(err, &ce) || errors.Is(err, claim.ErrDuplicate) {
		return err // already translated
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		code := se.Code()
		if code == sqlite3.SQLITE_CONSTRAINT_UNIQUE || code == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY {
			if strings.Contains(se.Error(), claimsUniqueColumns) {
				return fmt.Errorf("%w: %w", claim.ErrDuplicate, err)
			}
			return err
		}
		return claim.NewError(codeClass(code), err)
	}
	if errors.Is(err, context.Canceled) {
		return err
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return claim.NewError(claim.ClassTimeout, err)
	}
	if errors.Is(err, driver.ErrBadConn) || errors.Is(err, sql.ErrConnDone) || errors.Is(err, io.EOF) || sqlstore.ErrClosedDB(err) {
		return claim.NewError(claim.ClassConnection, err)
	}
	return err
}
