package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
)

const testKey = "c2VjcmV0LWtleS10aGF0LW11c3Qtbm90LWxlYWs="

func validEnv() map[string]string {
	return map[string]string{
		"SBCLAIM_DATABASE_URL":                 "postgres://app:hunter2@db:5432/claims?sslmode=disable",
		"SBCLAIM_SERVICEBUS_CONNECTION_STRING": "Endpoint=sb://localhost;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=" + testKey + ";UseDevelopmentEmulator=true;",
		"SBCLAIM_QUEUE":                        "payments",
		"SBCLAIM_CONSUMER":                     "billing",
		"SBCLAIM_ROUTES":                       "/etc/sbclaim/routes.yaml",
	}
}

func load(env map[string]string, args ...string) (*Config, error) {
	return LoadConfig(args, func(k string) string { return env[k] }, io.Discard)
}

func TestConfigValid(t *testing.T) {
	c, err := load(validEnv())
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxConcurrentCalls != 16 || c.ShutdownTimeout != 15*time.Second || c.StoreTimeout != 5*time.Second || c.GracePeriod != 30*time.Second || c.MaxLockRenewal != 5*time.Minute || !c.StorePayload {
		t.Errorf("defaults not applied: %+v", c)
	}
	if c.Entity() != "payments" {
		t.Errorf("entity %q", c.Entity())
	}

	// A flag wins over its variable.
	c, err = load(validEnv(), "-max-concurrent-calls", "3", "-queue", "other")
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxConcurrentCalls != 3 || c.Queue != "other" {
		t.Errorf("flags not applied: %+v", c)
	}

	env := validEnv()
	delete(env, "SBCLAIM_QUEUE")
	delete(env, "SBCLAIM_SERVICEBUS_CONNECTION_STRING")
	env["SBCLAIM_TOPIC"], env["SBCLAIM_SUBSCRIPTION"], env["SBCLAIM_SERVICEBUS_NAMESPACE"] = "orders", "billing", "contoso"
	c, err = load(env)
	if err != nil {
		t.Fatal(err)
	}
	if c.Entity() != "orders/billing" || c.Namespace != "contoso.servicebus.windows.net" {
		t.Errorf("topic config: entity %q namespace %q", c.Entity(), c.Namespace)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	tests := []struct {
		name  string
		edit  func(env map[string]string)
		field string
		value string // expected in the message, "" to skip
	}{
		{"database url missing", func(e map[string]string) { delete(e, "SBCLAIM_DATABASE_URL") }, "SBCLAIM_DATABASE_URL", ""},
		{"database url scheme", func(e map[string]string) { e["SBCLAIM_DATABASE_URL"] = "mysql://x@y/z" }, "SBCLAIM_DATABASE_URL", "mysql://x@y/z"},
		{"sqlite without path", func(e map[string]string) { e["SBCLAIM_DATABASE_URL"] = "sqlite:" }, "SBCLAIM_DATABASE_URL", ""},
		{"no service bus", func(e map[string]string) { delete(e, "SBCLAIM_SERVICEBUS_CONNECTION_STRING") }, "SBCLAIM_SERVICEBUS_CONNECTION_STRING", ""},
		{"both service bus", func(e map[string]string) { e["SBCLAIM_SERVICEBUS_NAMESPACE"] = "x" }, "SBCLAIM_SERVICEBUS_NAMESPACE", ""},
		{"connection string without endpoint", func(e map[string]string) {
			e["SBCLAIM_SERVICEBUS_CONNECTION_STRING"] = "SharedAccessKeyName=a;SharedAccessKey=" + testKey
		}, "SBCLAIM_SERVICEBUS_CONNECTION_STRING", ""},
		{"connection string without key", func(e map[string]string) {
			e["SBCLAIM_SERVICEBUS_CONNECTION_STRING"] = "Endpoint=sb://x;SharedAccessKeyName=a"
		}, "SBCLAIM_SERVICEBUS_CONNECTION_STRING", ""},
		{"bad namespace", func(e map[string]string) {
			delete(e, "SBCLAIM_SERVICEBUS_CONNECTION_STRING")
			e["SBCLAIM_SERVICEBUS_NAMESPACE"] = "a b"
		}, "SBCLAIM_SERVICEBUS_NAMESPACE", "a b"},
		{"no entity", func(e map[string]string) { delete(e, "SBCLAIM_QUEUE") }, "SBCLAIM_QUEUE", ""},
		{"queue and topic", func(e map[string]string) { e["SBCLAIM_TOPIC"] = "t" }, "SBCLAIM_QUEUE", ""},
		{"topic without subscription", func(e map[string]string) { delete(e, "SBCLAIM_QUEUE"); e["SBCLAIM_TOPIC"] = "t" }, "SBCLAIM_SUBSCRIPTION", ""},
		{"subscription without topic", func(e map[string]string) { delete(e, "SBCLAIM_QUEUE"); e["SBCLAIM_SUBSCRIPTION"] = "s" }, "SBCLAIM_TOPIC", ""},
		{"consumer missing", func(e map[string]string) { delete(e, "SBCLAIM_CONSUMER") }, "SBCLAIM_CONSUMER", ""},
		{"consumer too long", func(e map[string]string) { e["SBCLAIM_CONSUMER"] = strings.Repeat("c", 201) }, "SBCLAIM_CONSUMER", ""},
		{"routes missing", func(e map[string]string) { delete(e, "SBCLAIM_ROUTES") }, "SBCLAIM_ROUTES", ""},
		{"concurrency not a number", func(e map[string]string) { e["SBCLAIM_MAX_CONCURRENT_CALLS"] = "many" }, "SBCLAIM_MAX_CONCURRENT_CALLS", "many"},
		{"concurrency zero", func(e map[string]string) { e["SBCLAIM_MAX_CONCURRENT_CALLS"] = "0" }, "SBCLAIM_MAX_CONCURRENT_CALLS", "0"},
		{"lock renewal", func(e map[string]string) { e["SBCLAIM_MAX_LOCK_RENEWAL"] = "5 minutes" }, "SBCLAIM_MAX_LOCK_RENEWAL", "5 minutes"},
		{"sessions not a number", func(e map[string]string) { e["SBCLAIM_SESSIONS"] = "yes" }, "SBCLAIM_SESSIONS", "yes"},
		{"sessions negative", func(e map[string]string) { e["SBCLAIM_SESSIONS"] = "-1" }, "SBCLAIM_SESSIONS", "-1"},
		{"sessions beyond the limit", func(e map[string]string) { e["SBCLAIM_SESSIONS"] = "1000" }, "SBCLAIM_SESSIONS", "1000"},
		{"sessions without lock renewal", func(e map[string]string) {
			e["SBCLAIM_SESSIONS"], e["SBCLAIM_MAX_LOCK_RENEWAL"], e["SBCLAIM_LOCK_DURATION"] = "4", "0", "5m"
		}, "SBCLAIM_SESSIONS", ""},
		{"session idle timeout", func(e map[string]string) { e["SBCLAIM_SESSION_IDLE_TIMEOUT"] = "10ms" }, "SBCLAIM_SESSION_IDLE_TIMEOUT", "10ms"},
		{"heartbeat too short", func(e map[string]string) { e["SBCLAIM_HEARTBEAT_INTERVAL"] = "10ms" }, "SBCLAIM_HEARTBEAT_INTERVAL", "10ms"},
		{"takeover below three heartbeats", func(e map[string]string) { e["SBCLAIM_TAKEOVER_AFTER"] = "60s" }, "SBCLAIM_TAKEOVER_AFTER", "60s"},
		{"takeover beyond the stale window", func(e map[string]string) { e["SBCLAIM_TAKEOVER_AFTER"] = "10m" }, "SBCLAIM_STALE_AFTER", "10m"},
		{"takeover not a duration", func(e map[string]string) { e["SBCLAIM_TAKEOVER_AFTER"] = "soon" }, "SBCLAIM_TAKEOVER_AFTER", "soon"},
		{"shutdown timeout", func(e map[string]string) { e["SBCLAIM_SHUTDOWN_TIMEOUT"] = "-1s" }, "SBCLAIM_SHUTDOWN_TIMEOUT", "-1s"},
		{"shutdown timeout zero", func(e map[string]string) { e["SBCLAIM_SHUTDOWN_TIMEOUT"] = "0" }, "SBCLAIM_SHUTDOWN_TIMEOUT", "0"},
		{"shutdown budget beyond the grace period", func(e map[string]string) { e["SBCLAIM_SHUTDOWN_TIMEOUT"] = "25s" },
			"SBCLAIM_TERMINATION_GRACE_PERIOD", "25s + 5s + 5s = 35s"},
		{"shutdown budget equal to the grace period", func(e map[string]string) {
			e["SBCLAIM_SHUTDOWN_TIMEOUT"] = "10s"
			e["SBCLAIM_TERMINATION_GRACE_PERIOD"] = "20s"
		}, "SBCLAIM_SETTLE_TIMEOUT", "10s + 5s + 5s = 20s"},
		{"store timeout", func(e map[string]string) { e["SBCLAIM_STORE_TIMEOUT"] = "1ms" }, "SBCLAIM_STORE_TIMEOUT", "1ms"},
		{"concurrency beyond the pool", func(e map[string]string) { e["SBCLAIM_MAX_CONCURRENT_CALLS"] = "1000" }, "SBCLAIM_MAX_CONCURRENT_CALLS", "1000"},
		{"dedup key", func(e map[string]string) { e["SBCLAIM_DEDUP_KEY"] = "correlation-id" }, "SBCLAIM_DEDUP_KEY", "correlation-id"},
		{"dedup property empty", func(e map[string]string) { e["SBCLAIM_DEDUP_KEY"] = "property:" }, "SBCLAIM_DEDUP_KEY", ""},
		{"store payload", func(e map[string]string) { e["SBCLAIM_STORE_PAYLOAD"] = "maybe" }, "SBCLAIM_STORE_PAYLOAD", "maybe"},
		{"payload bytes", func(e map[string]string) { e["SBCLAIM_MAX_PAYLOAD_BYTES"] = "-5" }, "SBCLAIM_MAX_PAYLOAD_BYTES", "-5"},
		{"attempts", func(e map[string]string) { e["SBCLAIM_EFFECT_MAX_ATTEMPTS"] = "0" }, "SBCLAIM_EFFECT_MAX_ATTEMPTS", "0"},
		{"budget beyond renewal", func(e map[string]string) { e["SBCLAIM_EFFECT_RETRY_BUDGET"] = "10m" }, "SBCLAIM_EFFECT_RETRY_BUDGET", "10m"},
		{"http addr", func(e map[string]string) { e["SBCLAIM_HTTP_ADDR"] = "8080" }, "SBCLAIM_HTTP_ADDR", "8080"},
		{"log format", func(e map[string]string) { e["SBCLAIM_LOG_FORMAT"] = "xml" }, "SBCLAIM_LOG_FORMAT", "xml"},
		{"log level", func(e map[string]string) { e["SBCLAIM_LOG_LEVEL"] = "loud" }, "SBCLAIM_LOG_LEVEL", "loud"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := validEnv()
			tt.edit(env)
			_, err := load(env)
			if err == nil {
				t.Fatal("accepted")
			}
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("error %v is not a ConfigError", err)
			}
			if !strings.Contains(err.Error(), tt.field) {
				t.Errorf("error %q does not name %s", err, tt.field)
			}
			if tt.value != "" && !strings.Contains(err.Error(), tt.value) {
				t.Errorf("error %q does not show the bad value %q", err, tt.value)
			}
			if strings.Contains(err.Error(), testKey) || strings.Contains(err.Error(), "hunter2") {
				t.Errorf("error leaks a secret: %q", err)
			}
		})
	}
}

