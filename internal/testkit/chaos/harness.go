package chaos

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/internal/bridge"
	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/processor"
	"github.com/sbclaim/sbclaim/internal/reconciler"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
	"github.com/sbclaim/sbclaim/internal/testkit/membus"
	"github.com/sbclaim/sbclaim/prommetrics"
)

// Names used by a run.
const (
	Consumer      = "chaos"
	QueueName     = "chaos"
	EffectSubject = "chaos.effect"
	// PoisonSubject has no route: such messages are dead-lettered NoRoute
	// by design and must cause no effect.
	PoisonSubject = "chaos.unrouted"
)

// Config configures a chaos run. Zero values take the defaults in
// brackets.
type Config struct {
	Messages int     // distinct messages with an effect [500]
	Replicas int     // processor replicas running at once [3]
	DupShare float64 // share of messages sent 2 or 3 times [0.3]; negative: none
	Faults   []Fault // faults to inject (nil: none; see AllFaults)
	// FaultShare is the share of messages that get each per-message fault
	// [0.01, at least 3 messages per fault].
	FaultShare float64
	// Seed seeds every choice the harness makes (which messages are
	// duplicated, poisoned, conflicting or faulted). Goroutine scheduling
	// still varies between runs, so two runs with one seed inject the same
	// faults into the same messages but may interleave differently. 0 picks
	// a seed from the clock (reported).
	Seed uint64
	// DatabaseURL is the claims database: "" for a temporary SQLite file,
	// sqlite:/path or postgres://... (a fresh schema per run).
	DatabaseURL string

	MaxConcurrentCalls int           // per replica [16]
	LockDuration       time.Duration // [1s]
	MaxDeliveryCount   int           // [10]
	HeartbeatInterval  time.Duration // [100ms]
	// TakeoverAfter is the processors' SBCLAIM_TAKEOVER_AFTER [1s]: longer
	// than an outage window plus a heartbeat, so a holder whose heartbeats
	// an outage refused is not taken over while it still works.
	TakeoverAfter time.Duration
	StaleAfter    time.Duration // reconciler [2s]
	// Recovery is the routes' recovery mode [auto]: manual routes are never
	// repeated without an operator, so crash-left claims are flagged.
	Recovery sideeffects.Recovery
	// Answers is how the downstream answers [AnswersNormal]. With
	// AnswersMixed it answers like a payment API (Stripe's dialect) for a
	// share of keys: a final decline (402), a key conflict (400
	// idempotency_error) and a failure stored under the key (500, replayed
	// to every repeat); the routes carry the answer rules for it.
	Answers Answers
	// Handler is the effect the replicas run [HandlerHTTP]: the routes
	// file's HTTP route, or a Go handler (HandlerGo) calling the same
	// downstream. Either way each replica is built with
	// sbclaim.NewProcessor.
	Handler Handler
	// ReconcileEvery is how often the reconciler ticks during the run, as
	// it would in production [StaleAfter/2].
	ReconcileEvery time.Duration
	EffectTimeout  time.Duration // the HTTP route's timeout [300ms]
	OutageWindows  int           // store-outage windows [2]
	OutageDuration time.Duration // length of each window [400ms]
	// DownstreamWindow is the length of the downstream-outage and
	// misconfigured windows [3s]. A message's deliveries, each answered at
	// once, take about MaxDeliveryCount x 0.15 s (4 attempts 20, 40, 80 ms
	// apart): 1.5 s with the defaults, half the window.
	DownstreamWindow time.Duration
	// NoDeferral turns the processors' delayed retries off (the old
	// behaviour: a retryable outcome abandons the message, which is
	// redelivered at once); a downstream outage then makes the broker
	// dead-letter messages.
	NoDeferral bool
	// Sessions makes the queue session-enabled (sessions.go): every
	// message carries a session id, the replicas run in session mode, and
	// the report counts the messages that ran out of order (must be 0).
	Sessions     bool
	DrainTimeout time.Duration // bound on draining the queue [90s]

	Logger *slog.Logger // nil: discard
	// Tracing records every replica's and the reconciler's spans
	// (always-on sampler, in memory) and checks them (tracing.go).
	Tracing bool

	// wrapStore, when set, wraps each replica's store (tests use it to
	// break deduplication and check that the harness notices).
	wrapStore func(claim.Store) claim.Store
	// redrive, when set, replaces the operators' end-of-run redrive (a
	// test's broken redrive the harness must notice).
	redrive func(ctx context.Context, st claim.Store, p *reconciler.RedriveParams) (*claim.Claim, error)
}

