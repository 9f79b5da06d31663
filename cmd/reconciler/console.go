package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/internal/console"
)

// consoleEnvs are the settings `reconciler console` reads.
var consoleEnvs = []string{"SBCLAIM_DATABASE_URL", "SBCLAIM_CONSOLE_ADDR", "SBCLAIM_HTTP_ADDR",
	"SBCLAIM_CONSOLE_OIDC_ISSUER", "SBCLAIM_CONSOLE_OIDC_AUDIENCE", "SBCLAIM_CONSOLE_ALLOWED_GROUPS", "SBCLAIM_CONSOLE_ALLOWED_PRINCIPALS",
	"SBCLAIM_CONSOLE_INSECURE_TRUST_IDENTITY_HEADERS", "SBCLAIM_CONSOLE_LOCAL_OPERATOR",
	"SBCLAIM_ROUTES", "SBCLAIM_HEARTBEAT_INTERVAL", "SBCLAIM_QUERY_TIMEOUT", "SBCLAIM_SHUTDOWN_TIMEOUT", "SBCLAIM_LOG_FORMAT", "SBCLAIM_LOG_LEVEL"}

// validListenAddr checks a listen address: host:port with a numeric port
// (0 picks a free one) and a host that is empty, an IP address or a name.
func validListenAddr(v string) error {
	host, port, err := net.SplitHostPort(v)
	if err != nil {
		return errors.New("not host:port (e.g. :8082 or 127.0.0.1:8082)")
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("port %q is not a number from 0 to 65535", port)
	}
	if host != "" && net.ParseIP(host) == nil && strings.ContainsFunc(host, func(r rune) bool {
		return !(r == '-' || r == '.' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9')
	}) {
		return fmt.Errorf("host %q is neither an IP address nor a host name", host)
	}
	return nil
}

func consoleFlags(*flag.FlagSet) func(context.Context, *env, []string) int {
	return func(ctx context.Context, e *env, args []string) int {
		if len(args) > 0 {
			fmt.Fprintf(e.stderr, "reconciler console: unexpected arguments %q\n", args)
			return exitUsage
		}
		st, err := e.openStore(ctx)
		if err != nil {
			return e.fail("console", err)
		}
		defer st.Close()
		stop, err := e.startConsole(ctx, st)
		if err != nil {
			return e.fail("console", err)
		}
		// The probes' port: the console's own answers only operators.
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		stopHTTP, err := e.serveHTTP(st, reg)
		if err != nil {
			stop()
			return e.fail("console", err)
		}
		<-ctx.Done()
		stop()
		stopHTTP()
		return exitOK
	}
}

// startConsole binds SBCLAIM_CONSOLE_ADDR (an address it cannot bind is
// an error here, before anything is served) and serves the operator
// console until stop, which waits for actions in flight (a redrive) for up
// to SBCLAIM_SHUTDOWN_TIMEOUT.
func (e *env) startConsole(ctx context.Context, st *sbclaim.Store) (stop func(), err error) {
	routes, err := e.routes()
	if err != nil {
		return nil, err
	}
	opts := console.Options{
		Logger:        e.logger,
		LocalOperator: e.cfg.ConsoleLocalOperator, TrustIdentityHeaders: e.cfg.ConsoleTrustIdentityHeaders,
		HeartbeatInterval: e.cfg.HeartbeatInterval, StoreTimeout: e.cfg.QueryTimeout,
	}
	if e.cfg.ConsoleOIDCIssuer != "" {
		opts.OIDC = &console.OIDC{Issuer: e.cfg.ConsoleOIDCIssuer, Audience: e.cfg.ConsoleOIDCAudience,
			AllowedGroups: e.cfg.ConsoleAllowedGroups, AllowedPrincipals: e.cfg.ConsoleAllowedPrincipals}
	}
	srv, err := console.NewPublic(st, routes, opts)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", e.cfg.ConsoleAddr)
	if err != nil {
		return nil, fmt.Errorf("listen on SBCLAIM_CONSOLE_ADDR %s: %w", e.cfg.ConsoleAddr, err)
	}
	if len(routes) == 0 {
		e.logger.Warn("console: SBCLAIM_ROUTES is not set: redrive is off (resolve and the hand-off to your own binary still work)")
	}
	addr := ln.Addr().String()
	switch {
	case e.cfg.ConsoleLocalOperator != "":
		e.logger.Warn("console: LOCAL DEVELOPMENT MODE (SBCLAIM_CONSOLE_LOCAL_OPERATOR): nobody signs in; every action is recorded as "+
			strconv.Quote(e.cfg.ConsoleLocalOperator+" (local, not signed in)")+"; only requests addressed to localhost, 127.0.0.1 or [::1] are answered",
			"addr", addr)
		if host, _, _ := net.SplitHostPort(e.cfg.ConsoleAddr); host == "" || !(host == "localhost" || net.ParseIP(host).IsLoopback()) {
			e.logger.Warn("console: local development mode listens on every interface ("+e.cfg.ConsoleAddr+"): "+
				"anyone who reaches the port with a Host of localhost acts as the local operator; publish it on 127.0.0.1 only "+
				"(as docker-compose.yml does) or set SBCLAIM_CONSOLE_ADDR=127.0.0.1:8082", "addr", addr)
		}
	case e.cfg.ConsoleTrustIdentityHeaders:
		e.logger.Warn("console: INSECURE (SBCLAIM_CONSOLE_INSECURE_TRUST_IDENTITY_HEADERS): the operator is taken from the "+
			console.HeaderPrincipalName+"/-Id headers without verification; anybody who reaches this port directly can claim to be anyone. "+
			"Only behind a front that strips and sets them, on a port nothing else reaches.", "addr", addr)
	default:
		e.logger.Info("console: every request needs an ID token signed by "+e.cfg.ConsoleOIDCIssuer+" for audience "+e.cfg.ConsoleOIDCAudience+
			" ("+console.HeaderIDToken+" from the platform's sign-in, or Authorization: Bearer); identity headers alone are refused", "addr", addr,
			"allowed_groups", len(e.cfg.ConsoleAllowedGroups), "allowed_principals", len(e.cfg.ConsoleAllowedPrincipals))
		if len(e.cfg.ConsoleAllowedGroups)+len(e.cfg.ConsoleAllowedPrincipals) == 0 {
			e.logger.Warn("console: no SBCLAIM_CONSOLE_ALLOWED_GROUPS or SBCLAIM_CONSOLE_ALLOWED_PRINCIPALS: every user whose token the issuer signs for the audience may act", "addr", addr)
		}
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, ErrorLog: nil}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	go srv.Run(sctx)
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			e.logger.Error("console: http server", "err", err)
		}
	}()
	e.logger.Info("serving the operator console", "addr", ln.Addr().String())
	return func() {
		cancel()
		shctx, done := context.WithTimeout(context.Background(), e.cfg.ShutdownTimeout)
		defer done()
		if err := hs.Shutdown(shctx); err != nil {
			e.logger.Warn("console: actions still in flight at shutdown", "err", err)
		}
		<-served
		e.logger.Info("console stopped")
	}, nil
}