func TestSecretsNeverLogged(t *testing.T) {
	// A bad connection string: the error names the field, not the key.
	env := validEnv()
	env["SBCLAIM_SERVICEBUS_CONNECTION_STRING"] = "Endpoint=http://wrong;SharedAccessKeyName=a;SharedAccessKey=" + testKey
	env["SBCLAIM_DATABASE_URL"] = "ftp://app:hunter2@db/claims"
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), nil, func(k string) string { return env[k] }, &stdout, &stderr)
	if code == 0 {
		t.Fatal("started with a bad configuration")
	}
	out := stdout.String() + stderr.String()
	if !strings.Contains(out, "SBCLAIM_SERVICEBUS_CONNECTION_STRING") || !strings.Contains(out, "SBCLAIM_DATABASE_URL") {
		t.Errorf("output does not name the fields:\n%s", out)
	}
	if strings.Contains(out, testKey) || strings.Contains(out, "hunter2") {
		t.Errorf("output leaks a secret:\n%s", out)
	}

	// A valid config that fails later (routes file missing): the log lines
	// written up to the failure carry no secret either.
	env = validEnv()
	env["SBCLAIM_ROUTES"] = t.TempDir() + "/missing.yaml"
	env["SBCLAIM_LOG_LEVEL"] = "debug"
	stdout.Reset()
	stderr.Reset()
	code = run(context.Background(), nil, func(k string) string { return env[k] }, &stdout, &stderr)
	if code == 0 {
		t.Fatal("started without a routes file")
	}
	out = stdout.String() + stderr.String()
	if !strings.Contains(out, "SBCLAIM_ROUTES") {
		t.Errorf("output does not name SBCLAIM_ROUTES:\n%s", out)
	}
	if strings.Contains(out, testKey) || strings.Contains(out, "hunter2") {
		t.Errorf("output leaks a secret:\n%s", out)
	}
}

