package chaos

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claimdb"
	"github.com/sbclaim/sbclaim/internal/metricreg"
	"github.com/sbclaim/sbclaim/internal/processor"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/sideeffects/routesfile"
	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
	"github.com/sbclaim/sbclaim/internal/testkit/membus"
)

// Variant is one way of making a message's effect happen once, measured by
// the benchmarks. Every variant performs the same HTTP effect (the product's
// HTTP route against the fake downstream, with an Idempotency-Key), so the
// variants differ only in how they deduplicate.
type Variant string

// The benchmark variants.
const (
	// VariantTwoPhase (a): the product: the processor on the in-memory
	// broker, claim (ClaimBatch) + effect + MarkProcessed + complete.
	VariantTwoPhase Variant = "two-phase"
	// VariantRawClaim (b): the same store calls (ClaimBatch of 1, effect,
	// MarkProcessed) in a plain loop without broker or processor: the
	// limit the product can approach.
	VariantRawClaim Variant = "raw-claim"
	// VariantNaive (c): check-then-insert (SELECT, effect, INSERT) on a
	// table with a plain, non-unique index: fast and wrong.
	VariantNaive Variant = "naive"
	// VariantTxAcrossCall (d): one transaction held open across the HTTP
	// call (BEGIN; INSERT marker; effect; COMMIT) on a pool of 10
	// connections.
	VariantTxAcrossCall Variant = "tx-across-call"
	// VariantNoDedup (e): just the effect.
	VariantNoDedup Variant = "no-dedup"
	// VariantPhysical (f): the claim and outcome writes of (a) straight on
	// the database with the best batching it allows — ClaimBatch and
	// WriteOutcomes of PhysicalBatch messages, PhysicalWorkers at once —
	// and no broker and no effect: the ceiling of any design on this
	// database.
	VariantPhysical Variant = "physical-limit"
)

// Variants lists the variants in table order.
var Variants = []Variant{VariantTwoPhase, VariantRawClaim, VariantNaive, VariantTxAcrossCall, VariantNoDedup, VariantPhysical}

// The physical limit's batching: batches of PhysicalBatch messages,
// PhysicalWorkers batches at once (one on SQLite, which has one writer).
const (
	PhysicalBatch   = 128
	PhysicalWorkers = 4
)

// TxPoolSize is the connection pool of the tx-across-call variant (and of
// the naive variant's own table).
const TxPoolSize = 10

// BenchParams configures one benchmark cell.
type BenchParams struct {
	Variant     Variant
	DB          *Database
	Concurrency int           // workers (the processor's MaxConcurrentCalls)
	Latency     time.Duration // the downstream's latency per effect
	Messages    int           // messages to process
	// MaxDuration stops the cell early (throughput is measured over what
	// finished); 0 means no bound.
	MaxDuration time.Duration
	// Stream (two-phase only) measures the processor's own memory over a
	// long run: the messages are sent as the processor works them (at most
	// streamBacklog waiting), the broker forgets completed messages and the
	// downstream keeps no state, so that nothing but the processor grows
	// with the messages that went through.
	Stream bool
	// Tracing (two-phase only) runs the processor with tracing on: the
	// OpenTelemetry SDK, always-on sampler, batching into memory.
	Tracing bool
	// NoHistory (physical limit only) turns the store's history writes
	// off (claim.HistorySwitch), to measure what they cost.
	NoHistory bool
	Logger    *slog.Logger
}

// BenchResult is what one cell measured.
type BenchResult struct {
	BenchParams
	Done       int           // messages whose effect finished
	Elapsed    time.Duration // wall time
	RoundTrips int64         // database round trips (statements, BEGIN and COMMIT included)
	// PeakHeapInuse and PeakSys are the largest runtime.MemStats values
	// sampled during the cell; TotalAlloc is the bytes allocated during it.
	PeakHeapInuse, PeakSys, TotalAlloc uint64
	// Spans is how many spans a Tracing cell recorded.
	Spans int
	// CPU is the process's CPU time (user + system) during the cell: the
	// processor, the broker, the database and the downstream together.
	// Unlike the wall time, a shared machine's other work does not
	// inflate it.
	CPU time.Duration
}

