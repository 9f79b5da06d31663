package chaos

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/metricreg"
	"github.com/sbclaim/sbclaim/internal/processor"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/testkit/membus"
)

// The pipeline run (RunPipeline, `chaos -pipeline`): two consumers in a
// row, joined by the outbox. Consumer A ("payments") charges each payment
// (an idempotent in-memory downstream, keyed by A's idempotency key) and
// publishes a "payment.charged" follow-up to the payment-charged queue;
// consumer B ("receipts") consumes it and issues a receipt (another
// idempotent downstream, keyed by B's idempotency key, which derives from
// the follow-up's MessageId). Replicas of both are killed at every step:
// after the claim, after the effect, after the outcome is recorded, and —
// A's relay — between a follow-up's send and its mark; sends fail now and
// then (Service Bus refusing them), and effects perform then lose their
// answer. Duplicate detection is off on the target by default, so every
// resend reaches B: B's claim must deduplicate it by its MessageId.
//
// The verdict lines check, per payment: A's effect happened once; its
// follow-up was sent at least once, every send with the same MessageId
// (the one derived from A's claim), and none is left unsent; B's effect
// happened once.

// Names of the pipeline run.
const (
	PipelineConsumerA = "payments"
	PipelineConsumerB = "receipts"
	PipelineQueueA    = "payments"
	PipelineTarget    = "payment-charged"
)

// PipelineFault is a fault of the pipeline run.
type PipelineFault string

// The pipeline's faults.
const (
	PipeDieAfterClaim     PipelineFault = "die-after-claim"
	PipeDieAfterEffect    PipelineFault = "die-after-effect"
	PipeDieAfterProcessed PipelineFault = "die-after-processed"
	PipeDieAfterSend      PipelineFault = "die-between-send-and-mark"
	PipeSendFails         PipelineFault = "send-fails"
	PipeAnswerLost        PipelineFault = "answer-lost"
)

// PipelineFaults lists them, in report order.
var PipelineFaults = []PipelineFault{PipeDieAfterClaim, PipeDieAfterEffect, PipeDieAfterProcessed, PipeDieAfterSend, PipeSendFails, PipeAnswerLost}

// PipelineConfig configures RunPipeline.
type PipelineConfig struct {
	Payments int     // distinct payments (default 200)
	Replicas int     // replicas of each consumer (default 2)
	DupShare float64 // share of payments the producer sends twice (default 0.2)
	// FaultRate is the chance that one step of one message hits a fault
	// (default 0.04); each fault is forced at least once.
	FaultRate float64
	NoFaults  bool
	// DuplicateDetection turns it on on the target queue: a resend is then
	// dropped by the broker instead of by B's claim.
	DuplicateDetection bool
	Seed               uint64
	DatabaseURL        string
	Timeout            time.Duration // default 3m
	Logger             *slog.Logger
}

// PipelineReport is what RunPipeline saw.
type PipelineReport struct {
	Config   PipelineConfig
	Database string
	Elapsed  time.Duration
	Faults   map[PipelineFault]int
	Kills    int

	Payments       int
	AEffects       map[string]int // payment → charges performed (distinct keys)
	BEffects       map[string]int // payment → receipts performed (distinct keys)
	FollowUpIDs    map[string][]string
	Sends          int // follow-up sends that reached the target
	Resends        int // sends beyond the first of a follow-up
	DroppedByBus   int // resends duplicate detection dropped
	PendingLeft    int64
	AClaims        int
	BClaims        int
	BDuplicates    int // B's deliveries completed as duplicates (resends B's claim caught)
	Problems       []string
	PipelineFailed error
}

