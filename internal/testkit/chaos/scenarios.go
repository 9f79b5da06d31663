package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/jackc/pgx/v5/pgconn"
	mssqldb "github.com/microsoft/go-mssqldb"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claimdb"
	"github.com/sbclaim/sbclaim/internal/metricreg"
	"github.com/sbclaim/sbclaim/internal/processor"
	"github.com/sbclaim/sbclaim/internal/sideeffects/routesfile"
	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
	"github.com/sbclaim/sbclaim/internal/testkit/membus"
)

// Scenario names a reproduction of one dedup strategy under a race: one
// message delivered to two consumer instances at once.
type Scenario string

// The scenarios.
const (
	// ScenarioNaive: check-then-insert (SELECT, a gap, INSERT) on a table
	// without a unique index. Both instances see "not there" and both act:
	// 2 effects. This is the bug the product prevents; the scenario passes
	// when it reproduces it.
	ScenarioNaive Scenario = "naive"
	// ScenarioUniqueIndex: insert first into a table with a unique index,
	// the same gap before COMMIT. The database picks the winner: 1 effect.
	ScenarioUniqueIndex Scenario = "unique-index"
	// ScenarioTwoPhase: two real processor instances, a slow external HTTP
	// effect, the same message delivered to both at once (each holds one
	// copy before either claims): one request reaches the downstream, one
	// instance processes, the other completes its copy as a duplicate.
	ScenarioTwoPhase Scenario = "two-phase"
)

// Scenarios lists the scenarios.
var Scenarios = []Scenario{ScenarioNaive, ScenarioUniqueIndex, ScenarioTwoPhase}

// ScenarioConfig configures a scenario run.
type ScenarioConfig struct {
	DatabaseURL string        // as Config.DatabaseURL
	Gap         time.Duration // naive, unique-index: gap between check and act [50ms]
	Latency     time.Duration // two-phase: the downstream's latency [300ms]
	Logger      *slog.Logger

	// wrapStore, when set, wraps the two-phase instances' store (tests use
	// it to break the claim and check that the scenario notices).
	wrapStore func(claim.Store) claim.Store
}

// ScenarioResult is what a scenario found.
type ScenarioResult struct {
	Scenario Scenario
	Database string
	Effects  int // effects for the one message
	Expected int
	// Requests is how many effect requests for the message reached the
	// downstream (two-phase: must be 1; the downstream's own idempotency
	// would hide a second caller from Effects).
	Requests int
	Details  []string
	Problem  string // a failure besides the effect count
}

// Pass reports whether the scenario produced its expected effect count.
func (r *ScenarioResult) Pass() bool { return r.Effects == r.Expected && r.Problem == "" }

// Verdict is the one-line verdict.
func (r *ScenarioResult) Verdict() string {
	switch {
	case r.Scenario == ScenarioNaive && r.Pass():
		return fmt.Sprintf("VERDICT: PASS naive: %d effects (expected: the bug reproduced)", r.Effects)
	case r.Scenario == ScenarioNaive:
		return fmt.Sprintf("VERDICT: FAIL: naive: %d effects, expected %d (the race did not reproduce, so the harness's check would not bite)", r.Effects, r.Expected)
	case r.Pass():
		return fmt.Sprintf("VERDICT: PASS %s: %d effect", r.Scenario, r.Effects)
	case r.Problem != "":
		return fmt.Sprintf("VERDICT: FAIL: %s: %s", r.Scenario, r.Problem)
	}
	return fmt.Sprintf("VERDICT: FAIL: %s: %d effects, expected %d", r.Scenario, r.Effects, r.Expected)
}

// Write prints the result; the last line is the verdict.
func (r *ScenarioResult) Write(w io.Writer) {
	fmt.Fprintf(w, "scenario %s on %s: one message delivered to two instances at once\n", r.Scenario, r.Database)
	for _, d := range r.Details {
		fmt.Fprintf(w, "  %s\n", d)
	}
	fmt.Fprintf(w, "effects for the message: %d (expected %d)\n", r.Effects, r.Expected)
	if r.Scenario == ScenarioTwoPhase {
		fmt.Fprintf(w, "downstream requests for the message: %d (expected 1)\n", r.Requests)
	}
	if r.Scenario == ScenarioNaive {
		fmt.Fprintln(w, "This is the failure sbclaim prevents: a check-then-insert guard lets both instances act; only a unique index (the claim) picks one winner.")
	}
	fmt.Fprintln(w, r.Verdict())
}

