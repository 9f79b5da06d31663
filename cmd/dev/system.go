package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/internal/console"
	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
	ops "github.com/sbclaim/sbclaim/operator"
	"github.com/sbclaim/sbclaim/routesfile"
	"github.com/sbclaim/sbclaim/sbclaimtest"
)

// The dev system's names and timings: short, so that a retry, a take-over
// or a recovery happens while one watches (production defaults are
// minutes).
const (
	queueName     = "payments"
	consumer      = "payments"
	replicas      = 2
	operator      = "developer"
	lockDuration  = 10 * time.Second
	heartbeat     = time.Second
	takeoverAfter = 3 * time.Second
	staleAfter    = 6 * time.Second
	reconcileTick = 2 * time.Second
	// settleWait bounds the wait for the mix to settle: a mix that has
	// not settled by then is summarised as it is.
	settleWait = 2 * time.Minute
)

// downstreamHost is the demo downstream's host in the routes file, as
// docker-compose.yml names it: the routes' HTTP client dials the
// downstream's real (free) port for it. A route's fingerprint includes its
// URL, so a URL that changed with the port on every start would make the
// reconciler refuse (and flag) the claims an earlier run left unfinished.
const downstreamHost = "demoapi:8080"

// routesYAML is the routes file of the dev processors. The answer rules are Stripe's: a 402 is a
// final decline, a 5xx replayed under the key is a stored failure a person
// must decide on.
const routesYAML = `# The routes of the dev processors (consumer "payments"), written by
# cmd/dev on each start: edits here are overwritten. Same format as
# examples/routes.yaml. The dev command sends every request for
# demoapi:8080 to its demo downstream, wherever that listens.
version: 1
routes:
  - name: payments
    match: {subject: payment}
    method: POST
    url: "http://` + downstreamHost + `/payments"
    timeout: 2s
    body: json
    backoff: {first: 1s, max: 3s}
    breaker: {failures: 5, probeAfter: 2s}
    answers:
      - {status: 402, outcome: rejected}
      - {status: 5xx, header: Idempotent-Replayed, value: "true", outcome: flag}
    record:
      headers: [Request-Id]
      fields: [/id, /error/code, /error/decline_code]
    allowNewKey: true
`

// printer writes the terminal's lines; the console address and the
// summary are what a person (and the test) reads.
type printer struct {
	mu sync.Mutex
	w  io.Writer
}

func (p *printer) Printf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, format, args...)
}