// RunPipeline runs the pipeline (see the top of this file).
func RunPipeline(ctx context.Context, cfg PipelineConfig) (*PipelineReport, error) {
	if cfg.Payments == 0 {
		cfg.Payments = 200
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 2
	}
	if cfg.DupShare == 0 {
		cfg.DupShare = 0.2
	}
	if cfg.FaultRate == 0 {
		cfg.FaultRate = 0.04
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 3 * time.Minute
	}
	if cfg.Seed == 0 {
		cfg.Seed = uint64(time.Now().UnixNano())
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Payments < 1 || cfg.Replicas < 1 || cfg.FaultRate < 0 || cfg.FaultRate > 0.5 {
		return nil, fmt.Errorf("chaos: pipeline: need at least 1 payment and 1 replica, and a fault rate in [0, 0.5] (got %d, %d, %g)",
			cfg.Payments, cfg.Replicas, cfg.FaultRate)
	}
	db, err := OpenDatabase(ctx, cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	if _, ok := db.Store.(claim.Outbox); !ok {
		return nil, fmt.Errorf("chaos: pipeline: the store %T has no outbox", db.Store)
	}
	p := &pipeline{cfg: cfg, db: db, rng: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5bc1)),
		ns:      membus.NewNamespace(),
		queueA:  membus.NewQueue(PipelineQueueA, membus.QueueOptions{LockDuration: 2 * time.Second, MaxDeliveryCount: 50}),
		queueB:  membus.NewQueue(PipelineTarget, membus.QueueOptions{LockDuration: 2 * time.Second, MaxDeliveryCount: 50}),
		charges: newKeyLedger(), receipts: newKeyLedger(), faults: map[PipelineFault]int{},
		log: cfg.Logger}
	p.ns.AddQueue(p.queueB, cfg.DuplicateDetection)
	return p.run(ctx)
}

// keyLedger is an idempotent downstream: it performs each key once and
// remembers which payment each key was for.
type keyLedger struct {
	mu   sync.Mutex
	keys map[string]string // key → payment
}

func newKeyLedger() *keyLedger { return &keyLedger{keys: map[string]string{}} }

func (l *keyLedger) perform(key, payment string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.keys[key]; !ok {
		l.keys[key] = payment
	}
}

// perPayment counts the distinct keys performed per payment: the effects
// that happened.
func (l *keyLedger) perPayment() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int{}
	for _, p := range l.keys {
		out[p]++
	}
	return out
}

type pipeline struct {
	cfg      PipelineConfig
	db       *Database
	ns       *membus.Namespace
	queueA   *membus.Queue
	queueB   *membus.Queue
	charges  *keyLedger
	receipts *keyLedger
	log      *slog.Logger

	mu       sync.Mutex
	rng      *rand.Rand
	faults   map[PipelineFault]int
	kills    int
	stopping bool
	nextID   int
	wg       sync.WaitGroup
	runCtx   context.Context
	metricsB []*processor.Metrics // B's replicas'
}