// RunScenario runs one scenario.
func RunScenario(ctx context.Context, s Scenario, cfg ScenarioConfig) (*ScenarioResult, error) {
	cfg.Gap = cmp.Or(cfg.Gap, 50*time.Millisecond)
	cfg.Latency = cmp.Or(cfg.Latency, 300*time.Millisecond)
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	db, err := OpenDatabase(ctx, cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	switch s {
	case ScenarioNaive, ScenarioUniqueIndex:
		return runSQLScenario(ctx, s, db, cfg)
	case ScenarioTwoPhase:
		return runTwoPhase(ctx, db, cfg)
	}
	return nil, fmt.Errorf("unknown scenario %q (want naive, unique-index or two-phase)", s)
}

// deliverToTwo sends one message twice (a producer retry) to a fresh queue
// and has two instances receive one copy each, then run handle at the same
// time; each instance completes its copy.
func deliverToTwo(ctx context.Context, handle func(ctx context.Context, instance int, msg *azservicebus.ReceivedMessage) (string, error)) ([]string, error) {
	q := membus.NewQueue("scenario", membus.QueueOptions{LockDuration: time.Minute})
	q.DuplicateSends(true)
	id := "order-42"
	if err := q.SendMessage(ctx, &azservicebus.Message{MessageID: &id, Subject: ptr(EffectSubject), Body: []byte(`{"order":42,"amount":100}`)}, nil); err != nil {
		return nil, err
	}
	var (
		received sync.WaitGroup // both hold their copy before either acts
		wg       sync.WaitGroup
		mu       sync.Mutex
		lines    []string
		errs     []error
	)
	received.Add(2)
	for i := 1; i <= 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := q.NewReceiver()
			msgs, err := r.ReceiveMessages(ctx, 1, nil)
			received.Done()
			if err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("instance %d: receive: %w", i, err))
				mu.Unlock()
				return
			}
			received.Wait()
			what, err := handle(ctx, i, msgs[0])
			if err == nil {
				err = r.CompleteMessage(ctx, msgs[0], nil)
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("instance %d: %w", i, err))
				return
			}
			lines = append(lines, fmt.Sprintf("instance %d (delivery of %s, sequence %d): %s", i, msgs[0].MessageID, *msgs[0].SequenceNumber, what))
		}()
	}
	wg.Wait()
	return lines, errors.Join(errs...)
}

func runSQLScenario(ctx context.Context, s Scenario, d *Database, cfg ScenarioConfig) (*ScenarioResult, error) {
	db, err := d.OpenDB(4)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	table := "naive_effects"
	key := keyType(d.Dialect)
	ddl := []string{"CREATE TABLE naive_effects (message_id " + key + " NOT NULL, amount INTEGER NOT NULL)"}
	if s == ScenarioUniqueIndex {
		table = "unique_effects"
		ddl = []string{
			"CREATE TABLE unique_effects (message_id " + key + " NOT NULL, amount INTEGER NOT NULL)",
			"CREATE UNIQUE INDEX ux_unique_effects_message_id ON unique_effects (message_id)",
		}
	}
	for _, q := range ddl {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return nil, fmt.Errorf("create %s: %w", table, err)
		}
	}
	ph := placeholders(d.Dialect)
	insert := fmt.Sprintf("INSERT INTO %s (message_id, amount) VALUES (%s, %s)", table, ph(1), ph(2))

	handle := func(ctx context.Context, _ int, msg *azservicebus.ReceivedMessage) (string, error) {
		if s == ScenarioNaive {
			var n int
			if err := db.QueryRowContext(ctx, fmt.Sprintf("SELECT count(*) FROM %s WHERE message_id = %s", table, ph(1)), msg.MessageID).Scan(&n); err != nil {
				return "", err
			}
			if n > 0 {
				return "found the row: skipped as a duplicate", nil
			}
			time.Sleep(cfg.Gap) // the gap between check and act
			if _, err := db.ExecContext(ctx, insert, msg.MessageID, 100); err != nil {
				return "", err
			}
			return fmt.Sprintf("SELECT found nothing, %s later INSERTed: effect performed", cfg.Gap), nil
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return "", err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, insert, msg.MessageID, 100); err != nil {
			if isUniqueViolation(err) {
				return "INSERT hit the unique index: duplicate, no effect", nil
			}
			return "", err
		}
		time.Sleep(cfg.Gap) // the same gap, inside the transaction
		if err := tx.Commit(); err != nil {
			if isUniqueViolation(err) {
				return "COMMIT hit the unique index: duplicate, no effect", nil
			}
			return "", err
		}
		return fmt.Sprintf("INSERT won, COMMIT %s later: effect performed", cfg.Gap), nil
	}
	lines, err := deliverToTwo(ctx, handle)
	if err != nil {
		return nil, err
	}
	res := &ScenarioResult{Scenario: s, Database: d.String(), Expected: 1, Details: lines}
	if s == ScenarioNaive {
		res.Expected = 2
	}
	if err := db.QueryRowContext(ctx, fmt.Sprintf("SELECT count(*) FROM %s", table)).Scan(&res.Effects); err != nil {
		return nil, err
	}
	return res, nil
}