// CPUPerMessage is the cell's CPU time per message.
func (r *BenchResult) CPUPerMessage() time.Duration {
	return r.CPU / time.Duration(max(r.Done, 1))
}

// PerSecond is the cell's throughput in messages per second.
func (r *BenchResult) PerSecond() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Done) / r.Elapsed.Seconds()
}

// TripsPerMessage is database round trips per message.
func (r *BenchResult) TripsPerMessage() float64 {
	return float64(r.RoundTrips) / float64(max(r.Done, 1))
}

// AllocPerMessage is bytes allocated per message.
func (r *BenchResult) AllocPerMessage() float64 {
	return float64(r.TotalAlloc) / float64(max(r.Done, 1))
}

// benchEnv is the downstream and effect shared by a cell.
type benchEnv struct {
	down   *fakedownstream.Server
	srv    *httptest.Server
	effect sideeffects.Effect
	router sideeffects.Router
	client *http.Client
}

func newBenchEnv(p BenchParams) (*benchEnv, error) {
	e := &benchEnv{down: fakedownstream.New(fakedownstream.Options{Latency: p.Latency})}
	var handler http.Handler = e.down
	if p.Stream {
		handler = http.HandlerFunc(statelessDownstream)
	}
	e.srv = httptest.NewServer(handler)
	n := max(p.Concurrency, TxPoolSize) * 2
	e.client = &http.Client{Transport: &http.Transport{MaxIdleConns: n, MaxIdleConnsPerHost: n}}
	routes := fmt.Appendf(nil, "version: 1\nroutes:\n  - name: bench\n    match: {subject: %s}\n    url: %s/effects\n    timeout: 30s\n", EffectSubject, e.srv.URL)
	r, err := routesfile.Parse(routes, func(string) string { return "" }, e.client, p.Logger)
	if err != nil {
		e.close()
		return nil, err
	}
	e.router = r
	h, err := r.Route(&azservicebus.ReceivedMessage{Subject: ptr(EffectSubject)})
	if err != nil {
		e.close()
		return nil, err
	}
	e.effect = h.Effect
	return e, nil
}

func (e *benchEnv) close() {
	e.srv.Close()
	e.client.CloseIdleConnections()
}

// memSampler records peak memory while a cell runs.
type memSampler struct {
	stop              chan struct{}
	done              chan struct{}
	startAlloc        uint64
	startCPU          time.Duration
	peakHeap, peakSys uint64
	endAlloc          uint64
}

