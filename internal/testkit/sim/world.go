package sim

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/internal/bridge"
	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/sqlite"
	"github.com/sbclaim/sbclaim/internal/processor"
	"github.com/sbclaim/sbclaim/internal/reconciler"
	"github.com/sbclaim/sbclaim/internal/testkit/chaos"
	"github.com/sbclaim/sbclaim/internal/testkit/membus"
	"github.com/sbclaim/sbclaim/operator"
	"github.com/sbclaim/sbclaim/prommetrics"
)

// The simulated deployment's settings (one set for every seed: the seed
// varies the world, not the configuration the product is run with).
const (
	queueName         = "sim"
	consumerName      = "sim"
	lockDuration      = 60 * time.Second
	maxDeliveryCount  = 5
	heartbeatInterval = 5 * time.Second
	takeoverAfter     = 20 * time.Second
	staleAfter        = 60 * time.Second
	reconcileEvery    = 30 * time.Second
	retention         = 6 * time.Minute
	// horizon is the routes' delayed-retry horizon: a claim postponed for
	// this long is flagged.
	horizon = 8 * time.Minute
	// chaosPhase is how long faults happen; quietPhase follows, with the
	// faults off, so every message can settle; the run then stops.
	chaosPhase = 10 * time.Minute
	quietPhase = 40 * time.Minute
)

// callKind is what the downstream does with one call.
type callKind int

const (
	callOK         callKind = iota // performs, answers 200
	callDown                       // not performed: 503
	callLostAnswer                 // performs, the answer is lost (timeout)
	callSlow                       // performs after a long wait
	callReject                     // a final refusal: not performed, never will be
	callMisconfig                  // 401: not performed
	callStoredFail                 // performs nothing; stores a 500 under the key (idempotent downstreams repeat it)
)

func (k callKind) String() string {
	return [...]string{"ok", "down", "lost-answer", "slow", "reject", "401", "stored-500"}[k]
}

// hookFault is a replica's crash or freeze at one of the processor's hook
// points, on one delivery of one message.
type hookFault struct {
	point    string // AfterClaim, AfterEffect, AfterMarkProcessed, AfterFail, AfterDeferRecorded
	delivery uint32 // the delivery count it fires on (0: any)
	freeze   time.Duration
	crash    bool
	fetched  bool // only on a delivery fetched by its sequence number (a deferred message)
	// partition cuts the replica off from the store for this long (its
	// store calls fail as unavailable) while it goes on with the broker:
	// a holder that cannot heartbeat or record its outcome, but still
	// renews its message's lock, looks silent to the others.
	partition time.Duration
}

// plannedMessage is a message and everything the seed decided about it.
type plannedMessage struct {
	id     string
	route  string // "auto" or "manual"
	calls  []callKind
	faults []hookFault
	dup    time.Duration // a second send of the same message ID after this long (0: none)
}

// effectRecord is one call of the downstream that performed the effect.
type effectRecord struct {
	at       time.Time
	msg, key string
	who      string
	absorbed bool // an idempotent downstream answered from its store
}

// world is one seed's simulated deployment.
type world struct {
	seed uint64
	rng  *rand.Rand
	mu   sync.Mutex
	log  *slog.Logger

	db    *sqlite.Store
	queue *membus.Queue
	msgs  []*plannedMessage
	byID  map[string]*plannedMessage

	replicas []*replica
	nextRep  int
	stopping bool
	wg       sync.WaitGroup
	runCtx   context.Context

	noPayload func(replica int) bool // a new replica's StorePayload setting

	// the downstream
	calls    map[string]int // calls per message
	effects  []effectRecord
	keyStore map[string]bool // idempotent downstream: keys performed
	failed   map[string]bool // keys with a stored 500

	// store faults
	outageUntil time.Time
	// downstream outage
	downUntil time.Time
	storeErrP float64
	stallP    float64 // a replica stalls before a guarded write
	// historyBroken: history rows already reported by checkHistory.
	historyBroken map[string]bool
	// beats: the last heartbeat that landed, per claim id and owner token;
	// outcomes: every other owner write that landed.
	beats    map[string]time.Time
	outcomes []landedWrite

	storeCalls map[string]int  // store calls per (op, claim, caller)
	redrives   map[string]int  // operator redrives per message
	sends      map[string]int  // copies sent per message
	rejected   map[string]bool // the downstream gave a final refusal
	trace      []string
	start      time.Time
	violations []violation
}

type replica struct {
	w          *world
	id         int
	host       string
	noPayload  bool
	dead       atomic.Bool
	frozenTill atomic.Int64 // unix nanos
	cutTill    atomic.Int64 // unix nanos: cut off from the store until then (a partition)
	cancel     context.CancelFunc
	kill       context.CancelFunc
	killCtx    context.Context
	fetchedMu  sync.Mutex
	fetchedSet map[string]bool // deliveries (message ID/delivery count) fetched by sequence number
}

func (r *replica) fetched(m *azservicebus.ReceivedMessage) bool {
	r.fetchedMu.Lock()
	defer r.fetchedMu.Unlock()
	return r.fetchedSet[fmt.Sprintf("%s/%d", m.MessageID, m.DeliveryCount)]
}

func (w *world) now() string { return time.Since(w.start).Truncate(time.Millisecond).String() }

func (w *world) note(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.noteLocked(format, args...)
}

func (w *world) noteLocked(format string, args ...any) {
	w.trace = append(w.trace, fmt.Sprintf("%9s  ", w.now())+fmt.Sprintf(format, args...))
}

// violation is a broken invariant: its kind and what happened.
type violation struct {
	kind, text string
}

func (w *world) violate(kind, format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.violations = append(w.violations, violation{kind, fmt.Sprintf(format, args...)})
}

