package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sbclaim/sbclaim/internal/testkit/testdb"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestSIGTERMExitsZero runs the real main path (routes file, SQLite store,
// Service Bus client, HTTP endpoints), checks /healthz and /metrics, then
// sends the process SIGTERM: run must return 0 (a clean stop, not a crash
// loop on Container Apps) well within the shutdown timeout.
func TestSIGTERMExitsZero(t *testing.T) {
	dir := t.TempDir()
	routes := filepath.Join(dir, "routes.yaml")
	if err := os.WriteFile(routes, []byte("routes:\n  - name: p\n    match: {subject: p}\n    url: http://127.0.0.1:1/p\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	env := map[string]string{
		"SBCLAIM_DATABASE_URL":                 testdb.URL(t, "sqlite"),
		"SBCLAIM_SERVICEBUS_CONNECTION_STRING": "Endpoint=sb://127.0.0.1;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=" + testKey + ";UseDevelopmentEmulator=true;",
		"SBCLAIM_QUEUE":                        "payments",
		"SBCLAIM_CONSUMER":                     "billing",
		"SBCLAIM_ROUTES":                       routes,
		"SBCLAIM_HTTP_ADDR":                    addr,
		"SBCLAIM_SHUTDOWN_TIMEOUT":             "5s",
	}
	var stdout, stderr lockedBuffer
	done := make(chan int, 1)
	go func() {
		done <- run(context.Background(), nil, func(k string) string { return env[k] }, &stdout, &stderr)
	}()

	get := func(path string) int {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	deadline := time.Now().Add(30 * time.Second)
	for get("/healthz") != http.StatusOK {
		if time.Now().After(deadline) {
			t.Fatalf("/healthz never answered; output:\n%s%s", stdout.String(), stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code := get("/metrics"); code != http.StatusOK {
		t.Errorf("/metrics: %d", code)
	}
	if code := get("/readyz"); code != http.StatusOK && code != http.StatusServiceUnavailable {
		t.Errorf("/readyz: %d", code)
	}

	start := time.Now()
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit code %d after SIGTERM, want 0; output:\n%s", code, stdout.String())
		}
		t.Logf("stopped %s after SIGTERM", time.Since(start).Round(time.Millisecond))
	case <-time.After(20 * time.Second):
		t.Fatalf("still running 20s after SIGTERM; output:\n%s", stdout.String())
	}
	out := stdout.String()
	if !strings.Contains(out, "processor stopped") {
		t.Errorf("no 'processor stopped' line:\n%s", out)
	}
	if strings.Contains(out+stderr.String(), testKey) {
		t.Errorf("the connection string's key was logged")
	}
	// The emulator's MaxDeliveryCount cannot be read: one warning, and the
	// processor starts anyway (docker compose up must work).
	if n := strings.Count(out, "delivery budget not checked"); n != 1 {
		t.Errorf("%d delivery-budget warnings, want 1:\n%s", n, out)
	}
}

// TestListenerFailureExitsBeforeReceiving: when SBCLAIM_HTTP_ADDR cannot
// be bound, the processor exits non-zero naming the variable, before it
// opens a receiver (a processor nobody can probe or scrape must not
// consume messages).
func TestListenerFailureExitsBeforeReceiving(t *testing.T) {
	dir := t.TempDir()
	routes := filepath.Join(dir, "routes.yaml")
	if err := os.WriteFile(routes, []byte("routes:\n  - name: p\n    match: {subject: p}\n    url: http://127.0.0.1:1/p\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	env := map[string]string{
		"SBCLAIM_DATABASE_URL":                 testdb.URL(t, "sqlite"),
		"SBCLAIM_SERVICEBUS_CONNECTION_STRING": "Endpoint=sb://127.0.0.1;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=" + testKey + ";UseDevelopmentEmulator=true;",
		"SBCLAIM_QUEUE":                        "payments",
		"SBCLAIM_CONSUMER":                     "billing",
		"SBCLAIM_ROUTES":                       routes,
		"SBCLAIM_HTTP_ADDR":                    busy.Addr().String(),
	}
	var stdout, stderr lockedBuffer
	code := run(context.Background(), nil, func(k string) string { return env[k] }, &stdout, &stderr)
	out := stdout.String() + stderr.String()
	if code == 0 || !strings.Contains(out, "SBCLAIM_HTTP_ADDR") || !strings.Contains(out, "address already in use") {
		t.Fatalf("exit %d, output:\n%s\nwant non-zero naming SBCLAIM_HTTP_ADDR", code, out)
	}
	if strings.Contains(out, "processor started") {
		t.Errorf("the processor started receiving before its listener failed:\n%s", out)
	}
}
