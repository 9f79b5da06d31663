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

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/internal/redact"
	ops "github.com/sbclaim/sbclaim/operator"
	"github.com/sbclaim/sbclaim/routesfile"
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
	rec, err := e.newReconciler(st, reg)
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
func (e *env) serveHTTP(st *sbclaim.Store, reg *prometheus.Registry) (stop func(), err error) {
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

// pinger is what /readyz asks: the store.
type pinger interface{ Ping(context.Context) error }

// httpHandler serves /healthz (liveness: the process serves), /readyz
// (the database answers a ping) and /metrics (the binary's own
// registry), like the processor's.
func httpHandler(st pinger, reg *prometheus.Registry) http.Handler {
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
		e.logger.Info("another reconciler holds the lock; nothing to do", "lock", ops.ReconcilerLockName)
	}
	return exitOK
}

// newReconciler builds the tick from the configuration: with routes,
// recovery is on; without, it says so (every stale claim goes to
// operators). reg, when set, gets the tick's metrics.
func (e *env) newReconciler(st *sbclaim.Store, reg prometheus.Registerer) (*ops.Reconciler, error) {
	routers, err := e.routes()
	if err != nil {
		return nil, err
	}
	cfg := e.cfg.reconcilerConfig(st, routers)
	cfg.Logger, cfg.Registerer = e.logger, reg
	if len(routers) == 0 {
		e.logger.Warn("SBCLAIM_ROUTES is not set: recovery is off, every stale claim is flagged for an operator")
	} else {
		var consumers []string
		for _, c := range slices.Sorted(maps.Keys(routers)) {
			consumers = append(consumers, cmp.Or(c, "(every other consumer)"))
		}
		e.logger.Info("recovery on: stale claims are re-run with the same idempotency key",
			"consumers", consumers, "max_attempts", cmp.Or(cfg.RecoveryMaxAttempts, ops.DefaultRecoveryMaxAttempts))
	}
	return ops.NewReconciler(cfg)
}

// routes loads SBCLAIM_ROUTES: a router by consumer, each with its
// routes file (nil when it is not set).
func (e *env) routes() (map[string]*sbclaim.Router, error) {
	paths, err := parseRoutesSpec(e.cfg.RoutesPath)
	if err != nil || len(paths) == 0 {
		return nil, err
	}
	routers := map[string]*sbclaim.Router{}
	for consumer, path := range paths {
		f, err := routesfile.Load(path, &routesfile.Options{Getenv: e.getenv, Logger: e.logger})
		if err != nil {
			return nil, fmt.Errorf("load routes from SBCLAIM_ROUTES (%s): %w", path, err)
		}
		r, err := sbclaim.NewRouter()
		if err == nil {
			err = r.AddRoutesFile(f)
		}
		if err != nil {
			return nil, fmt.Errorf("load routes from SBCLAIM_ROUTES (%s): %w", path, err)
		}
		routers[consumer] = r
	}
	return routers, nil
}

// routerFor is the router of a consumer's claims: its own, else the one
// for every consumer (nil: none).
func routerFor(routers map[string]*sbclaim.Router, consumer string) *sbclaim.Router {
	if r, ok := routers[consumer]; ok {
		return r
	}
	return routers[""]
}

// cmdMigrate applies the claims schema.
func cmdMigrate(ctx context.Context, e *env, _ []string) int {
	if err := sbclaim.Migrate(ctx, e.cfg.DatabaseURL); err != nil {
		return e.fail("migrate", fmt.Errorf("migrate %s: %w", redact.URL(e.cfg.DatabaseURL), err))
	}
	fmt.Fprintf(e.stdout, "claims schema is up to date on %s\n", redact.URL(e.cfg.DatabaseURL))
	return exitOK
}
