// Package sqlstore holds the dialect-independent parts of the SQL claim
// stores: input validation, batch planning (intra-batch duplicates),
// outcome classification, property encoding and defaults. Dialect SQL and
// driver error translation stay in each dialect package.
package sqlstore

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// Defaults applied when a params struct leaves a limit at zero.
const (
	DefaultListLimit  = 100
	DefaultFlagLimit  = 100
	DefaultPurgeLimit = 1000
	// MaxConsumerLength is the width of the Consumer column.
	MaxConsumerLength = 200
	// MaxRouteLength and MaxFingerprintLength are the widths of the Route
	// and Fingerprint columns (route names are at most 64 characters).
	MaxRouteLength       = 64
	MaxFingerprintLength = 64
	// MaxReasonLength bounds a take-over or flag reason (the width of the
	// SQL Server columns); longer reasons are cut.
	MaxReasonLength = 400
)

// Bound cuts s to at most n runes.
func Bound(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n-1]) + "…"
}

// LateSuccessBy is the LateSuccessBy text of a late success: the holder
// and its owner token.
func LateSuccessBy(p *claim.LateSuccessParams) string {
	return Bound(fmt.Sprintf("%s (owner %s)", p.By, p.Owner), 256)
}

// Key is the dedup key of a claim: the claims unique index.
type Key struct {
	MessageID string
	Consumer  string
}

// KeyOf returns the key of a claim.
func KeyOf(c *claim.Claim) Key { return Key{c.MessageID, c.Consumer} }

// ValidateClaim checks one message before it reaches the database, so a bad
// value is a clear error instead of a constraint violation.
func ValidateClaim(p *claim.ClaimParams) error {
	if n := utf8.RuneCountInString(p.MessageID); n == 0 || n > claim.MaxMessageIDLength {
		return fmt.Errorf("claim: MessageID must be 1..%d characters, got %d", claim.MaxMessageIDLength, n)
	}
	if n := utf8.RuneCountInString(p.Consumer); n == 0 || n > MaxConsumerLength {
		return fmt.Errorf("claim %s: Consumer must be 1..%d characters, got %d", p.MessageID, MaxConsumerLength, n)
	}
	if len(p.PayloadHash) == 0 {
		return fmt.Errorf("claim %s/%s: PayloadHash is empty", p.MessageID, p.Consumer)
	}
	if p.Owner == uuid.Nil {
		return fmt.Errorf("claim %s/%s: Owner (the attempt's token) is required", p.MessageID, p.Consumer)
	}
	if n := utf8.RuneCountInString(p.SessionID); n > claim.MaxMessageIDLength {
		return fmt.Errorf("claim %s/%s: SessionID must be at most %d characters, got %d", p.MessageID, p.Consumer, claim.MaxMessageIDLength, n)
	}
	return validateRoute(fmt.Sprintf("claim %s/%s", p.MessageID, p.Consumer), p.Route, p.Fingerprint)
}

func validateRoute(what, route, fingerprint string) error {
	if n := utf8.RuneCountInString(route); n > MaxRouteLength {
		return fmt.Errorf("%s: Route must be at most %d characters, got %d", what, MaxRouteLength, n)
	}
	if n := len(fingerprint); n > MaxFingerprintLength {
		return fmt.Errorf("%s: Fingerprint must be at most %d bytes, got %d", what, MaxFingerprintLength, n)
	}
	return nil
}

// Plan is a batch reduced to its distinct keys. Only the first message of
// each key is sent to the database; later messages with the same key are
// classified against the row the first one produced ("first wins").
type Plan struct {
	Claims []claim.ClaimParams
	// First holds, per distinct key, the index in Claims of its first
	// message, in input order.
	First []int
}

// NewPlan validates a batch and finds its distinct keys.
func NewPlan(claims []claim.ClaimParams) (*Plan, error) {
	p := &Plan{Claims: claims}
	seen := make(map[Key]bool, len(claims))
	for i := range claims {
		if err := ValidateClaim(&claims[i]); err != nil {
			return nil, err
		}
		k := Key{claims[i].MessageID, claims[i].Consumer}
		if !seen[k] {
			seen[k] = true
			p.First = append(p.First, i)
		}
	}
	return p, nil
}