// plan draws the seed's messages and their fates.
func (w *world) plan() {
	n := 4 + w.rng.IntN(10)
	manualShare := w.rng.Float64()
	faultRate := w.rng.Float64() * 0.6
	for i := range n {
		m := &plannedMessage{id: fmt.Sprintf("m%02d", i), route: "auto"}
		if w.rng.Float64() < manualShare {
			m.route = "manual"
		}
		for range 2 + w.rng.IntN(6) {
			k := callOK
			if w.rng.Float64() < faultRate {
				k = []callKind{callDown, callDown, callDown, callLostAnswer, callSlow, callMisconfig, callStoredFail, callReject}[w.rng.IntN(8)]
			}
			m.calls = append(m.calls, k)
		}
		for w.rng.Float64() < faultRate {
			f := hookFault{
				point:    []string{"AfterClaim", "AfterEffect", "AfterEffect", "AfterMarkProcessed", "AfterFail", "AfterDeferRecorded"}[w.rng.IntN(6)],
				delivery: uint32(w.rng.IntN(maxDeliveryCount + 1)),
			}
			switch w.rng.IntN(3) {
			case 0:
				f.crash = true
			case 1:
				f.freeze = time.Duration(1+w.rng.IntN(120)) * time.Second
				f.crash = w.rng.IntN(3) == 0 // frozen, then killed
			default:
				f.partition = time.Duration(5+w.rng.IntN(240)) * time.Second
			}
			m.faults = append(m.faults, f)
		}
		if w.rng.Float64() < 0.5 {
			// (fires only on a fetched delivery whose effect succeeded:
			// rare, so planned often) a holder of a fetched (deferred) message that dies or goes
			// silent after its effect, before recording it
			f := hookFault{point: "AfterEffect", fetched: true}
			switch w.rng.IntN(3) {
			case 0:
				f.crash = true
				if w.rng.IntN(2) == 0 {
					f.freeze = time.Duration(1+w.rng.IntN(90)) * time.Second
				}
			case 1:
				f.freeze = time.Duration(1+w.rng.IntN(90)) * time.Second
			default:
				// silent to the store, alive at the broker: the poller
				// takes the claim and cannot fetch the locked message
				f.partition = time.Duration(30+w.rng.IntN(240)) * time.Second
			}
			m.faults = append(m.faults, f)
		}
		if w.rng.Float64() < faultRate/3 {
			// within the retention of the original's finish (a duplicate
			// later than that is claimed afresh, as documented)
			m.dup = time.Duration(w.rng.IntN(int(retention*2/3/time.Second))) * time.Second
		}
		w.msgs = append(w.msgs, m)
		w.byID[m.id] = m
	}
	w.storeErrP = w.rng.Float64() * faultRate * 0.1
	w.stallP = w.rng.Float64() * faultRate * 0.05
	payloadMix := w.rng.IntN(3) // 0: all on, 1: all off, 2: mixed per replica
	w.noPayload = func(id int) bool {
		switch payloadMix {
		case 0:
			return false
		case 1:
			return true
		}
		return w.chance(0.5, "payload", id)
	}
}

// stalls are the guarded writes a replica may stall before (the gate's
// stall fault).
var stalls = map[string]bool{"TakeOver": true, "TakeDeferred": true, "Flag": true, "MarkProcessed": true,
	"Release": true, "RecordAttempt": true, "Fail": true, "Defer": true, "WriteOutcomes": true}

// rng2 is a number in [0, n) drawn from the seed and x (not from the
// world's generator, whose draws must not depend on goroutine order).
func (w *world) rng2(x int64, n int) int {
	h := fnv.New64a()
	fmt.Fprint(h, w.seed, "rng2", x, time.Now().UnixNano())
	return int(h.Sum64() % uint64(n))
}