// fire decides whether fault f hits now: each fault is forced the first
// time it can happen, then hits at the configured rate.
func (p *pipeline) fire(f PipelineFault) bool {
	if p.cfg.NoFaults {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopping {
		return false
	}
	if p.faults[f] > 0 && p.rng.Float64() >= p.cfg.FaultRate {
		return false
	}
	p.faults[f]++
	return true
}

// pipeReplica is one processor process of consumer A or B.
type pipeReplica struct {
	p        *pipeline
	consumer string
	id       int
	host     string
	dead     atomic.Bool
	killCtx  context.Context
	kill     context.CancelFunc
	cancel   context.CancelFunc
}

func (p *pipeline) start(consumer string) {
	p.mu.Lock()
	if p.stopping {
		p.mu.Unlock()
		return
	}
	p.nextID++
	r := &pipeReplica{p: p, consumer: consumer, id: p.nextID, host: fmt.Sprintf("%s-%d", consumer, p.nextID)}
	p.wg.Add(1)
	p.mu.Unlock()
	r.killCtx, r.kill = context.WithCancel(context.Background())
	runCtx, cancel := context.WithCancel(p.runCtx)
	r.cancel = cancel
	log := p.log.With("replica", r.host)

	st := &pipeStore{gateStore: &gateStore{inner: p.db.Store, gate: r.gate}, ob: p.db.Store.(claim.Outbox), rep: r}
	queue, router := p.queueA, sideeffects.Router(pipeRouter{h: sideeffects.Handler{Name: "charge", Effect: p.chargeEffect(r), Fingerprint: "charge-1"}})
	if consumer == PipelineConsumerB {
		queue, router = p.queueB, pipeRouter{h: sideeffects.Handler{Name: "receipt", Effect: p.receiptEffect(r), Fingerprint: "receipt-1"}}
	}
	m := metricreg.ProcessorMetrics(nil)
	if consumer == PipelineConsumerB {
		p.mu.Lock()
		p.metricsB = append(p.metricsB, m)
		p.mu.Unlock()
	}
	opts := processor.Options{
		Consumer: consumer, Entity: queue.Name(), Store: st, Router: router,
		NewReceiver: func(ctx context.Context) (processor.Receiver, error) {
			if r.dead.Load() {
				<-ctx.Done()
				return nil, ctx.Err()
			}
			return &pipeReceiver{Receiver: queue.NewReceiver(), rep: r}, nil
		},
		MaxConcurrentCalls: 8,
		MaxLockRenewal:     30 * time.Second,
		HeartbeatInterval:  100 * time.Millisecond,
		TakeoverAfter:      400 * time.Millisecond,
		Retry:              sideeffects.RetryPolicy{MaxAttempts: 3, InitialInterval: 10 * time.Millisecond, MaxInterval: 50 * time.Millisecond, Budget: 2 * time.Second},
		MaxDeliveryCount:   50,
		DeferPollInterval:  50 * time.Millisecond,
		StorePayload:       true,
		SettleTimeout:      2 * time.Second,
		StoreTimeout:       5 * time.Second,
		ShutdownTimeout:    5 * time.Second,
		RecordRetryWindow:  2 * time.Second,
		Host:               r.host,
		Logger:             log,
		Metrics:            m,
		Hooks: processor.Hooks{
			AfterClaim:         r.crash(PipeDieAfterClaim),
			AfterEffect:        r.crash(PipeDieAfterEffect),
			AfterMarkProcessed: r.crash(PipeDieAfterProcessed),
		},
	}
	if consumer == PipelineConsumerA {
		opts.Outbox = processor.OutboxOptions{
			NewSender:     func(target string) (processor.Sender, error) { return p.newSender(r, target) },
			Lease:         time.Second,
			SendTimeout:   500 * time.Millisecond,
			SweepInterval: 100 * time.Millisecond,
			MinBackoff:    20 * time.Millisecond,
			MaxBackoff:    200 * time.Millisecond,
			AfterSend: func(ctx context.Context, f *claim.StoredFollowUp) error {
				if r.dead.Load() {
					return processor.ErrCrash
				}
				if p.fire(PipeDieAfterSend) {
					r.die()
					return processor.ErrCrash
				}
				return nil
			},
		}
	}
	proc, err := processor.New(opts)
	if err != nil {
		panic("chaos: pipeline: processor: " + err.Error()) // the harness's own fixed options
	}
	go func() {
		defer p.wg.Done()
		if err := proc.Run(runCtx); err != nil {
			log.Error("processor stopped", "error", err)
		}
	}()
}

type pipeRouter struct{ h sideeffects.Handler }

func (r pipeRouter) Route(*azservicebus.ReceivedMessage) (sideeffects.Handler, error) {
	return r.h, nil
}

// crash is a processor hook that kills the replica when fault f fires.
func (r *pipeReplica) crash(f PipelineFault) func(context.Context, *azservicebus.ReceivedMessage) error {
	return func(context.Context, *azservicebus.ReceivedMessage) error {
		if r.dead.Load() {
			return processor.ErrCrash
		}
		if r.p.fire(f) {
			r.die()
			return processor.ErrCrash
		}
		return nil
	}
}

// die kills the replica (its store, receiver and senders refuse every
// later call) and starts its replacement 50 ms later.
func (r *pipeReplica) die() {
	if !r.dead.CompareAndSwap(false, true) {
		return
	}
	r.kill()
	r.cancel()
	p := r.p
	p.mu.Lock()
	p.kills++
	p.mu.Unlock()
	p.log.Info("replica killed", "replica", r.host)
	go func() {
		time.Sleep(50 * time.Millisecond)
		p.start(r.consumer)
	}()
}

func (r *pipeReplica) gate(context.Context, string, int64) error {
	if r.dead.Load() {
		return fmt.Errorf("chaos: replica %s is dead (store): %w", r.host, claim.ErrUnavailable)
	}
	return nil
}

// chargeEffect is A's effect: charge the payment (once per key) and
// publish payment.charged.
func (p *pipeline) chargeEffect(r *pipeReplica) sideeffects.Effect {
	return sideeffects.EffectFunc(func(ctx context.Context, msg *azservicebus.ReceivedMessage, key string) error {
		if r.dead.Load() {
			return sideeffects.Retryable(errors.New("chaos: the replica is dead"))
		}
		payment := string(msg.Body)
		p.charges.perform(key, payment)
		if err := claim.FollowUpSinkOf(ctx).Publish(claim.FollowUp{To: PipelineTarget, Body: []byte(payment), Subject: "payment.charged",
			Properties: map[string]string{"payment": payment}}); err != nil {
			return sideeffects.Permanent(err)
		}
		if p.fire(PipeAnswerLost) {
			return sideeffects.Unknown(errors.New("chaos: charged, answer lost"))
		}
		return nil
	})
}

// receiptEffect is B's effect: issue the payment's receipt (once per key).
func (p *pipeline) receiptEffect(r *pipeReplica) sideeffects.Effect {
	return sideeffects.EffectFunc(func(ctx context.Context, msg *azservicebus.ReceivedMessage, key string) error {
		if r.dead.Load() {
			return sideeffects.Retryable(errors.New("chaos: the replica is dead"))
		}
		p.receipts.perform(key, string(msg.Body))
		if p.fire(PipeAnswerLost) {
			return sideeffects.Unknown(errors.New("chaos: receipt issued, answer lost"))
		}
		return nil
	})
}

// newSender is A's sender to target: cut when the replica dies, and
// failing now and then (PipeSendFails: nothing sent).
func (p *pipeline) newSender(r *pipeReplica, target string) (processor.Sender, error) {
	s, err := p.ns.NewSender(target)
	if err != nil {
		return nil, err
	}
	return &pipeSender{Sender: s, rep: r}, nil
}

type pipeSender struct {
	*membus.Sender
	rep *pipeReplica
}

func (s *pipeSender) SendMessage(ctx context.Context, m *azservicebus.Message, o *azservicebus.SendMessageOptions) error {
	if s.rep.dead.Load() {
		return &azservicebus.Error{Code: azservicebus.CodeConnectionLost}
	}
	if s.rep.p.fire(PipeSendFails) {
		return fmt.Errorf("chaos: send refused: %w", &azservicebus.Error{Code: azservicebus.CodeConnectionLost})
	}
	return s.Sender.SendMessage(ctx, m, o)
}

// pipeReceiver is a replica's receiver: once it is dead every call fails
// and does nothing (its locks run out).
type pipeReceiver struct {
	*membus.Receiver
	rep *pipeReplica
}

func (k *pipeReceiver) dead(code azservicebus.Code) error {
	return fmt.Errorf("chaos: replica %s is dead: %w", k.rep.host, &azservicebus.Error{Code: code})
}

func (k *pipeReceiver) ReceiveMessages(ctx context.Context, n int, o *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	if k.rep.dead.Load() {
		return nil, k.dead(azservicebus.CodeClosed)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(k.rep.killCtx, cancel)
	defer stop()
	msgs, err := k.Receiver.ReceiveMessages(ctx, n, o)
	if k.rep.dead.Load() {
		// A dead process takes nothing: what the call locked runs out.
		return nil, k.dead(azservicebus.CodeClosed)
	}
	return msgs, err
}

func (k *pipeReceiver) CompleteMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.CompleteMessageOptions) error {
	if k.rep.dead.Load() {
		return k.dead(azservicebus.CodeConnectionLost)
	}
	return k.Receiver.CompleteMessage(ctx, m, o)
}

func (k *pipeReceiver) AbandonMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.AbandonMessageOptions) error {
	if k.rep.dead.Load() {
		return k.dead(azservicebus.CodeConnectionLost)
	}
	return k.Receiver.AbandonMessage(ctx, m, o)
}

