// Command processor receives Service Bus messages, claims each in the
// claims table, runs its side effects with the message's dedup key as the
// idempotency key, and settles it. See docs/configuration.md.
package main

import (
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
	"syscall"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/prommetrics"
	"github.com/sbclaim/sbclaim/routesfile"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cfg, err := LoadConfig(args, getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "processor: invalid configuration:\n%v\n", err)
		return 2
	}
	logger := newLogger(cfg.LogFormat, cfg.LogLevel, stdout)

	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	returned := make(chan struct{})
	defer close(returned)
	go func() {
		// After the first signal, a second one forces the exit.
		select {
		case <-ctx.Done():
		case <-returned:
			return
		}
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		defer signal.Stop(sig)
		stop()
		select {
		case <-sig:
			logger.Error("second signal: exiting now")
			os.Exit(1)
		case <-returned:
		}
	}()

	if err := serve(ctx, cfg, logger, getenv); err != nil {
		logger.Error("processor stopped", "error", err)
		var ce *ConfigError
		if errors.As(err, &ce) {
			return 2 // a setting that contradicts what Service Bus says
		}
		return 1
	}
	return 0
}

func serve(ctx context.Context, cfg *Config, logger *slog.Logger, getenv func(string) string) error {
	tel, flush, err := setupTelemetry(ctx, getenv)
	if err != nil {
		return fmt.Errorf("OpenTelemetry (OTEL_*): %w", err)
	}
	defer flush()
	logger.Info("OpenTelemetry", "export", tel)
	routes, err := routesfile.Load(cfg.Routes, &routesfile.Options{Getenv: getenv, Logger: logger})
	if err != nil {
		return fmt.Errorf("SBCLAIM_ROUTES: %w", err)
	}
	router := &sbclaim.Router{}
	if err := router.AddRoutesFile(routes); err != nil {
		return fmt.Errorf("SBCLAIM_ROUTES: %w", err)
	}

	openCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	st, err := sbclaim.OpenStore(openCtx, cfg.DatabaseURL)
	cancel()
	if err != nil {
		return fmt.Errorf("open claims store: %w", err)
	}
	defer st.Close()

	client, cred, err := newServiceBusClient(cfg)
	if err != nil {
		return err
	}
	defer client.Close(context.Background())

	// The delivery budget is the entity's: read it where the identity may.
	entityAdmin, skip := newEntityAdmin(cfg, cred)
	maxDeliveries, err := resolveMaxDeliveryCount(ctx, cfg, entityAdmin, skip, logger)
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	renewal := cfg.MaxLockRenewal
	if renewal == 0 {
		renewal = -1 // SBCLAIM_MAX_LOCK_RENEWAL=0 turns renewal off
	}
	newReceiver, sessions := receivers(cfg, client)
	p, err := sbclaim.NewProcessor(sbclaim.ProcessorConfig{
		Consumer:           cfg.Consumer,
		Entity:             cfg.Entity(),
		Store:              st,
		Router:             router,
		NewReceiver:        newReceiver,
		Sessions:           sessions,
		DedupKey:           cfg.Key,
		MaxConcurrentCalls: cfg.MaxConcurrentCalls,
		MaxLockRenewal:     renewal,
		LockDuration:       cfg.LockDuration,
		HeartbeatInterval:  cfg.HeartbeatInterval,
		TakeoverAfter:      cfg.TakeoverAfter,
		StaleAfter:         cfg.StaleAfter,
		Retry: sbclaim.RetryPolicy{
			MaxAttempts:     cfg.EffectMaxAttempts,
			InitialInterval: 500 * time.Millisecond,
			MaxInterval:     30 * time.Second,
			Budget:          cfg.EffectBudget,
		},
		NoPayload:              !cfg.StorePayload,
		MaxPayloadBytes:        cfg.MaxPayloadBytes,
		MaxDeliveryCount:       maxDeliveries,
		DeferPollInterval:      cfg.DeferPollInterval,
		DeferGrace:             cfg.DeferGrace,
		NoDeferral:             !cfg.Deferral,
		ShutdownTimeout:        cfg.ShutdownTimeout,
		StoreTimeout:           cfg.StoreTimeout,
		SettleTimeout:          cfg.SettleTimeout,
		TerminationGracePeriod: cfg.GracePeriod,
		GroupCommit: sbclaim.GroupCommit{
			Disabled: !cfg.GroupCommit,
			MaxBatch: cfg.GroupCommitMaxBatch, MaxInFlight: cfg.GroupCommitMaxInFlight, Window: cfg.GroupCommitWindow,
		},
		Logger:  logger,
		Metrics: prommetrics.New(reg),
		Outbox:  outboxConfig(routes, client, logger),
	})
	if err != nil {
		return err
	}

	// Bind before receiving: a processor without /healthz, /readyz and
	// /metrics must not consume messages (the platform could neither
	// probe it nor scrape it).
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen on SBCLAIM_HTTP_ADDR %s: %w", cfg.HTTPAddr, err)
	}
	srv := &http.Server{
		Handler:           httpHandler(p, st, reg),
		ReadHeaderTimeout: 5 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("http server failed", "error", err)
		}
	}()
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()

	logger.Info("processor started", "entity", cfg.Entity(), "consumer", cfg.Consumer,
		"max_concurrent_calls", cfg.MaxConcurrentCalls, "http_addr", cfg.HTTPAddr)
	err = p.Run(ctx)
	logger.Info("processor stopped")
	return err
}

