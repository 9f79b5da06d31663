package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claimdb"
	"github.com/sbclaim/sbclaim/internal/redact"
	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
)

// cli runs the binary's run function with an environment of its own.
type cli struct {
	t   *testing.T
	env map[string]string
}

type result struct {
	code           int
	stdout, stderr string
}

func newCLI(t *testing.T, env map[string]string) *cli {
	base := map[string]string{"SBCLAIM_LOG_FORMAT": "text", "SBCLAIM_OPERATOR": "tester"}
	for k, v := range env {
		base[k] = v
	}
	return &cli{t: t, env: base}
}

func (c *cli) run(args ...string) result {
	c.t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, func(k string) string { return c.env[k] }, &stdout, &stderr)
	r := result{code: code, stdout: stdout.String(), stderr: stderr.String()}
	c.t.Logf("reconciler %s → %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), code, r.stdout, r.stderr)
	return r
}

func (c *cli) runCtx(ctx context.Context, args ...string) result {
	c.t.Helper()
	var stdout, stderr syncBuffer
	code := run(ctx, args, func(k string) string { return c.env[k] }, &stdout, &stderr)
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

func (c *cli) mustRun(args ...string) result {
	c.t.Helper()
	r := c.run(args...)
	if r.code != exitOK {
		c.t.Fatalf("reconciler %s exited %d: %s", strings.Join(args, " "), r.code, r.stderr)
	}
	return r
}

// databases lists the URLs the CLI tests run against: a fresh SQLite file
// always, a fresh PostgreSQL database when SBCLAIM_TEST_POSTGRES_URL is set.
func eachDatabase(t *testing.T, fn func(t *testing.T, url string)) {
	t.Run("sqlite", func(t *testing.T) {
		fn(t, "sqlite:"+filepath.Join(t.TempDir(), "claims.db"))
	})
	t.Run("postgres", func(t *testing.T) {
		fn(t, freshPostgres(t))
	})
}

func openStore(t *testing.T, url string) claim.Store {
	t.Helper()
	st, err := claimdb.Open(context.Background(), url)
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// staleClaim claims a message and waits, by the database clock, until it
// is older than staleAfter; a tick then flags it.
func claimMessage(t *testing.T, st claim.Store, id, subject string, payload []byte, store bool) *claim.Claim {
	t.Helper()
	p := claim.ClaimParams{KeyForm: claim.KeyFormRaw, Owner: uuid.New(), MessageID: id, Consumer: "billing", Entity: "payments", Subject: subject,
		ContentType: "application/json", Properties: map[string]string{"tenant": "t1"},
		PayloadHash: claim.HashPayload(payload), DeliveryCount: 1}
	if store {
		p.Payload = payload
	}
	res, err := st.ClaimBatch(context.Background(), &claim.ClaimBatchParams{Host: "host-a", Claims: []claim.ClaimParams{p}})
	if err != nil || res[0].Outcome != claim.OutcomeWon {
		t.Fatalf("claim %s: %v %v", id, err, res)
	}
	return res[0].Claim
}

// waitStale polls the database clock until every claim's heartbeat is
// older than d.
func waitStale(t *testing.T, st claim.Store, d time.Duration, claims ...*claim.Claim) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for _, c := range claims {
		for {
			now, err := st.Now(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			cur, err := st.Get(context.Background(), c.ID)
			if err != nil {
				t.Fatal(err)
			}
			if now.Sub(cur.HeartbeatAt) > d+50*time.Millisecond {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("claim %d never became stale", c.ID)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func TestCLIEndToEnd(t *testing.T) {
	eachDatabase(t, func(t *testing.T, url string) {
		fake := fakedownstream.New(fakedownstream.Options{})
		srv := httptest.NewServer(fake)
		t.Cleanup(srv.Close)
		routes := filepath.Join(t.TempDir(), "routes.yaml")
		writeFile(t, routes, fmt.Sprintf("version: 1\nroutes:\n  - name: payments\n    key: raw\n    match: {subject: payment}\n    method: POST\n    url: %q\n    timeout: 5s\n    body: json\n", srv.URL+"/payments"))

		// A 1s stale window needs a 1s/3 heartbeat to pass validation.
		c := newCLI(t, map[string]string{
			"SBCLAIM_DATABASE_URL": url, "SBCLAIM_STALE_AFTER": "1s", "SBCLAIM_HEARTBEAT_INTERVAL": "300ms",
			"SBCLAIM_ROUTES": routes, "SBCLAIM_HTTP_ADDR": "127.0.0.1:0",
		})
		if r := c.mustRun("migrate"); !strings.Contains(r.stdout, "up to date") {
			t.Errorf("migrate said %q", r.stdout)
		}
		c.mustRun("migrate") // idempotent

		st := openStore(t, url)
		ctx := context.Background()
		payload := []byte(`{"amount":42,"currency":"EUR"}`)
		toResolve := claimMessage(t, st, "msg-resolve", "payment", payload, true)
		toRedrive := claimMessage(t, st, "msg-redrive", "payment", payload, true)
		noPayload := claimMessage(t, st, "msg-nopayload", "payment", payload, false)
		live := claimMessage(t, st, "msg-live", "payment", payload, true)

		// The original attempt of msg-redrive performed the effect, then
		// died before MarkProcessed: the downstream has it, the claim is
		// claimed and goes stale.
		postEffect(t, srv.URL+"/payments", toRedrive.MessageID, payload)
		waitStale(t, st, time.Second, toResolve, toRedrive, noPayload)
		if err := st.Heartbeat(ctx, &claim.HeartbeatParams{ID: live.ID, Owner: live.Owner}); err != nil {
			t.Fatal(err)
		}
		// Without SBCLAIM_ROUTES recovery is off (and said so): every
		// stale claim goes to operators.
		delete(c.env, "SBCLAIM_ROUTES")
		if r := c.mustRun("once"); !strings.Contains(r.stderr, "recovery is off") {
			t.Errorf("once without routes does not say recovery is off: %q", r.stderr)
		}
		c.env["SBCLAIM_ROUTES"] = routes
		for _, id := range []int64{toResolve.ID, toRedrive.ID, noPayload.ID} {
			if got, _ := st.Get(ctx, id); got.State != claim.StateFlagged {
				t.Fatalf("claim %d is %s after once, want flagged", id, got.State)
			}
		}

		// list: the flagged claims, as a table and as JSON.
		r := c.mustRun("list")
		for _, want := range []string{"ID", "STATE", "msg-resolve", "msg-redrive", "msg-nopayload", "flagged"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("list table lacks %q", want)
			}
		}
		if strings.Contains(r.stdout, "msg-live") {
			t.Error("list (flagged by default) shows the live claim")
		}
		r = c.mustRun("list", "--json")
		var listed []map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &listed); err != nil {
			t.Fatalf("list --json: %v", err)
		}
		if len(listed) != 3 || listed[0]["message_id"] != "msg-resolve" || listed[0]["state"] != "flagged" ||
			listed[0]["flag_reason"] == "" || listed[0]["payload_hash"] != fmt.Sprintf("%x", claim.HashPayload(payload)) {
			t.Errorf("list --json = %v", listed)
		}
		r = c.mustRun("list", "--state", "claimed", "--json")
		if err := json.Unmarshal([]byte(r.stdout), &listed); err != nil || len(listed) != 1 || listed[0]["message_id"] != "msg-live" {
			t.Errorf("list --state claimed = %v (%v)", listed, err)
		}
		r = c.mustRun("list", "--state", "all", "--consumer", "nobody")
		if !strings.Contains(r.stdout, "no matching claims") {
			t.Errorf("empty list said %q", r.stdout)
		}
		if r := c.run("list", "--state", "bogus"); r.code != exitUsage || !strings.Contains(r.stderr, "bogus") {
			t.Errorf("list --state bogus: %d %q", r.code, r.stderr)
		}

		// show: everything about one claim.
		r = c.mustRun("show", strconv.FormatInt(toResolve.ID, 10))
		for _, want := range []string{"msg-resolve", "billing", "flagged", "heartbeat at:", "ago", "sha256:" + fmt.Sprintf("%x", claim.HashPayload(payload)),
			`{\"amount\":42`, "History (one row per change", "claimed", "tenant=t1"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("show lacks %q", want)
			}
		}
		if r := c.mustRun("show", strconv.FormatInt(noPayload.ID, 10)); !strings.Contains(r.stdout, "(not stored)") {
			t.Error("show of a claim without payload does not say (not stored)")
		}
		if r := c.run("show", "999999"); r.code != exitFailure || !strings.Contains(r.stderr, "not found") {
			t.Errorf("show of a missing claim: %d %q", r.code, r.stderr)
		}

		// resolve: note required, then done, then a second resolve refused.
		id := strconv.FormatInt(toResolve.ID, 10)
		if r := c.run("resolve", id, "--as", "done"); r.code != exitUsage || !strings.Contains(r.stderr, "--note") {
			t.Errorf("resolve without note: %d %q", r.code, r.stderr)
		}
		if r := c.run("resolve", id, "--as", "redriven", "--note", "x"); r.code != exitUsage {
			t.Errorf("resolve --as redriven: %d, want usage error", r.code)
		}
		c.mustRun("resolve", id, "--as", "done", "--note", "refund confirmed in the PSP dashboard", "--by", "alice")
		got, _ := st.Get(ctx, toResolve.ID)
		if got.State != claim.StateResolved || got.Resolution != claim.ResolutionDone || got.ResolvedBy != "alice" ||
			got.ResolutionNote != "refund confirmed in the PSP dashboard" || got.ResolvedAt == nil {
			t.Errorf("after resolve: %+v", got)
		}
		r = c.run("resolve", id, "--as", "discarded", "--note", "again")
		if r.code != exitFailure || !strings.Contains(r.stderr, "refused") || !strings.Contains(r.stderr, "alice") {
			t.Errorf("second resolve: %d %q, want a refusal naming who resolved it", r.code, r.stderr)
		}
		r = c.mustRun("show", id)
		for _, want := range []string{"resolved", "by alice", "flagged → resolved: done: refund confirmed", "flagged"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("show after resolve lacks %q in the audit trail", want)
			}
		}

		// redrive: the downstream already performed the effect; the
		// redrive sends the same key and the downstream replays it.
		r = c.mustRun("redrive", strconv.FormatInt(toRedrive.ID, 10))
		if !strings.Contains(r.stdout, "redriven") {
			t.Errorf("redrive said %q", r.stdout)
		}
		if e, n := fake.Effects(toRedrive.MessageID), fake.Requests(toRedrive.MessageID); e != 1 || n != 2 {
			t.Errorf("downstream: %d effect(s), %d request(s) for %s; want 1 effect, 2 requests", e, n, toRedrive.MessageID)
		}
		got, _ = st.Get(ctx, toRedrive.ID)
		if got.State != claim.StateResolved || got.Resolution != claim.ResolutionRedriven || got.ProcessedAt == nil || got.ResolvedBy != "tester" {
			t.Errorf("after redrive: %+v", got)
		}
		if r := c.run("redrive", strconv.FormatInt(toRedrive.ID, 10)); r.code != exitFailure || !strings.Contains(r.stderr, "resolved (redriven by tester") ||
			!strings.Contains(r.stderr, "nothing was changed") {
			t.Errorf("second redrive: %d %q", r.code, r.stderr)
		}
		if r := c.run("redrive", strconv.FormatInt(noPayload.ID, 10)); r.code != exitFailure || !strings.Contains(r.stderr, "payload was not stored") {
			t.Errorf("redrive without payload: %d %q", r.code, r.stderr)
		}
		if n := fake.TotalRequests(); n != 2 {
			t.Errorf("refused redrives reached the downstream: %d requests in all", n)
		}
	})
}

// TestOnceRecoversWithRoutes: with the processors' routes, a tick takes
// stale claims over and re-runs them with the same idempotency key; only
// what it cannot re-run (no stored payload) is flagged, with a reason.
func TestOnceRecoversWithRoutes(t *testing.T) {
	eachDatabase(t, func(t *testing.T, url string) {
		fake := fakedownstream.New(fakedownstream.Options{})
		srv := httptest.NewServer(fake)
		t.Cleanup(srv.Close)
		routes := filepath.Join(t.TempDir(), "routes.yaml")
		writeFile(t, routes, fmt.Sprintf("version: 1\nroutes:\n  - name: payments\n    key: raw\n    match: {subject: payment}\n    url: %q\n    body: json\n", srv.URL+"/payments"))
		c := newCLI(t, map[string]string{
			"SBCLAIM_DATABASE_URL": url, "SBCLAIM_STALE_AFTER": "1s", "SBCLAIM_HEARTBEAT_INTERVAL": "300ms",
			"SBCLAIM_ROUTES": "billing=" + routes, "SBCLAIM_HTTP_ADDR": "127.0.0.1:0",
		})
		c.mustRun("migrate")
		st := openStore(t, url)
		ctx := context.Background()
		payload := []byte(`{"amount":42}`)
		performed := claimMessage(t, st, "msg-performed", "payment", payload, true)
		notYet := claimMessage(t, st, "msg-not-yet", "payment", payload, true)
		noPayload := claimMessage(t, st, "msg-nopayload", "payment", payload, false)
		postEffect(t, srv.URL+"/payments", performed.MessageID, payload) // the crashed attempt got this far
		waitStale(t, st, time.Second, performed, notYet, noPayload)
		r := c.mustRun("once")
		if !strings.Contains(r.stderr, "recovery on") {
			t.Errorf("once with routes does not say recovery is on: %q", r.stderr)
		}
		for _, cl := range []*claim.Claim{performed, notYet} {
			got, _ := st.Get(ctx, cl.ID)
			if got.State != claim.StateProcessed || got.TakeOverPath != claim.PathReconciler || got.Recoveries != 1 {
				t.Errorf("%s after once: %s, path %q, recoveries %d; want processed by the reconciler's recovery", cl.MessageID, got.State, got.TakeOverPath, got.Recoveries)
			}
			if e := fake.Effects(cl.MessageID); e != 1 {
				t.Errorf("%s: %d effects, want exactly 1 (the same key)", cl.MessageID, e)
			}
		}
		got, _ := st.Get(ctx, noPayload.ID)
		if got.State != claim.StateFlagged || !strings.Contains(got.FlagReason, "no stored payload") {
			t.Errorf("no payload: %s %q; want flagged with the reason", got.State, got.FlagReason)
		}
		for _, bad := range []string{"billing=", "=x.yaml", "a=x.yaml,a=y.yaml"} {
			c.env["SBCLAIM_ROUTES"] = bad
			if r := c.run("once"); r.code != exitUsage || !strings.Contains(r.stderr, "SBCLAIM_ROUTES") {
				t.Errorf("SBCLAIM_ROUTES=%q: %d %q, want a usage error naming the variable", bad, r.code, r.stderr)
			}
		}
	})
}

func TestOnceExitCodes(t *testing.T) {
	eachDatabase(t, func(t *testing.T, url string) {
		c := newCLI(t, map[string]string{"SBCLAIM_DATABASE_URL": url})
		c.mustRun("migrate")
		c.mustRun("once")
	})
	t.Run("sqlite in a missing directory", func(t *testing.T) {
		c := newCLI(t, map[string]string{"SBCLAIM_DATABASE_URL": "sqlite:" + filepath.Join(t.TempDir(), "no", "such", "dir", "claims.db")})
		if r := c.run("once"); r.code == exitOK {
			t.Fatal("once succeeded on an unreachable database")
		}
	})
	t.Run("postgres on a closed port", func(t *testing.T) {
		c := newCLI(t, map[string]string{"SBCLAIM_DATABASE_URL": "postgres://sbclaim:hunter2secret@127.0.0.1:1/sbclaim?sslmode=disable&connect_timeout=2"})
		r := c.run("once")
		if r.code == exitOK {
			t.Fatal("once succeeded on an unreachable database")
		}
		if strings.Contains(r.stderr, "hunter2secret") {
			t.Errorf("the database password leaked into the output: %s", r.stderr)
		}
	})
}

func TestShowPayloadPreviewIsSafe(t *testing.T) {
	url := "sqlite:" + filepath.Join(t.TempDir(), "claims.db")
	c := newCLI(t, map[string]string{"SBCLAIM_DATABASE_URL": url})
	c.mustRun("migrate")
	st := openStore(t, url)
	payload := append([]byte("\x1b[31mred\x07\x00"), bytes.Repeat([]byte("A"), 400)...)
	cl := claimMessage(t, st, "bin\x1b]0;title\x07", "payment", payload, true)
	r := c.mustRun("show", strconv.FormatInt(cl.ID, 10))
	if strings.ContainsAny(r.stdout, "\x1b\x07\x00") {
		t.Errorf("show printed raw control characters: %q", r.stdout)
	}
	for _, want := range []string{`\x1b[31mred\a\x00`, "truncated", "first 200 of 410 bytes", `bin\x1b]0;title\a`} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("show lacks %q", want)
		}
	}
	r = c.mustRun("list", "--state", "claimed")
	if strings.ContainsAny(r.stdout, "\x1b\x07") {
		t.Errorf("list printed raw control characters: %q", r.stdout)
	}
}

