// Command reconciler recovers stale claims (repeating their effect with the
// same idempotency key), flags for operators what a person must decide,
// purges old finished claims, and gives operators the commands and the web
// console to review, redrive and resolve claims. It is built on the public
// API (package sbclaim: the store, the reconciler's passes, the operator
// actions), plus its settings, redaction and the console.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/internal/redact"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// After the first signal, restore the default handling: a second
		// SIGTERM or Ctrl-C kills the process at once.
		<-ctx.Done()
		stop()
	}()
	os.Exit(run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1 // the command ran and failed, or refused
	exitUsage   = 2 // bad arguments or configuration
)

// command is one subcommand.
type command struct {
	name, args, summary string
	// envs are the settings the command uses (nil: all).
	envs []string
	// flags registers the command's own flags; it returns the function
	// that runs the command once the flags are parsed.
	flags func(fs *flag.FlagSet) func(ctx context.Context, e *env, args []string) int
}

var (
	dbEnvs  = []string{"SBCLAIM_DATABASE_URL", "SBCLAIM_LOG_FORMAT", "SBCLAIM_LOG_LEVEL"}
	opEnvs  = append(dbEnvs[:len(dbEnvs):len(dbEnvs)], "SBCLAIM_OPERATOR")
	redrive = append(opEnvs[:len(opEnvs):len(opEnvs)], "SBCLAIM_ROUTES", "SBCLAIM_HEARTBEAT_INTERVAL", "SBCLAIM_QUERY_TIMEOUT")
)

func commands() []command {
	return []command{
		{name: "run", summary: "run the reconciler daemon: a tick on the cron schedule, /healthz, /readyz and /metrics",
			flags: func(*flag.FlagSet) func(context.Context, *env, []string) int { return cmdRun }},
		{name: "once", summary: "run one tick and exit (non-zero on failure): for a scheduled job",
			envs: []string{"SBCLAIM_DATABASE_URL", "SBCLAIM_STALE_AFTER", "SBCLAIM_HEARTBEAT_INTERVAL",
				"SBCLAIM_RETENTION", "SBCLAIM_LOCK_DURATION", "SBCLAIM_MAX_DELIVERY_COUNT",
				"SBCLAIM_FLAG_BATCH_SIZE", "SBCLAIM_PURGE_BATCH_SIZE", "SBCLAIM_PURGE_MAX_PER_TICK",
				"SBCLAIM_QUERY_TIMEOUT", "SBCLAIM_ROUTES", "SBCLAIM_RECOVERY_MAX_ATTEMPTS", "SBCLAIM_RECOVERY_BACKOFF",
				"SBCLAIM_RECOVERY_BACKOFF_MAX", "SBCLAIM_RECOVERY_CONCURRENCY", "SBCLAIM_LOG_FORMAT", "SBCLAIM_LOG_LEVEL"},
			flags: func(*flag.FlagSet) func(context.Context, *env, []string) int { return cmdOnce }},
		{name: "migrate", summary: "apply the claims schema to the database",
			envs:  []string{"SBCLAIM_DATABASE_URL", "SBCLAIM_LOG_FORMAT", "SBCLAIM_LOG_LEVEL"},
			flags: func(*flag.FlagSet) func(context.Context, *env, []string) int { return cmdMigrate }},
		{name: "list", summary: "list claims (flagged ones by default)", envs: dbEnvs, flags: listFlags},
		{name: "show", args: "<id>", summary: "show everything about one claim", envs: dbEnvs, flags: showFlags},
		{name: "resolve", args: "<id> --as done|discarded --note TEXT", summary: "close a flagged claim by hand, audited",
			envs: opEnvs, flags: resolveFlags},
		{name: "redrive", args: "<id> [--new-key --note TEXT]", summary: "re-run a flagged claim's effect with the same idempotency key (--new-key: under a new one, for a route that allows it)",
			envs: redrive, flags: redriveFlags},
		{name: "retry", args: "<id>...|--failed [--new-key] [--handoff] --note TEXT", summary: "run failed claims again after fixing what made the downstream refuse them (same key; --new-key: a new one, for a route that allows it)",
			envs: redrive, flags: retryFlags},
		{name: "console", summary: "serve the operator console (review, redrive and resolve claims in a browser), and /healthz and /metrics", envs: consoleEnvs, flags: consoleFlags},
	}
}