// gate is every store call of a replica (or of the reconciler and the
// operators, rep nil): a frozen replica's call waits, a dead one's fails,
// a store outage fails every call, and a random error before commit.
func (w *world) gate(rep *replica) func(ctx context.Context, op string, id int64) error {
	who := "reconciler"
	if rep != nil {
		who = rep.host
	}
	return func(ctx context.Context, op string, id int64) error {
		if rep != nil {
			rep.waitThaw(ctx)
			if rep.dead.Load() {
				return fmt.Errorf("sim: %s is dead", rep.host)
			}
			if stalls[op] && w.stallP > 0 && !w.quiet() && w.chance(w.stallP, "stall", op, id, who, time.Now().UnixNano()) {
				// The replica stalls (a GC pause, a frozen VM) after it
				// decided and before its guarded write reaches the store:
				// the write then carries what it read before the stall.
				d := time.Duration(21+w.rng2(id, 70)) * time.Second
				w.note("%s stalls %s before its %s of claim %d", rep.host, d, op, id)
				rep.frozenTill.Store(time.Now().Add(d).UnixNano())
				rep.waitThaw(ctx)
				if rep.dead.Load() {
					return fmt.Errorf("sim: %s is dead", rep.host)
				}
			}
		}
		if rep != nil && time.Now().UnixNano() < rep.cutTill.Load() {
			return fmt.Errorf("sim: %s cut off from the store (%s): %w", rep.host, op, claim.ErrUnavailable)
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if time.Now().Before(w.outageUntil) {
			// as a lost connection presents: the whole store is unavailable
			return fmt.Errorf("sim: store outage (%s): %w", op, claim.ErrUnavailable)
		}
		// One call's error before commit (a deadlock victim, say), decided
		// by the seed and the call's identity, not by the order in which
		// goroutines happen to reach the store.
		ck := fmt.Sprintf("%s/%d/%s", op, id, who)
		w.storeCalls[ck]++
		if w.storeErrP > 0 && w.chance(w.storeErrP, ck, w.storeCalls[ck]) {
			return fmt.Errorf("sim: store error before commit (%s): %w", op, claim.ErrAborted)
		}
		return nil
	}
}

func (r *replica) waitThaw(ctx context.Context) {
	for {
		till := time.Unix(0, r.frozenTill.Load())
		d := time.Until(till)
		if d <= 0 || ctx.Err() != nil {
			return
		}
		time.Sleep(d)
	}
}

// handler is the downstream as a Go handler of a route: the ledger of
// effects is kept here, by the simulated world, not by the code under test.
func (w *world) handler(who string) sbclaim.HandlerFunc {
	return func(ctx context.Context, d *sbclaim.Delivery) error {
		msg := d.Message().MessageID
		key := d.IdempotencyKey()
		w.mu.Lock()
		m := w.byID[msg]
		i := w.calls[msg]
		w.calls[msg]++
		k := callOK
		if m != nil && i < len(m.calls) {
			k = m.calls[i]
		}
		if w.quiet() && k != callReject {
			k = callOK
		}
		if time.Now().Before(w.downUntil) {
			k = callDown
			w.calls[msg]-- // the script resumes after the outage
		}
		manual := m != nil && m.route == "manual"
		w.mu.Unlock()
		switch k {
		case callDown:
			w.note("%s call %d by %s key %s: 503", msg, i, who, key)
			return sbclaim.NotPerformed(errors.New("503 service unavailable"))
		case callMisconfig:
			w.note("%s call %d by %s key %s: 401", msg, i, who, key)
			return sbclaim.Misconfigured(errors.New("401 unauthorized"))
		case callReject:
			w.mu.Lock()
			w.rejected[msg] = true
			w.mu.Unlock()
			w.note("%s call %d by %s key %s: 402 rejected", msg, i, who, key)
			return sbclaim.Rejected(errors.New("402 declined"))
		case callSlow:
			select {
			case <-time.After(time.Duration(5+i*7%50) * time.Second):
			case <-ctx.Done():
				w.note("%s call %d by %s key %s: cancelled while slow", msg, i, who, key)
				return ctx.Err()
			}
		}
		w.mu.Lock()
		if k == callStoredFail {
			if manual { // a downstream without idempotency: a plain 500, nothing done
				w.mu.Unlock()
				w.note("%s call %d by %s key %s: 500", msg, i, who, key)
				return errors.New("500 internal server error")
			}
			w.failed[key] = true
		}
		if w.failed[key] {
			w.mu.Unlock()
			w.note("%s call %d by %s key %s: stored 500", msg, i, who, key)
			return errors.New("500 (stored under the key)")
		}
		absorbed := !manual && w.keyStore[key]
		w.keyStore[key] = true
		w.effects = append(w.effects, effectRecord{at: time.Now(), msg: msg, key: key, who: who, absorbed: absorbed})
		w.noteLocked("%s call %d by %s key %s: EFFECT%s (%s)", msg, i, who, key, map[bool]string{true: " absorbed by the key"}[absorbed], k)
		w.mu.Unlock()
		if k == callLostAnswer {
			return errors.New("timeout after the request was written")
		}
		return nil
	}
}

// chance is a draw with probability p decided by the seed and a name, so
// that a decision does not depend on which goroutine asks first.
func (w *world) chance(p float64, parts ...any) bool {
	h := fnv.New64a()
	fmt.Fprint(h, w.seed, parts)
	// FNV's high bits hardly change with the last byte: mix them
	// (splitmix64's finalizer) before taking a fraction.
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return float64(x>>11)/(1<<53) < p
}

func (w *world) quiet() bool { return time.Since(w.start) > chaosPhase }

func (w *world) router(who string) *sbclaim.Router {
	r, err := sbclaim.NewRouter(
		sbclaim.Route{Name: "auto", Match: sbclaim.MatchSubject("auto"), Handler: w.handler(who), Recovery: sbclaim.RecoveryAuto,
			Version: "1", Backoff: sbclaim.Backoff{First: 10 * time.Second, Max: time.Minute, Horizon: horizon}, Breaker: sbclaim.Breaker{Off: true}},
		sbclaim.Route{Name: "manual", Match: sbclaim.MatchSubject("manual"), Handler: w.handler(who), Recovery: sbclaim.RecoveryManual,
			Version: "1", Backoff: sbclaim.Backoff{First: 10 * time.Second, Max: time.Minute, Horizon: horizon}, Breaker: sbclaim.Breaker{Off: true}},
	)
	if err != nil {
		panic("sim: router: " + err.Error())
	}
	return r
}

func (w *world) startReplica() {
	w.mu.Lock()
	if w.stopping {
		w.mu.Unlock()
		return
	}
	w.nextRep++
	r := &replica{w: w, id: w.nextRep, host: fmt.Sprintf("replica-%d", w.nextRep), noPayload: w.noPayload(w.nextRep)}
	w.replicas = append(w.replicas, r)
	w.wg.Add(1)
	w.noteLocked("%s starts (payloads %s)", r.host, map[bool]string{true: "off", false: "on"}[r.noPayload])
	w.mu.Unlock()

	r.killCtx, r.kill = context.WithCancel(context.Background())
	ctx, cancel := context.WithCancel(w.runCtx)
	r.cancel = cancel
	st := chaos.GateStoreLanded(w.db, w.gate(r), w.landed)
	p, err := sbclaim.NewProcessor(sbclaim.ProcessorConfig{
		Consumer: consumerName, Entity: queueName,
		Store:  bridge.NewStore(st).(*sbclaim.Store),
		Router: w.router(r.host),
		NewReceiver: func(ctx context.Context) (sbclaim.Receiver, error) {
			if r.dead.Load() {
				<-ctx.Done()
				return nil, ctx.Err()
			}
			return &simReceiver{r: w.queue.NewReceiver(), rep: r}, nil
		},
		MaxConcurrentCalls: 4,
		MaxLockRenewal:     10 * time.Minute,
		LockDuration:       lockDuration,
		HeartbeatInterval:  heartbeatInterval,
		TakeoverAfter:      takeoverAfter,
		StaleAfter:         staleAfter,
		Retry:              sbclaim.RetryPolicy{MaxAttempts: 3, InitialInterval: time.Second, MaxInterval: 5 * time.Second, Budget: 20 * time.Second},
		NoPayload:          r.noPayload,
		MaxDeliveryCount:   maxDeliveryCount,
		DeferPollInterval:  15 * time.Second,
		DeferGrace:         5 * time.Minute, // scaled down with the other windows (1 h in production)
		SettleTimeout:      5 * time.Second,
		StoreTimeout:       10 * time.Second,
		ShutdownTimeout:    30 * time.Second,
		Host:               r.host,
		Logger:             w.log,
		Metrics:            prommetrics.New(prometheus.NewRegistry()),
	})
	if err != nil {
		panic("sim: processor: " + err.Error())
	}
	hook := func(point string) func(context.Context, *azservicebus.ReceivedMessage) error {
		return func(_ context.Context, msg *azservicebus.ReceivedMessage) error { return w.fireHook(r, point, msg) }
	}
	ctx = processor.WithHooks(ctx, processor.Hooks{
		AfterClaim: hook("AfterClaim"), AfterEffect: hook("AfterEffect"), AfterMarkProcessed: hook("AfterMarkProcessed"),
		AfterFail: hook("AfterFail"), AfterDeferRecorded: hook("AfterDeferRecorded"),
	})
	go func() {
		defer w.wg.Done()
		_ = p.Run(ctx)
	}()
}

// fireHook applies the message's planned faults at a hook point: each
// fires once.
func (w *world) fireHook(r *replica, point string, msg *azservicebus.ReceivedMessage) error {
	if r.dead.Load() {
		return processor.ErrCrash
	}
	w.mu.Lock()
	m := w.byID[msg.MessageID]
	var f *hookFault
	if m != nil && !w.quiet() {
		for i := range m.faults {
			c := m.faults[i]
			if c.fetched && !r.fetched(msg) {
				continue
			}
			if c.point == point && (c.fetched || c.delivery == 0 || c.delivery == msg.DeliveryCount) {
				f = &m.faults[i]
				m.faults = append(m.faults[:i:i], m.faults[i+1:]...)
				break
			}
		}
	}
	w.mu.Unlock()
	if f == nil {
		return nil
	}
	if f.partition > 0 {
		w.note("%s is cut off from the store for %s at %s of %s (delivery %d, fetched %v)", r.host, f.partition, point, msg.MessageID, msg.DeliveryCount, f.fetched)
		r.cutTill.Store(time.Now().Add(f.partition).UnixNano())
		return nil
	}
	if f.freeze > 0 {
		w.note("%s freezes %s at %s of %s (delivery %d, fetched %v)", r.host, f.freeze, point, msg.MessageID, msg.DeliveryCount, f.fetched)
		r.frozenTill.Store(time.Now().Add(f.freeze).UnixNano())
		time.Sleep(f.freeze)
	}
	if f.crash {
		w.note("%s dies at %s of %s (delivery %d, fetched %v)", r.host, point, msg.MessageID, msg.DeliveryCount, f.fetched)
		r.die()
		return processor.ErrCrash
	}
	w.note("%s thaws", r.host)
	return nil
}

func (r *replica) die() {
	if !r.dead.CompareAndSwap(false, true) {
		return
	}
	r.kill()
	r.cancel()
	go func() {
		time.Sleep(10 * time.Second) // the platform restarts it
		r.w.startReplica()
	}()
}

// simReceiver is a replica's receiver: a frozen replica's calls wait, a
// dead one's fail and do nothing.
type simReceiver struct {
	r   *membus.Receiver
	rep *replica
}

var errDead = &azservicebus.Error{Code: azservicebus.CodeConnectionLost}

func (s *simReceiver) check(ctx context.Context) error {
	s.rep.waitThaw(ctx)
	if s.rep.dead.Load() {
		return errDead
	}
	return nil
}

func (s *simReceiver) ReceiveMessages(ctx context.Context, n int, o *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	if err := s.check(ctx); err != nil {
		return nil, &azservicebus.Error{Code: azservicebus.CodeClosed}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.rep.killCtx, cancel)
	defer stop()
	msgs, err := s.r.ReceiveMessages(ctx, n, o)
	if s.rep.dead.Load() {
		// received by a process that is gone: the locks run out
		return nil, &azservicebus.Error{Code: azservicebus.CodeClosed}
	}
	for _, m := range msgs {
		s.rep.w.note("%s receives %s (delivery %d, seq %d)", s.rep.host, m.MessageID, m.DeliveryCount, *m.SequenceNumber)
	}
	return msgs, err
}

func (s *simReceiver) CompleteMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.CompleteMessageOptions) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	err := s.r.CompleteMessage(ctx, m, o)
	s.rep.w.note("%s completes %s (delivery %d): %v", s.rep.host, m.MessageID, m.DeliveryCount, err)
	if err == nil {
		s.rep.w.checkCompleted(m.MessageID, s.rep.host)
	}
	return err
}