func runSystem(ctx context.Context, cfg config, logger *slog.Logger, logPath string, stdout io.Writer) error {
	out := &printer{w: stdout}
	startCtx, cancelStart := context.WithTimeout(ctx, startTime)
	defer cancelStart()

	dbPath := filepath.Join(cfg.Dir, "claims.db")
	url := "sqlite:" + dbPath
	if err := sbclaim.Migrate(startCtx, url); err != nil {
		return fmt.Errorf("claims store %s: %w", dbPath, err)
	}
	store, err := sbclaim.OpenStore(startCtx, url)
	if err != nil {
		return fmt.Errorf("claims store %s: %w", dbPath, err)
	}
	defer store.Close()
	earlierClaims, err := runClaims(startCtx, store, "")
	if err != nil {
		return fmt.Errorf("claims store %s: %w", dbPath, err)
	}
	earlier := countOf(earlierClaims)
	var leftOver []int64 // the claims an earlier run left unfinished
	for _, c := range earlierClaims {
		if c.State == sbclaim.StateClaimed || c.State == sbclaim.StateReleased {
			leftOver = append(leftOver, c.ID)
		}
	}

	// The demo downstream, on loopback.
	fake := fakedownstream.New(fakedownstream.Options{Seed: cfg.Seed, Logger: logger})
	fake.SetReplyFunc(replyFor)
	if cfg.Outage > 0 && cfg.Payments > 0 {
		fake.AddFault(fakedownstream.FaultRule{Fault: fakedownstream.FaultUnavailable, Times: cfg.Outage, RetryAfterSeconds: 1})
	}
	fakeLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("demo downstream: %w", err)
	}
	fakeSrv := &http.Server{Handler: fake, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = fakeSrv.Serve(fakeLn) }()
	defer fakeSrv.Close()

	routesPath := filepath.Join(cfg.Dir, "routes.yaml")
	if err := os.WriteFile(routesPath, []byte(routesYAML), 0o644); err != nil {
		return err
	}
	routes, err := routesfile.Parse([]byte(routesYAML), &routesfile.Options{Logger: logger,
		HTTPClient: downstreamClient(fakeLn.Addr().String())})
	if err != nil {
		return err
	}
	router := &sbclaim.Router{}
	if err := router.AddRoutesFile(routes); err != nil {
		return err
	}
	routers := map[string]*sbclaim.Router{consumer: router}

	queue := sbclaimtest.NewQueue(&sbclaimtest.QueueOptions{LockDuration: lockDuration, MaxDeliveryCount: 10})

	// The console, on loopback, in local mode.
	con, err := console.NewPublic(store, routers, console.Options{Logger: logger, LocalOperator: operator,
		HeartbeatInterval: heartbeat, StoreTimeout: 5 * time.Second})
	if err != nil {
		return err
	}
	conLn, err := net.Listen("tcp", cfg.ConsoleAddr)
	if err != nil {
		return fmt.Errorf("console: listen on %s: %w", cfg.ConsoleAddr, err)
	}
	consoleURL := "http://" + conLn.Addr().String()

	out.Printf("sbclaim dev: the whole system in one process, for trying and for demos (not for production)\n")
	out.Printf("  broker:     in-memory Service Bus queue %q: NOT durable; messages not yet settled are lost when this stops\n", queueName)
	out.Printf("  claims:     SQLite %s: durable; a restart on -dir %s resumes\n", dbPath, cfg.Dir)
	out.Printf("  processors: %d replicas of consumer %q, routes in %s\n", replicas, consumer, routesPath)
	out.Printf("  reconciler: every %s; recovers a claim whose holder has been silent for %s\n", reconcileTick, staleAfter)
	out.Printf("  downstream: demo API at http://%s (the routes call it %s; in memory: it forgets its effects when this stops)\n", fakeLn.Addr(), downstreamHost)
	out.Printf("  log:        %s\n", logPath)
	if earlier.total > 0 {
		out.Printf("resuming: the store holds %d claims from earlier runs (%s)\n", earlier.total, earlier)
		if n := earlier.unfinished(); n > 0 {
			out.Printf("  %d unfinished: the reconciler recovers them from their stored payload once their holder has been silent for %s\n", n, staleAfter)
		}
	}
	out.Printf("console: %s/\n", consoleURL)
	out.Printf("  (local mode: nobody signs in; actions are recorded as %q; only loopback requests are answered)\n", operator+" (local, not signed in)")

	// Everything runs until ctx ends; the processors stop first, so that
	// their effects in flight finish while the downstream and the store
	// are still there.
	var processors []*sbclaim.Processor
	for i := range replicas {
		p, err := sbclaim.NewProcessor(sbclaim.ProcessorConfig{
			Consumer: consumer, Entity: queueName, Store: store, Router: router, NewReceiver: queue.NewReceiver,
			MaxConcurrentCalls: 8,
			MaxLockRenewal:     time.Minute,
			HeartbeatInterval:  heartbeat,
			TakeoverAfter:      takeoverAfter,
			StaleAfter:         staleAfter,
			Retry:              sbclaim.RetryPolicy{MaxAttempts: 3, InitialInterval: 100 * time.Millisecond, MaxInterval: time.Second, Budget: 2 * time.Second},
			MaxDeliveryCount:   10,
			DeferPollInterval:  250 * time.Millisecond,
			DeferGrace:         5 * time.Second,
			ShutdownTimeout:    5 * time.Second,
			Host:               fmt.Sprintf("dev-processor-%d", i+1),
			Logger:             logger.With("replica", i+1),
		})
		if err != nil {
			return err
		}
		processors = append(processors, p)
	}
	rec, err := ops.NewReconciler(ops.ReconcilerConfig{Store: store, Routers: routers,
		StaleAfter: staleAfter, HeartbeatInterval: heartbeat,
		RecoveryBackoff: 2 * time.Second, RecoveryBackoffMax: 10 * time.Second,
		Host: "dev-reconciler", Logger: logger})
	if err != nil {
		return err
	}
	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRun()
	var wg sync.WaitGroup
	procErrs := make(chan error, replicas)
	for i, p := range processors {
		wg.Go(func() {
			if err := p.Run(runCtx); err != nil && !errors.Is(err, context.Canceled) {
				procErrs <- fmt.Errorf("processor %d: %w", i+1, err)
			}
		})
	}
	recDone := make(chan struct{})
	go func() {
		defer close(recDone)
		reconcile(runCtx, rec, out, logger)
	}()
	conCtx, stopConsole := context.WithCancel(context.WithoutCancel(ctx))
	go con.Run(conCtx)
	conSrv := &http.Server{Handler: con, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = conSrv.Serve(conLn) }()

	stopped := func() error {
		stopRun()
		wg.Wait()
		<-recDone
		stopConsole()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = conSrv.Shutdown(sctx)
		_ = fakeSrv.Shutdown(sctx)
		select {
		case err := <-procErrs:
			return err
		default:
		}
		lost := queue.Pending()
		out.Printf("stopped cleanly: the claims are kept in %s", dbPath)
		if lost > 0 {
			out.Printf("; %d message(s) still in the in-memory queue were lost (it is not durable)", lost)
		}
		out.Printf("\n")
		return nil
	}

	if len(leftOver) > 0 {
		resumed := make(chan struct{})
		defer func() { <-resumed }()
		go func() {
			defer close(resumed)
			resume(ctx, store, fake, leftOver, out)
		}()
	}
	if cfg.Payments > 0 {
		m := newMix(uuid.NewString()[:8], cfg.Payments, cfg.DupShare, seedOr(cfg.Seed))
		if err := queue.Send(ctx, m.Sends...); err != nil {
			_ = stopped()
			return fmt.Errorf("send the mix: %w", err)
		}
		out.Printf("%s", m.Describe())
		if cfg.Outage > 0 {
			out.Printf("  and the downstream is down for its first %d requests (503 Retry-After: 1): retried later, same key\n", cfg.Outage)
		}
		if err := settle(ctx, store, queue, m.RunID, out); err != nil && ctx.Err() == nil {
			out.Printf("the mix has not settled: %v\n", err)
		}
		if ctx.Err() == nil {
			s, err := summarize(ctx, store, queue, fake, m)
			if err != nil {
				out.Printf("summary: %v\n", err)
			} else {
				out.Printf("%s", s.Format(consoleURL))
			}
		}
	} else {
		out.Printf("nothing sent (-payments 0)\n")
	}
	if ctx.Err() == nil {
		out.Printf("running until Ctrl-C: the console is at %s/\n", consoleURL)
		out.Printf("  open the flagged claim there: the downstream stored a failure under its key, so redrive it under a new key, or resolve it\n")
	}
	select {
	case <-ctx.Done():
	case err := <-procErrs:
		procErrs <- err
	}
	out.Printf("stopping: the processors finish their effects in flight, then the reconciler and the console stop\n")
	return stopped()
}