// env is what a command gets: the configuration, a logger, the outputs,
// and the OS hooks tests replace.
type env struct {
	cfg    *Config
	logger *slog.Logger
	stdout io.Writer
	stderr io.Writer // scrubbed of the database password
	getenv func(string) string
}

// run is main without the process: it parses args, runs the command and
// returns the exit code. Tests call it directly.
func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help" {
		usage(stderr, getenv)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	var cmd *command
	for _, c := range commands() {
		if c.name == args[0] {
			cmd = &c
			break
		}
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "reconciler: unknown command %q\n\n", args[0])
		usage(stderr, getenv)
		return exitUsage
	}

	fs := flag.NewFlagSet("reconciler "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	cf := bindConfig(fs, getenv, cmd.envs)
	exec := cmd.flags(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: reconciler %s [flags] %s\n\n%s.\n\nFlags (each defaults to its environment variable):\n",
			cmd.name, cmd.args, cmd.summary)
		fs.PrintDefaults()
	}
	rest, err := parseInterspersed(fs, args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		return exitUsage // flag already printed the error and usage
	}

	cfg, err := cf.load()
	if err == nil && (cmd.name == "run" || cmd.name == "once") {
		err = cfg.Validate()
	}
	if err == nil && (cmd.name == "console" || cmd.name == "run" && cfg.RunConsole) {
		err = cfg.ValidateConsole()
	}
	if err != nil {
		fmt.Fprintf(stderr, "reconciler %s: invalid configuration:\n", cmd.name)
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintf(stderr, "  %s\n", line)
		}
		return exitUsage
	}

	errOut := redact.NewScrubber(redact.Secrets(cfg.DatabaseURL)...).Writer(stderr)
	e := &env{cfg: cfg, logger: newLogger(errOut, cfg), stdout: stdout, stderr: errOut, getenv: getenv}
	_, flush, err := setupTelemetry(ctx, getenv)
	if err != nil {
		fmt.Fprintf(errOut, "reconciler %s: OpenTelemetry (OTEL_*): %v\n", cmd.name, err)
		return exitUsage
	}
	defer flush()
	return exec(ctx, e, rest)
}

// parseInterspersed parses flags that may come after positional arguments
// ("resolve 42 --as done"), which the flag package alone does not allow.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

func usage(w io.Writer, getenv func(string) string) {
	fmt.Fprint(w, `Usage: reconciler <command> [flags] [args]

The sbclaim reconciler recovers claims whose processor stopped (no
heartbeat, or released and not taken over) by re-running their effect with
the same idempotency key, flags for operators only what recovery cannot
settle, purges old finished claims, and lets operators review, redrive and
resolve flagged claims.

Commands:
`)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, c := range commands() {
		fmt.Fprintf(tw, "  %s %s\t%s\n", c.name, c.args, c.summary)
	}
	tw.Flush()
	fmt.Fprint(w, "\nConfiguration (environment variable, flag, current value or default):\n")
	fs := flag.NewFlagSet("reconciler", flag.ContinueOnError)
	fs.SetOutput(w)
	bindConfig(fs, getenv, nil)
	fs.PrintDefaults()
	fmt.Fprint(w, "\nRun 'reconciler <command> -h' for a command's flags.\n")
}

func newLogger(w io.Writer, cfg *Config) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	if cfg.LogFormat == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// openStore opens the claims store, with errors that never show the
// database password.
func (e *env) openStore(ctx context.Context) (*sbclaim.Store, error) {
	st, err := sbclaim.OpenStore(ctx, e.cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("open claims database %s: %w", redact.URL(e.cfg.DatabaseURL), err)
	}
	return st, nil
}

// fail prints err for the operator and returns exitFailure.
func (e *env) fail(cmd string, err error) int {
	fmt.Fprintf(e.stderr, "reconciler %s: %v\n", cmd, err)
	return exitFailure
}
