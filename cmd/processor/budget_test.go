package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"

	"github.com/sbclaim/sbclaim"
)

// fakeAdmin stands in for the administration client: the entity's
// MaxDeliveryCount, or err.
type fakeAdmin struct {
	n     int32
	err   error
	calls int
}

func (f *fakeAdmin) GetQueue(context.Context, string, *admin.GetQueueOptions) (*admin.GetQueueResponse, error) {
	f.calls++
	if f.err != nil {
		return nil, f.err
	}
	return &admin.GetQueueResponse{QueueProperties: admin.QueueProperties{MaxDeliveryCount: &f.n}}, nil
}

func (f *fakeAdmin) GetSubscription(context.Context, string, string, *admin.GetSubscriptionOptions) (*admin.GetSubscriptionResponse, error) {
	f.calls++
	if f.err != nil {
		return nil, f.err
	}
	return &admin.GetSubscriptionResponse{SubscriptionProperties: admin.SubscriptionProperties{MaxDeliveryCount: &f.n}}, nil
}

type logLine struct {
	Level string `json:"level"`
	Msg   string `json:"msg"`
}

func logLines(t *testing.T, buf *bytes.Buffer) []logLine {
	t.Helper()
	var lines []logLine
	for _, raw := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if raw == "" {
			continue
		}
		var l logLine
		if err := json.Unmarshal([]byte(raw), &l); err != nil {
			t.Fatalf("log line %q: %v", raw, err)
		}
		lines = append(lines, l)
	}
	return lines
}

func TestResolveMaxDeliveryCount(t *testing.T) {
	t.Parallel()
	unauthorized := &azcore.ResponseError{StatusCode: http.StatusUnauthorized}
	for name, tc := range map[string]struct {
		configured int // 0: SBCLAIM_MAX_DELIVERY_COUNT unset
		topic      bool
		admin      *fakeAdmin
		skip       string
		want       int
		refuse     []string // in the error, when the processor must not start
		warn       []string // in the one warning, when the budget is unchecked
	}{
		"match":                     {configured: 5, admin: &fakeAdmin{n: 5}, want: 5},
		"match (subscription)":      {configured: 3, topic: true, admin: &fakeAdmin{n: 3}, want: 3},
		"unset adopts the entity's": {admin: &fakeAdmin{n: 7}, want: 7},
		"mismatch refuses": {configured: 10, admin: &fakeAdmin{n: 5},
			refuse: []string{`SBCLAIM_MAX_DELIVERY_COUNT="10"`, "entity payments has MaxDeliveryCount 5", "set SBCLAIM_MAX_DELIVERY_COUNT=5"}},
		"mismatch refuses (subscription)": {configured: 5, topic: true, admin: &fakeAdmin{n: 3},
			refuse: []string{`SBCLAIM_MAX_DELIVERY_COUNT="5"`, "entity orders/billing has MaxDeliveryCount 3"}},
		"unauthorized warns and keeps the setting": {configured: 5, admin: &fakeAdmin{err: unauthorized}, want: 5,
			warn: []string{"delivery budget not checked", "entity payments", "Manage rights", "HTTP 401", "assuming 5 (SBCLAIM_MAX_DELIVERY_COUNT)"}},
		"unauthorized and unset warns and assumes 10": {admin: &fakeAdmin{err: unauthorized}, want: 10,
			warn: []string{"delivery budget not checked", "assuming 10 (the default, SBCLAIM_MAX_DELIVERY_COUNT being unset)"}},
		"unreachable warns": {configured: 5, admin: &fakeAdmin{err: errors.New("dial tcp 10.0.0.1:443: i/o timeout")}, want: 5,
			warn: []string{"delivery budget not checked", "could not be reached", "assuming 5"}},
		"emulator warns without asking": {configured: 5, skip: emulatorSkip, want: 5,
			warn: []string{"delivery budget not checked", "development emulator", "assuming 5 (SBCLAIM_MAX_DELIVERY_COUNT)"}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := &Config{Queue: "payments", MaxDeliveryCount: tc.configured}
			if tc.topic {
				cfg = &Config{Topic: "orders", Subscription: "billing", MaxDeliveryCount: tc.configured}
			}
			var buf bytes.Buffer
			logger := slog.New(slog.NewJSONHandler(&buf, nil))
			var a sbclaim.EntityAdmin
			if tc.admin != nil {
				a = tc.admin
			}
			got, err := resolveMaxDeliveryCount(context.Background(), cfg, a, tc.skip, logger)
			if tc.admin != nil && tc.admin.calls != 1 {
				t.Errorf("%d reads of the entity, want 1", tc.admin.calls)
			}
			if tc.refuse != nil {
				var ce *ConfigError
				if !errors.As(err, &ce) || ce.Field != "SBCLAIM_MAX_DELIVERY_COUNT" {
					t.Fatalf("err = %v, want a *ConfigError about SBCLAIM_MAX_DELIVERY_COUNT", err)
				}
				for _, part := range tc.refuse {
					if !strings.Contains(err.Error(), part) {
						t.Errorf("error %q does not say %q", err, part)
					}
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %d, %v; want %d", got, err, tc.want)
			}
			var warnings []string
			for _, l := range logLines(t, &buf) {
				if l.Level == "WARN" {
					warnings = append(warnings, l.Msg)
				}
			}
			if tc.warn == nil {
				if len(warnings) != 0 {
					t.Errorf("checked budget, but warned: %q", warnings)
				}
				return
			}
			if len(warnings) != 1 {
				t.Fatalf("%d warnings, want exactly one: %q", len(warnings), warnings)
			}
			for _, part := range tc.warn {
				if !strings.Contains(warnings[0], part) {
					t.Errorf("warning %q does not say %q", warnings[0], part)
				}
			}
		})
	}
}

