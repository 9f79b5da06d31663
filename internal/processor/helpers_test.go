package processor_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/processor"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/testkit/membus"
	"github.com/sbclaim/sbclaim/internal/testkit/testdb"
)

var backends = testdb.Backends

func newStore(t *testing.T, backend string) claim.Store { return testdb.Open(t, backend) }

// effects is a programmable effect: per subject behaviour, with counts of
// calls and of effects that "happened" per key.
type effects struct {
	mu        sync.Mutex
	calls     map[string]int
	performed map[string]int
	// behave decides what one call does; nil means "perform, ok".
	behave func(subject, key string, call int) error
	// behaveCtx, when set, decides instead, with the call's context (to
	// report the downstream's answer).
	behaveCtx func(ctx context.Context, key string, call int) error
	delay     time.Duration
	// gate, when set, blocks each call until it is closed.
	gate    chan struct{}
	started chan string
	// hang, when set and true for a call, blocks it until its context
	// ends and returns the context's error.
	hang func(call int) bool
	// ignoreCtx makes a gated call wait for the gate even when its
	// context ends (an effect that ignores cancellation).
	ignoreCtx bool
}

func newEffects() *effects {
	return &effects{calls: map[string]int{}, performed: map[string]int{}}
}

func (e *effects) Perform(ctx context.Context, msg *azservicebus.ReceivedMessage, key string) error {
	e.mu.Lock()
	e.calls[key]++
	call := e.calls[key]
	behave, behaveCtx, delay, gate, started, hang, ignoreCtx := e.behave, e.behaveCtx, e.delay, e.gate, e.started, e.hang, e.ignoreCtx
	e.mu.Unlock()
	if started != nil {
		started <- key
	}
	if hang != nil && hang(call) {
		<-ctx.Done()
		return ctx.Err()
	}
	if gate != nil && ignoreCtx {
		<-gate
	} else if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	var err error
	switch {
	case behaveCtx != nil:
		err = behaveCtx(ctx, key, call)
	case behave != nil:
		err = behave(subject(msg), key, call)
	}
	if err == nil || errors.Is(err, errPerformedThenLost) {
		e.mu.Lock()
		e.performed[key]++
		e.mu.Unlock()
	}
	if errors.Is(err, errPerformedThenLost) {
		return sideeffects.Unknown(err)
	}
	return err
}

var errPerformedThenLost = errors.New("performed, response lost")

func (e *effects) Calls(key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.calls[key]
}

func (e *effects) Performed(key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.performed[key]
}

func (e *effects) PerformedAll() map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := map[string]int{}
	for k, v := range e.performed {
		out[k] = v
	}
	return out
}

func subject(msg *azservicebus.ReceivedMessage) string {
	if msg.Subject == nil {
		return ""
	}
	return *msg.Subject
}

// router routes by Subject: "tx" to a transactional effect writing to a
// ledger table, "json" to the effect after checking the body is JSON,
// "noroute" nowhere, anything else to the effect.
type router struct {
	eff *effects
	tx  sideeffects.TxEffect
	// fp, when set, is the default route's fingerprint (a routes file
	// changed under a claim); "fp-effect" otherwise.
	fp atomic.Value
	// form is the default route's key form. The protocol tests count
	// effects per message id, so their routes opt out (raw) unless a test
	// of the key forms sets it before starting the processors.
	form claim.KeyForm
	// backoff is the delayed-retry schedule of the default and manual
	// routes (set before the processor starts).
	backoff sideeffects.Backoff
	// breaker is the default route's breaker (set before the processor
	// starts).
	breaker sideeffects.Breaker
	// holdSession is the default and manual routes' HoldSessionOnFailure
	// (set before the processor starts).
	holdSession bool
}

func (r *router) keyForm() claim.KeyForm {
	if r.form == "" {
		return claim.KeyFormRaw
	}
	return r.form
}

func (r *router) fingerprint() string {
	if v, ok := r.fp.Load().(string); ok {
		return v
	}
	return "fp-effect"
}