func (c Config) withDefaults() Config {
	c.Messages = cmp.Or(c.Messages, 500)
	c.Replicas = cmp.Or(c.Replicas, 3)
	if c.DupShare == 0 {
		c.DupShare = 0.3
	}
	c.FaultShare = cmp.Or(c.FaultShare, 0.01)
	c.MaxConcurrentCalls = cmp.Or(c.MaxConcurrentCalls, 16)
	c.LockDuration = cmp.Or(c.LockDuration, time.Second)
	c.MaxDeliveryCount = cmp.Or(c.MaxDeliveryCount, 10)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, 100*time.Millisecond)
	c.TakeoverAfter = cmp.Or(c.TakeoverAfter, time.Second)
	c.StaleAfter = cmp.Or(c.StaleAfter, 2*time.Second)
	c.Recovery = cmp.Or(c.Recovery, sideeffects.RecoveryAuto)
	c.Answers = cmp.Or(c.Answers, AnswersNormal)
	c.Handler = cmp.Or(c.Handler, HandlerHTTP)
	c.ReconcileEvery = cmp.Or(c.ReconcileEvery, c.StaleAfter/2)
	c.EffectTimeout = cmp.Or(c.EffectTimeout, 300*time.Millisecond)
	c.OutageWindows = cmp.Or(c.OutageWindows, 2)
	c.OutageDuration = cmp.Or(c.OutageDuration, 400*time.Millisecond)
	c.DownstreamWindow = cmp.Or(c.DownstreamWindow, 3*time.Second)
	c.DrainTimeout = cmp.Or(c.DrainTimeout, 90*time.Second)
	if c.Seed == 0 {
		c.Seed = uint64(time.Now().UnixNano())
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate names the first bad field.
func (c Config) Validate() error {
	switch {
	case c.Messages < 0:
		//lint:ignore ST1005 the error names the field, as every config error here does
		return fmt.Errorf("Messages cannot be negative (got %d)", c.Messages)
	case c.Replicas < 0:
		//lint:ignore ST1005 the error names the field, as every config error here does
		return fmt.Errorf("Replicas cannot be negative (got %d)", c.Replicas)
	case c.DupShare > 1:
		return fmt.Errorf("DupShare must be at most 1 (got %g)", c.DupShare)
	case c.FaultShare < 0 || c.FaultShare > 0.15:
		return fmt.Errorf("FaultShare must be in 0..0.15 (got %g)", c.FaultShare)
	case !c.Recovery.Valid():
		//lint:ignore ST1005 the error names the field, as every config error here does
		return fmt.Errorf("Recovery must be auto or manual (got %q)", c.Recovery)
	case c.Answers != AnswersNormal && c.Answers != AnswersMixed:
		return fmt.Errorf("Answers must be normal or mixed (got %q)", c.Answers)
	case c.Handler != HandlerHTTP && c.Handler != HandlerGo:
		return fmt.Errorf("Handler must be http or go (got %q)", c.Handler)
	}
	return nil
}

// harness is one run's state.
type harness struct {
	cfg    Config
	tk     *tracingKit // nil: tracing off
	log    *slog.Logger
	rng    *rand.Rand
	db     *Database
	queue  *membus.Queue
	down   *fakedownstream.Server
	srv    *httptest.Server
	routes []byte // routes file of the HTTP effect
	base   http.RoundTripper
	book   *faultBook
	out    outage
	// outageWin and misconfWin are the downstream's windows.
	outageWin, misconfWin downWindow
	metrics               *prometheus.Registry // every replica's processor metrics (prommetrics on this registry, labelled by replica)
	led                   *ledger
	// firstSend and effectAt are per key: when its first copy was sent,
	// first delivered, and when its effect was performed.
	firstSend, firstDelivery, effectAt map[string]time.Time
	recMetrics                         *reconciler.Metrics

	sent      []sentMessage
	ids       []string // distinct normal (routed) message IDs
	poison    []string
	conflicts []string
	// answers: routed message ID → the downstream's reply to its key when
	// not the normal one (AnswersMixed).
	answers   map[string]fakedownstream.Reply
	copies    map[string]int    // routed message ID → sends of its normal payload
	conflictB map[string][]byte // conflict message ID → the conflicting payload

	trips atomic.Int64 // store round trips from replicas
	// batches and batched: the replicas' group-committed outcome batches
	// and the writes in them.
	batches, batched atomic.Int64
	runCtx           context.Context // ends when the replicas must stop

	mu       sync.Mutex
	replicas []*replica
	nextID   int
	stopping bool
	kills    int
	started  int
	wg       sync.WaitGroup
	seen     map[string]uint32 // message ID → highest delivery count received
	// performers: key → who sent each request that performed the effect
	// (a delivery, or "redrive").
	performers map[string][]string
	// heldAtDeath: killed replica's host → message IDs it had received and
	// not yet settled when it died.
	heldAtDeath map[string]map[string]bool
	// explained: key → why its claim was flagged (filled by reconcile).
	explained map[string]string
	// completedSilent: deliveries completed while their claim's holder
	// was silent or dead (violations; see checkCompletion).
	completedSilent []string
	// diedAt: killed replica's host → when it died.
	diedAt map[string]time.Time
	// timedOut: keys whose effect request got no answer in time, a fault
	// or not (a loaded machine answers slowly): an unknown outcome the
	// processor saw, which explains a flag on a manual route.
	timedOut map[string]bool

	hist *history
	// sess is the order check's record (Config.Sessions); nil otherwise.
	sess *sessionBook
}

type sentMessage struct {
	msg   *azservicebus.Message
	order float64
}

// Run runs one chaos scenario end to end and returns its report. It
// returns an error only when the run could not be set up; violations of
// exactly-once are in the report (Report.Pass).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	h := &harness{
		cfg:         cfg,
		log:         cfg.Logger,
		rng:         rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5bd1e995)),
		book:        newFaultBook(),
		metrics:     prometheus.NewRegistry(),
		seen:        map[string]uint32{},
		performers:  map[string][]string{},
		heldAtDeath: map[string]map[string]bool{},
		explained:   map[string]string{},
		hist:        newHistory(),
		copies:      map[string]int{},
		conflictB:   map[string][]byte{},
		answers:     map[string]fakedownstream.Reply{},
		led:         newLedger(cfg.TakeoverAfter, cfg.StaleAfter),
		diedAt:      map[string]time.Time{},
		timedOut:    map[string]bool{},
		firstSend:   map[string]time.Time{}, firstDelivery: map[string]time.Time{}, effectAt: map[string]time.Time{},
		recMetrics: reconciler.NewMetrics(prometheus.NewRegistry()),
		tk:         newTracingKit(cfg.Tracing),
	}
	h.outageWin.fault, h.misconfWin.fault = FaultDownstreamOutage, FaultMisconfigured
	if cfg.Sessions {
		h.sess = newSessionBook()
	}
	db, err := OpenDatabase(ctx, cfg.DatabaseURL)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	h.db = db

	h.down = fakedownstream.New(fakedownstream.Options{Seed: cfg.Seed})
	h.srv = httptest.NewServer(http.HandlerFunc(h.serveDownstream))
	defer h.srv.Close()
	tr := &http.Transport{MaxIdleConns: 512, MaxIdleConnsPerHost: 512, IdleConnTimeout: 30 * time.Second}
	defer tr.CloseIdleConnections()
	h.base = &outageTransport{base: tr, h: h}
	h.routes = fmt.Appendf(nil, "version: 1\nroutes:\n  - name: chaos\n    match: {subject: %s}\n    url: %s/effects\n    timeout: %s\n    recovery: %s\n    backoff: {first: 100ms, max: 1s}\n    breaker: %s\n",
		EffectSubject, h.srv.URL, cfg.EffectTimeout, cfg.Recovery, h.breakerSpec())
	if cfg.Answers == AnswersMixed {
		h.down.SetConflictStyle(fakedownstream.ConflictStripe)
		h.routes = append(h.routes, mixedAnswerRules...)
	}

	h.queue = membus.NewQueue(QueueName, membus.QueueOptions{LockDuration: cfg.LockDuration, MaxDeliveryCount: cfg.MaxDeliveryCount,
		RequiresSession: cfg.Sessions, AcceptTimeout: 200 * time.Millisecond})
	h.plan()
	for _, s := range h.sent {
		if _, ok := h.firstSend[*s.msg.MessageID]; !ok {
			h.firstSend[*s.msg.MessageID] = time.Now()
		}
		if err := h.queue.SendMessage(ctx, s.msg, nil); err != nil {
			return nil, fmt.Errorf("chaos: send: %w", err)
		}
	}

	rep := &Report{Config: cfg, Database: db.String(), Dialect: db.Dialect, FlagReasons: map[string]int{}, FlagExplained: map[string]int{},
		FlagSamples: map[string][]string{}, RecoveryExplained: map[string]int{}}
	start := time.Now()
	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	h.runCtx = runCtx
	for range cfg.Replicas {
		h.startReplica()
	}
	monitorDone := make(chan struct{})
	go func() { defer close(monitorDone); h.monitor(runCtx) }()
	downDone := make(chan struct{})
	go func() { defer close(downDone); h.monitorDownstream(runCtx) }()
	rec, err := h.newReconciler()
	if err != nil {
		return nil, err
	}
	reconcilerDone := make(chan struct{})
	go func() { defer close(reconcilerDone); h.reconcileDuringRun(runCtx, rec, rep) }()

	dctx, cancel := context.WithTimeout(ctx, cfg.DrainTimeout)
	drainErr := h.queue.WaitIdle(dctx)
	cancel()
	rep.DrainTime = time.Since(start)
	if drainErr != nil {
		rep.violate("queue did not drain within %s: %v", cfg.DrainTimeout, drainErr)
	}

	// Stop every replica gracefully (their in-flight work finishes).
	h.mu.Lock()
	h.stopping = true
	h.mu.Unlock()
	stopRun()
	<-monitorDone
	<-downDone
	<-reconcilerDone
	h.out.active.Store(false)
	waitDone := make(chan struct{})
	go func() { h.wg.Wait(); close(waitDone) }()
	select {
	case <-waitDone:
	case <-time.After(30 * time.Second):
		rep.violate("replicas did not stop within 30s")
	}

	recStart := time.Now()
	h.reconcile(ctx, rec, rep)
	rep.ReconcileTime = time.Since(recStart)
	h.verify(ctx, rep)
	h.tk.report(ctx, rep)
	h.checkOrder(rep)
	rep.Duration = time.Since(start)
	return rep, nil
}