// Inserted is the claim row an insert of p wrote, built from p and what
// the database chose (the id and the clock's times), so that a claim batch
// returns the rows it inserted without reading every column back: a row
// just inserted holds p's values and every other column's default. It
// shares p's slices and map. The conformance suite compares it with the
// row read back (claimtest: ClaimBatchReturnsTheRowItWrote).
func Inserted(p *claim.ClaimParams, id int64, state claim.State, host string, claimedAt, heartbeatAt time.Time, processedAt *time.Time) *claim.Claim {
	c := &claim.Claim{
		ID: id, MessageID: p.MessageID, Consumer: p.Consumer, Owner: p.Owner, State: state,
		Entity: p.Entity, SessionID: p.SessionID, Subject: p.Subject, ContentType: p.ContentType,
		PayloadHash: p.PayloadHash, DeliveryCount: p.DeliveryCount, ClaimedBy: host,
		Route: p.Route, Fingerprint: p.Fingerprint, ClaimedAt: claimedAt, HeartbeatAt: heartbeatAt,
		ProcessedAt: processedAt, KeyForm: FormOf(p), EffectKey: EffectKeyOf(p),
	}
	if len(p.Properties) > 0 {
		c.Properties = p.Properties
	}
	if state != claim.StateProcessed {
		c.Payload = p.Payload // nil: none stored (a NULL)
	}
	return c
}

// FirstOf returns the index in the plan's Claims of key's first message
// (-1 when the plan has no such key). It looks from *next on, round the
// plan's keys, and leaves *next after the key found: rows that come back
// in the order they were sent are each found at the first look.
func (p *Plan) FirstOf(next *int, messageID, consumer string) int {
	n := len(p.First)
	for k := range n {
		pos := (*next + k) % n
		if i := p.First[pos]; p.Claims[i].MessageID == messageID && p.Claims[i].Consumer == consumer {
			*next = pos + 1
			return i
		}
	}
	return -1
}

// Results classifies every message of the batch, in input order. won holds
// the rows this call inserted, existing the rows that were already there;
// every distinct key must be in one of them. An existing row that carries
// the message's own owner token and payload hash and is still claimed was
// inserted by an earlier try of this same attempt (a retried or partly
// committed batch): it is Won too. In any other state it is classified as
// anyone's row: a released one is taken over with a new token, never won
// back by the old one; processed, failed, flagged and resolved ones are
// settled or an operator's. (A store that cannot tell the rows it inserted
// from an earlier try's may pass them all in existing: SQL Server does.)
func (p *Plan) Results(won, existing map[Key]*claim.Claim) ([]claim.ClaimResult, error) {
	out := make([]claim.ClaimResult, len(p.Claims))
	first := make(map[Key]bool, len(p.First))
	for i := range p.Claims {
		c := &p.Claims[i]
		k := Key{c.MessageID, c.Consumer}
		row, ok := won[k]
		if !ok {
			if e := existing[k]; e != nil && e.Owner == c.Owner && e.State == claim.StateClaimed && bytes.Equal(e.PayloadHash, c.PayloadHash) {
				row, ok = e, true
			}
		}
		if ok && !first[k] {
			first[k] = true
			out[i] = claim.ClaimResult{Outcome: claim.OutcomeWon, Claim: row}
			continue
		}
		first[k] = true
		row = existing[k]
		if row == nil {
			row = won[k]
		}
		if row == nil {
			return nil, fmt.Errorf("claim %s/%s: neither inserted nor found", c.MessageID, c.Consumer)
		}
		out[i] = Classify(c.PayloadHash, row)
	}
	return out, nil
}

// Classify compares a message's payload hash with an existing claim of the
// same key: the same hash is a duplicate, another hash a conflict. The
// claim is copied so results never share a pointer.
func Classify(hash []byte, existing *claim.Claim) claim.ClaimResult {
	cp := *existing
	if bytes.Equal(hash, existing.PayloadHash) {
		return claim.ClaimResult{Outcome: claim.OutcomeDuplicate, Claim: &cp}
	}
	return claim.ClaimResult{Outcome: claim.OutcomeConflict, Claim: &cp}
}

// EncodeProperties returns the JSON object stored in the Properties column.
func EncodeProperties(props map[string]string) (string, error) {
	if len(props) == 0 {
		return "{}", nil
	}
	b, err := json.Marshal(props)
	if err != nil {
		return "", fmt.Errorf("encode properties: %w", err)
	}
	return string(b), nil
}