func (s *simReceiver) AbandonMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.AbandonMessageOptions) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	return s.r.AbandonMessage(ctx, m, o)
}

func (s *simReceiver) DeadLetterMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.DeadLetterOptions) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	err := s.r.DeadLetterMessage(ctx, m, o)
	s.rep.w.note("%s dead-letters %s: %v", s.rep.host, m.MessageID, err)
	return err
}

func (s *simReceiver) RenewMessageLock(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.RenewMessageLockOptions) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	return s.r.RenewMessageLock(ctx, m, o)
}

func (s *simReceiver) DeferMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.DeferMessageOptions) error {
	if err := s.check(ctx); err != nil {
		return err
	}
	err := s.r.DeferMessage(ctx, m, o)
	s.rep.w.note("%s defers %s (seq %d): %v", s.rep.host, m.MessageID, *m.SequenceNumber, err)
	return err
}

func (s *simReceiver) ReceiveDeferredMessages(ctx context.Context, seqs []int64, o *azservicebus.ReceiveDeferredMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	msgs, err := s.r.ReceiveDeferredMessages(ctx, seqs, o)
	for _, m := range msgs {
		s.rep.fetchedMu.Lock()
		if s.rep.fetchedSet == nil {
			s.rep.fetchedSet = map[string]bool{}
		}
		s.rep.fetchedSet[fmt.Sprintf("%s/%d", m.MessageID, m.DeliveryCount)] = true
		s.rep.fetchedMu.Unlock()
		s.rep.w.note("%s fetches deferred %s (delivery %d)", s.rep.host, m.MessageID, m.DeliveryCount)
	}
	return msgs, err
}

func (s *simReceiver) PeekMessages(ctx context.Context, n int, o *azservicebus.PeekMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	if err := s.check(ctx); err != nil {
		return nil, err
	}
	return s.r.PeekMessages(ctx, n, o)
}

func (s *simReceiver) Close(ctx context.Context) error { return s.r.Close(ctx) }

// result is what one seed did.
type result struct {
	seed       uint64
	messages   int
	simulated  time.Duration
	effects    int
	violations []violation
	trace      []string
}