func (r *router) Route(msg *azservicebus.ReceivedMessage) (sideeffects.Handler, error) {
	switch s := subject(msg); s {
	case "noroute":
		return sideeffects.Handler{}, &sideeffects.InputError{Reason: sideeffects.ReasonNoRoute, Description: "no route for subject noroute"}
	case "tx":
		return sideeffects.Handler{Name: "tx", TxEffect: r.tx, KeyForm: claim.KeyFormRaw}, nil
	case "json":
		if !json.Valid(msg.Body) {
			return sideeffects.Handler{}, &sideeffects.InputError{Reason: sideeffects.ReasonMalformedBody, Description: "body is not JSON"}
		}
		return sideeffects.Handler{Name: "json", Effect: r.eff, Fingerprint: "fp-json", KeyForm: claim.KeyFormRaw}, nil
	case "manual":
		return sideeffects.Handler{Name: "manual", Effect: r.eff, Recovery: sideeffects.RecoveryManual, Fingerprint: "fp-manual", KeyForm: claim.KeyFormRaw, Backoff: r.backoff, HoldSessionOnFailure: r.holdSession}, nil
	default:
		return sideeffects.Handler{Name: "effect", Effect: r.eff, Fingerprint: r.fingerprint(), KeyForm: r.keyForm(), Backoff: r.backoff, Breaker: r.breaker, HoldSessionOnFailure: r.holdSession}, nil
	}
}

// bundle is what a protocol test needs.
type bundle struct {
	t       *testing.T
	backend string
	q       *membus.Queue
	store   claim.Store
	eff     *effects
	router  *router
	logs    *syncBuffer
}

func setup(t *testing.T, backend string, qopts membus.QueueOptions) *bundle {
	t.Helper()
	if qopts.LockDuration == 0 {
		qopts.LockDuration = 2 * time.Second
	}
	if qopts.MaxDeliveryCount == 0 {
		qopts.MaxDeliveryCount = 10
	}
	b := &bundle{
		t:       t,
		backend: backend,
		q:       membus.NewQueue("orders", qopts),
		store:   newStore(t, backend),
		eff:     newEffects(),
		logs:    &syncBuffer{},
	}
	b.router = &router{eff: b.eff}
	return b
}

// options returns processor options wired to the bundle, with short
// intervals for tests.
func (b *bundle) options() processor.Options {
	return processor.Options{
		Consumer: "billing",
		Entity:   "orders",
		Store:    b.store,
		Router:   b.router,
		NewReceiver: func(context.Context) (processor.Receiver, error) {
			return b.q.NewReceiver(), nil
		},
		MaxConcurrentCalls: 8,
		MaxLockRenewal:     time.Minute,
		HeartbeatInterval:  200 * time.Millisecond,
		Retry:              sideeffects.RetryPolicy{MaxAttempts: 1, Budget: time.Second},
		StorePayload:       true,
		MaxPayloadBytes:    1024,
		ShutdownTimeout:    10 * time.Second,
		RecordRetryWindow:  time.Second,
		Logger:             slog.New(slog.NewJSONHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

// start runs a processor until the test ends (or stop is called) and
// returns it with a stop function that waits for Run to return.
func (b *bundle) start(opts processor.Options) (*processor.Processor, func()) {
	b.t.Helper()
	p, err := processor.New(opts)
	if err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					b.t.Errorf("Run: %v", err)
				}
			case <-time.After(30 * time.Second):
				b.t.Error("Run did not return within 30s of cancel")
			}
		})
	}
	b.t.Cleanup(stop)
	return p, stop
}

func (b *bundle) send(id, subj string, body string, props map[string]any) {
	b.t.Helper()
	m := &azservicebus.Message{Body: []byte(body), ApplicationProperties: props}
	if id != "" {
		m.MessageID = &id
	}
	if subj != "" {
		m.Subject = &subj
	}
	if err := b.q.SendMessage(context.Background(), m, nil); err != nil {
		b.t.Fatal(err)
	}
}

// waitIdle waits until every message is completed or dead-lettered.
func (b *bundle) waitIdle() {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := b.q.WaitIdle(ctx); err != nil {
		b.t.Fatalf("queue not drained: %v; stats %+v\nlogs:\n%s", err, b.q.Stats(), b.logs.tail(40))
	}
}