// replyFor tells the demo downstream how to answer a key's first request:
// the declined payment and the stored failure (an Idempotency-Key ends
// with the dedup key; a redrive under a new key adds ":r<N>", which is
// answered normally).
func replyFor(key string) fakedownstream.Reply {
	switch {
	case strings.HasSuffix(key, declinedSuffix):
		return fakedownstream.ReplyDecline
	case strings.HasSuffix(key, storedFailureSuffix):
		return fakedownstream.ReplyCachedFailure
	}
	return fakedownstream.ReplyNormal
}

// downstreamClient returns the routes' HTTP client: it connects every
// request for downstreamHost to addr and refuses any other host.
func downstreamClient(addr string) *http.Client {
	var d net.Dialer
	return &http.Client{Transport: &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, host string) (net.Conn, error) {
			if host != downstreamHost {
				return nil, fmt.Errorf("dev: the routes may only call %s (the demo downstream), not %s", downstreamHost, host)
			}
			return d.DialContext(ctx, network, addr)
		},
		MaxIdleConnsPerHost: 32,
	}}
}

func seedOr(seed uint64) uint64 {
	if seed != 0 {
		return seed
	}
	return uint64(time.Now().UnixNano())
}

// reconcile ticks the reconciler until ctx ends and says what a tick did
// when it did something.
func reconcile(ctx context.Context, rec *ops.Reconciler, out *printer, logger *slog.Logger) {
	t := time.NewTicker(reconcileTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		res, err := rec.RunOnce(ctx)
		if err != nil {
			if ctx.Err() == nil {
				logger.Warn("reconciler tick", "error", err)
			}
			continue
		}
		if res.Recovered+res.Postponed+res.Failed+res.Flagged > 0 {
			out.Printf("reconciler: recovered %d, postponed %d, failed %d, flagged %d stale claim(s)\n",
				res.Recovered, res.Postponed, res.Failed, res.Flagged)
		}
	}
}