// run simulates one seed. It must be called inside a synctest bubble.
// The store reads the bubble's fake clock (sqlite.UseGoClock): every
// time expression of every simulated store.
func init() { sqlite.UseGoClock(true) }

func run(seed uint64, verbose io.Writer) *result {
	w := &world{
		seed:          seed,
		rng:           rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		byID:          map[string]*plannedMessage{},
		calls:         map[string]int{},
		keyStore:      map[string]bool{},
		failed:        map[string]bool{},
		redrives:      map[string]int{},
		storeCalls:    map[string]int{},
		sends:         map[string]int{},
		rejected:      map[string]bool{},
		historyBroken: map[string]bool{},
		beats:         map[string]time.Time{},
		start:         time.Now(),
	}
	lvl := slog.LevelError + 100
	if verbose != nil {
		lvl = slog.LevelInfo
	} else {
		verbose = io.Discard
	}
	w.log = slog.New(slog.NewTextHandler(verbose, &slog.HandlerOptions{Level: lvl}))
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	db, err := sqlite.Open(ctx, "sqlite::memory:")
	if err != nil {
		panic("sim: open sqlite: " + err.Error())
	}
	defer db.Close()
	w.db = db
	w.queue = membus.NewQueue(queueName, membus.QueueOptions{LockDuration: lockDuration, MaxDeliveryCount: maxDeliveryCount})
	w.plan()
	for _, m := range w.msgs {
		w.send(ctx, m)
		if m.dup > 0 {
			go func() {
				time.Sleep(m.dup)
				w.note("%s sent again (a duplicate)", m.id)
				w.send(ctx, m)
			}()
		}
	}
	runCtx, stopRun := context.WithCancel(ctx)
	w.runCtx = runCtx
	for range 1 + w.rng.IntN(3) {
		w.startReplica()
	}
	var bg sync.WaitGroup
	bg.Go(func() { w.reconcileLoop(runCtx) })
	bg.Go(func() { w.monkey(runCtx) })
	opRNG := rand.New(rand.NewPCG(seed, 0x0be7a70))
	bg.Go(func() { w.operator(runCtx, opRNG) })

	time.Sleep(chaosPhase)
	// The faults stop: none of the broker's counted faults outlives the
	// chaos phase (a settlement failure left over would fail the quiet
	// phase's settlements, on a message's last delivery too).
	w.queue.FailSettlements(0)
	w.queue.FailRenewals(0)
	w.queue.FailReceives(0, "")
	// The quiet phase ends early once everything settled: nothing at the
	// broker but dead letters, no claim claimed or released.
	for end := time.Now().Add(quietPhase); time.Now().Before(end); {
		time.Sleep(time.Minute)
		if w.settled(ctx) {
			break
		}
	}
	w.mu.Lock()
	w.stopping = true
	w.mu.Unlock()
	stopRun()
	bg.Wait()
	w.wg.Wait()
	w.verify(ctx)
	return &result{seed: seed, messages: len(w.msgs), simulated: time.Since(w.start), effects: len(w.effects), violations: w.violations, trace: w.trace}
}

func (w *world) send(ctx context.Context, m *plannedMessage) {
	w.mu.Lock()
	w.sends[m.id]++
	w.mu.Unlock()
	id := m.id
	subject := m.route
	if err := w.queue.SendMessage(ctx, &azservicebus.Message{MessageID: &id, Subject: &subject, Body: []byte(`{"amount":1}`)}, nil); err != nil {
		panic("sim: send: " + err.Error())
	}
}

// reconcileLoop ticks the real reconciler, as its schedule would.
func (w *world) reconcileLoop(ctx context.Context) {
	st := chaos.GateStore(w.db, w.gate(nil))
	rec, err := reconciler.New(st, reconciler.Config{
		StaleAfter: staleAfter, HeartbeatInterval: heartbeatInterval, Retention: retention,
		QueryTimeout: 30 * time.Second, RecoveryMaxAttempts: 3, RecoveryBackoff: staleAfter / 2, RecoveryBackoffMax: 2 * staleAfter,
		Routes: reconciler.Routes{"": bridge.RouterOf(w.router("reconciler"))},
		Host:   "reconciler",
	}, w.log, reconciler.NewMetrics(prometheus.NewRegistry()))
	if err != nil {
		panic("sim: reconciler: " + err.Error())
	}
	t := time.NewTicker(reconcileEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.checkHistory(ctx) // before the tick's purge deletes finished claims' histories
		res, err := rec.RunOnce(ctx)
		if res != nil {
			for _, c := range res.Flagged {
				w.note("reconciler flags claim %d of %s: %s", c.ID, c.MessageID, c.FlagReason)
			}
		}
		_ = err
	}
}

// monkey injects the seed's world-wide faults at random moments of the
// chaos phase: broker lock expiries and settlement failures, store
// outages, replica kills.
func (w *world) monkey(ctx context.Context) {
	for {
		d := time.Duration(1+w.rng.IntN(120)) * time.Second
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
		if w.quiet() {
			return
		}
		switch w.rng.IntN(10) {
		case 9:
			w.mu.Lock()
			var live []*replica
			for _, r := range w.replicas {
				if !r.dead.Load() {
					live = append(live, r)
				}
			}
			w.mu.Unlock()
			if len(live) > 0 {
				r := live[w.rng.IntN(len(live))]
				d := time.Duration(10+w.rng.IntN(170)) * time.Second
				r.cutTill.Store(time.Now().Add(d).UnixNano())
				w.note("%s is cut off from the store for %s", r.host, d)
			}
		case 6, 8:
			d := time.Duration(20+w.rng.IntN(160)) * time.Second
			w.mu.Lock()
			w.downUntil = time.Now().Add(d)
			w.noteLocked("downstream: down for %s", d)
			w.mu.Unlock()
		case 7:
			w.resubmitDeadLetter(ctx, w.rng)
		case 0:
			if n := w.queue.ExpireAllLocks(); n > 0 {
				w.note("broker: %d locks expire", n)
			}
		case 1:
			n := 1 + w.rng.IntN(2)
			w.queue.FailSettlements(n)
			w.note("broker: the next %d settlements fail", n)
		case 2:
			d := time.Duration(5+w.rng.IntN(90)) * time.Second
			w.mu.Lock()
			w.outageUntil = time.Now().Add(d)
			w.noteLocked("store: outage for %s", d)
			w.mu.Unlock()
		case 3:
			w.mu.Lock()
			var live []*replica
			for _, r := range w.replicas {
				if !r.dead.Load() {
					live = append(live, r)
				}
			}
			var r *replica
			if len(live) > 0 {
				r = live[w.rng.IntN(len(live))]
			}
			w.mu.Unlock()
			if r != nil {
				w.note("%s killed", r.host)
				r.die()
			}
		default:
			// nothing this time
		}
	}
}