func (k *pipeReceiver) DeadLetterMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.DeadLetterOptions) error {
	if k.rep.dead.Load() {
		return k.dead(azservicebus.CodeConnectionLost)
	}
	return k.Receiver.DeadLetterMessage(ctx, m, o)
}

func (k *pipeReceiver) RenewMessageLock(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.RenewMessageLockOptions) error {
	if k.rep.dead.Load() {
		return k.dead(azservicebus.CodeConnectionLost)
	}
	return k.Receiver.RenewMessageLock(ctx, m, o)
}

func (k *pipeReceiver) DeferMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.DeferMessageOptions) error {
	if k.rep.dead.Load() {
		return k.dead(azservicebus.CodeConnectionLost)
	}
	return k.Receiver.DeferMessage(ctx, m, o)
}

func (k *pipeReceiver) ReceiveDeferredMessages(ctx context.Context, seqs []int64, o *azservicebus.ReceiveDeferredMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	if k.rep.dead.Load() {
		return nil, k.dead(azservicebus.CodeConnectionLost)
	}
	return k.Receiver.ReceiveDeferredMessages(ctx, seqs, o)
}

// pipeStore is a replica's store: the dead-replica gate on every call,
// the outbox's included.
type pipeStore struct {
	*gateStore
	ob  claim.Outbox
	rep *pipeReplica
}