func TestHelpListsEveryVariable(t *testing.T) {
	var out bytes.Buffer
	_, err := LoadConfig([]string{"-h"}, func(string) string { return "" }, &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err = %v, want flag.ErrHelp", err)
	}
	for _, s := range configSettings(&Config{}) {
		if !strings.Contains(out.String(), s.Env) {
			t.Errorf("-h does not list %s", s.Env)
		}
		if s.Default != "" && !strings.Contains(out.String(), s.Default) {
			t.Errorf("-h does not show the default of %s (%s)", s.Env, s.Default)
		}
	}
}

var _ = slog.LevelInfo

// TestConfigRefusesAWatchShorterThanTheTakeOver: a redelivery watches a
// silent holder's claim only while it holds its message (the lock-renewal
// window, or with renewal off the lock itself); a window that does not
// outlast SBCLAIM_TAKEOVER_AFTER (plus a heartbeat, one poll) completes a
// dead holder's message instead of taking its claim over. The error names
// every setting involved, with its value.
func TestConfigRefusesAWatchShorterThanTheTakeOver(t *testing.T) {
	for _, tt := range []struct {
		name string
		env  map[string]string
		want []string
	}{
		{"renewal shorter than the take-over", map[string]string{"SBCLAIM_MAX_LOCK_RENEWAL": "1m", "SBCLAIM_EFFECT_RETRY_BUDGET": "30s"},
			[]string{`SBCLAIM_MAX_LOCK_RENEWAL="1m"`, "SBCLAIM_TAKEOVER_AFTER", "1m30s", "SBCLAIM_HEARTBEAT_INTERVAL"}},
		{"renewal off, the default lock", map[string]string{"SBCLAIM_MAX_LOCK_RENEWAL": "0"},
			[]string{"SBCLAIM_MAX_LOCK_RENEWAL", "SBCLAIM_LOCK_DURATION", "1m0s", "SBCLAIM_SETTLE_TIMEOUT", "SBCLAIM_TAKEOVER_AFTER", "1m30s"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env := validEnv()
			for k, v := range tt.env {
				env[k] = v
			}
			_, err := load(env)
			var ce *ConfigError
			if !errors.As(err, &ce) {
				t.Fatalf("err = %v, want a ConfigError", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
	env := validEnv()
	env["SBCLAIM_MAX_LOCK_RENEWAL"], env["SBCLAIM_LOCK_DURATION"] = "0", "5m"
	if _, err := load(env); err != nil {
		t.Errorf("renewal off with a 5m lock: %v", err)
	}
}
