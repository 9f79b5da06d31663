// Command chaos runs sbclaim's chaos harness: several processor replicas
// against the in-memory Service Bus, a real claim store and a fake
// idempotent downstream, with replicas killed at every step of the
// protocol, lost responses, expiring locks and store outages; then the
// reconciler's tick and redrive; then it checks that every message's
// effect happened exactly once. The last line is the verdict; the exit
// code is non-zero on any violation.
//
//	go run ./cmd/chaos -messages 2000 -replicas 3 -faults all -seed 1
//	go run ./cmd/chaos -db "$SBCLAIM_TEST_POSTGRES_URL" -seed 2
//	go run ./cmd/chaos -db "$SBCLAIM_TEST_SQLSERVER_URL" -seed 2   # a fresh database, dropped after
//	go run ./cmd/chaos -seed 3 -flagged-histories   # why the reconciler had work
//	go run ./cmd/chaos -recovery manual   # manual routes: crash-left claims go to operators
//	go run ./cmd/chaos -answers mixed     # a payment API's declines, key conflicts and stored failures
//	go run ./cmd/chaos -handler go        # the replicas run a Go sbclaim.HandlerFunc instead of the HTTP route
//	go run ./cmd/chaos -sessions          # a session-enabled queue: effects in order per session ("out of order 0")
//	go run ./cmd/chaos -faults all,downstream-outage   # the downstream refuses every request for 3 s
//	go run ./cmd/chaos -faults all,downstream-outage -no-deferral   # the old behaviour: FAIL (broker dead letters)
//	go run ./cmd/chaos -pipeline -messages 200   # the outbox: A publishes, B consumes; replicas of both killed
//	go run ./cmd/chaos -scenario naive|unique-index|two-phase
//	go run ./cmd/chaos -bench   # SQLite, plus PostgreSQL / SQL Server when their URLs are set
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/testkit/chaos"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		messages  = fs.Int("messages", 500, "distinct messages with an effect")
		replicas  = fs.Int("replicas", 3, "processor replicas running at once")
		dupShare  = fs.Float64("dup-share", 0.3, "share of messages sent 2 or 3 times")
		faults    = fs.String("faults", "all", "faults to inject: all, none, or a comma list of "+faultNames())
		seed      = fs.Uint64("seed", 0, "seed for every choice the harness makes (0: from the clock; scheduling still varies)")
		db        = fs.String("db", "", "claims database URL: empty for a temporary SQLite file, sqlite:/path, postgres://... (a fresh schema per run) or sqlserver://... (a fresh database per run, dropped after; the login needs CREATE DATABASE)")
		scenario  = fs.String("scenario", "", "run a named scenario instead: naive, unique-index or two-phase")
		bench     = fs.Bool("bench", false, "run the benchmark matrix and print a markdown table")
		benchPG   = fs.String("bench-postgres", os.Getenv("SBCLAIM_TEST_POSTGRES_URL"), "with -bench: PostgreSQL URL for the PostgreSQL rows (default $SBCLAIM_TEST_POSTGRES_URL)")
		benchMS   = fs.String("bench-sqlserver", os.Getenv("SBCLAIM_TEST_SQLSERVER_URL"), "with -bench: SQL Server URL for the SQL Server rows, a fresh database per table (default $SBCLAIM_TEST_SQLSERVER_URL)")
		benchConc = fs.String("bench-conc", "1,16,64", "with -bench: the concurrencies of the matrix (comma list)")
		benchLat  = fs.String("bench-latency", "0,20ms", "with -bench: the downstream latencies of the matrix (comma list of durations)")
		benchScan = fs.Bool("bench-scan", true, "with -bench: time the reconciler's stale scan at 10k and 1M claims")
		benchHeap = fs.String("bench-scale", "", "with -bench: also run the processor over these message counts on SQLite at 0 ms and report its peak heap (comma list, e.g. 100000,1000000)")
		verbose   = fs.Bool("v", false, "log the replicas' and reconciler's work to stderr")
		samples   = fs.Bool("flagged-histories", false, "print the history of a few flagged claims of each kind (why the reconciler had work)")
		answers   = fs.String("answers", "normal", "how the downstream answers: normal (every key performed) or mixed (like a payment API, a share of keys gets a final decline, a key conflict or a failure stored under the key)")
		handler   = fs.String("handler", "http", "the replicas' effect: http (the routes file's HTTP route) or go (a Go sbclaim.HandlerFunc calling the same downstream); both through sbclaim.NewProcessor")
		recovery  = fs.String("recovery", "auto", "the routes' recovery: auto (the downstream honours Idempotency-Key: crash-left claims are repeated with the same key) or manual (they are flagged for operators)")
		noDefer   = fs.Bool("no-deferral", false, "turn the processors' delayed retries off (the old behaviour: a retryable outcome abandons the message and the broker redelivers it at once); with -faults ...,downstream-outage the run should FAIL")
		window    = fs.Duration("downstream-window", 3*time.Second, "length of the downstream-outage and misconfigured windows")
		pipeline  = fs.Bool("pipeline", false, "run the outbox pipeline instead: consumer A charges each payment and publishes payment.charged (its follow-up), consumer B issues a receipt for it; replicas of both killed at every step, A's relay between a follow-up's send and its mark; -messages payments, -replicas per consumer, -db, -seed, -faults none|all")
		pipeDedup = fs.Bool("pipeline-duplicate-detection", false, "with -pipeline: turn duplicate detection on at the target (a resend is then dropped by the broker; off, B's claim deduplicates it)")
		sessions  = fs.Bool("sessions", false, "session-enabled queue: every message carries a session id (about 8 messages per session), the replicas run in session mode, and the report counts messages that ran out of order in their session (must be 0)")
		tracing   = fs.Bool("tracing", false, "run with OpenTelemetry tracing on (always-on sampler, spans kept in memory and checked); with -bench: also measure the processor's throughput with tracing on against off in each cell")
	)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "chaos: unexpected arguments %q\n", fs.Args())
		return 2
	}
	rec := sideeffects.Recovery(*recovery)
	if *recovery == "" || !rec.Valid() {
		fmt.Fprintf(stderr, "chaos: -recovery: %q is not auto or manual\n", *recovery)
		return 2
	}
	ans := chaos.Answers(*answers)
	if ans != chaos.AnswersNormal && ans != chaos.AnswersMixed {
		fmt.Fprintf(stderr, "chaos: -answers: %q is not normal or mixed\n", *answers)
		return 2
	}
	hk := chaos.Handler(*handler)
	if hk != chaos.HandlerHTTP && hk != chaos.HandlerGo {
		fmt.Fprintf(stderr, "chaos: -handler: %q is not http or go\n", *handler)
		return 2
	}
	fl, err := chaos.ParseFaults(*faults)
	if err != nil {
		fmt.Fprintf(stderr, "chaos: -faults: %v\n", err)
		return 2
	}
	logger := slog.New(slog.DiscardHandler)
	if *verbose {
		logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	switch {
	case *pipeline:
		rep, err := chaos.RunPipeline(ctx, chaos.PipelineConfig{
			Payments: *messages, Replicas: *replicas, Seed: *seed, DatabaseURL: *db, Logger: logger,
			NoFaults: *faults == "none", DuplicateDetection: *pipeDedup, DupShare: orNone(*dupShare),
		})
		if err != nil {
			fmt.Fprintf(stderr, "chaos: pipeline: %v\n", err)
			return 2
		}
		rep.Write(stdout)
		if !rep.Pass() {
			return 1
		}
		return 0
	case *bench:
		concs, err := intList(*benchConc)
		if err != nil {
			fmt.Fprintf(stderr, "chaos: -bench-conc: %v\n", err)
			return 2
		}
		lats, err := durationList(*benchLat)
		if err != nil {
			fmt.Fprintf(stderr, "chaos: -bench-latency: %v\n", err)
			return 2
		}
		scale, err := intList(*benchHeap)
		if err != nil {
			fmt.Fprintf(stderr, "chaos: -bench-scale: %v\n", err)
			return 2
		}
		err = chaos.RunBenchmarks(ctx, chaos.BenchConfig{
			SQLite:        true,
			PostgresURL:   *benchPG,
			SQLServerURL:  *benchMS,
			Concurrencies: concs,
			Latencies:     lats,
			NoScan:        !*benchScan,
			ScaleMessages: scale,
			Logger:        logger,
			Progress:      stderr,
			Tracing:       *tracing,
		}, stdout)
		if err != nil {
			fmt.Fprintf(stderr, "chaos: bench: %v\n", err)
			return 1
		}
		return 0
	case *scenario != "":
		res, err := chaos.RunScenario(ctx, chaos.Scenario(*scenario), chaos.ScenarioConfig{DatabaseURL: *db, Logger: logger})
		if err != nil {
			fmt.Fprintf(stderr, "chaos: scenario %s: %v\n", *scenario, err)
			return 2
		}
		res.Write(stdout)
		if !res.Pass() {
			return 1
		}
		return 0
	}

	start := time.Now()
	rep, err := chaos.Run(ctx, chaos.Config{
		Messages:    *messages,
		Replicas:    *replicas,
		DupShare:    orNone(*dupShare),
		Faults:      fl,
		Seed:        *seed,
		DatabaseURL: *db,
		Recovery:    rec,
		Answers:     ans,
		Handler:     hk,
		Logger:      logger,
		Tracing:     *tracing,

		DownstreamWindow: *window,
		NoDeferral:       *noDefer,
		Sessions:         *sessions,
	})
	if err != nil {
		fmt.Fprintf(stderr, "chaos: %v (after %s)\n", err, time.Since(start).Round(time.Millisecond))
		return 2
	}
	if *samples {
		rep.WriteFlagSamples(stdout)
	}
	rep.Write(stdout)
	if !rep.Pass() {
		return 1
	}
	return 0
}

// orNone maps an explicit -dup-share 0 to "no duplicates" (Config's zero
// value means the default).
func orNone(share float64) float64 {
	if share == 0 {
		return -1
	}
	return share
}

func faultNames() string {
	s := ""
	for i, f := range chaos.KnownFaults() {
		if i > 0 {
			s += ","
		}
		s += string(f)
	}
	return s
}

// intList parses "1,16,64" ("" is none).
func intList(s string) ([]int, error) {
	var out []int
	for part := range strings.SplitSeq(s, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		n, err := strconv.Atoi(part)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", part)
		}
		out = append(out, n)
	}
	return out, nil
}

// durationList parses "0,20ms".
func durationList(s string) ([]time.Duration, error) {
	var out []time.Duration
	for part := range strings.SplitSeq(s, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		if part == "0" {
			out = append(out, 0)
			continue
		}
		d, err := time.ParseDuration(part)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("%q is not a duration", part)
		}
		out = append(out, d)
	}
	return out, nil
}