// breakerSpec is the chaos route's breaker: off (its faults fail single
// messages, and an open breaker would postpone the whole route past the
// drain window), except with the misconfigured window, whose 401s open it
// (a probe every 200 ms closes it once the configuration is fixed).
func (h *harness) breakerSpec() string {
	if h.enabled(FaultMisconfigured) {
		return "{probeAfter: 200ms}"
	}
	return "{off: true}"
}

// plan builds the messages to send and assigns faults to messages.
func (h *harness) plan() {
	cfg := h.cfg
	n := cfg.Messages
	nPoison := max(1, n/100)
	nConflict := max(1, n/100)
	if n < 10 {
		nPoison, nConflict = 0, 0
	}
	subject := EffectSubject
	for i := range n {
		id := fmt.Sprintf("m-%06d", i)
		h.ids = append(h.ids, id)
		copies := 1
		if cfg.DupShare > 0 && h.rng.Float64() < cfg.DupShare {
			copies = 2 + h.rng.IntN(2)
		}
		body := fmt.Appendf(nil, `{"n":%d,"amount":%d}`, i, 100+h.rng.IntN(900))
		h.copies[id] = copies
		for c := range copies {
			order := float64(i)
			if c > 0 {
				if h.rng.IntN(2) == 0 {
					order += 0.5 // adjacent: the copies race each other
				} else {
					order += h.rng.Float64() * float64(n-i) // a late producer retry
				}
			}
			h.sent = append(h.sent, sentMessage{order: order, msg: &azservicebus.Message{
				MessageID: &id, Subject: &subject, Body: body, ContentType: ptr("application/json"),
			}})
		}
	}
	// Conflicts: the same ID as a normal message, another body, sent later.
	for _, i := range h.rng.Perm(n)[:nConflict] {
		id := h.ids[i]
		h.conflicts = append(h.conflicts, id)
		h.conflictB[id] = fmt.Appendf(nil, `{"n":%d,"conflict":true}`, i)
		h.sent = append(h.sent, sentMessage{order: float64(i) + 0.7, msg: &azservicebus.Message{
			MessageID: &id, Subject: &subject, Body: h.conflictB[id], ContentType: ptr("application/json"),
		}})
	}
	for i := range nPoison {
		id := fmt.Sprintf("poison-%04d", i)
		h.poison = append(h.poison, id)
		h.sent = append(h.sent, sentMessage{order: h.rng.Float64() * float64(n), msg: &azservicebus.Message{
			MessageID: &id, Subject: ptr(PoisonSubject), Body: []byte(`{}`),
		}})
	}
	slices.SortStableFunc(h.sent, func(a, b sentMessage) int { return cmp.Compare(a.order, b.order) })
	if cfg.Sessions {
		h.planSessions()
	}

	if cfg.Answers == AnswersMixed {
		h.planAnswers()
	}

	// Per-message faults, never on conflict keys (their outcome is checked
	// separately), nor the downstream's hangs on keys it answers other
	// than normally (a hang stands for a performed effect whose answer was
	// lost).
	var faults []Fault
	for _, f := range cfg.Faults {
		if f.perMessage() {
			faults = append(faults, f)
		}
	}
	per := max(3, int(float64(n)*cfg.FaultShare+0.5))
	candidates := h.rng.Perm(n)
	next := 0
	for _, f := range faults {
		planned := per
		if f != FaultResponseLost && f != FaultLostThen503 {
			// Spares for the faults that fire at a point of the processor's
			// work (a hook, a committed outcome write), which a message can
			// miss when another fault or a kill settled its fate first (see
			// faultBook).
			planned = 2 * per
		}
		for k := 0; k < planned && next < len(candidates); next++ {
			id := h.ids[candidates[next]]
			if slices.Contains(h.conflicts, id) {
				continue
			}
			if _, odd := h.answers[id]; odd && (f == FaultResponseLost || f == FaultLostThen503) {
				continue
			}
			h.book.assign(id, f, k >= per)
			switch f {
			case FaultResponseLost:
				h.down.FailKey(keyOf(id), 1, fakedownstream.FaultHang)
			case FaultLostThen503:
				h.down.FailKey(keyOf(id), 1, fakedownstream.FaultHang)
				h.down.FailKey(keyOf(id), 2, fakedownstream.FaultUnavailable) // the retries within the 3 s budget
			case FaultAckLost:
				if k%2 == 1 {
					// Every attempt of the first delivery is refused: the
					// effect is not performed, the claim is released.
					h.down.FailKey(keyOf(id), 4, fakedownstream.FaultUnavailable)
				}
			}
			k++
		}
	}
}

func ptr[T any](v T) *T { return &v }

func (h *harness) enabled(f Fault) bool { return slices.Contains(h.cfg.Faults, f) }

// serveDownstream is the fake downstream, observed: a request for a
// response-lost key that got no answer before the caller gave up is one
// response-lost fault that happened.
//
// It also notes who performed each key's effect: the request answered 2xx
// and not replayed, or the request that hung (a hang is injected on a
// key's first request, which performs it; the harness's downstream has no
// latency, so no other request goes unanswered).
func (h *harness) serveDownstream(w http.ResponseWriter, r *http.Request) {
	arrived := time.Now()
	tw := &trackWriter{ResponseWriter: w}
	if !h.refuseDownstream(tw, r) {
		h.down.ServeHTTP(tw, r)
	}
	// The message the request is for (the key is scoped: see idOfKey).
	key := idOfKey(r.Header.Get("Idempotency-Key"))
	if f := h.book.planFor(key); tw.status == 0 && r.Context().Err() != nil && (f == FaultResponseLost || f == FaultLostThen503) {
		h.book.count(f, 1)
		h.book.markHit(key, f)
	}
	d := r.Header.Get(DeliveryHeader)
	from, _, _ := strings.Cut(d, "/") // the replica's host
	switch {
	case r.Header.Get(RedriveHeader) != "":
		from = operatorHost
	case r.Header.Get(RecoveryHeader) != "":
		from = reconcilerHost
	}
	performed := tw.status == 0 || tw.status >= 200 && tw.status < 300 && !tw.replayed
	what := fmt.Sprintf("answered %d", tw.status)
	switch {
	case tw.status == 0:
		what = "performed, no answer (hang)"
	case performed:
		what = fmt.Sprintf("performed, answered %d", tw.status)
	case tw.replayed:
		what = fmt.Sprintf("replayed %d", tw.status)
	}
	h.hist.add(key, "downstream request from %s: %s", cmpOr(from, "(untagged)"), what)
	if key == "" {
		return
	}
	if mayHavePerformed(tw.status) {
		h.led.requested(key, cmpOr(from, "(untagged)"), arrived)
	}
	h.sess.attempted(key, arrived)
	h.mu.Lock()
	defer h.mu.Unlock()
	if performed {
		h.performers[key] = append(h.performers[key], cmpOr(from, "(untagged)"))
		if _, ok := h.effectAt[key]; !ok {
			h.effectAt[key] = arrived
		}
	}
}