func startMemSampler() *memSampler {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	s := &memSampler{stop: make(chan struct{}), done: make(chan struct{}), startAlloc: ms.TotalAlloc, startCPU: cpuTime(), peakHeap: ms.HeapInuse, peakSys: ms.Sys}
	go func() {
		defer close(s.done)
		t := time.NewTicker(25 * time.Millisecond)
		defer t.Stop()
		for {
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			s.peakHeap, s.peakSys = max(s.peakHeap, ms.HeapInuse), max(s.peakSys, ms.Sys)
			s.endAlloc = ms.TotalAlloc
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

func (s *memSampler) finish(r *BenchResult) {
	close(s.stop)
	<-s.done
	r.CPU = cpuTime() - s.startCPU
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	r.PeakHeapInuse, r.PeakSys = max(s.peakHeap, ms.HeapInuse), max(s.peakSys, ms.Sys)
	r.TotalAlloc = ms.TotalAlloc - s.startAlloc
}

// RunBench runs one benchmark cell.
func RunBench(ctx context.Context, p BenchParams) (*BenchResult, error) {
	p.Concurrency = cmp.Or(p.Concurrency, 1)
	if p.Logger == nil {
		p.Logger = slog.New(slog.DiscardHandler)
	}
	if p.Messages <= 0 {
		return nil, errors.New("bench: Messages must be positive")
	}
	env, err := newBenchEnv(p)
	if err != nil {
		return nil, err
	}
	defer env.close()
	run := uuid.NewString()[:8] // keeps cells apart in one database
	res := &BenchResult{BenchParams: p}
	switch p.Variant {
	case VariantTwoPhase:
		err = benchTwoPhase(ctx, p, env, run, res)
	case VariantRawClaim, VariantNaive, VariantTxAcrossCall, VariantNoDedup:
		err = benchLoop(ctx, p, env, run, res)
	case VariantPhysical:
		err = benchPhysical(ctx, p, run, res)
	default:
		err = fmt.Errorf("bench: unknown variant %q", p.Variant)
	}
	if err != nil {
		return nil, fmt.Errorf("bench %s: %w", p.Variant, err)
	}
	return res, nil
}

func benchMessage(run string, i int) *azservicebus.ReceivedMessage {
	return &azservicebus.ReceivedMessage{
		MessageID: fmt.Sprintf("%s-%07d", run, i),
		Subject:   ptr(EffectSubject),
		Body:      fmt.Appendf(nil, `{"n":%d,"amount":%d}`, i, 100+i%900),
	}
}

// streamBacklog bounds the messages waiting in the broker in a Stream
// cell.
const streamBacklog = 5000

// statelessDownstream answers every effect 201 and keeps nothing (Stream
// cells: the fake downstream's per-key records would be measured as the
// processor's memory).
func statelessDownstream(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, `{"ok":true}`+"\n")
}

func benchTwoPhase(ctx context.Context, p BenchParams, env *benchEnv, run string, res *BenchResult) error {
	q := membus.NewQueue("bench", membus.QueueOptions{LockDuration: time.Minute, ForgetCompleted: p.Stream})
	send := func(i int) error {
		m := benchMessage(run, i)
		return q.SendMessage(ctx, &azservicebus.Message{MessageID: &m.MessageID, Subject: m.Subject, Body: m.Body}, nil)
	}
	upfront := p.Messages
	if p.Stream {
		upfront = min(p.Messages, streamBacklog)
	}
	for i := range upfront {
		if err := send(i); err != nil {
			return err
		}
	}
	var trips atomic.Int64
	tk := newTracingKit(p.Tracing)
	proc, err := processor.New(processor.Options{
		TracerProvider:     tk.provider(),
		Consumer:           "bench-" + run,
		Entity:             "bench",
		Store:              CountingStore(p.DB.Store, &trips),
		Router:             env.router,
		NewReceiver:        func(context.Context) (processor.Receiver, error) { return q.NewReceiver(), nil },
		MaxConcurrentCalls: p.Concurrency,
		// The Prometheus collectors the processor command registers (here
		// on no registry): a processor without metrics would be measured
		// cheaper than the one that runs.
		Metrics:        metricreg.ProcessorMetrics(nil),
		MaxLockRenewal: 5 * time.Minute,
		StorePayload:   true,
		Host:           "bench",
		Logger:         p.Logger,
	})
	if err != nil {
		return err
	}
	mem := startMemSampler()
	start := time.Now()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = proc.Run(runCtx) }()
	wctx := ctx
	if p.MaxDuration > 0 {
		var cancel context.CancelFunc
		wctx, cancel = context.WithTimeout(ctx, p.MaxDuration)
		defer cancel()
	}
	if p.Stream {
		// Top the backlog up as the processor works it off, then wait for
		// the last message.
		next := upfront
		for q.Stats().Completed < p.Messages && wctx.Err() == nil {
			st := q.Stats()
			for ; next < p.Messages && next-st.Completed < streamBacklog; next++ {
				if err := send(next); err != nil {
					stop()
					<-done
					return err
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	_ = q.WaitIdle(wctx)
	res.Elapsed = time.Since(start)
	res.Done = q.Stats().Completed
	stop()
	<-done
	mem.finish(res)
	res.Spans = len(tk.finish(ctx))
	res.RoundTrips = trips.Load()
	if st := q.Stats(); st.DeadLettered > 0 {
		return fmt.Errorf("%d messages dead-lettered: %v", st.DeadLettered, st.DeadLetterReasons)
	}
	return nil
}

// benchLoop runs the variants without a broker: Concurrency workers take
// message numbers from a shared counter.
func benchLoop(ctx context.Context, p BenchParams, env *benchEnv, run string, res *BenchResult) error {
	var (
		trips atomic.Int64
		db    *sql.DB
		store claim.Store
	)
	ph := placeholders(p.DB.Dialect)
	switch p.Variant {
	case VariantRawClaim:
		store = CountingStore(p.DB.Store, &trips)
	case VariantNaive, VariantTxAcrossCall:
		var err error
		if db, err = p.DB.OpenDB(TxPoolSize); err != nil {
			return err
		}
		defer db.Close()
		if err := createBenchTables(ctx, db, p.DB.Dialect); err != nil {
			return err
		}
	}
	consumer := "bench-" + run
	one := func(ctx context.Context, m *azservicebus.ReceivedMessage) error {
		switch p.Variant {
		case VariantNoDedup:
			return env.effect.Perform(ctx, m, m.MessageID)

		case VariantRawClaim:
			rs, err := store.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "bench", Claims: []claim.ClaimParams{{
				MessageID: m.MessageID, Consumer: consumer, Owner: uuid.New(), Entity: "bench", Subject: EffectSubject,
				PayloadHash: claim.HashPayload(m.Body), Payload: m.Body, DeliveryCount: 1,
			}}})
			if err != nil {
				return err
			}
			if rs[0].Outcome != claim.OutcomeWon {
				return nil
			}
			if err := env.effect.Perform(ctx, m, m.MessageID); err != nil {
				return err
			}
			return store.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: rs[0].Claim.ID, Owner: rs[0].Claim.Owner})

		case VariantNaive:
			var n int
			trips.Add(1)
			if err := db.QueryRowContext(ctx, "SELECT count(*) FROM bench_naive WHERE message_id = "+ph(1), m.MessageID).Scan(&n); err != nil {
				return err
			}
			if n > 0 {
				return nil
			}
			if err := env.effect.Perform(ctx, m, m.MessageID); err != nil {
				return err
			}
			trips.Add(1)
			_, err := db.ExecContext(ctx, "INSERT INTO bench_naive (message_id) VALUES ("+ph(1)+")", m.MessageID)
			return err

		case VariantTxAcrossCall:
			trips.Add(1)
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer tx.Rollback()
			trips.Add(1)
			if _, err := tx.ExecContext(ctx, "INSERT INTO bench_tx (message_id) VALUES ("+ph(1)+")", m.MessageID); err != nil {
				if isUniqueViolation(err) {
					return nil
				}
				return err
			}
			if err := env.effect.Perform(ctx, m, m.MessageID); err != nil {
				return err
			}
			trips.Add(1)
			return tx.Commit()
		}
		return nil
	}

	msgs := make([]*azservicebus.ReceivedMessage, p.Messages)
	for i := range msgs {
		msgs[i] = benchMessage(run, i)
	}
	return runWorkers(ctx, p, p.Concurrency, 1, res, &trips, func(ctx context.Context, from, to int) error {
		return one(ctx, msgs[from])
	})
}

// runWorkers runs workers goroutines that take the cell's messages step at
// a time, [from, to), until all are done, one fails, ctx ends or
// p.MaxDuration passes; it records the elapsed time, the messages done,
// trips and the memory in res.
func runWorkers(ctx context.Context, p BenchParams, workers, step int, res *BenchResult, trips *atomic.Int64, work func(ctx context.Context, from, to int) error) error {
	var (
		next, done atomic.Int64
		wg         sync.WaitGroup
		errOnce    sync.Once
		firstErr   error
	)
	deadline := time.Time{}
	mem := startMemSampler()
	start := time.Now()
	if p.MaxDuration > 0 {
		deadline = start.Add(p.MaxDuration)
	}
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				from := int(next.Add(int64(step))) - step
				if from >= p.Messages || ctx.Err() != nil || (!deadline.IsZero() && time.Now().After(deadline)) {
					return
				}
				to := min(from+step, p.Messages)
				if err := work(ctx, from, to); err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
				done.Add(int64(to - from))
			}
		}()
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	mem.finish(res)
	res.Done = int(done.Load())
	res.RoundTrips = trips.Load()
	return firstErr
}

