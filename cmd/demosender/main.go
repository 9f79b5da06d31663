// Command demosender sends a burst of demo messages to the Service Bus
// emulator (or a real namespace): payments to a queue and orders to a topic,
// with deliberate duplicates (the same MessageID and body sent two or three
// times), one idempotency-key conflict (the same MessageID with another
// body) and one poison message (no route, body not JSON). It then prints
// what it sent and which effect counts demoapi's GET /_counts should show.
//
// Usage:
//
//	demosender [-n 50] [-orders 10] [-dup-share 0.3] [-seed N] [-run-id ID] [-wait 3m]
//
// Environment:
//
//	SBCLAIM_SERVICEBUS_CONNECTION_STRING  required (the emulator's works)
//	SBCLAIM_QUEUE                         queue for payments (empty: none)
//	SBCLAIM_TOPIC                         topic for orders (empty: none)
//	SBCLAIM_LOG_FORMAT                    text (default) or json
//
// demosender waits for the broker with a bounded exponential backoff
// (-wait), so it can start together with the emulator under docker compose.
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
	"syscall"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/cenkalti/backoff/v5"
	"github.com/google/uuid"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "demosender:", err)
		}
		os.Exit(1)
	}
}

// config is demosender's configuration, from flags and environment.
type config struct {
	ConnectionString string
	Plan             PlanParams
	Wait             time.Duration
	LogFormat        string
}

func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("demosender", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		n        = fs.Int("n", 50, "distinct payment keys to send to SBCLAIM_QUEUE")
		orders   = fs.Int("orders", 10, "distinct order keys to send to SBCLAIM_TOPIC")
		entries  = fs.Int("entries", 20, "ledger entries to send to SBCLAIM_SESSION_QUEUE (session-enabled), in accounts of about 4, each account a session")
		dupShare = fs.Float64("dup-share", 0.3, "fraction of keys sent more than once (0..1)")
		seed     = fs.Uint64("seed", 0, "seed for the interleaving (0: random)")
		runID    = fs.String("run-id", "", "prefix of every MessageID (default: random, so each run uses fresh keys)")
		wait     = fs.Duration("wait", 3*time.Minute, "how long to wait for the broker to accept connections")
	)
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	cfg := config{
		ConnectionString: getenv("SBCLAIM_SERVICEBUS_CONNECTION_STRING"),
		Wait:             *wait,
		LogFormat:        getenv("SBCLAIM_LOG_FORMAT"),
		Plan: PlanParams{
			RunID:    *runID,
			Queue:    getenv("SBCLAIM_QUEUE"),
			Topic:    getenv("SBCLAIM_TOPIC"),
			Payments: *n,
			Orders:   *orders,

			SessionQueue: getenv("SBCLAIM_SESSION_QUEUE"),
			Entries:      *entries,
			DupShare:     *dupShare,
			Seed:         *seed,
		},
	}
	if cfg.Plan.RunID == "" {
		cfg.Plan.RunID = uuid.NewString()[:8]
	}
	if cfg.Plan.Seed == 0 {
		cfg.Plan.Seed = uint64(time.Now().UnixNano())
	}
	var errs []error
	if cfg.ConnectionString == "" {
		errs = append(errs, errors.New("SBCLAIM_SERVICEBUS_CONNECTION_STRING is required"))
	}
	if cfg.Wait <= 0 {
		errs = append(errs, fmt.Errorf("-wait must be positive, got %s", cfg.Wait))
	}
	if err := cfg.Plan.Validate(); err != nil {
		errs = append(errs, err)
	}
	return cfg, errors.Join(errs...)
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseConfig(args, getenv, stderr)
	if err != nil {
		return err
	}
	var handler slog.Handler = slog.NewTextHandler(stderr, nil)
	if cfg.LogFormat == "json" {
		handler = slog.NewJSONHandler(stderr, nil)
	}
	logger := slog.New(handler)

	plan, err := NewPlan(cfg.Plan)
	if err != nil {
		return err
	}

	// The connection string is never logged: it carries the SAS key.
	// The SDK's own retries are off (MaxRetries < 0 means one try): this
	// program retries with its own bounded backoff, so a failure surfaces
	// with its cause instead of as a deadline hit inside the SDK's retries.
	client, err := azservicebus.NewClientFromConnectionString(cfg.ConnectionString, &azservicebus.ClientOptions{
		RetryOptions: azservicebus.RetryOptions{MaxRetries: -1},
	})
	if err != nil {
		return errors.New("invalid SBCLAIM_SERVICEBUS_CONNECTION_STRING (value not shown)")
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = client.Close(closeCtx)
	}()

	sent, err := sendPlan(ctx, logger, client, plan, cfg.Wait)
	if err != nil {
		return fmt.Errorf("sent %d of %d messages: %w", sent, len(plan.Sends), err)
	}
	plan.Summary.Print(stdout)
	return nil
}

