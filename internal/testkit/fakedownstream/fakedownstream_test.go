package fakedownstream

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func setup(t *testing.T, opts Options) (*Server, string) {
	t.Helper()
	opts.Logger = slog.New(slog.NewTextHandler(tWriter{t}, nil))
	s := New(opts)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return s, srv.URL
}

type answer struct {
	status   int
	body     string
	replayed bool
	header   http.Header
}

func send(t *testing.T, ctx context.Context, url, key, body string) (answer, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return answer{resp.StatusCode, string(b), resp.Header.Get("Idempotent-Replayed") == "true", resp.Header}, nil
}

func mustSend(t *testing.T, url, key, body string) answer {
	t.Helper()
	a, err := send(t, context.Background(), url, key, body)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestIdempotencySemantics(t *testing.T) {
	t.Parallel()
	s, url := setup(t, Options{})

	first := mustSend(t, url+"/payments", "k1", `{"a":1}`)
	if first.status != http.StatusCreated || first.replayed {
		t.Fatalf("first: %+v", first)
	}
	again := mustSend(t, url+"/payments", "k1", `{"a":1}`)
	if again.status != http.StatusCreated || !again.replayed || again.body != first.body {
		t.Errorf("repeat: %+v, want a replay of %q", again, first.body)
	}
	other := mustSend(t, url+"/payments", "k1", `{"a":2}`)
	if other.status != http.StatusUnprocessableEntity {
		t.Errorf("same key, other payload: %d, want 422", other.status)
	}
	// Another path is another store.
	if a := mustSend(t, url+"/emails", "k1", `{"a":2}`); a.status != http.StatusCreated || a.replayed {
		t.Errorf("other path: %+v", a)
	}
	if a := mustSend(t, url+"/payments", "", `{}`); a.status != http.StatusBadRequest {
		t.Errorf("no key: %d, want 400", a.status)
	}
	if s.Effects("k1") != 2 || s.Requests("k1") != 4 || s.TotalEffects() != 2 || s.TotalRequests() != 5 {
		t.Errorf("counts: effects %d requests %d total %d/%d", s.Effects("k1"), s.Requests("k1"), s.TotalEffects(), s.TotalRequests())
	}
	if s.EffectsAt("/payments", "k1") != 1 || s.EffectsAt("/emails", "k1") != 1 {
		t.Errorf("EffectsAt: payments %d emails %d, want 1 each", s.EffectsAt("/payments", "k1"), s.EffectsAt("/emails", "k1"))
	}
	if got := fmt.Sprint(s.Keys()); got != "[k1]" {
		t.Errorf("Keys() = %s", got)
	}
	if got := len(s.Headers("k1")); got != 4 {
		t.Errorf("Headers: %d, want 4", got)
	}

	resp, err := http.Get(url + "/_counts")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var c Counts
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
		t.Fatal(err)
	}
	if c.TotalEffects != 2 || c.Keys["k1"].Effects != 2 || c.Keys["k1"].Requests != 4 || c.Keys["k1"].Paths["/emails"] != 1 {
		t.Errorf("/_counts = %+v", c)
	}
}

func TestConcurrentSameKey(t *testing.T) {
	t.Parallel()
	s, url := setup(t, Options{Latency: 300 * time.Millisecond})
	const n = 8
	var wg sync.WaitGroup
	statuses := make([]int, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, err := send(t, context.Background(), url+"/p", "same", `{}`)
			if err != nil {
				t.Error(err)
				return
			}
			statuses[i] = a.status
		}()
	}
	wg.Wait()
	if s.Effects("same") != 1 {
		t.Errorf("effects = %d, want 1 (statuses %v)", s.Effects("same"), statuses)
	}
	created := 0
	for _, st := range statuses {
		switch st {
		case http.StatusCreated:
			created++
		case http.StatusConflict:
		default:
			t.Errorf("unexpected status %d", st)
		}
	}
	if created == 0 {
		t.Errorf("no request got 201: %v", statuses)
	}
	if s.Requests("same") != n {
		t.Errorf("requests = %d, want %d", s.Requests("same"), n)
	}
}