// benchPhysical claims and marks processed the cell's messages in batches,
// straight on the store (see VariantPhysical).
func benchPhysical(ctx context.Context, p BenchParams, run string, res *BenchResult) error {
	var trips atomic.Int64
	if p.NoHistory {
		sw, ok := p.DB.Store.(claim.HistorySwitch)
		if !ok {
			return fmt.Errorf("%T cannot turn its history off", p.DB.Store)
		}
		sw.SetHistoryForBench(false)
		defer sw.SetHistoryForBench(true)
	}
	st := CountingStore(p.DB.Store, &trips)
	bw := st.(claim.BatchWriter)
	consumer := "bench-" + run
	workers := PhysicalWorkers
	if p.DB.Dialect == claimdb.SQLite {
		workers = 1
	}
	return runWorkers(ctx, p, workers, PhysicalBatch, res, &trips, func(ctx context.Context, from, to int) error {
		var claims []claim.ClaimParams
		for i := from; i < to; i++ {
			m := benchMessage(run, i)
			claims = append(claims, claim.ClaimParams{
				MessageID: m.MessageID, Consumer: consumer, Owner: uuid.New(), Entity: "bench", Subject: EffectSubject,
				PayloadHash: claim.HashPayload(m.Body), Payload: m.Body, DeliveryCount: 1,
			})
		}
		rs, err := st.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "bench", Claims: claims})
		if err != nil {
			return err
		}
		writes := make([]claim.OutcomeWrite, 0, len(rs))
		for _, r := range rs {
			if r.Outcome == claim.OutcomeWon {
				writes = append(writes, claim.OutcomeWrite{MarkProcessed: &claim.MarkProcessedParams{ID: r.Claim.ID, Owner: r.Claim.Owner}})
			}
		}
		errs, err := bw.WriteOutcomes(ctx, writes)
		if err != nil {
			return err
		}
		return errors.Join(errs...)
	})
}