func (h *harness) noteTimeout(key string) {
	key = idOfKey(key)
	if key == "" {
		return
	}
	h.hist.add(key, "an effect request got no answer in time")
	h.mu.Lock()
	defer h.mu.Unlock()
	h.timedOut[key] = true
}

func (h *harness) sawDelivery(m *azservicebus.ReceivedMessage) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if m.DeliveryCount > h.seen[m.MessageID] {
		h.seen[m.MessageID] = m.DeliveryCount
	}
	if _, ok := h.firstDelivery[m.MessageID]; !ok {
		h.firstDelivery[m.MessageID] = time.Now()
	}
}

// checkCompletion checks a completed delivery against its claim: with
// auto routes a delivery must never complete its copy while the claim is
// still claimed by a holder that went silent (it had to take the claim
// over and run the effect), nor while it is released. sent is when the
// completion was sent: the processor decided no later, so the holder's
// silence and death are measured up to then, not up to the claim read
// that follows (which a slow database can make seconds later).
func (h *harness) checkCompletion(m *azservicebus.ReceivedMessage, host string, sent time.Time) {
	if h.cfg.Recovery == sideeffects.RecoveryManual {
		return // completing while a manual route's holder is silent is the design
	}
	id := h.hist.idOf(m.MessageID)
	if id == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := h.db.Store.Get(ctx, id)
	if err != nil {
		return
	}
	if c.State != claim.StateClaimed {
		return
	}
	if c.DeferredSeq != nil && (m.SequenceNumber == nil || *c.DeferredSeq != *m.SequenceNumber) {
		return // the claim's deferred message carries the work (the holder fetched it; it returns to deferred if the holder died)
	}
	now := sent
	holder, silent := h.led.holder(m.MessageID, now)
	h.mu.Lock()
	defer h.mu.Unlock()
	died, dead := h.diedAt[holder]
	// Slack for the decision, made before the completion was sent: a
	// holder that died, or went silent, just before could not have been
	// known to.
	const slack = 250 * time.Millisecond
	switch {
	case dead && now.Sub(died) > slack:
		h.completedSilent = append(h.completedSilent, fmt.Sprintf("%s: %s completed delivery %d while the claim was still claimed by %s, dead for %s: the claim's fate was open (it had to wait for the holder's silence, take the claim over and run the effect)",
			m.MessageID, host, m.DeliveryCount, holder, now.Sub(died).Round(time.Millisecond)))
	case silent > h.cfg.TakeoverAfter+slack:
		h.completedSilent = append(h.completedSilent, fmt.Sprintf("%s: %s completed delivery %d while the claim was still claimed by %s, silent for %s: it had to take the claim over and run the effect",
			m.MessageID, host, m.DeliveryCount, holder, silent.Round(time.Millisecond)))
	}
}

func (h *harness) highestDelivery(id string) uint32 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.seen[id]
}