func TestFaults(t *testing.T) {
	t.Parallel()
	s, url := setup(t, Options{})

	s.AddFault(FaultRule{Fault: FaultUnavailable, Key: "u", Times: 1, RetryAfterSeconds: 7})
	a := mustSend(t, url, "u", `x`)
	if a.status != http.StatusServiceUnavailable || a.header.Get("Retry-After") != "7" || s.Effects("u") != 0 {
		t.Errorf("unavailable: %d Retry-After %q effects %d", a.status, a.header.Get("Retry-After"), s.Effects("u"))
	}
	if a := mustSend(t, url, "u", `x`); a.status != http.StatusCreated || s.Effects("u") != 1 {
		t.Errorf("after the fault: %d, effects %d", a.status, s.Effects("u"))
	}

	s.FailNext(1, FaultErrorBefore)
	if a := mustSend(t, url, "b", `x`); a.status != 500 || s.Effects("b") != 0 {
		t.Errorf("error-before: %d, effects %d", a.status, s.Effects("b"))
	}

	s.FailNext(1, FaultErrorAfter)
	if a := mustSend(t, url, "a", `x`); a.status != 500 || s.Effects("a") != 1 {
		t.Errorf("error-after: %d, effects %d", a.status, s.Effects("a"))
	}
	if a := mustSend(t, url, "a", `x`); a.status != http.StatusCreated || !a.replayed || s.Effects("a") != 1 {
		t.Errorf("retry after error-after: %+v, effects %d", a, s.Effects("a"))
	}

	s.FailKey("h", 1, FaultHang)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := send(t, ctx, url, "h", `x`); err == nil {
		t.Errorf("hang: got an answer")
	}
	if a := mustSend(t, url, "h", `x`); a.status != http.StatusCreated || !a.replayed || s.Effects("h") != 1 || s.Requests("h") != 2 {
		t.Errorf("after hang: %+v, effects %d requests %d", a, s.Effects("h"), s.Requests("h"))
	}

	// Global fault, then cleared over HTTP.
	s.SetFault(FaultErrorBefore)
	if a := mustSend(t, url, "g", `x`); a.status != 500 {
		t.Errorf("global: %d", a.status)
	}
	req, _ := http.NewRequest(http.MethodDelete, url+"/_faults", nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE /_faults: %v %v", resp, err)
	}
	if a := mustSend(t, url, "g", `x`); a.status != http.StatusCreated {
		t.Errorf("after clearing: %d", a.status)
	}

	// A rule added over HTTP.
	resp, err := http.Post(url+"/_faults", "application/json", strings.NewReader(`{"fault":"error-before","key":"w","times":2}`))
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("POST /_faults: %v %v", resp, err)
	}
	for i := range 3 {
		want := 500
		if i == 2 {
			want = http.StatusCreated
		}
		if a := mustSend(t, url, "w", `x`); a.status != want {
			t.Errorf("w request %d: %d, want %d", i, a.status, want)
		}
	}
	resp, err = http.Post(url+"/_faults", "application/json", strings.NewReader(`{"fault":"explode"}`))
	if err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Errorf("bad fault accepted: %v %v", resp, err)
	}
	if d := s.Duplicates(); len(d) != 0 {
		t.Errorf("duplicates: %v", d)
	}
}

func TestFaultProbabilityIsSeeded(t *testing.T) {
	t.Parallel()
	run := func() []int {
		s, url := setup(t, Options{Seed: 7})
		s.SetFaultRate(0.5, FaultErrorBefore)
		var out []int
		for i := range 40 {
			out = append(out, mustSend(t, url, fmt.Sprint("k", i), `x`).status)
		}
		return out
	}
	a, b := run(), run()
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Errorf("same seed, different faults:\n%v\n%v", a, b)
	}
	fails := 0
	for _, st := range a {
		if st == 500 {
			fails++
		}
	}
	if fails == 0 || fails == len(a) {
		t.Errorf("p=0.5 gave %d failures of %d", fails, len(a))
	}
}

func TestParseFault(t *testing.T) {
	t.Parallel()
	for f := range faultNames {
		got, err := ParseFault(f.String())
		if err != nil || got != f {
			t.Errorf("ParseFault(%q) = %v, %v", f, got, err)
		}
	}
	if _, err := ParseFault("nope"); err == nil {
		t.Error("ParseFault accepted nope")
	}
}