var _ claim.Outbox = (*pipeStore)(nil)

func (s *pipeStore) LeaseFollowUps(ctx context.Context, p *claim.LeaseFollowUpsParams) ([]*claim.StoredFollowUp, error) {
	if err := s.rep.gate(ctx, "LeaseFollowUps", p.ClaimID); err != nil {
		return nil, err
	}
	return s.ob.LeaseFollowUps(ctx, p)
}

func (s *pipeStore) MarkFollowUpSent(ctx context.Context, p *claim.FollowUpLeaseParams) error {
	if err := s.rep.gate(ctx, "MarkFollowUpSent", p.ClaimID); err != nil {
		return err
	}
	return s.ob.MarkFollowUpSent(ctx, p)
}

func (s *pipeStore) RetryFollowUp(ctx context.Context, p *claim.RetryFollowUpParams) error {
	if err := s.rep.gate(ctx, "RetryFollowUp", p.ClaimID); err != nil {
		return err
	}
	return s.ob.RetryFollowUp(ctx, p)
}

func (s *pipeStore) FollowUps(ctx context.Context, id int64) ([]*claim.StoredFollowUp, error) {
	if err := s.rep.gate(ctx, "FollowUps", id); err != nil {
		return nil, err
	}
	return s.ob.FollowUps(ctx, id)
}

func (s *pipeStore) OutboxStats(ctx context.Context) (*claim.OutboxStats, error) {
	if err := s.rep.gate(ctx, "OutboxStats", 0); err != nil {
		return nil, err
	}
	return s.ob.OutboxStats(ctx)
}

func (p *pipeline) run(ctx context.Context) (*PipelineReport, error) {
	start := time.Now()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	p.runCtx = runCtx
	for range p.cfg.Replicas {
		p.start(PipelineConsumerA)
		p.start(PipelineConsumerB)
	}
	// The producer: every payment once, a share of them twice (a retry
	// after a lost acknowledgement, with the same MessageId).
	var payments []string
	for i := range p.cfg.Payments {
		payments = append(payments, fmt.Sprintf("pay-%06d", i))
	}
	for _, id := range payments {
		n := 1
		p.mu.Lock()
		if p.rng.Float64() < p.cfg.DupShare {
			n = 2
		}
		p.mu.Unlock()
		for range n {
			mid := id
			if err := p.queueA.SendMessage(ctx, &azservicebus.Message{MessageID: &mid, Body: []byte(id), Subject: ptr("payment")}, nil); err != nil {
				return nil, err
			}
		}
	}
	err := p.waitDone(ctx, len(payments))
	p.mu.Lock()
	p.stopping = true
	p.mu.Unlock()
	cancel()
	p.wg.Wait()
	rep := p.report(ctx, payments)
	rep.Elapsed = time.Since(start)
	rep.PipelineFailed = err
	if err != nil {
		rep.Problems = append(rep.Problems, err.Error())
	}
	return rep, nil
}