// DecodeProperties parses the Properties column; an empty object is nil.
func DecodeProperties(s string) (map[string]string, error) {
	if s == "" || s == "{}" {
		return nil, nil
	}
	var m map[string]string
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		return nil, fmt.Errorf("decode properties: %w", err)
	}
	if len(m) == 0 {
		return nil, nil
	}
	return m, nil
}

// ValidateFlag checks FlagStale's params and fills the default limit.
func ValidateFlag(p *claim.FlagStaleParams) (time.Duration, int, error) {
	if p.StaleAfter <= 0 {
		return 0, 0, fmt.Errorf("flag stale: StaleAfter must be positive, got %s", p.StaleAfter)
	}
	return p.StaleAfter, Limit(p.Limit, DefaultFlagLimit), nil
}

// ValidatePurge checks PurgeProcessed's params and fills the default limit.
func ValidatePurge(p *claim.PurgeParams) (time.Duration, int, error) {
	if p.OlderThan < 0 {
		return 0, 0, fmt.Errorf("purge: OlderThan must not be negative, got %s", p.OlderThan)
	}
	return p.OlderThan, Limit(p.Limit, DefaultPurgeLimit), nil
}

// ValidateList checks List's params.
func ValidateList(p *claim.ListParams) error {
	for _, s := range p.States {
		if !s.Valid() {
			return fmt.Errorf("list: unknown state %q", s)
		}
	}
	if p.OlderThan < 0 {
		return fmt.Errorf("list: OlderThan must not be negative, got %s", p.OlderThan)
	}
	return nil
}

// ValidateResolve checks Resolve's params.
func ValidateResolve(p *claim.ResolveParams) error {
	if !p.Resolution.Valid() {
		return fmt.Errorf("resolve claim %d: unknown resolution %q", p.ID, p.Resolution)
	}
	if p.By == "" {
		return fmt.Errorf("resolve claim %d: By (who resolves) is required", p.ID)
	}
	if p.Owner != uuid.Nil && p.Resolution != claim.ResolutionRedriven {
		return fmt.Errorf("resolve claim %d: Owner is only for a redrive's own resolution (redriven), not %q", p.ID, p.Resolution)
	}
	if len(p.FollowUps) > 0 && p.Owner == uuid.Nil {
		return fmt.Errorf("resolve claim %d: FollowUps are only for a redrive's own resolution (with its Owner)", p.ID)
	}
	return claim.ValidateNumbered(p.ID, p.FollowUps)
}

// ValidateTakeOver checks TakeOver's params.
func ValidateTakeOver(p *claim.TakeOverParams) error {
	switch {
	case !p.Path.Valid():
		return fmt.Errorf("take over claim %d: unknown path %q", p.ID, p.Path)
	case p.Owner == uuid.Nil:
		return fmt.Errorf("take over claim %d: Owner (the new token) is required", p.ID)
	case p.PreviousOwner == uuid.Nil:
		return fmt.Errorf("take over claim %d: PreviousOwner (the owner the caller saw) is required", p.ID)
	case p.Owner == p.PreviousOwner:
		return fmt.Errorf("take over claim %d: the new Owner must differ from PreviousOwner", p.ID)
	case p.Path != claim.PathOperator && p.SilentFor <= 0:
		return fmt.Errorf("take over claim %d: SilentFor must be positive for path %s, got %s", p.ID, p.Path, p.SilentFor)
	case p.By == "":
		return fmt.Errorf("take over claim %d: By (the new holder) is required", p.ID)
	case p.NewKey && p.Path != claim.PathOperator:
		return fmt.Errorf("take over claim %d: NewKey is only for an operator's redrive (path %s), not %s", p.ID, claim.PathOperator, p.Path)
	case p.Retry && p.Path != claim.PathOperator:
		return fmt.Errorf("take over claim %d: Retry is only for an operator (path %s), not %s", p.ID, claim.PathOperator, p.Path)
	case p.NewKey && strings.TrimSpace(p.Reason) == "":
		return fmt.Errorf("take over claim %d: a new key needs a Reason (the operator's note)", p.ID)
	}
	return validateRoute(fmt.Sprintf("take over claim %d", p.ID), p.Route, p.Fingerprint)
}

