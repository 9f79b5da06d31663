package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claimdb"
	"github.com/sbclaim/sbclaim/internal/reconciler"
	"github.com/sbclaim/sbclaim/internal/redact"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
)

// cmdRun is the daemon: the tick on the cron schedule, and /healthz,
// /readyz and /metrics, until the context ends (SIGTERM).
func cmdRun(ctx context.Context, e *env, _ []string) int {
	st, err := e.openStore(ctx)
	if err != nil {
		return e.fail("run", err)
	}
	defer st.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	rec, err := e.newReconciler(st, reconciler.NewMetrics(reg))
	if err != nil {
		return e.fail("run", err)
	}

	// The console first: an address it cannot bind stops the daemon
	// before anything is served.
	if e.cfg.RunConsole {
		stopConsole, err := e.startConsole(ctx, st)
		if err != nil {
			return e.fail("run", err)
		}
		defer stopConsole()
	}

	stopHTTP, err := e.serveHTTP(st, reg)
	if err != nil {
		return e.fail("run", err)
	}
	err = rec.Run(ctx)
	stopHTTP()
	if err != nil {
		return e.fail("run", err)
	}
	return exitOK
}

// serveHTTP serves /healthz, /readyz and /metrics on SBCLAIM_HTTP_ADDR
// (nothing when it is empty) until stop: the port the platform's probes
// use, apart from the console's, which answers only signed-in operators.
func (e *env) serveHTTP(st claim.Store, reg *prometheus.Registry) (stop func(), err error) {
	if e.cfg.HTTPAddr == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", e.cfg.HTTPAddr)
	if err != nil {
		return nil, fmt.Errorf("listen on SBCLAIM_HTTP_ADDR %s: %w", e.cfg.HTTPAddr, err)
	}
	srv := &http.Server{Handler: httpHandler(st, reg), ReadHeaderTimeout: 5 * time.Second}
	e.logger.Info("serving /healthz, /readyz and /metrics", "addr", ln.Addr().String())
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			e.logger.Error("http server", "err", err)
		}
	}()
	return func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}, nil
}

// httpHandler serves /healthz (liveness: the process serves), /readyz
// (the database answers a ping) and /metrics (the binary's own
// registry), like the processor's.
func httpHandler(st claim.Store, reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		if err := st.Ping(ctx); err != nil {
			// The error may describe the server; it never carries the
			// password (the store gets no chance to print the URL here).
			http.Error(w, "database unreachable", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	return mux
}

// cmdOnce runs one tick and exits: non-zero when the tick failed.
func cmdOnce(ctx context.Context, e *env, _ []string) int {
	st, err := e.openStore(ctx)
	if err != nil {
		return e.fail("once", err)
	}
	defer st.Close()
	rec, err := e.newReconciler(st, nil)
	if err != nil {
		return e.fail("once", err)
	}
	res, err := rec.RunOnce(ctx)
	if err != nil {
		return e.fail("once", err)
	}
	if !res.Locked {
		e.logger.Info("another reconciler holds the lock; nothing to do", "lock", reconciler.LockName)
	}
	return exitOK
}

// newReconciler builds the tick from the configuration: with routes,
// recovery is on; without, it says so (every stale claim goes to
// operators).
func (e *env) newReconciler(st claim.Store, m *reconciler.Metrics) (*reconciler.Reconciler, error) {
	routes, err := e.routes()
	if err != nil {
		return nil, err
	}
	cfg := e.cfg.reconcilerConfig(routes)
	if !cfg.Recovering() {
		e.logger.Warn("SBCLAIM_ROUTES is not set: recovery is off, every stale claim is flagged for an operator")
	} else {
		var consumers []string
		for _, c := range slices.Sorted(maps.Keys(routes)) {
			consumers = append(consumers, cmp.Or(c, "(every other consumer)"))
		}
		e.logger.Info("recovery on: stale claims are re-run with the same idempotency key",
			"consumers", consumers, "max_attempts", cfg.RecoveryMaxAttempts)
	}
	return reconciler.New(st, cfg, e.logger, m)
}

// routes loads SBCLAIM_ROUTES (nil when it is not set).
func (e *env) routes() (reconciler.Routes, error) {
	paths, err := parseRoutesSpec(e.cfg.RoutesPath)
	if err != nil || len(paths) == 0 {
		return nil, err
	}
	routes := reconciler.Routes{}
	for consumer, path := range paths {
		r, err := sideeffects.LoadRoutes(path, e.getenv, e.logger)
		if err != nil {
			return nil, fmt.Errorf("load routes from SBCLAIM_ROUTES (%s): %w", path, err)
		}
		routes[consumer] = r
	}
	return routes, nil
}

// cmdMigrate applies the claims schema.
func cmdMigrate(ctx context.Context, e *env, _ []string) int {
	if err := claimdb.Migrate(ctx, e.cfg.DatabaseURL); err != nil {
		return e.fail("migrate", fmt.Errorf("migrate %s: %w", redact.URL(e.cfg.DatabaseURL), err))
	}
	fmt.Fprintf(e.stdout, "claims schema is up to date on %s\n", redact.URL(e.cfg.DatabaseURL))
	return exitOK
}