func TestIsEmulator(t *testing.T) {
	t.Parallel()
	for cs, want := range map[string]bool{
		"Endpoint=sb://servicebus;SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true;":  true,
		"Endpoint=sb://localhost;SharedAccessKeyName=k;SharedAccessKey=v; usedevelopmentemulator = True": true,
		"Endpoint=sb://x.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=v":                false,
		"Endpoint=sb://localhost;SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=false":   false,
	} {
		if got := isEmulator(cs); got != want {
			t.Errorf("isEmulator(%q) = %v, want %v", cs, got, want)
		}
	}
}

// SBCLAIM_MAX_DELIVERY_COUNT unset is 0 (read the entity's), not 10.
func TestMaxDeliveryCountSetting(t *testing.T) {
	t.Parallel()
	base := map[string]string{
		"SBCLAIM_DATABASE_URL":                 "sqlite:" + t.TempDir() + "/c.db",
		"SBCLAIM_SERVICEBUS_CONNECTION_STRING": "Endpoint=sb://localhost;SharedAccessKeyName=k;SharedAccessKey=v",
		"SBCLAIM_QUEUE":                        "payments",
		"SBCLAIM_CONSUMER":                     "payments",
		"SBCLAIM_ROUTES":                       "/etc/sbclaim/routes.yaml",
	}
	load := func(v string) (*Config, error) {
		env := map[string]string{}
		for k, val := range base {
			env[k] = val
		}
		if v != "" {
			env["SBCLAIM_MAX_DELIVERY_COUNT"] = v
		}
		var out bytes.Buffer
		return LoadConfig(nil, func(k string) string { return env[k] }, &out)
	}
	for v, want := range map[string]int{"": 0, "5": 5, "2000": 2000} {
		c, err := load(v)
		if err != nil || c.MaxDeliveryCount != want {
			t.Errorf("SBCLAIM_MAX_DELIVERY_COUNT=%q: got %v, %v; want %d", v, c, err, want)
		}
	}
	for _, bad := range []string{"0", "2001", "five", "-1"} {
		_, err := load(bad)
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != "SBCLAIM_MAX_DELIVERY_COUNT" {
			t.Errorf("SBCLAIM_MAX_DELIVERY_COUNT=%q: err = %v, want a *ConfigError about it", bad, err)
		}
	}
}

func TestNewEntityAdmin(t *testing.T) {
	t.Parallel()
	if a, skip := newEntityAdmin(&Config{ConnectionString: "Endpoint=sb://servicebus;SharedAccessKeyName=k;SharedAccessKey=v;UseDevelopmentEmulator=true;"}, nil); a != nil || skip != emulatorSkip {
		t.Errorf("emulator: got %v, %q; want no client and the emulator's reason", a, skip)
	}
	if a, skip := newEntityAdmin(&Config{ConnectionString: "Endpoint=sb://contoso.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=v"}, nil); a == nil || skip != "" {
		t.Errorf("connection string: got %v, %q; want a client", a, skip)
	}
}