// ValidateFail checks Fail's params.
func ValidateFail(p *claim.FailParams) error {
	switch n := utf8.RuneCountInString(p.Reason); {
	case p.Owner == uuid.Nil:
		return fmt.Errorf("fail claim %d: Owner is required", p.ID)
	case n == 0:
		return fmt.Errorf("fail claim %d: Reason (the dead-letter reason) is required", p.ID)
	case n > claim.MaxFailReasonLength:
		return fmt.Errorf("fail claim %d: Reason must be at most %d characters, got %d", p.ID, claim.MaxFailReasonLength, n)
	}
	return nil
}

// EncodeAnswer returns the JSON text an answer is stored as (not Valid:
// no answer). Every string is made storable (claim.Storable: PostgreSQL
// refuses NUL in JSON); an answer over claim.MaxAnswerBytes keeps its
// status and step only, marked truncated.
func EncodeAnswer(a *claim.Answer) (sql.NullString, error) {
	if a == nil {
		return sql.NullString{}, nil
	}
	clean := claim.Answer{Status: a.Status, Step: claim.Storable(a.Step), Truncated: a.Truncated}
	storable := func(m map[string]string) map[string]string {
		if len(m) == 0 {
			return nil
		}
		out := make(map[string]string, len(m))
		for k, v := range m {
			out[claim.Storable(k)] = claim.Storable(v)
		}
		return out
	}
	clean.Headers, clean.Fields = storable(a.Headers), storable(a.Fields)
	b, err := json.Marshal(clean)
	if err != nil {
		return sql.NullString{}, fmt.Errorf("encode answer: %w", err)
	}
	if len(b) > claim.MaxAnswerBytes {
		clean = claim.Answer{Status: a.Status, Step: Bound(clean.Step, 64), Truncated: true}
		if b, err = json.Marshal(clean); err != nil {
			return sql.NullString{}, fmt.Errorf("encode answer: %w", err)
		}
	}
	return sql.NullString{String: string(b), Valid: true}, nil
}

// NullInt64 is p as a nullable parameter.
func NullInt64(p *int64) sql.NullInt64 {
	if p == nil {
		return sql.NullInt64{}
	}
	return sql.NullInt64{Int64: *p, Valid: true}
}

// DecodeAnswer parses the Answer column (nil: none).
func DecodeAnswer(s *string) (*claim.Answer, error) {
	if s == nil || *s == "" {
		return nil, nil
	}
	var a claim.Answer
	if err := json.Unmarshal([]byte(*s), &a); err != nil {
		return nil, fmt.Errorf("decode answer: %w", err)
	}
	return &a, nil
}

// ValidateFlagOne checks Flag's params.
func ValidateFlagOne(p *claim.FlagParams) error {
	switch {
	case p.Owner == uuid.Nil:
		return fmt.Errorf("flag claim %d: Owner (the owner the caller saw) is required", p.ID)
	case p.State != claim.StateClaimed && p.State != claim.StateReleased:
		return fmt.Errorf("flag claim %d: State must be claimed or released, got %q", p.ID, p.State)
	case p.SilentFor < 0:
		return fmt.Errorf("flag claim %d: SilentFor must not be negative, got %s", p.ID, p.SilentFor)
	case p.Reason == "":
		return fmt.Errorf("flag claim %d: Reason is required (operators read it)", p.ID)
	}
	return nil
}

// ValidateFindStale checks FindStale's params and fills the default limit.
func ValidateFindStale(p *claim.FindStaleParams) (time.Duration, int, error) {
	if p.StaleAfter <= 0 {
		return 0, 0, fmt.Errorf("find stale: StaleAfter must be positive, got %s", p.StaleAfter)
	}
	return p.StaleAfter, Limit(p.Limit, DefaultFlagLimit), nil
}