func placeholders(d claimdb.Dialect) func(int) string {
	switch d {
	case claimdb.Postgres:
		return func(i int) string { return fmt.Sprintf("$%d", i) }
	case claimdb.SQLServer:
		return func(i int) string { return fmt.Sprintf("@p%d", i) }
	}
	return func(int) string { return "?" }
}

// keyType is the column type of the scenarios' and benchmarks' own
// message_id columns: on SQL Server nvarchar, the type go-mssqldb sends a
// Go string as (a varchar column compared with an nvarchar parameter is
// converted row by row, and the index is scanned instead of sought).
func keyType(d claimdb.Dialect) string {
	if d == claimdb.SQLServer {
		return "NVARCHAR(128)"
	}
	return "VARCHAR(128)"
}

// isUniqueViolation recognises a unique violation from SQLite, PostgreSQL
// or SQL Server (the scenarios' own tables; the product's stores translate
// their errors themselves).
func isUniqueViolation(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code == "23505"
	}
	var me mssqldb.Error
	if errors.As(err, &me) {
		return me.Number == 2601 || me.Number == 2627
	}
	var se *sqlite.Error
	if errors.As(err, &se) {
		return se.Code() == sqlite3.SQLITE_CONSTRAINT_UNIQUE || se.Code() == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY
	}
	return false
}