// eventually polls cond until it holds or a generous deadline passes.
func (b *bundle) eventually(what string, cond func() bool) {
	b.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			b.t.Fatalf("timed out waiting for %s; stats %+v\nlogs:\n%s", what, b.q.Stats(), b.logs.tail(40))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (b *bundle) claims() []*claim.Claim {
	b.t.Helper()
	cs, err := b.store.List(context.Background(), &claim.ListParams{Limit: 10000})
	if err != nil {
		b.t.Fatal(err)
	}
	return cs
}

func (b *bundle) claimOf(key string) *claim.Claim {
	b.t.Helper()
	var found *claim.Claim
	for _, c := range b.claims() {
		if c.MessageID == key {
			if found != nil {
				b.t.Fatalf("two claims for %q", key)
			}
			found = c
		}
	}
	if found == nil {
		b.t.Fatalf("no claim for %q", key)
	}
	return found
}

func (b *bundle) deadLetterReasons() map[string]string {
	out := map[string]string{}
	for _, m := range b.q.DeadLetters() {
		r := ""
		if m.DeadLetterReason != nil {
			r = *m.DeadLetterReason
		}
		out[m.MessageID] = r
	}
	return out
}

func countCompleted(q *membus.Queue, id string) int {
	n := 0
	for _, c := range q.Completed() {
		if c == id {
			n++
		}
	}
	return n
}

func outcomes(m *processor.Metrics, o processor.Result) int {
	return int(metricValue(m.Messages.With(string(o))))
}

// syncBuffer collects log output from many goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

func (s *syncBuffer) tail(n int) string {
	lines := strings.Split(strings.TrimSpace(s.String()), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// flakyStore makes the claim store unavailable while down is set.
type flakyStore struct {
	claim.Store
	down  atomic.Bool
	fails atomic.Int64
	// probed counts the processor's store probes (heartbeats of no
	// claim) that succeeded.
	probed atomic.Int64
}

func (f *flakyStore) check() error {
	if f.down.Load() {
		f.fails.Add(1)
		return fmt.Errorf("simulated outage: %w", claim.ErrUnavailable)
	}
	return nil
}

func (f *flakyStore) ClaimBatch(ctx context.Context, p *claim.ClaimBatchParams) ([]claim.ClaimResult, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	return f.Store.ClaimBatch(ctx, p)
}

func (f *flakyStore) ClaimTx(ctx context.Context, p *claim.ClaimTxParams, fn func(context.Context, *sql.Tx) error) (claim.ClaimResult, error) {
	if err := f.check(); err != nil {
		return claim.ClaimResult{}, err
	}
	return f.Store.ClaimTx(ctx, p, fn)
}

func (f *flakyStore) MarkProcessed(ctx context.Context, p *claim.MarkProcessedParams) error {
	if err := f.check(); err != nil {
		return err
	}
	return f.Store.MarkProcessed(ctx, p)
}

func (f *flakyStore) Ping(ctx context.Context) error {
	if err := f.check(); err != nil {
		return err
	}
	return f.Store.Ping(ctx)
}

func (f *flakyStore) Heartbeat(ctx context.Context, p *claim.HeartbeatParams) error {
	if err := f.check(); err != nil {
		return err
	}
	err := f.Store.Heartbeat(ctx, p)
	if p.ID < 0 && !claim.StoreWide(err) {
		f.probed.Add(1)
	}
	return err
}

func testutilCounter(m *processor.Metrics) float64 { return metricValue(m.Receivers) }

// noDeferral turns delayed retries off: a retryable outcome releases the
// claim and abandons the message (the behaviour of a store without
// claim.Deferrer, and of Options.NoDeferral).
func noDeferral(o processor.Options) processor.Options {
	o.NoDeferral = true
	return o
}

// metricValue reads an instrument of metricreg.ProcessorMetrics (a
// Prometheus collector behind the processor's interfaces).
func metricValue(instrument any) float64 {
	return testutil.ToFloat64(instrument.(prometheus.Collector))
}