func TestConfigValidation(t *testing.T) {
	url := "sqlite:" + filepath.Join(t.TempDir(), "claims.db")
	cases := []struct {
		name  string
		env   map[string]string
		field string
		want  []string
	}{
		{"retention below the redelivery window", map[string]string{"SBCLAIM_RETENTION": "5m"},
			"SBCLAIM_RETENTION", []string{`"5m0s"`, "1m0s × 10 = 10m0s", "redeliver"}},
		{"retention with custom lock settings", map[string]string{"SBCLAIM_RETENTION": "1h", "SBCLAIM_LOCK_DURATION": "5m", "SBCLAIM_MAX_DELIVERY_COUNT": "20"},
			"SBCLAIM_RETENTION", []string{"5m0s × 20 = 1h40m0s"}},
		{"stale-after not comfortably above the heartbeat", map[string]string{"SBCLAIM_STALE_AFTER": "1m"},
			"SBCLAIM_STALE_AFTER", []string{`"1m0s"`, "3 × 30s = 1m30s"}},
		{"bad duration", map[string]string{"SBCLAIM_STALE_AFTER": "5 minutes"},
			"SBCLAIM_STALE_AFTER", []string{`"5 minutes"`, "not a duration"}},
		{"negative duration", map[string]string{"SBCLAIM_RETENTION": "-1h"},
			"SBCLAIM_RETENTION", []string{"must be positive"}},
		{"bad cron spec", map[string]string{"SBCLAIM_RECONCILE_SCHEDULE": "every minute"},
			"SBCLAIM_RECONCILE_SCHEDULE", []string{`"every minute"`, "cron"}},
		{"zero flag batch", map[string]string{"SBCLAIM_FLAG_BATCH_SIZE": "0"},
			"SBCLAIM_FLAG_BATCH_SIZE", []string{"at least 1"}},
		{"zero purge batch", map[string]string{"SBCLAIM_PURGE_BATCH_SIZE": "0"},
			"SBCLAIM_PURGE_BATCH_SIZE", []string{"at least 1"}},
		{"bad log format", map[string]string{"SBCLAIM_LOG_FORMAT": "xml"},
			"SBCLAIM_LOG_FORMAT", []string{"json or text"}},
		{"missing database", map[string]string{"SBCLAIM_DATABASE_URL": ""},
			"SBCLAIM_DATABASE_URL", []string{"required"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{"SBCLAIM_DATABASE_URL": url}
			for k, v := range tc.env {
				env[k] = v
			}
			c := newCLI(t, env)
			cmds := []string{"once", "run"}
			if tc.field == "SBCLAIM_RECONCILE_SCHEDULE" {
				cmds = []string{"run"} // once has no schedule
			}
			for _, cmd := range cmds {
				r := c.run(cmd)
				if r.code != exitUsage {
					t.Fatalf("%s exited %d, want %d", cmd, r.code, exitUsage)
				}
				for _, want := range append([]string{tc.field}, tc.want...) {
					if !strings.Contains(r.stderr, want) {
						t.Errorf("%s: error lacks %q", cmd, want)
					}
				}
			}
			// The same check through the API: a *ConfigError naming the field.
			fs := newFlagSet()
			cf := bindConfig(fs, func(k string) string { return env[k] }, nil)
			cfg, err := cf.load()
			if err == nil {
				err = cfg.Validate()
			}
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field {
				t.Errorf("config error = %v, want a *ConfigError for %s", err, tc.field)
			}
		})
	}
	t.Run("defaults are valid", func(t *testing.T) {
		cf := bindConfig(newFlagSet(), func(k string) string {
			if k == "SBCLAIM_DATABASE_URL" {
				return url
			}
			return ""
		}, nil)
		cfg, err := cf.load()
		if err == nil {
			err = cfg.Validate()
		}
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Retention != 168*time.Hour || cfg.StaleAfter != 5*time.Minute || cfg.Schedule != "@every 1m" ||
			cfg.FlagBatchSize != 100 || cfg.PurgeBatchSize != 500 || cfg.HTTPAddr != ":8081" || cfg.LogFormat != "json" {
			t.Errorf("defaults = %+v", cfg)
		}
	})
	t.Run("flags override the environment", func(t *testing.T) {
		fs := newFlagSet()
		cf := bindConfig(fs, func(k string) string {
			return map[string]string{"SBCLAIM_DATABASE_URL": url, "SBCLAIM_RETENTION": "5m"}[k]
		}, nil)
		if err := fs.Parse([]string{"--retention", "720h"}); err != nil {
			t.Fatal(err)
		}
		cfg, err := cf.load()
		if err != nil || cfg.Retention != 720*time.Hour || cfg.Validate() != nil {
			t.Errorf("retention = %s (%v)", cfg.Retention, err)
		}
	})
}