func runTwoPhase(ctx context.Context, d *Database, cfg ScenarioConfig) (*ScenarioResult, error) {
	down := fakedownstream.New(fakedownstream.Options{Latency: cfg.Latency})
	srv := httptest.NewServer(down)
	defer srv.Close()
	routes := fmt.Appendf(nil, "version: 1\nroutes:\n  - name: orders\n    match: {subject: %s}\n    url: %s/orders\n    timeout: 10s\n", EffectSubject, srv.URL)
	router, err := routesfile.Parse(routes, func(string) string { return "" }, nil, cfg.Logger)
	if err != nil {
		return nil, err
	}
	q := membus.NewQueue("scenario", membus.QueueOptions{LockDuration: 5 * time.Second})
	q.DuplicateSends(true) // one send, two copies: a producer retry
	id := "order-42"
	if err := q.SendMessage(ctx, &azservicebus.Message{MessageID: &id, Subject: ptr(EffectSubject), Body: []byte(`{"order":42,"amount":100}`)}, nil); err != nil {
		return nil, err
	}
	var store claim.Store = d.Store
	if cfg.wrapStore != nil {
		store = cfg.wrapStore(store)
	}
	metrics := metricreg.ProcessorMetrics(nil)
	var (
		mu    sync.Mutex
		lines []string
		// Each instance receives one copy, and neither goes on until both
		// hold theirs: the two claims race for real.
		both sync.WaitGroup
	)
	both.Add(2)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	got := make([]*oneCopyReceiver, 2)
	for i := 1; i <= 2; i++ {
		got[i-1] = &oneCopyReceiver{inner: q.NewReceiver(), both: &both}
		p, err := processor.New(processor.Options{
			Consumer:           "two-phase",
			Entity:             "scenario",
			Store:              store,
			Router:             router,
			NewReceiver:        func(context.Context) (processor.Receiver, error) { return got[i-1], nil },
			MaxConcurrentCalls: 1,
			MaxLockRenewal:     time.Minute,
			HeartbeatInterval:  time.Second,
			StorePayload:       true,
			Host:               fmt.Sprintf("instance-%d", i),
			Logger:             cfg.Logger,
			Metrics:            metrics,
			Hooks: processor.Hooks{AfterEffect: func(context.Context, *azservicebus.ReceivedMessage) error {
				mu.Lock()
				defer mu.Unlock()
				lines = append(lines, fmt.Sprintf("instance %d won the claim and called the downstream (%s latency)", i, cfg.Latency))
				return nil
			}},
		})
		if err != nil {
			return nil, err
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = p.Run(runCtx) }()
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	err = q.WaitIdle(wctx)
	cancel()
	stop()
	wg.Wait()
	if err != nil {
		return nil, fmt.Errorf("queue did not drain: %w", err)
	}
	oc := outcomeCounts(metrics)
	st := q.Stats()
	key := claim.KeyFor(claim.KeyFormScoped, "two-phase", id, 0) // the route keeps the default key form
	res := &ScenarioResult{Scenario: ScenarioTwoPhase, Database: d.String(), Expected: 1,
		Effects: down.Effects(key), Requests: down.Requests(key)}
	res.Details = append(lines,
		fmt.Sprintf("copies received: instance 1 %d, instance 2 %d (both held theirs before either claimed)", got[0].copies(), got[1].copies()),
		fmt.Sprintf("processor outcomes: processed %d, duplicate %d (the loser completed its copy without calling the downstream)", oc[processor.ResultProcessed], oc[processor.ResultDuplicate]),
		fmt.Sprintf("queue: sent %d, completed %d, dead-lettered %d; downstream requests for the key %d, effects %d (the downstream deduplicates by key itself, so only the request count shows a second caller)",
			st.Sent, st.Completed, st.DeadLettered, res.Requests, res.Effects))
	var problems []string
	if got[0].copies() != 1 || got[1].copies() != 1 {
		problems = append(problems, fmt.Sprintf("the instances received %d and %d copies (want 1 each: the race did not happen)", got[0].copies(), got[1].copies()))
	}
	if res.Requests != 1 {
		problems = append(problems, fmt.Sprintf("the downstream got %d requests for the key (want 1: the claim must stop the second instance before it calls)", res.Requests))
	}
	if oc[processor.ResultProcessed] != 1 || oc[processor.ResultDuplicate] != 1 {
		problems = append(problems, fmt.Sprintf("outcomes processed %d, duplicate %d (want 1 and 1)", oc[processor.ResultProcessed], oc[processor.ResultDuplicate]))
	}
	if st.Completed != 2 {
		problems = append(problems, fmt.Sprintf("%d of 2 copies completed (both must be)", st.Completed))
	}
	res.Problem = strings.Join(problems, "; ")
	return res, nil
}

// oneCopyReceiver hands its instance exactly one message, and only once
// the other instance holds its copy too; later receives wait for the end
// of the run.
type oneCopyReceiver struct {
	inner *membus.Receiver
	both  *sync.WaitGroup
	n     atomic.Int32
}

func (r *oneCopyReceiver) copies() int { return int(r.n.Load()) }

func (r *oneCopyReceiver) ReceiveMessages(ctx context.Context, _ int, o *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	if r.n.Load() > 0 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	msgs, err := r.inner.ReceiveMessages(ctx, 1, o)
	if err != nil || len(msgs) == 0 {
		return msgs, err
	}
	r.n.Add(int32(len(msgs)))
	r.both.Done()
	waited := make(chan struct{})
	go func() { r.both.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-ctx.Done():
	case <-time.After(30 * time.Second): // the other never got a copy; the result says so
	}
	return msgs, nil
}

func (r *oneCopyReceiver) CompleteMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.CompleteMessageOptions) error {
	return r.inner.CompleteMessage(ctx, m, o)
}

func (r *oneCopyReceiver) AbandonMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.AbandonMessageOptions) error {
	return r.inner.AbandonMessage(ctx, m, o)
}

func (r *oneCopyReceiver) DeadLetterMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.DeadLetterOptions) error {
	return r.inner.DeadLetterMessage(ctx, m, o)
}

func (r *oneCopyReceiver) RenewMessageLock(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.RenewMessageLockOptions) error {
	return r.inner.RenewMessageLock(ctx, m, o)
}

func (r *oneCopyReceiver) DeferMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.DeferMessageOptions) error {
	return r.inner.DeferMessage(ctx, m, o)
}

func (r *oneCopyReceiver) ReceiveDeferredMessages(ctx context.Context, seqs []int64, o *azservicebus.ReceiveDeferredMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	return r.inner.ReceiveDeferredMessages(ctx, seqs, o)
}

func (r *oneCopyReceiver) PeekMessages(ctx context.Context, n int, o *azservicebus.PeekMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	return r.inner.PeekMessages(ctx, n, o)
}

func (r *oneCopyReceiver) Close(ctx context.Context) error { return r.inner.Close(ctx) }