func httpHandler(p *sbclaim.Processor, st *sbclaim.Store, reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if ok, why := p.Ready(); !ok {
			http.Error(w, why, http.StatusServiceUnavailable)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := st.Ping(ctx); err != nil {
			http.Error(w, "claims store unreachable", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return mux
}

// newServiceBusClient returns the client and, without a connection string,
// the credential it uses (nil with one).
func newServiceBusClient(cfg *Config) (*azservicebus.Client, azcore.TokenCredential, error) {
	if cfg.ConnectionString != "" {
		c, err := azservicebus.NewClientFromConnectionString(cfg.ConnectionString, nil)
		if err != nil {
			// The SDK's message may quote the string: never pass it on.
			return nil, nil, errors.New("SBCLAIM_SERVICEBUS_CONNECTION_STRING: the Service Bus client rejected the connection string")
		}
		return c, nil, nil
	}
	cred, err := azidentity.NewDefaultAzureCredential(nil)
	if err != nil {
		return nil, nil, fmt.Errorf("azure credential: %w", err)
	}
	c, err := azservicebus.NewClient(cfg.Namespace, cred, nil)
	return c, cred, err
}

func newLogger(format string, level slog.Level, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// outboxConfig turns the outbox on when the routes publish follow-ups
// (followUps): the relay sends them with the processor's Service Bus
// client, whose identity needs Data Sender on each target.
func outboxConfig(routes *sbclaim.RoutesFile, client *azservicebus.Client, logger *slog.Logger) sbclaim.OutboxConfig {
	targets := routes.FollowUpTargets()
	if len(targets) == 0 {
		return sbclaim.OutboxConfig{}
	}
	logger.Info("outbox on: the routes publish follow-up messages (the identity needs Data Sender on each target; enable duplicate detection on them)",
		"targets", targets)
	return sbclaim.OutboxConfig{NewSender: func(to string) (sbclaim.Sender, error) { return client.NewSender(to, nil) }}
}

// receivers returns how the processor receives: a receiver on the entity,
// or, with SBCLAIM_SESSIONS, the next session of it.
func receivers(cfg *Config, client *azservicebus.Client) (func(context.Context) (sbclaim.Receiver, error), *sbclaim.Sessions) {
	if cfg.Sessions > 0 {
		return nil, &sbclaim.Sessions{
			AcceptNext: func(ctx context.Context) (sbclaim.SessionReceiver, error) {
				if cfg.Queue != "" {
					return client.AcceptNextSessionForQueue(ctx, cfg.Queue, nil)
				}
				return client.AcceptNextSessionForSubscription(ctx, cfg.Topic, cfg.Subscription, nil)
			},
			MaxConcurrent: cfg.Sessions,
			IdleTimeout:   cfg.SessionIdleTimeout,
		}
	}
	return func(ctx context.Context) (sbclaim.Receiver, error) {
		if cfg.Queue != "" {
			return client.NewReceiverForQueue(cfg.Queue, nil)
		}
		return client.NewReceiverForSubscription(cfg.Topic, cfg.Subscription, nil)
	}, nil
}
