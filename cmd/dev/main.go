// Command dev runs the whole of sbclaim on one machine with only Go: no
// Docker, no Azure, no database server. It is for trying sbclaim and for
// demos, not for production.
//
//	go run ./cmd/dev
//
// It starts, in one process:
//
//   - an in-memory Service Bus queue "payments" (the one the tests use:
//     peek-lock, lock expiry, redelivery, deferral, dead-lettering). It is
//     NOT durable: messages that were sent and not yet settled are lost
//     when the command stops;
//   - a SQLite claims store in a local folder (-dir, default ./sbclaim-dev),
//     which survives a restart: a restart on the same folder resumes, and
//     the reconciler recovers the claims a stopped run left unfinished
//     (from the payload each claim keeps);
//   - two processor replicas of consumer "payments", with the routes file
//     the folder's routes.yaml shows (written on each start), so that
//     duplicates really race;
//   - the reconciler, ticking every 2 s;
//   - the demo downstream: an idempotent HTTP API on 127.0.0.1 with
//     Idempotency-Key semantics (an in-memory fake: it forgets what it did
//     when the command stops);
//   - the operator console in local mode (nobody signs in; actions are
//     recorded as "developer (local, not signed in)") on 127.0.0.1.
//
// Then it sends the demo mix: payments, some of them two or three times
// (duplicates), one key reused with another amount (a key conflict), one
// poison message (no route, not JSON), one payment the downstream
// declines (402), one the downstream stores a failure for (500 replayed
// under the key: flagged for an operator), while the downstream is down
// for its first requests (503). When every message is settled it prints a
// summary read from the claims store, the queue and the downstream, and
// keeps serving the console until Ctrl-C.
//
// Flags:
//
//	-dir           folder of the SQLite claims store (default ./sbclaim-dev)
//	-console-addr  the console's address, on loopback (default 127.0.0.1:0: a free port)
//	-payments      distinct payment keys to send (default 20; 0 sends nothing)
//	-dup-share     share of the keys sent more than once (default 0.3)
//	-outage        requests the downstream answers 503 when the mix starts (default 12)
//	-seed          seed of the mix (default: random)
//	-log-level     level of the log written to <dir>/dev.log (default info)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		stop() // a second Ctrl-C kills the process
	}()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// config is the dev command's configuration.
type config struct {
	Dir         string
	ConsoleAddr string
	Payments    int
	DupShare    float64
	Outage      int
	Seed        uint64
	LogLevel    slog.Level
}

func parseConfig(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c config
	fs.StringVar(&c.Dir, "dir", "sbclaim-dev", "folder of the SQLite claims store (created if missing; a restart on it resumes)")
	fs.StringVar(&c.ConsoleAddr, "console-addr", "127.0.0.1:0", "the operator console's address, on loopback (port 0: a free one)")
	fs.IntVar(&c.Payments, "payments", 20, "distinct payment keys to send (0: send nothing, only run)")
	fs.Float64Var(&c.DupShare, "dup-share", 0.3, "share of the payment keys sent more than once (0..1)")
	fs.IntVar(&c.Outage, "outage", 12, "requests the demo downstream answers 503 when the mix starts (0: no outage)")
	fs.Uint64Var(&c.Seed, "seed", 0, "seed of the mix's order (0: random)")
	level := fs.String("log-level", "info", "level of the log in <dir>/dev.log: debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var errs []error
	if c.Dir == "" {
		errs = append(errs, errors.New("-dir cannot be empty"))
	}
	if err := loopbackAddr(c.ConsoleAddr); err != nil {
		errs = append(errs, fmt.Errorf("-console-addr %q: %w", c.ConsoleAddr, err))
	}
	if c.Payments < 0 || c.Payments > 10000 {
		errs = append(errs, fmt.Errorf("-payments must be from 0 to 10000, got %d", c.Payments))
	}
	if c.DupShare < 0 || c.DupShare > 1 {
		errs = append(errs, fmt.Errorf("-dup-share must be within [0, 1], got %v", c.DupShare))
	}
	if c.Outage < 0 {
		errs = append(errs, fmt.Errorf("-outage cannot be negative, got %d", c.Outage))
	}
	if err := c.LogLevel.UnmarshalText([]byte(*level)); err != nil {
		errs = append(errs, fmt.Errorf("-log-level %q: want debug, info, warn or error", *level))
	}
	return c, errors.Join(errs...)
}

// loopbackAddr accepts host:port where host is a loopback address or
// localhost: the console runs in local mode, where nobody signs in, so it
// must not be reachable from the network.
func loopbackAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return errors.New("not host:port (e.g. 127.0.0.1:8082)")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return errors.New("the console runs without sign-in here: give a loopback address (127.0.0.1 or [::1])")
	}
	return nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseConfig(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "dev: invalid flags:\n%v\n", err)
		return 2
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		fmt.Fprintf(stderr, "dev: %v\n", err)
		return 1
	}
	logPath := filepath.Join(cfg.Dir, "dev.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		fmt.Fprintf(stderr, "dev: %v\n", err)
		return 1
	}
	defer logFile.Close()
	logger := slog.New(slog.NewTextHandler(logFile, &slog.HandlerOptions{Level: cfg.LogLevel}))
	if err := runSystem(ctx, cfg, logger, logPath, stdout); err != nil {
		fmt.Fprintf(stderr, "dev: %v\n", err)
		logger.Error("dev stopped", "error", err)
		return 1
	}
	return 0
}

// startTime bounds starting up (migrating, binding); the whole system
// then runs until ctx ends.
const startTime = 30 * time.Second