// monitor opens the store-outage windows as the run progresses.
func (h *harness) monitor(ctx context.Context) {
	if !h.enabled(FaultStoreOutage) {
		return
	}
	total := len(h.sent)
	windows := h.cfg.OutageWindows
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for w := 1; w <= windows; w++ {
		threshold := total * w / (windows + 1)
		for {
			st := h.queue.Stats()
			if st.Completed+st.DeadLettered >= threshold {
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
		h.log.Info("store outage begins", "window", w, "duration", h.cfg.OutageDuration)
		h.out.active.Store(true)
		h.book.count(FaultStoreOutage, 1)
		select {
		case <-ctx.Done():
		case <-time.After(h.cfg.OutageDuration):
		}
		h.out.active.Store(false)
		h.log.Info("store outage ends", "window", w)
	}
}

// replica is one processor process. Killing it cuts its store, receiver
// and HTTP client at once and cancels its Run; the harness starts a
// replacement, as a container platform restarts a crashed container.
type replica struct {
	h       *harness
	id      int
	host    string
	dead    atomic.Bool
	mu      sync.Mutex
	held    map[[16]byte]string // lock token → message ID, received and not settled
	killCtx context.Context
	kill    context.CancelFunc
	cancel  context.CancelFunc
}

func (h *harness) startReplica() {
	h.mu.Lock()
	if h.stopping {
		h.mu.Unlock()
		return
	}
	h.nextID++
	h.started++
	r := &replica{h: h, id: h.nextID, host: fmt.Sprintf("replica-%d", h.nextID), held: map[[16]byte]string{}}
	h.replicas = append(h.replicas, r)
	h.wg.Add(1)
	h.mu.Unlock()

	r.killCtx, r.kill = context.WithCancel(context.Background())
	runCtx, cancel := context.WithCancel(h.runCtx)
	r.cancel = cancel
	log := h.log.With("replica", r.id)

	// The replica is built as a user's program builds its processor, with
	// the public API: an *sbclaim.Store (the fault-injecting store chain
	// wrapped through the bridge), an *sbclaim.Router (a Go handler, or the
	// routes file with the replica's HTTP client) and sbclaim.NewProcessor.
	// The crash hooks ride on Run's context (processor.WithHooks).
	client := &http.Client{Transport: &killTransport{base: h.base, rep: r}}
	router, err := h.replicaRouter(r, client, log)
	if err != nil {
		panic("chaos: router: " + err.Error()) // the harness's own fixed routes
	}
	// The chain, outermost first: a test's wrapper, lost acknowledgements,
	// the history and ledger (what the store really did), the dead-replica
	// gate, the outage gate.
	var st claim.Store = &gateStore{inner: &gateStore{inner: h.db.Store, gate: h.out.gate}, gate: r.gate, calls: &h.trips, batches: &h.batches, batched: &h.batched}
	st = &lostAckStore{Store: &traceStore{Store: st, host: r.host, hist: h.hist, led: h.led, sess: h.sess}, h: h}
	if h.cfg.wrapStore != nil {
		st = h.cfg.wrapStore(st)
	}
	newReceiver, sessions := r.newReceiver, (*sbclaim.Sessions)(nil)
	if h.cfg.Sessions {
		newReceiver, sessions = nil, &sbclaim.Sessions{AcceptNext: r.acceptSession, MaxConcurrent: h.cfg.MaxConcurrentCalls, IdleTimeout: 300 * time.Millisecond}
	}
	p, err := sbclaim.NewProcessor(sbclaim.ProcessorConfig{
		Consumer:    Consumer,
		Entity:      QueueName,
		Store:       bridge.NewStore(st).(*sbclaim.Store),
		Router:      router,
		NewReceiver: newReceiver,
		Sessions:    sessions,

		MaxConcurrentCalls: h.cfg.MaxConcurrentCalls,
		MaxLockRenewal:     30 * time.Second,
		LockDuration:       h.cfg.LockDuration,
		HeartbeatInterval:  h.cfg.HeartbeatInterval,
		TakeoverAfter:      h.cfg.TakeoverAfter,
		StaleAfter:         h.cfg.StaleAfter,
		Retry:              sbclaim.RetryPolicy{MaxAttempts: 4, InitialInterval: 20 * time.Millisecond, MaxInterval: 200 * time.Millisecond, Budget: 3 * time.Second},
		MaxDeliveryCount:   h.cfg.MaxDeliveryCount,
		DeferPollInterval:  50 * time.Millisecond,
		NoDeferral:         h.cfg.NoDeferral,
		SettleTimeout:      2 * time.Second,
		StoreTimeout:       5 * time.Second,
		ShutdownTimeout:    10 * time.Second,
		Host:               r.host,
		Logger:             log,
		Metrics:            prommetrics.New(prometheus.WrapRegistererWith(prometheus.Labels{"replica": r.host}, h.metrics)),
		TracerProvider:     h.tk.provider(),
	})
	if err != nil {
		panic("chaos: processor: " + err.Error())
	}
	runCtx = processor.WithHooks(runCtx, processor.Hooks{
		AfterClaim:         h.crashHook(r, FaultDieAfterClaim),
		AfterEffect:        h.crashHook(r, FaultDieAfterEffect),
		AfterMarkProcessed: h.crashHook(r, FaultDieAfterProcessed),
		AfterFail:          h.crashHook(r, FaultDieAfterProcessed),
	})
	go func() {
		defer h.wg.Done()
		if err := p.Run(runCtx); err != nil {
			log.Error("processor stopped", "error", err)
		}
	}()
}

// replicaRouter is a replica's router, with the fault injection around
// its effect: the Go handler wrapped as a user would wrap a HandlerFunc
// (faultHandler), the routes file's HTTP route through the bridge
// (faultRouter: the public API cannot reach into a routes file's effect).
func (h *harness) replicaRouter(r *replica, client *http.Client, log *slog.Logger) (*sbclaim.Router, error) {
	if h.cfg.Handler == HandlerGo {
		return h.newRouter(client, log, h.faultHandler(r))
	}
	pub, err := h.newRouter(client, log, nil)
	if err != nil {
		return nil, err
	}
	return bridge.NewRouter(&faultRouter{inner: bridge.RouterOf(pub), h: h, rep: r}).(*sbclaim.Router), nil
}

// gate refuses every store call once the replica is dead.
func (r *replica) gate(context.Context, string, int64) error {
	if r.dead.Load() {
		return replicaDeadError(r.id, "store")
	}
	return nil
}

func (r *replica) newReceiver(ctx context.Context) (sbclaim.Receiver, error) {
	if r.dead.Load() {
		<-ctx.Done() // a dead process opens nothing
		return nil, ctx.Err()
	}
	mr := r.h.queue.NewReceiver()
	return &killReceiver{killSettle: killSettle{set: mr, rep: r}, r: mr}, nil
}

// die kills the replica and schedules its replacement.
func (r *replica) die() {
	if !r.dead.CompareAndSwap(false, true) {
		return
	}
	// What it held when it died: a claim it owns on one of these may be
	// left unfinished, legitimately. (A receive that returns after this
	// point can claim nothing: the store refuses a dead replica.)
	r.mu.Lock()
	held := map[string]bool{}
	for _, id := range r.held {
		held[id] = true
	}
	r.mu.Unlock()
	r.kill()
	r.cancel()
	h := r.h
	h.mu.Lock()
	h.kills++
	h.heldAtDeath[r.host] = held
	h.diedAt[r.host] = time.Now()
	h.mu.Unlock()
	for id := range held {
		h.hist.add(id, "%s killed while holding a delivery", r.host)
	}
	h.log.Info("replica killed", "replica", r.id)
	go func() {
		time.Sleep(50 * time.Millisecond) // the platform notices and restarts
		h.startReplica()
	}()
}

func (h *harness) crashHook(r *replica, f Fault) func(context.Context, *azservicebus.ReceivedMessage) error {
	if !h.enabled(f) {
		return nil
	}
	return func(_ context.Context, msg *azservicebus.ReceivedMessage) error {
		if r.dead.Load() {
			// Already dead (its in-flight work runs on, but can reach
			// nothing): it does not get further, and a planned fault is
			// not spent on it.
			return processor.ErrCrash
		}
		if !h.book.fire(msg.MessageID, f) {
			return nil
		}
		h.book.count(f, 1)
		h.book.markHit(msg.MessageID, f)
		h.hist.add(msg.MessageID, "fault %s: %s dies here (delivery %d)", f, r.host, msg.DeliveryCount)
		h.log.Info("fault kills the replica", "fault", f, "message_id", msg.MessageID, "replica", r.id)
		r.die()
		return processor.ErrCrash
	}
}

// faultRouter wraps the HTTP route's router (reached through the bridge)
// with beforeEffect.
type faultRouter struct {
	inner sideeffects.Router
	h     *harness
	rep   *replica
}

func (fr *faultRouter) Route(msg *azservicebus.ReceivedMessage) (sideeffects.Handler, error) {
	hd, err := fr.inner.Route(msg)
	if err != nil || hd.Effect == nil {
		return hd, err
	}
	inner := hd.Effect
	hd.Effect = sideeffects.EffectFunc(func(ctx context.Context, m *azservicebus.ReceivedMessage, key string) error {
		return inner.Perform(fr.h.beforeEffect(ctx, fr.rep, m), m, key)
	})
	return hd, nil
}

// beforeEffect runs before a replica's effect, whichever the handler: it
// tags the context with the delivery (killTransport sends it as
// DeliveryHeader) and, for a message planned for lock-expiry, expires the
// message's lock and waits until another delivery of it was received, so
// the two overlap.
func (h *harness) beforeEffect(ctx context.Context, rep *replica, m *azservicebus.ReceivedMessage) context.Context {
	ctx = withDelivery(ctx, rep, m)
	if h.enabled(FaultLockExpiry) && h.book.fire(m.MessageID, FaultLockExpiry) {
		if n := h.queue.ExpireLock(m.MessageID); n > 0 {
			h.book.count(FaultLockExpiry, 1)
			h.book.markHit(m.MessageID, FaultLockExpiry)
			// Hold the effect until the redelivery was received (or a
			// bound passes), so the two overlap.
			deadline := time.Now().Add(2 * h.cfg.LockDuration)
			for h.highestDelivery(m.MessageID) <= m.DeliveryCount && time.Now().Before(deadline) && ctx.Err() == nil {
				time.Sleep(5 * time.Millisecond)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return ctx
}

// Holders of claims that are not replicas, as the ledger and the
// downstream requests name them.
const (
	reconcilerHost = "reconciler"
	operatorName   = "chaos"
	operatorHost   = "operator:" + operatorName
)

// newReconciler is the reconciler of the run: recovery on (the replicas'
// routes, its requests tagged RecoveryHeader), its store behind the
// outage gate and its own trace, ticking during the run and after it.
func (h *harness) newReconciler() (*reconciler.Reconciler, error) {
	router, err := h.internalRouter(&http.Client{Transport: taggedTransport{h.base, RecoveryHeader}})
	if err != nil {
		return nil, fmt.Errorf("chaos: reconciler routes: %w", err)
	}
	st := &traceStore{Store: &gateStore{inner: h.db.Store, gate: h.out.gate}, host: reconcilerHost, hist: h.hist, led: h.led, sess: h.sess}
	return reconciler.New(st, reconciler.Config{
		TracerProvider:      h.tk.provider(),
		StaleAfter:          h.cfg.StaleAfter,
		HeartbeatInterval:   h.cfg.HeartbeatInterval,
		Retention:           30 * 24 * time.Hour,
		FlagBatchSize:       500,
		QueryTimeout:        30 * time.Second,
		Routes:              reconciler.Routes{"": router},
		RecoveryMaxAttempts: 3,
		RecoveryBackoff:     h.cfg.StaleAfter / 2,
		RecoveryBackoffMax:  2 * h.cfg.StaleAfter,
		Host:                reconcilerHost,
	}, h.log, h.recMetrics)
}

// reconcileDuringRun ticks the reconciler while the replicas run, as the
// scheduled job does in production.
func (h *harness) reconcileDuringRun(ctx context.Context, rec *reconciler.Reconciler, rep *Report) {
	t := time.NewTicker(h.cfg.ReconcileEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		res, err := rec.RunOnce(ctx)
		if err != nil && ctx.Err() == nil {
			h.log.Warn("reconciler tick during the run failed", "error", err)
		}
		if res != nil {
			h.noteFlagged(rep, res.Flagged)
		}
	}
}

// noteFlagged records claims the reconciler flagged: each must be
// explained (a fault, an outage, a kill) and, with auto routes, none is
// expected at all: recovery settles crash-left claims.
func (h *harness) noteFlagged(rep *Report, flagged []*claim.Claim) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range flagged {
		rep.Flagged++
		rep.FlagReasons[flagReasonKind(c.FlagReason)]++
		h.hist.add(c.MessageID, "reconciler flagged claim %d (%s; claimed by %s, delivery %d, attempts %d, last error %q)",
			c.ID, c.FlagReason, c.ClaimedBy, c.DeliveryCount, c.Attempts, c.LastError)
		why, kind := h.explainLocked(c)
		rep.FlagExplained[kind]++
		if len(rep.FlagSamples[kind]) < maxSamples {
			rep.FlagSamples[kind] = append(rep.FlagSamples[kind], fmt.Sprintf("claim %d %s (%s):\n    %s", c.ID, c.MessageID, cmpOr(why, "unexplained"), h.hist.of(c.MessageID)))
		}
		h.explained[c.MessageID] = why
		if h.cfg.Recovery == sideeffects.RecoveryAuto && h.answerOf(c.MessageID) != fakedownstream.ReplyCachedFailure {
			rep.violate("claim %d (%s) flagged for operators (%s) although its route is auto: recovery must settle what a crash leaves",
				c.ID, c.MessageID, c.FlagReason)
		}
		if why == "" {
			rep.Unexplained++
			rep.violate("claim %d (%s) flagged (%s) and nothing explains it: claimed by %s, which was not killed holding it; no fault happened to the key; no store call for it was refused by an outage",
				c.ID, c.MessageID, flagReasonKind(c.FlagReason), c.ClaimedBy)
			rep.history(c.MessageID, h.hist.of(c.MessageID))
		}
	}
}

// reconcile runs reconciler ticks after the replicas stopped until no
// claim is left claimed or released, then redrives every flagged claim,
// as an operator would: the stand-in for operators, counted apart.
func (h *harness) reconcile(ctx context.Context, rec *reconciler.Reconciler, rep *Report) {
	redriveRouter, err := h.internalRouter(&http.Client{Transport: taggedTransport{h.base, RedriveHeader}})
	if err != nil {
		rep.violate("redrive routes: %v", err)
		return
	}
	redrive := h.cfg.redrive
	if redrive == nil {
		redrive = reconciler.Redrive
	}
	opStore := &traceStore{Store: h.db.Store, host: operatorHost, hist: h.hist, led: h.led, sess: h.sess}
	deadline := time.Now().Add(h.cfg.StaleAfter*3 + 30*time.Second)
	for {
		res, err := rec.RunOnce(ctx)
		if err != nil {
			rep.violate("reconciler tick: %v", err)
			return
		}
		rep.Ticks++
		h.noteFlagged(rep, res.Flagged)
		if len(h.cfg.Faults) == 0 && slices.ContainsFunc(res.Flagged, func(c *claim.Claim) bool {
			return h.answerOf(c.MessageID) != fakedownstream.ReplyCachedFailure
		}) {
			rep.violate("no fault was injected, yet the reconciler flagged claims other than the downstream's cached failures (want none)")
		}
		if res.Stats != nil && res.Stats.Claimed == 0 && res.Stats.Released == 0 {
			break
		}
		if time.Now().After(deadline) {
			rep.violate("claims still unfinished after reconciling until %s", deadline.Format(time.TimeOnly))
			return
		}
		select {
		case <-ctx.Done():
			rep.violate("reconcile: %v", ctx.Err())
			return
		case <-time.After(h.cfg.StaleAfter / 5):
		}
	}

	// The operators: redrive what is flagged, a few at a time.
	flagged, err := h.db.Store.List(ctx, &claim.ListParams{States: []claim.State{claim.StateFlagged}, Limit: 100000})
	if err != nil {
		rep.violate("list flagged claims: %v", err)
		return
	}
	h.noteProcessorFlags(rep, flagged)
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		sem = make(chan struct{}, 8)
	)
	for _, c := range flagged {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			p := &reconciler.RedriveParams{
				ID: c.ID, By: operatorName, Routes: reconciler.Routes{"": redriveRouter}, Logger: h.log,
				HeartbeatInterval: h.cfg.HeartbeatInterval,
				Retry:             sideeffects.RetryPolicy{MaxAttempts: 5, InitialInterval: 50 * time.Millisecond, MaxInterval: 500 * time.Millisecond, Budget: 10 * time.Second},
			}
			if h.answerOf(c.MessageID) == fakedownstream.ReplyCachedFailure {
				// The operator saw the stored 500 (the claim's answer) and
				// that nothing was charged under the key: a new key.
				p.NewKey, p.Note = true, "the downstream stored a 500 under the key; nothing was performed"
			}
			_, err := redrive(ctx, opStore, p)
			// A manual route's redrive stops at its first unknown outcome
			// (a slow answer on a loaded machine) and flags the claim
			// again: the operator checks the downstream and redrives it
			// once more, as a person would.
			for again := 0; again < 3; again++ {
				var ee *reconciler.EffectError
				if !errors.As(err, &ee) || !ee.Reflagged || ee.Outcome != sideeffects.OutcomeUnknown {
					break
				}
				h.hist.add(c.MessageID, "redrive of claim %d: %v; redriven again", c.ID, err)
				p.NewKey = false // a new key was already chosen: the claim keeps it
				_, err = redrive(ctx, opStore, p)
			}
			mu.Lock()
			defer mu.Unlock()
			var ee *reconciler.EffectError
			if errors.As(err, &ee) && ee.Failed && h.answerOf(c.MessageID) != fakedownstream.ReplyNormal && h.answerOf(c.MessageID) != fakedownstream.ReplyCachedFailure {
				// A manual route's claim flagged after a crash, whose
				// redrive got the key's final answer: the claim failed.
				h.hist.add(c.MessageID, "redrive of claim %d: the final answer failed the claim", c.ID)
				rep.Redriven++
				return
			}
			if err != nil {
				rep.violate("redrive claim %d (%s): %v", c.ID, c.MessageID, err)
				h.hist.add(c.MessageID, "redrive of claim %d: %v", c.ID, err)
				return
			}
			h.hist.add(c.MessageID, "redrive of claim %d: resolved", c.ID)
			rep.Redriven++
		}()
	}
	wg.Wait()
}

// noteProcessorFlags explains the claims a processor flagged (the
// reconciler's flags went through noteFlagged): a downstream answer that
// needs a person, an outcome left unknown by a fault, an outage or a
// killed replica — the holder that flagged it, or the one it took the
// claim from when that holder went silent (a poller that took a manual
// route's claim from the silent holder of its deferred message flags it:
// its outcome is unknown). Each must be explained like the reconciler's,
// or it is a violation.
func (h *harness) noteProcessorFlags(rep *Report, flagged []*claim.Claim) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range flagged {
		if _, seen := h.explained[c.MessageID]; seen {
			continue
		}
		why, kind := h.explainLocked(c)
		if why == "" && c.PreviousHolder != "" {
			prev := *c
			prev.ClaimedBy, prev.Owner, prev.TakeOverPath = c.PreviousHolder, c.PreviousOwner, ""
			if pw, pk := h.explainLocked(&prev); pw != "" {
				why, kind = "the holder it was taken from: "+pw, "previous holder: "+pk
			} else if silent, ok := h.led.takenWhileSilent(c.PreviousOwner); ok && strings.Contains(c.FlagReason, "went silent") {
				// Alive, but it showed no life in the store for the
				// take-over window (a late heartbeat on a loaded machine):
				// the take-over was legitimate (the ledger checked it),
				// and a manual route's unknown outcome is an operator's.
				why = fmt.Sprintf("its holder %s showed no life for %s (the take-over window): a late heartbeat, and a manual route's unknown outcome is an operator's", c.PreviousHolder, silent.Round(time.Millisecond))
				kind = "previous holder silent (late heartbeat)"
			}
		}
		h.hist.add(c.MessageID, "a processor flagged claim %d (%s; claimed by %s, taken from %s)", c.ID, c.FlagReason, c.ClaimedBy, c.PreviousHolder)
		rep.FlagExplained["processor flag, "+kind]++
		h.explained[c.MessageID] = why
		if why == "" {
			rep.Unexplained++
			rep.violate("claim %d (%s) flagged by a processor (%s) and nothing explains it: claimed by %s (taken from %s), neither killed holding it; no fault happened to the key; no store call for it was refused by an outage",
				c.ID, c.MessageID, c.FlagReason, c.ClaimedBy, c.PreviousHolder)
			rep.history(c.MessageID, h.hist.of(c.MessageID))
		}
	}
}

// explain says why a flagged claim may legitimately have been left
// unfinished by a correct processor, and its kind (for the report's
// counts); why is "" when nothing does:
//
//   - a fault happened to the message's key;
//   - an outage refused a call on the claim that records its outcome or
//     keeps it alive (MarkProcessed, Release, RecordAttempt, Heartbeat,
//     TakeOver);
//   - the replica that owns it (ClaimedBy) was killed while it held a
//     delivery of the message (received, not yet settled). Merely owning
//     it is not enough: a replica that was killed later, after it had
//     settled the message, must have recorded the claim's outcome first.
func (h *harness) explainLocked(c *claim.Claim) (why, kind string) {
	if h.answers[c.MessageID] == fakedownstream.ReplyCachedFailure {
		return "the downstream stored a failure under its key: a repeat with the same key can never succeed", "cached failure"
	}
	if f, ok := h.book.hitOn(c.MessageID); ok {
		return fmt.Sprintf("fault %s happened to it", f), "fault " + string(f)
	}
	for _, w := range h.downWindows() {
		if w.touched(c.MessageID) {
			return fmt.Sprintf("the downstream refused it (%s)", w.fault), "downstream " + string(w.fault)
		}
	}
	if ops := h.out.refusedFor(c.ID); len(ops) > 0 {
		return fmt.Sprintf("an outage refused %s on it", strings.Join(ops, ", ")), "outage refused " + strings.Join(ops, "+")
	}
	if h.timedOut[c.MessageID] {
		return "an effect request of it got no answer within the route's timeout: its outcome was unknown", "answer timed out"
	}
	holder, holderOwner := c.ClaimedBy, c.Owner
	if c.TakeOverPath == claim.PathReconciler || c.TakeOverPath == claim.PathOperator {
		holder, holderOwner = c.PreviousHolder, c.PreviousOwner // who left it to the reconciler
	}
	if h.heldAtDeath[holder][c.MessageID] {
		return fmt.Sprintf("%s was killed holding it", holder), "killed holding it"
	}
	if c.Postponements > 0 && c.TakeOverPath == claim.PathReconciler && h.handedOff(c.ID) {
		return fmt.Sprintf("postponed %d times, its message's deliveries ran out: a processor handed it to the reconciler", c.Postponements), "deliveries spent by postponements"
	}
	if h.led.grantUnanswered(c.MessageID, holderOwner) {
		return fmt.Sprintf("%s's call that took it got no answer (a timeout, or the replica killed mid-call) and may have committed: nobody held it", holder), "grant unanswered"
	}
	return "", "UNEXPLAINED"
}

// flagReasonKind drops the timestamp from a flag reason ("no heartbeat
// since <time>").
func flagReasonKind(reason string) string {
	if i := strings.Index(reason, " since "); i >= 0 {
		return reason[:i]
	}
	return reason
}

// verify checks exactly-once and fills the report.
func (h *harness) verify(ctx context.Context, rep *Report) {
	rep.Sent = len(h.sent)
	rep.Distinct = len(h.ids)
	rep.Poison = len(h.poison)
	rep.Conflicts = len(h.conflicts)
	rep.Replicas = h.cfg.Replicas
	h.mu.Lock()
	rep.Kills, rep.ReplicasStarted = h.kills, h.started
	h.mu.Unlock()
	rep.RoundTrips = h.trips.Load()
	rep.Batches, rep.Batched = h.batches.Load(), h.batched.Load()
	rep.OutageRefused = h.out.refused.Load()
	rep.Planned, rep.Happened = h.book.snapshot()
	rep.Outcomes = gatheredOutcomes(h.metrics, rep)

	// Downstream effects per key.
	rep.EffectsPerKey = map[int]int{}
	for _, id := range h.ids {
		if _, odd := h.answers[id]; odd {
			continue // no effect under its key: checkAnswers
		}
		n := h.down.Effects(keyOf(id))
		rep.EffectsPerKey[n]++
		if n != 1 {
			rep.wrongKey("%s: %d effects (want 1)", id, n)
		}
	}
	for _, id := range h.poison {
		if n := h.down.Effects(keyOf(id)); n != 0 {
			rep.wrongKey("%s (poison, no route): %d effects (want 0)", id, n)
		}
	}
	h.mu.Lock()
	for _, id := range h.ids {
		by := h.performers[id]
		switch {
		case len(by) == 0:
		case by[0] == operatorHost:
			rep.EffectsByRedrive++
			if h.explained[id] == "" {
				rep.violate("%s: its effect was performed only by an operator's redrive, and nothing explains why the processor did not perform it", id)
			}
		case by[0] == reconcilerHost:
			rep.EffectsByReconciler++
		default:
			rep.EffectsByProcessor++
		}
		if t, ok := h.effectAt[id]; ok {
			rep.TimeToEffect = append(rep.TimeToEffect, t.Sub(h.firstSend[id]))
			if d, ok := h.firstDelivery[id]; ok {
				rep.DeliveryToEffect = append(rep.DeliveryToEffect, t.Sub(d))
			}
		}
	}
	for _, v := range h.completedSilent {
		rep.violate("%s", v)
	}
	h.mu.Unlock()
	problems, repeated := h.led.check()
	rep.RepeatedByTakeOver = repeated
	for _, p := range problems {
		rep.violate("%s", p)
	}
	rep.Effects = h.down.TotalEffects()
	rep.Requests = h.down.TotalRequests()

	// Queue.
	st := h.queue.Stats()
	rep.Queue = st
	if st.Active+st.Locked+st.Deferred != 0 {
		rep.violate("%d messages still in the queue (%d active, %d locked, %d deferred)", st.Active+st.Locked+st.Deferred, st.Active, st.Locked, st.Deferred)
	}
	if seqs := h.queue.DeferredSequenceNumbers(); len(seqs) > 0 {
		// Which messages were left deferred, and what happened to them.
		if msgs, err := h.queue.NewReceiver().ReceiveDeferredMessages(ctx, seqs, nil); err == nil {
			for _, m := range msgs {
				rep.violate("%s left deferred (sequence number %d, delivery %d)", m.MessageID, *m.SequenceNumber, m.DeliveryCount)
				rep.history(m.MessageID, h.hist.of(m.MessageID))
			}
		}
	}
	if st.Completed+st.DeadLettered != st.Sent {
		rep.violate("sent %d but completed %d + dead-lettered %d", st.Sent, st.Completed, st.DeadLettered)
	}
	conflictDL := map[string]int{}
	poisonDL := map[string]int{}
	answerDL := map[string]map[string]int{} // message ID → reason → dead letters
	for _, m := range h.queue.DeadLetters() {
		reason := ""
		if m.DeadLetterReason != nil {
			reason = *m.DeadLetterReason
		}
		_, odd := h.answers[m.MessageID]
		switch {
		case odd:
			if answerDL[m.MessageID] == nil {
				answerDL[m.MessageID] = map[string]int{}
			}
			answerDL[m.MessageID][reason]++
		case reason == processor.ReasonIdempotencyKeyConflict && slices.Contains(h.conflicts, m.MessageID):
			conflictDL[m.MessageID]++
		case reason == sideeffects.ReasonNoRoute && slices.Contains(h.poison, m.MessageID):
			poisonDL[m.MessageID]++
		default:
			desc := ""
			if m.DeadLetterErrorDescription != nil {
				desc = *m.DeadLetterErrorDescription
			}
			rep.violate("unexpected dead letter %s (delivery %d): %s: %s", m.MessageID, m.DeliveryCount, reason, desc)
			rep.history(m.MessageID, h.hist.of(m.MessageID))
		}
	}
	for _, id := range h.poison {
		if poisonDL[id] != 1 {
			rep.violate("poison %s: dead-lettered %d times as %s (want 1)", id, poisonDL[id], sideeffects.ReasonNoRoute)
		}
	}

	// Claims.
	rep.ClaimStates = map[claim.State]int{}
	perKey := map[string]int{}
	hashes := map[string][]byte{}
	byKey := map[string]*claim.Claim{}
	var after int64
	for {
		page, err := h.db.Store.List(ctx, &claim.ListParams{Consumer: Consumer, AfterID: after, Limit: 1000})
		if err != nil {
			rep.violate("list claims: %v", err)
			break
		}
		for _, c := range page {
			rep.ClaimStates[c.State]++
			perKey[c.MessageID]++
			hashes[c.MessageID] = c.PayloadHash
			byKey[c.MessageID] = c
			switch c.State {
			case claim.StateFailed:
				if _, odd := h.answers[c.MessageID]; !odd {
					rep.violate("claim %d (%s) failed (%s: %s) although the downstream answers its key normally", c.ID, c.MessageID, c.FailReason, c.LastError)
				}
			case claim.StateClaimed, claim.StateReleased:
				rep.violate("claim %d (%s) left %s", c.ID, c.MessageID, c.State)
			case claim.StateFlagged:
				rep.violate("claim %d (%s) flagged and not redriven: %s", c.ID, c.MessageID, c.FlagReason)
			case claim.StateResolved:
				if c.Resolution != claim.ResolutionRedriven {
					rep.violate("claim %d (%s) resolved as %s", c.ID, c.MessageID, c.Resolution)
				}
			case claim.StateProcessed:
				switch c.TakeOverPath {
				case claim.PathRedelivery:
					rep.RecoveredByRedelivery++
				case claim.PathReconciler:
					rep.RecoveredByReconciler++
					// A claim the reconciler had to recover is left work,
					// like a flagged one: it must be explained.
					h.mu.Lock()
					why, kind := h.explainLocked(c)
					h.mu.Unlock()
					rep.RecoveryExplained[kind]++
					if why == "" {
						rep.violate("claim %d (%s) was recovered by the reconciler and nothing explains why the processors left it: held by %s, which was not killed holding it; no fault or outage touched it",
							c.ID, c.MessageID, c.PreviousHolder)
						rep.history(c.MessageID, h.hist.of(c.MessageID))
					}
				}
			}
			if c.FlaggedAt != nil {
				rep.FlaggedForOperators++
			}
			after = c.ID
		}
		if len(page) < 1000 {
			break
		}
	}
	for _, id := range h.ids {
		if perKey[id] != 1 {
			rep.violate("%s has %d claims (want 1)", id, perKey[id])
		}
	}
	// A conflict key: whichever payload claimed first wins; every send of
	// the other payload is dead-lettered.
	for _, id := range h.conflicts {
		want, winner := 1, "the original"
		if bytes.Equal(hashes[id], claim.HashPayload(h.conflictB[id])) {
			want, winner = h.copies[id], "the conflicting payload"
		}
		if conflictDL[id] != want {
			rep.violate("conflict %s (%s won): dead-lettered %d times as %s (want %d)", id, winner, conflictDL[id], processor.ReasonIdempotencyKeyConflict, want)
		}
	}

	h.checkAnswers(rep, byKey, answerDL)
	h.checkWindows(rep)
	rep.BrokerDeadLettered = st.DeadLetterReasons[membus.ReasonMaxDeliveryCountExceeded]
	rep.Postponed = rep.Outcomes[processor.ResultPostponed]
	if h.cfg.Sessions {
		// A held retry ends its delivery later, as processed or otherwise:
		// count the holds (sbclaim_postponed_total) instead.
		rep.Postponed = gatheredCounter(h.metrics, "sbclaim_postponed_total", rep)
	}
	h.checkHistory(ctx, rep, byKey)

	for _, f := range h.cfg.Faults {
		if rep.Happened[f] == 0 {
			rep.violate("fault %s is on but never happened", f)
		}
	}
}

// handedOff reports whether claim id's history shows a processor handing
// it to the reconciler because its message's deliveries were spent (a
// release whose reason says so).
func (h *harness) handedOff(id int64) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	hist, err := h.db.Store.History(ctx, id)
	if err != nil {
		return false
	}
	for _, e := range hist {
		if e.What == claim.ChangeReleased && strings.Contains(e.Reason, "deliveries are spent") {
			return true
		}
	}
	return false
}
