package sideeffects

import (
	"bytes"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
)

// syncBuffer is a goroutine-safe log sink that also echoes to t.Log.
type syncBuffer struct {
	t   testing.TB
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.t.Log(strings.TrimRight(string(p), "\n"))
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// testLogger returns a Debug logger routed to t.Log and a copy of all its
// output.
func testLogger(t testing.TB) (*slog.Logger, *syncBuffer) {
	b := &syncBuffer{t: t}
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug})), b
}

type fakeBundle struct {
	fake *fakedownstream.Server
	url  string
	logs *syncBuffer
	log  *slog.Logger
}

func setupFake(t *testing.T, opts fakedownstream.Options) *fakeBundle {
	t.Helper()
	logger, logs := testLogger(t)
	if opts.Logger == nil {
		opts.Logger = logger
	}
	fake := fakedownstream.New(opts)
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	return &fakeBundle{fake: fake, url: srv.URL, logs: logs, log: logger}
}

func newMsg(id, subject, body string) *azservicebus.ReceivedMessage {
	return &azservicebus.ReceivedMessage{
		MessageID:             id,
		Subject:               &subject,
		Body:                  []byte(body),
		ApplicationProperties: map[string]any{},
	}
}

// mustRouter parses a routes file or fails the test.
func mustRouter(t *testing.T, yml string, env map[string]string, logger *slog.Logger) *HTTPRouter {
	t.Helper()
	r, err := ParseRoutes([]byte(yml), mapEnv(env), nil, logger)
	if err != nil {
		t.Fatalf("ParseRoutes: %v", err)
	}
	return r
}

func mapEnv(env map[string]string) func(string) string {
	return func(k string) string { return env[k] }
}

// mustEffect routes msg and returns its effect.
func mustEffect(t *testing.T, r Router, msg *azservicebus.ReceivedMessage) Effect {
	t.Helper()
	h, err := r.Route(msg)
	if err != nil {
		t.Fatalf("Route: %v", err)
	}
	if h.Effect == nil {
		t.Fatalf("Route returned no Effect: %+v", h)
	}
	return h.Effect
}