func createBenchTables(ctx context.Context, db *sql.DB, d claimdb.Dialect) error {
	key := keyType(d)
	qs := []string{
		"CREATE TABLE IF NOT EXISTS bench_naive (message_id " + key + " NOT NULL)",
		"CREATE INDEX IF NOT EXISTS ix_bench_naive_message_id ON bench_naive (message_id)", // plain, not unique
		"CREATE TABLE IF NOT EXISTS bench_tx (message_id " + key + " NOT NULL)",
		"CREATE UNIQUE INDEX IF NOT EXISTS ux_bench_tx_message_id ON bench_tx (message_id)",
	}
	if d == claimdb.SQLServer { // no IF NOT EXISTS in T-SQL's CREATE
		qs = []string{
			"IF OBJECT_ID(N'dbo.bench_naive', N'U') IS NULL CREATE TABLE dbo.bench_naive (message_id " + key + " NOT NULL)",
			"IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE name = N'ix_bench_naive_message_id') CREATE INDEX ix_bench_naive_message_id ON dbo.bench_naive (message_id)",
			"IF OBJECT_ID(N'dbo.bench_tx', N'U') IS NULL CREATE TABLE dbo.bench_tx (message_id " + key + " NOT NULL)",
			"IF NOT EXISTS (SELECT 1 FROM sys.indexes WHERE name = N'ux_bench_tx_message_id') CREATE UNIQUE INDEX ux_bench_tx_message_id ON dbo.bench_tx (message_id)",
		}
	}
	for _, q := range qs {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("create bench tables: %w", err)
		}
	}
	return nil
}
