// Command demoapi runs the fake idempotent downstream
// (internal/testkit/fakedownstream) as a small HTTP API for
// docker-compose demos: any path (/payments, /emails, /invoices, ...) is an
// endpoint with Idempotency-Key semantics, and each path is its own
// idempotency store.
//
//	GET    /_counts   effects and requests per key, as JSON
//	POST   /_faults   add a fault rule, e.g. {"fault":"hang","times":3}
//	DELETE /_faults   clear fault rules
//	POST   /_replies  answer a key like a payment API, e.g.
//	                  {"key":"order-42","reply":"decline"} (or conflict, cached-failure)
//	DELETE /_replies  clear reply settings
//	GET    /healthz   liveness
//
// Flags (and environment variables):
//
//	-addr        SBCLAIM_DEMOAPI_ADDR        listen address (default :8080)
//	-latency     SBCLAIM_DEMOAPI_LATENCY     time each effect takes (default 0)
//	-fault       SBCLAIM_DEMOAPI_FAULT       fault injected at -fault-rate: unavailable,
//	                                         error-before, error-after, hang (default none)
//	-fault-rate  SBCLAIM_DEMOAPI_FAULT_RATE  share of requests that get -fault (0..1)
//	-seed        SBCLAIM_DEMOAPI_SEED        seed for the fault draws (default 1)
//	-conflict-style SBCLAIM_DEMOAPI_CONFLICT_STYLE  how a key reused with another
//	                                         payload is answered: 422 (default) or
//	                                         stripe (400 idempotency_error)
//
// Every effect is logged as one JSON line (SBCLAIM_LOG_FORMAT=text for
// text).
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
)

// config is the demo API's configuration.
type config struct {
	Addr      string
	Latency   time.Duration
	Fault     fakedownstream.Fault
	FaultRate float64
	Seed      uint64
	Conflicts fakedownstream.ConflictStyle
}

// Validate names the field and the bad value.
func (c config) Validate() error {
	switch {
	case c.Addr == "":
		return errors.New("addr (SBCLAIM_DEMOAPI_ADDR) cannot be empty")
	case c.Latency < 0:
		return fmt.Errorf("latency (SBCLAIM_DEMOAPI_LATENCY) cannot be negative, got %s", c.Latency)
	case c.FaultRate < 0 || c.FaultRate > 1:
		return fmt.Errorf("fault-rate (SBCLAIM_DEMOAPI_FAULT_RATE) must be between 0 and 1, got %v", c.FaultRate)
	case c.FaultRate > 0 && c.Fault == fakedownstream.FaultNone:
		return fmt.Errorf("fault-rate (SBCLAIM_DEMOAPI_FAULT_RATE) is %v but fault (SBCLAIM_DEMOAPI_FAULT) is none", c.FaultRate)
	}
	return nil
}

// parseConfig reads flags, with environment variables as defaults.
func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("demoapi", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", cmp.Or(getenv("SBCLAIM_DEMOAPI_ADDR"), ":8080"), "listen address (SBCLAIM_DEMOAPI_ADDR)")
	latency := fs.String("latency", cmp.Or(getenv("SBCLAIM_DEMOAPI_LATENCY"), "0s"), "time each effect takes (SBCLAIM_DEMOAPI_LATENCY)")
	fault := fs.String("fault", cmp.Or(getenv("SBCLAIM_DEMOAPI_FAULT"), "none"), "fault injected at -fault-rate: unavailable, error-before, error-after, hang (SBCLAIM_DEMOAPI_FAULT)")
	rate := fs.String("fault-rate", cmp.Or(getenv("SBCLAIM_DEMOAPI_FAULT_RATE"), "0"), "share of requests that get -fault, 0..1 (SBCLAIM_DEMOAPI_FAULT_RATE)")
	seed := fs.String("seed", cmp.Or(getenv("SBCLAIM_DEMOAPI_SEED"), "1"), "seed for fault draws (SBCLAIM_DEMOAPI_SEED)")
	conflicts := fs.String("conflict-style", cmp.Or(getenv("SBCLAIM_DEMOAPI_CONFLICT_STYLE"), "422"), "answer to a key reused with another payload: 422 or stripe (SBCLAIM_DEMOAPI_CONFLICT_STYLE)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	var c config
	var err error
	c.Addr = *addr
	if c.Latency, err = time.ParseDuration(*latency); err != nil {
		return c, fmt.Errorf("latency (SBCLAIM_DEMOAPI_LATENCY) %q: %w", *latency, err)
	}
	if c.Fault, err = fakedownstream.ParseFault(*fault); err != nil {
		return c, fmt.Errorf("fault (SBCLAIM_DEMOAPI_FAULT): %w", err)
	}
	if c.FaultRate, err = strconv.ParseFloat(*rate, 64); err != nil {
		return c, fmt.Errorf("fault-rate (SBCLAIM_DEMOAPI_FAULT_RATE) %q: %w", *rate, err)
	}
	if c.Seed, err = strconv.ParseUint(*seed, 10, 64); err != nil {
		return c, fmt.Errorf("seed (SBCLAIM_DEMOAPI_SEED) %q: %w", *seed, err)
	}
	if c.Conflicts, err = fakedownstream.ParseConflictStyle(*conflicts); err != nil {
		return c, fmt.Errorf("conflict-style (SBCLAIM_DEMOAPI_CONFLICT_STYLE): %w", err)
	}
	return c, c.Validate()
}

func main() {
	var handler slog.Handler = slog.NewJSONHandler(os.Stdout, nil)
	if os.Getenv("SBCLAIM_LOG_FORMAT") == "text" {
		handler = slog.NewTextHandler(os.Stdout, nil)
	}
	logger := slog.New(handler)

	cfg, err := parseConfig(os.Args[1:], os.Getenv, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		logger.Error("invalid configuration", slog.String("error", err.Error()))
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal kills the process
	}()
	if err := run(ctx, cfg, logger, nil); err != nil {
		logger.Error("demoapi stopped", slog.String("error", err.Error()))
		os.Exit(1)
	}
}

// run serves until ctx ends, then drains for up to 10s. ready (may be nil)
// is called with the listening address.
func run(ctx context.Context, cfg config, logger *slog.Logger, ready func(addr string)) error {
	fake := fakedownstream.New(fakedownstream.Options{Seed: cfg.Seed, Latency: cfg.Latency, Logger: logger, ConflictStyle: cfg.Conflicts})
	if cfg.FaultRate > 0 {
		fake.SetFaultRate(cfg.FaultRate, cfg.Fault)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "ok\n")
	})
	mux.Handle("/", fake)

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Addr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	logger.Info("demoapi listening", slog.String("addr", ln.Addr().String()),
		slog.Duration("latency", cfg.Latency), slog.String("fault", cfg.Fault.String()), slog.Float64("fault_rate", cfg.FaultRate),
		slog.String("conflict_style", cfg.Conflicts.String()))
	if ready != nil {
		ready(ln.Addr().String())
	}

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return fmt.Errorf("shutdown: %w", err)
	}
	logger.Info("demoapi stopped", slog.Int("effects", fake.TotalEffects()))
	return nil
}