// waitDone waits until A processed every payment, every follow-up is
// sent, B processed one per payment and both queues are drained.
func (p *pipeline) waitDone(ctx context.Context, n int) error {
	deadline := time.Now().Add(p.cfg.Timeout)
	ob := p.db.Store.(claim.Outbox)
	for {
		if time.Now().After(deadline) {
			return fmt.Errorf("not finished after %s: queue A %+v, queue B %+v", p.cfg.Timeout, p.queueA.Stats(), p.queueB.Stats())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if !p.queueA.Drained() || !p.queueB.Drained() {
			continue
		}
		st, err := ob.OutboxStats(ctx)
		if err != nil || st.Pending > 0 {
			continue
		}
		a, b, err := p.processed(ctx)
		if err == nil && a == n && b == n && p.queueB.Drained() {
			return nil
		}
	}
}

// processed counts the processed claims of A and B.
func (p *pipeline) processed(ctx context.Context) (a, b int, err error) {
	for _, consumer := range []string{PipelineConsumerA, PipelineConsumerB} {
		cs, err := listAll(ctx, p.db.Store, &claim.ListParams{Consumer: consumer, States: []claim.State{claim.StateProcessed}})
		if err != nil {
			return 0, 0, err
		}
		if consumer == PipelineConsumerA {
			a = len(cs)
		} else {
			b = len(cs)
		}
	}
	return a, b, nil
}

func listAll(ctx context.Context, st claim.Store, params *claim.ListParams) ([]*claim.Claim, error) {
	var out []*claim.Claim
	q := *params
	q.Limit = 1000
	for {
		cs, err := st.List(ctx, &q)
		if err != nil {
			return nil, err
		}
		out = append(out, cs...)
		if len(cs) < q.Limit {
			return out, nil
		}
		q.AfterID = cs[len(cs)-1].ID
	}
}

func (p *pipeline) report(ctx context.Context, payments []string) *PipelineReport {
	rep := &PipelineReport{Config: p.cfg, Database: p.db.String(), Faults: map[PipelineFault]int{}, Payments: len(payments),
		AEffects: p.charges.perPayment(), BEffects: p.receipts.perPayment(), FollowUpIDs: map[string][]string{}}
	p.mu.Lock()
	for f, n := range p.faults {
		rep.Faults[f] = n
	}
	rep.Kills = p.kills
	p.mu.Unlock()
	problem := func(format string, args ...any) { rep.Problems = append(rep.Problems, fmt.Sprintf(format, args...)) }

	// The follow-ups as the target got them.
	sends := map[string]int{}
	for _, m := range p.ns.Sent(PipelineTarget) {
		payment := string(m.Body)
		id := ""
		if m.MessageID != nil {
			id = *m.MessageID
		}
		if !slices.Contains(rep.FollowUpIDs[payment], id) {
			rep.FollowUpIDs[payment] = append(rep.FollowUpIDs[payment], id)
		}
		sends[payment]++
		rep.Sends++
	}
	rep.DroppedByBus = p.ns.Dropped(PipelineTarget)
	for _, pay := range payments {
		if n := rep.AEffects[pay]; n != 1 {
			problem("payment %s charged %d times", pay, n)
		}
		ids := rep.FollowUpIDs[pay]
		want := claim.FollowUpMessageID(PipelineConsumerA, pay, 1)
		switch {
		case len(ids) == 0:
			problem("payment %s: its follow-up was never sent", pay)
		case len(ids) > 1 || ids[0] != want:
			problem("payment %s: follow-up sent with MessageIds %v, want only %s", pay, ids, want)
		}
		if sends[pay] > 1 {
			rep.Resends += sends[pay] - 1
		}
		if n := rep.BEffects[pay]; n != 1 {
			problem("payment %s: %d receipts, want 1", pay, n)
		}
	}
	if st, err := p.db.Store.(claim.Outbox).OutboxStats(ctx); err != nil {
		problem("outbox stats: %v", err)
	} else if rep.PendingLeft = st.Pending; st.Pending != 0 {
		problem("%d follow-ups left unsent", st.Pending)
	}
	a, b, err := p.processed(ctx)
	if err != nil {
		problem("claims: %v", err)
	}
	rep.AClaims, rep.BClaims = a, b
	if a != len(payments) || b != len(payments) {
		problem("processed claims: A %d, B %d, want %d each", a, b, len(payments))
	}
	for _, q := range []*membus.Queue{p.queueA, p.queueB} {
		if dl := q.DeadLetters(); len(dl) > 0 {
			problem("%s: %d dead letters (first: %s)", q.Name(), len(dl), deref(dl[0].DeadLetterReason))
		}
	}
	for _, m := range p.metricsB {
		rep.BDuplicates += int(counterValue(m.Messages, "duplicate"))
	}
	if !p.cfg.NoFaults {
		for _, f := range PipelineFaults {
			if rep.Faults[f] == 0 {
				problem("fault %s never happened", f)
			}
		}
	}
	return rep
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// Pass reports whether the run found no problem.
func (r *PipelineReport) Pass() bool { return len(r.Problems) == 0 }

// Write prints the report: the faults, then one verdict line per check,
// then the overall verdict.
func (r *PipelineReport) Write(w io.Writer) {
	fmt.Fprintf(w, "pipeline: %d payments, %d replicas of A (%s) and of B (%s), database %s, duplicate detection on the target: %v, seed %d, %s\n",
		r.Payments, r.Config.Replicas, PipelineConsumerA, PipelineConsumerB, r.Database, r.Config.DuplicateDetection, r.Config.Seed, r.Elapsed.Round(time.Millisecond))
	var names []string
	for _, f := range PipelineFaults {
		names = append(names, fmt.Sprintf("%s %d", f, r.Faults[f]))
	}
	fmt.Fprintf(w, "faults: %s; replicas killed %d\n", joinComma(names), r.Kills)
	once := func(m map[string]int) (ok, bad int) {
		for _, n := range m {
			if n == 1 {
				ok++
			} else {
				bad++
			}
		}
		return ok, r.Payments - ok
	}
	aOK, aBad := once(r.AEffects)
	fmt.Fprintf(w, "VERDICT A effects: %s: %d of %d payments charged exactly once (%d not)\n", passFail(aBad == 0), aOK, r.Payments, aBad)
	sameID, lost := 0, 0
	for _, ids := range r.FollowUpIDs {
		if len(ids) == 1 {
			sameID++
		}
	}
	lost = r.Payments - len(r.FollowUpIDs)
	fuOK := sameID == r.Payments && lost == 0 && r.PendingLeft == 0
	fmt.Fprintf(w, "VERDICT follow-ups: %s: %d of %d payments' follow-up sent, every send with its one MessageId (%d sends, %d resends, %d dropped by duplicate detection), %d lost, %d left unsent\n",
		passFail(fuOK), len(r.FollowUpIDs), r.Payments, r.Sends, r.Resends, r.DroppedByBus, lost, r.PendingLeft)
	bOK, bBad := once(r.BEffects)
	fmt.Fprintf(w, "VERDICT B effects: %s: %d of %d payments got exactly one receipt (%d not); B completed %d deliveries as duplicates\n",
		passFail(bBad == 0), bOK, r.Payments, bBad, r.BDuplicates)
	if r.Pass() {
		fmt.Fprintln(w, "VERDICT: PASS")
		return
	}
	problems := r.Problems
	if len(problems) > 10 {
		problems = append(problems[:10:10], fmt.Sprintf("... and %d more", len(r.Problems)-10))
	}
	fmt.Fprintf(w, "VERDICT: FAIL: %s\n", joinSemi(problems))
}

func passFail(ok bool) string {
	if ok {
		return "PASS"
	}
	return "FAIL"
}

func joinComma(s []string) string { return strings.Join(s, ", ") }
func joinSemi(s []string) string  { return strings.Join(s, "; ") }

// counterValue reads one counter of a vector.
func counterValue(v processor.CounterVec, label string) float64 {
	return testutil.ToFloat64(v.With(label).(prometheus.Collector))
}