// checkCompleted is the step invariant of a completion: once the broker
// forgets a message, its work must be finished (processed, resolved,
// failed), in operators' hands (flagged), or carried by its claim's stored
// payload. A claim left claimed or released without a payload has nothing
// left to run it from.
func (w *world) checkCompleted(id, host string) {
	var state string
	var payload bool
	err := w.db.DB().QueryRow(`SELECT state, payload IS NOT NULL FROM claims WHERE message_id = ?`, id).Scan(&state, &payload)
	if err != nil {
		w.note("%s: reading its claim after the completion: %v", id, err)
		return
	}
	w.note("%s: completed by %s; its claim is %s (payload %v)", id, host, state, payload)
	if state == "released" && !payload && !w.keptAtBroker(id) {
		w.violate("completed-unheld", "%s: completed by %s while its claim is %s without a stored payload: nothing carries the work", id, host, state)
	}
}

// keptAtBroker reports whether a copy of the message is still at the
// broker (active, locked or deferred): sent more often than completed or
// dead-lettered.
func (w *world) keptAtBroker(id string) bool {
	settled := 0
	for _, c := range w.queue.Completed() {
		if c == id {
			settled++
		}
	}
	for _, m := range w.queue.DeadLetters() {
		if m.MessageID == id {
			settled++
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sends[id] > settled
}

// resubmitDeadLetter sends a copy of a dead-lettered message again, as
// an operator re-submits one from the dead-letter queue.
func (w *world) resubmitDeadLetter(ctx context.Context, rng *rand.Rand) {
	dl := w.queue.DeadLetters()
	if len(dl) == 0 {
		return
	}
	m := w.byID[dl[rng.IntN(len(dl))].MessageID]
	if m == nil {
		return
	}
	w.note("%s: operator re-submits its dead letter", m.id)
	w.send(ctx, m)
}

// operator acts on failed and flagged claims at random moments, with the
// public operator API the console uses: retry (with the handler here, or
// handed off), redrive, hand-off, resolve.
func (w *world) operator(ctx context.Context, rng *rand.Rand) {
	st := bridge.NewStore(chaos.GateStore(w.db, w.gate(nil))).(*sbclaim.Store)
	routers := map[string]*sbclaim.Router{"": w.router("operator")}
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(30+rng.IntN(300)) * time.Second):
		}
		if time.Since(w.start) > chaosPhase+quietPhase/4 {
			return // the rest of the quiet phase lets the last actions settle
		}
		rows, err := w.db.DB().QueryContext(ctx, `SELECT id, message_id, state, payload IS NOT NULL FROM claims WHERE state IN ('failed', 'flagged') ORDER BY id`)
		if err != nil {
			continue
		}
		type cand struct {
			id         int64
			msg, state string
			payload    bool
		}
		var cs []cand
		for rows.Next() {
			var c cand
			if rows.Scan(&c.id, &c.msg, &c.state, &c.payload) == nil {
				cs = append(cs, c)
			}
		}
		rows.Close()
		if len(cs) == 0 {
			continue
		}
		c := cs[rng.IntN(len(cs))]
		w.mu.Lock()
		effected := false
		for _, e := range w.effects {
			effected = effected || e.msg == c.msg
		}
		w.mu.Unlock()
		switch {
		case c.state == "failed":
			opts := operator.RetryOptions{By: "op", Note: "fixed", HeartbeatInterval: heartbeatInterval, QueryTimeout: 10 * time.Second}
			if c.payload && rng.IntN(2) == 0 {
				opts.Routers = routers
			}
			w.note("%s: operator retries claim %d (handler here: %v)", c.msg, c.id, opts.Routers != nil)
			_, err := operator.Retry(ctx, st, c.id, opts)
			w.note("%s: retry of claim %d: %v", c.msg, c.id, err)
			if err == nil && opts.Routers == nil && !c.payload {
				// handed off without a payload: its dead letter is
				// re-submitted, as the retry says
				w.resubmitDeadLetter(ctx, rng)
			}
		case effected:
			w.note("%s: operator resolves claim %d done (the downstream shows the effect)", c.msg, c.id)
			_, err := operator.Resolve(ctx, st, c.id, sbclaim.ResolutionDone, "op", "checked the downstream")
			w.note("%s: resolve of claim %d: %v", c.msg, c.id, err)
		case c.payload && rng.IntN(2) == 0:
			w.mu.Lock()
			w.redrives[c.msg]++
			w.mu.Unlock()
			w.note("%s: operator redrives claim %d", c.msg, c.id)
			_, err := operator.Redrive(ctx, st, c.id, operator.RedriveOptions{By: "op", Note: "redrive", Routers: routers, HeartbeatInterval: heartbeatInterval, QueryTimeout: 10 * time.Second})
			w.note("%s: redrive of claim %d: %v", c.msg, c.id, err)
		case c.payload:
			w.mu.Lock()
			w.redrives[c.msg]++ // a hand-off is a redrive run by the reconciler
			w.mu.Unlock()
			w.note("%s: operator hands claim %d off", c.msg, c.id)
			_, err := operator.HandOff(ctx, st, c.id, "op", "hand-off")
			w.note("%s: hand-off of claim %d: %v", c.msg, c.id, err)
		}
	}
}

// settled reports whether the run has nothing left to do.
func (w *world) settled(ctx context.Context) bool {
	st := w.queue.Stats()
	if st.Active+st.Locked+st.Deferred > 0 {
		return false
	}
	var open int
	if err := w.db.DB().QueryRowContext(ctx, `SELECT count(*) FROM claims WHERE state IN ('claimed', 'released')`).Scan(&open); err != nil {
		return false
	}
	return open == 0
}