// sendPlan opens a sender per entity, waits until the broker accepts it,
// and sends the burst in order. It returns how many messages were sent.
func sendPlan(ctx context.Context, logger *slog.Logger, client *azservicebus.Client, plan Plan, wait time.Duration) (int, error) {
	senders := make(map[string]*azservicebus.Sender)
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		for _, s := range senders {
			_ = s.Close(closeCtx)
		}
	}()
	for _, s := range plan.Sends {
		if _, ok := senders[s.Entity]; ok {
			continue
		}
		sender, err := client.NewSender(s.Entity, nil)
		if err != nil {
			return 0, fmt.Errorf("sender for %q: %w", s.Entity, err)
		}
		senders[s.Entity] = sender
		if err := waitReady(ctx, logger, sender, s.Entity, wait); err != nil {
			return 0, err
		}
	}

	contentType := "application/json"
	for i, s := range plan.Sends {
		msg := &azservicebus.Message{
			MessageID:   &s.MessageID,
			Subject:     &s.Subject,
			Body:        s.Body,
			ContentType: &contentType,
			ApplicationProperties: map[string]any{
				"demo_kind":   string(s.Kind),
				"demo_run_id": plan.Summary.RunID,
			},
		}
		if s.SessionID != "" {
			msg.SessionID = &s.SessionID
		}
		// A retried send whose acknowledgement was lost is itself a source of
		// duplicates: exactly what the processors must absorb.
		_, err := backoff.Retry(ctx, func() (struct{}, error) {
			sendCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			return struct{}{}, classify(s.Entity, s.MessageID, senders[s.Entity].SendMessage(sendCtx, msg, nil))
		}, backoff.WithMaxTries(5), backoff.WithMaxElapsedTime(time.Minute))
		if err != nil {
			return i, fmt.Errorf("send %s to %q: %w", s.MessageID, s.Entity, err)
		}
		logger.Debug("sent", "entity", s.Entity, "message_id", s.MessageID, "kind", s.Kind)
	}
	return len(plan.Sends), nil
}

// waitReady retries opening the send link (NewMessageBatch needs it, and
// sends nothing) until the broker accepts it or wait has passed.
func waitReady(ctx context.Context, logger *slog.Logger, sender *azservicebus.Sender, entity string, wait time.Duration) error {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = time.Second
	b.MaxInterval = 10 * time.Second
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		attemptCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		_, err := sender.NewMessageBatch(attemptCtx, nil)
		return struct{}{}, classify(entity, "", err)
	},
		backoff.WithBackOff(b),
		backoff.WithMaxElapsedTime(wait),
		backoff.WithNotify(func(err error, next time.Duration) {
			logger.Info("waiting for Service Bus", "entity", entity, "retry_in", next.Round(time.Millisecond), "err", err)
		}),
	)
	if err != nil {
		//lint:ignore ST1005 Service Bus is a proper noun
		return fmt.Errorf("Service Bus entity %q not reachable within %s: %w", entity, wait, err)
	}
	logger.Info("Service Bus is ready", "entity", entity)
	return nil
}

// classify marks errors that retrying cannot fix as permanent. A missing
// entity is retried: the emulator creates its entities from Config.json
// while it starts, so "not found" can be transient there.
func classify(entity, messageID string, err error) error {
	if err == nil {
		return nil
	}
	var sbErr *azservicebus.Error
	if errors.As(err, &sbErr) && sbErr.Code == azservicebus.CodeUnauthorizedAccess {
		return backoff.Permanent(fmt.Errorf("not authorized for %q (check the connection string's key): %w", entity, err))
	}
	if messageID != "" {
		return fmt.Errorf("message %s: %w", messageID, err)
	}
	return err
}