func TestSecretsNeverPrinted(t *testing.T) {
	const secret = "pa55-w0rd!"
	for _, url := range []string{
		"postgres://sbclaim:" + secret + "@127.0.0.1:1/sbclaim?sslmode=disable&connect_timeout=2",
		"postgres://127.0.0.1:1/sbclaim?sslmode=disable&connect_timeout=2&password=" + secret,
		"sqlserver://sa:" + secret + "@127.0.0.1:1?database=claims&dial+timeout=2",
		"mysql://root:" + secret + "@db/claims", // rejected by validation, value shown redacted
	} {
		c := newCLI(t, map[string]string{"SBCLAIM_DATABASE_URL": url, "SBCLAIM_LOG_LEVEL": "debug"})
		for _, args := range [][]string{{"once"}, {"list"}, {"migrate"}, {"-h"}, {"list", "-h"}} {
			r := c.run(args...)
			if strings.Contains(r.stdout+r.stderr, secret) {
				t.Errorf("reconciler %v with %s printed the password:\n%s%s", args, redact.URL(url), r.stdout, r.stderr)
			}
		}
	}
}

func TestHelp(t *testing.T) {
	c := newCLI(t, map[string]string{"SBCLAIM_STALE_AFTER": "10m"})
	r := c.run("-h")
	if r.code != exitOK {
		t.Fatalf("-h exited %d", r.code)
	}
	for _, want := range []string{"run", "once", "migrate", "list", "show", "resolve", "redrive",
		"SBCLAIM_DATABASE_URL", "SBCLAIM_RECONCILE_SCHEDULE", "@every 1m", "SBCLAIM_RETENTION", "168h",
		"SBCLAIM_HTTP_ADDR", ":8081", "SBCLAIM_STALE_AFTER", `"10m"`} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("-h lacks %q", want)
		}
	}
	r = c.run("resolve", "-h")
	for _, want := range []string{"-as", "-note", "-by", "SBCLAIM_OPERATOR", "SBCLAIM_DATABASE_URL"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("resolve -h lacks %q", want)
		}
	}
	if r.code != exitOK {
		t.Errorf("resolve -h exited %d", r.code)
	}
	if r := c.run("frobnicate"); r.code != exitUsage {
		t.Errorf("unknown command exited %d", r.code)
	}
	if r := c.run(); r.code != exitUsage {
		t.Errorf("no command exited %d", r.code)
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

// The daemon serves /healthz, /readyz and /metrics, ticks on its
// schedule, and exits 0 when its context ends (SIGTERM).
func TestRunDaemon(t *testing.T) {
	url := "sqlite:" + filepath.Join(t.TempDir(), "claims.db")
	addr := freeAddr(t)
	c := newCLI(t, map[string]string{
		"SBCLAIM_DATABASE_URL": url, "SBCLAIM_HTTP_ADDR": addr, "SBCLAIM_RECONCILE_SCHEDULE": "@every 1s",
		"SBCLAIM_STALE_AFTER": "1s", "SBCLAIM_HEARTBEAT_INTERVAL": "300ms",
	})
	c.mustRun("migrate")
	st := openStore(t, url)
	stale := claimMessage(t, st, "daemon-1", "payment", []byte(`{}`), true)

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan result, 1)
	go func() { done <- c.runCtx(ctx, "run") }()

	// The tick flags the stale claim; /metrics reports it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		body, code := httpGet("http://" + addr + "/metrics")
		if code == 200 && strings.Contains(body, "sbclaim_reconciler_flagged_total 1") && strings.Contains(body, "sbclaim_claims_flagged 1") {
			for _, name := range []string{"sbclaim_claims_unfinished", "sbclaim_claims_oldest_unfinished_age_seconds",
				"sbclaim_reconciler_purged_total", "sbclaim_reconciler_tick_duration_seconds_count", "sbclaim_reconciler_tick_errors_total 0"} {
				if !strings.Contains(body, name) {
					t.Errorf("/metrics lacks %s", name)
				}
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the daemon never flagged the stale claim; last /metrics (%d):\n%s", code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got, _ := st.Get(context.Background(), stale.ID); got.State != claim.StateFlagged {
		t.Errorf("claim is %s, want flagged", got.State)
	}
	if body, code := httpGet("http://" + addr + "/healthz"); code != 200 || !strings.Contains(body, "ok") {
		t.Errorf("/healthz = %d %q", code, body)
	}
	if body, code := httpGet("http://" + addr + "/readyz"); code != 200 || !strings.Contains(body, "ready") {
		t.Errorf("/readyz = %d %q", code, body)
	}

	cancel()
	select {
	case r := <-done:
		if r.code != exitOK {
			t.Fatalf("run exited %d: %s", r.code, r.stderr)
		}
		for _, want := range []string{"reconciler started", "claim flagged for operators", "daemon-1", "reconciler stopped"} {
			if !strings.Contains(r.stderr, want) {
				t.Errorf("daemon log lacks %q:\n%s", want, r.stderr)
			}
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run did not stop after its context ended")
	}
}

func httpGet(url string) (string, int) {
	resp, err := http.Get(url)
	if err != nil {
		return err.Error(), 0
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b), resp.StatusCode
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// syncBuffer is a bytes.Buffer safe for the daemon's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"plain":         "plain",
		"tab\there":     `tab\there`,
		"\x1b[2J":       `\x1b[2J`,
		"日本語のメッセージID":   "日本語のメッセージID",
		"\u202egnp.exe": `\u202egnp.exe`,
	} {
		if got := printable(in, 0); got != want {
			t.Errorf("printable(%q) = %q, want %q", in, got, want)
		}
	}
	if got := printable("日本語のメッセージIDです", 8); got != "日本語のメ..." {
		t.Errorf("truncation = %q, want whole runes", got)
	}
}

// TestRunListenerFailureExitsBeforeScheduling: `reconciler run` whose
// SBCLAIM_HTTP_ADDR cannot be bound exits non-zero, naming the variable,
// before its first tick is scheduled.
func TestRunListenerFailureExitsBeforeScheduling(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	url := "sqlite:" + filepath.Join(t.TempDir(), "claims.db")
	c := newCLI(t, map[string]string{"SBCLAIM_DATABASE_URL": url, "SBCLAIM_HTTP_ADDR": busy.Addr().String()})
	c.mustRun("migrate")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := c.runCtx(ctx, "run")
	if r.code == exitOK || !strings.Contains(r.stderr, "SBCLAIM_HTTP_ADDR") {
		t.Fatalf("run with a busy port: exit %d, stderr %q; want a failure naming SBCLAIM_HTTP_ADDR", r.code, r.stderr)
	}
	if strings.Contains(r.stderr, "reconciler started") {
		t.Errorf("the reconciler scheduled ticks before its listener failed: %q", r.stderr)
	}
	if ctx.Err() != nil {
		t.Error("run did not return before the context ended: it kept running")
	}
}

// pingStore is a claims store whose Ping answers err.
type pingStore struct{ err error }

func (s pingStore) Ping(context.Context) error { return s.err }

// TestDaemonHealthAndReadiness: /healthz says the process serves (a
// liveness probe must not restart the reconciler for a database outage);
// /readyz says whether the database answers (the compose file and the
// README point the readiness check at it).
func TestDaemonHealthAndReadiness(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ping            error
		healthz, readyz int
	}{
		{nil, 200, 200},
		{errors.New("database unreachable"), 200, 503},
	} {
		srv := httptest.NewServer(httpHandler(pingStore{err: tc.ping}, prometheus.NewRegistry()))
		for path, want := range map[string]int{"/healthz": tc.healthz, "/readyz": tc.readyz, "/metrics": 200} {
			if body, code := httpGet(srv.URL + path); code != want {
				t.Errorf("database ping %v: %s = %d %q, want %d", tc.ping, path, code, body, want)
			}
		}
		srv.Close()
	}
}