// claimRow is a claim as the verification reads it.
type claimRow struct {
	id                int64
	msg, state, route string
	payload           bool
	deferred          bool
	flagReason        string
}

// verify checks the invariants from the world's ledger and the broker.
// checkHistory checks every claim's audit history as a chain: each row
// starts from the state the row before it ended in, a change of owner
// (taken over, redriven, retried, dead letter taken) names as the previous
// owner the owner the row before it left, and every other change keeps
// that owner. A guarded write whose guard let a stale holder through (a
// take-over from an owner that was no longer the owner, an outcome
// written by a replaced holder) breaks the chain. Each broken chain is
// reported once.
// landedWrite is an owner's write that the store accepted.
type landedWrite struct {
	op    string
	id    int64
	owner string
	at    time.Time
}

// landed notes a replica's owner write that the store accepted.
func (w *world) landed(op string, id int64, owner uuid.UUID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if op == "Heartbeat" {
		w.beats[fmt.Sprintf("%d/%s", id, owner)] = time.Now()
		return
	}
	w.outcomes = append(w.outcomes, landedWrite{op: op, id: id, owner: owner.String(), at: time.Now()})
}

// ownership is a history row that gave a claim its owner.
type ownership struct {
	at          time.Time
	owner, prev string
}

// checkOutcomes checks every owner write that landed against the owner
// the claim had then, by its history: a write by an owner the claim no
// longer had got past its guard.
func (w *world) checkOutcomes(ws []landedWrite, owners map[int64][]ownership) {
	for _, lw := range ws {
		hist := owners[lw.id]
		if len(hist) == 0 {
			continue // purged, or not read yet
		}
		// The history's times are the database clock to the millisecond.
		at := lw.at.Truncate(time.Millisecond)
		ok, current := false, ""
		for _, o := range hist {
			switch {
			case o.at.Before(at):
				current = o.owner
			case o.at.Equal(at) && (o.prev == lw.owner || o.owner == lw.owner):
				ok = true // taken over within the same millisecond, after the write
			}
		}
		if !ok && current != lw.owner {
			w.violateOnce(fmt.Sprintf("%d/%s/%s/%d", lw.id, lw.op, lw.owner, lw.at.UnixNano()), "stale-owner-write",
				"claim %d: %s by owner %.8s landed at %s, when the claim's owner was %.8s", lw.id, lw.op, lw.owner, lw.at.Sub(w.start), current)
		}
	}
}

// silentWindow is how long a holder must have shown no life before a
// take-over by path may take its claim (the guard's SilentFor).
var silentWindow = map[string]time.Duration{"redelivery": takeoverAfter, "reconciler": staleAfter}

func (w *world) checkHistory(ctx context.Context) {
	// The writes that landed before the history is read: each one's
	// ownership row is in what the query reads (a write taken after it
	// could belong to an owner whose row the query did not see).
	w.mu.Lock()
	landed := slices.Clone(w.outcomes)
	w.mu.Unlock()
	rows, err := w.db.DB().QueryContext(ctx, `SELECT claim_id, id, what, from_state, to_state, coalesce(previous_owner, ''), owner, by_whom, at_utc, path
		FROM claim_history ORDER BY claim_id, id`)
	if err != nil {
		return // a store outage of the world: the next check reads it
	}
	defer rows.Close()
	type row struct {
		claim, id                                   int64
		what, from, to, prev, owner, whom, at, path string
	}
	var last row
	owners := map[int64][]ownership{}
	// life: the owner's last sign of life as the take-over guards read it
	// (heartbeat_utc): the row that gave it the claim, or a heartbeat
	// that landed. (Its other writes, an attempt say, do not count: the
	// guards do not read them.)
	var life time.Time
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.claim, &r.id, &r.what, &r.from, &r.to, &r.prev, &r.owner, &r.whom, &r.at, &r.path); err != nil {
			return
		}
		at, _ := time.Parse("2006-01-02T15:04:05.999999999", strings.TrimSuffix(r.at, "Z"))
		if r.claim == last.claim && r.what == "taken over" && last.to == "claimed" && r.prev == last.owner {
			w.mu.Lock()
			if b, ok := w.beats[fmt.Sprintf("%d/%s", r.claim, r.prev)]; ok && b.After(life) && !b.After(at) {
				life = b
			}
			w.mu.Unlock()
			if win, ok := silentWindow[r.path]; ok && at.Sub(life) < win-time.Second {
				w.violateOnce(fmt.Sprintf("%d/%d", r.claim, r.id), "live-taken-over", "claim %d, history row %d: %s took it over (%s) from an owner that showed life %s before (the window is %s)",
					r.claim, r.id, r.whom, r.path, at.Sub(life), win)
			}
		}
		if r.claim != last.claim || r.owner != last.owner {
			life = at // the row that gave the claim its owner
			owners[r.claim] = append(owners[r.claim], ownership{at: at, owner: r.owner, prev: r.prev})
		}
		if r.claim == last.claim {
			why := ""
			switch r.what {
			case "claimed":
				why = "a second 'claimed' row"
			case "taken over", "redriven", "retried", "dead letter taken":
				if r.prev != "" && r.prev != last.owner {
					why = fmt.Sprintf("%s from owner %.8s, but the owner was %.8s", r.what, r.prev, last.owner)
				}
			default:
				if r.owner != last.owner {
					why = fmt.Sprintf("%s by %s changed the owner from %.8s to %.8s without a take-over", r.what, r.whom, last.owner, r.owner)
				}
			}
			if why == "" && r.from != last.to {
				why = fmt.Sprintf("%s from state %s, but the state was %s", r.what, r.from, last.to)
			}
			if why != "" {
				w.violateOnce(fmt.Sprintf("%d/%d", r.claim, r.id), "history", "claim %d, history row %d: %s", r.claim, r.id, why)
			}
		}
		last = r
	}
	w.checkOutcomes(landed, owners)
}

// violateOnce reports a violation once per key (checkHistory reads the
// same rows at every tick).
func (w *world) violateOnce(key, kind, format string, args ...any) {
	w.mu.Lock()
	seen := w.historyBroken[kind+"/"+key]
	w.historyBroken[kind+"/"+key] = true
	w.mu.Unlock()
	if !seen {
		w.violate(kind, format, args...)
	}
}