// TakeOverRefused explains a take-over whose guarded UPDATE matched no row,
// from the row as it is now (nil: not found): ErrRouteChanged when the row
// would otherwise have qualified but records another route, else
// ErrStateChanged with what the row says.
func TakeOverRefused(p *claim.TakeOverParams, now *claim.Claim) error {
	if now == nil {
		return fmt.Errorf("take over claim %d: %w", p.ID, claim.ErrNotFound)
	}
	qualifies := now.State == claim.StateClaimed || now.State == claim.StateReleased
	if p.Path == claim.PathOperator {
		qualifies = now.State == claim.StateFlagged
		if p.Retry {
			qualifies = now.State == claim.StateFailed
		}
	}
	if qualifies && now.Owner == p.PreviousOwner && now.RouteDiffers(p.Route, p.Fingerprint) {
		return fmt.Errorf("take over claim %d: %w: the claim was taken for route %q (fingerprint %s), the caller runs route %q (fingerprint %s)",
			p.ID, claim.ErrRouteChanged, now.Route, dash(now.Fingerprint), p.Route, dash(p.Fingerprint))
	}
	why := fmt.Sprintf("it is %s", now.State)
	switch {
	case now.Owner != p.PreviousOwner:
		why = fmt.Sprintf("it is %s under another owner (held by %s)", now.State, now.ClaimedBy)
	case now.State == claim.StateClaimed && p.Path != claim.PathOperator:
		why = fmt.Sprintf("its holder %s showed life at %s, within %s", now.ClaimedBy, now.HeartbeatAt.Format(time.RFC3339Nano), p.SilentFor)
	case now.NextAttemptAt != nil && p.Path == claim.PathReconciler:
		why = fmt.Sprintf("it is %s, next attempt not before %s", now.State, now.NextAttemptAt.Format(time.RFC3339Nano))
	}
	return fmt.Errorf("take over claim %d: %w: %s", p.ID, claim.ErrStateChanged, why)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// Limit returns n, or def when n is not positive.
func Limit(n, def int) int {
	if n <= 0 {
		return def
	}
	return n
}

// Flag reasons, followed by the time of the last sign of life (UTC).
const (
	ReasonNoHeartbeat = "no heartbeat since "
	ReasonReleased    = "released and not taken over since "
)

// ErrClosedDB reports whether err is database/sql's "database is closed",
// which has no exported sentinel.
func ErrClosedDB(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if e.Error() == "sql: database is closed" {
			return true
		}
	}
	return false
}

// MaxOpenConns bounds the connection pool of a server store (PostgreSQL,
// SQL Server). A message holds a connection only for the length of each of
// its short statements (claim, heartbeat, mark processed), so this serves
// the processor's largest SBCLAIM_MAX_CONCURRENT_CALLS (256), while many
// replicas scaled out by KEDA still fit a server's connection limit. Calls
// beyond it wait for a free connection.
const MaxOpenConns = 64

// LimitPool applies MaxOpenConns to db. Idle connections are kept up to the
// same bound (a smaller idle pool made a busy replica close and reopen
// hundreds of connections per thousand messages: the chaos benchmark
// measured 2-4x the throughput without that churn) and closed after five
// idle minutes, so a replica that quietened down gives them back.
func LimitPool(db *sql.DB) {
	db.SetMaxOpenConns(MaxOpenConns)
	db.SetMaxIdleConns(MaxOpenConns)
	db.SetConnMaxIdleTime(5 * time.Minute)
}

// Querier is what QueryClaims needs: a *sql.DB, *sql.Tx or *sql.Conn.
type Querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Execer is what ExecGuarded needs.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Scanner is a row to scan a claim from.
type Scanner interface{ Scan(dest ...any) error }

// QueryClaims runs query and calls each with every claim that scan reads
// from its rows; driver errors go through translate.
func QueryClaims(ctx context.Context, q Querier, translate func(error) error, scan func(Scanner) (*claim.Claim, error),
	query string, args []any, each func(*claim.Claim)) error {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return translate(err)
	}
	defer rows.Close()
	for rows.Next() {
		c, err := scan(rows)
		if err != nil {
			return translate(err)
		}
		each(c)
	}
	return translate(rows.Err())
}

// ExecGuarded runs an UPDATE guarded on a claim's id, owner and state and
// reports claim.ErrStateChanged when it matched no row; driver errors go
// through translate. op names the operation in errors.
func ExecGuarded(ctx context.Context, db Execer, translate func(error) error, op string, id int64, query string, args ...any) error {
	res, err := db.ExecContext(ctx, query, args...)
	if err != nil {
		return fmt.Errorf("%s claim %d: %w", op, id, translate(err))
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("%s claim %d: %w", op, id, translate(err))
	}
	if n == 0 {
		return fmt.Errorf("%s claim %d: %w", op, id, claim.ErrStateChanged)
	}
	return nil
}