func (w *world) verify(ctx context.Context) {
	w.checkHistory(ctx)
	rows, err := w.db.DB().QueryContext(ctx, `SELECT id, message_id, state, coalesce(route, ''), payload IS NOT NULL, deferred_seq IS NOT NULL, coalesce(flag_reason, '') FROM claims`)
	if err != nil {
		w.violate("harness", "read claims: %v", err)
		return
	}
	claims := map[string][]claimRow{}
	for rows.Next() {
		var c claimRow
		if err := rows.Scan(&c.id, &c.msg, &c.state, &c.route, &c.payload, &c.deferred, &c.flagReason); err != nil {
			w.violate("harness", "scan claims: %v", err)
			rows.Close()
			return
		}
		claims[c.msg] = append(claims[c.msg], c)
	}
	rows.Close()

	keys := map[string]map[string]bool{}
	performed := map[string]int{}
	// repeats: performances within the retention of the message's previous
	// one. A copy that comes later than the retention after its claim
	// finished is claimed afresh, as documented (the retention must
	// outlast redeliveries and re-submissions); one within it must not run.
	repeats := map[string]int{}
	last := map[string]time.Time{}
	for _, e := range w.effects {
		if keys[e.msg] == nil {
			keys[e.msg] = map[string]bool{}
		}
		keys[e.msg][e.key] = true
		if !e.absorbed {
			performed[e.msg]++
			if t, ok := last[e.msg]; ok && e.at.Sub(t) < retention {
				repeats[e.msg]++
			}
			last[e.msg] = e.at
		}
	}
	dead := map[string]string{}
	for _, m := range w.queue.DeadLetters() {
		reason := ""
		if m.DeadLetterReason != nil {
			reason = *m.DeadLetterReason
		}
		dead[m.MessageID] = reason
	}
	// kept: a copy of the message is still at the broker (active,
	// locked or deferred): sent more often than completed or dead-lettered.
	settled := map[string]int{}
	for _, id := range w.queue.Completed() {
		settled[id]++
	}
	for _, m := range w.queue.DeadLetters() {
		settled[m.MessageID]++
	}
	kept := map[string]bool{}
	for _, m := range w.msgs {
		kept[m.id] = w.sends[m.id] > settled[m.id]
	}
	for _, m := range w.msgs {
		cs := claims[m.id]
		if m.route == "auto" && len(keys[m.id]) > 1 {
			w.violate("auto-keys", "%s (auto route): its effect ran under %d keys %v", m.id, len(keys[m.id]), sortedKeys(keys[m.id]))
		}
		if m.route == "manual" && repeats[m.id] > w.redrives[m.id] {
			w.violate("manual-double", "%s (manual route): its effect ran %d times, %d of them within the retention (%s) of the one before (operator redrives: %d)", m.id, performed[m.id], repeats[m.id], retention, w.redrives[m.id])
		}
		if reason, ok := dead[m.id]; ok && reason == membus.ReasonMaxDeliveryCountExceeded && len(keys[m.id]) == 0 && (len(cs) == 0 || cs[len(cs)-1].state != "flagged" && cs[len(cs)-1].state != "failed") {
			// (a message whose effect ran may end there when the broker
			// refused its completion time after time: not lost, and a
			// re-submission is absorbed by its claim; nor is a flagged
			// claim's message: the dead-letter queue keeps it for the
			// operator; nor a failed claim's, whose dead-letter call
			// failed on its last delivery: it belongs there, and the
			// claim keeps the final answer's reason)
			w.violate("broker-dead-letter", "%s: the broker dead-lettered it (%s): only a final answer may dead-letter a message", m.id, reason)
		}
		var c *claimRow
		for i := range cs {
			c = &cs[i]
		}
		switch {
		case c == nil && (len(keys[m.id]) > 0 || dead[m.id] != "" || kept[m.id] || w.rejected[m.id]):
			// (rejected: a final answer; reached by a redrive or recovery
			// after its message was gone, it has no dead letter, and its
			// failed claim is purged after the retention)
			// effected (and its claim purged after the retention), failed
			// and dead-lettered, or still at the broker
		case c == nil:
			w.violate("no-claim", "%s: no claim at the end (effects %d, dead-lettered %v)", m.id, performed[m.id], dead[m.id] != "")
		case c.state == "processed" || c.state == "resolved":
			if len(keys[m.id]) == 0 && c.state == "processed" {
				w.violate("processed-no-effect", "%s: claim %d processed but the downstream never performed its effect", m.id, c.id)
			}
		case c.state == "failed":
			// a final answer: its message dead-lettered, or, when the
			// answer came after the message was gone (a recovery or a
			// redrive after a hand-off), its payload kept for a retry
			if _, ok := dead[m.id]; !ok && !c.payload {
				w.violate("failed-not-dead-lettered", "%s: claim %d failed but the message was not dead-lettered and no payload is kept", m.id, c.id)
			}
		case c.state == "flagged":
			// In operators' hands: with its payload or its message it can
			// be redriven; without (payloads off) the flag says to check
			// the downstream and resolve it by hand. The completion of its
			// message is checked when it happens (checkCompleted).
		default:
			w.violate("unfinished", "%s: claim %d still %s at the end, %s after the faults stopped, not flagged (payload %v, deferred %v)", m.id, c.id, c.state, quietPhase, c.payload, c.deferred)
		}
	}
}

func sortedKeys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// traceOf is the part of the trace about the message IDs named in the
// violations (all of it when none is named).
func traceOf(r *result) []string {
	ids := map[string]bool{}
	for _, v := range r.violations {
		if i := strings.IndexByte(v.text, ' '); i > 0 {
			id := strings.TrimSuffix(v.text[:i], ":")
			ids[id] = true
		}
	}
	var out []string
	for _, line := range r.trace {
		for id := range ids {
			if strings.Contains(line, " "+id+" ") || strings.Contains(line, " "+id+":") || strings.Contains(line, " "+id+"\n") || strings.HasSuffix(line, " "+id) || !strings.Contains(line, " m") {
				out = append(out, line)
				break
			}
		}
	}
	return out
}
