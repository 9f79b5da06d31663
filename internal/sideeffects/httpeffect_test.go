package sideeffects

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
)

// fastPolicy retries quickly; the tests assert what happens, never how
// long it took.
var fastPolicy = RetryPolicy{MaxAttempts: 5, InitialInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond, Budget: time.Minute}

func oneRoute(url, extra string) string {
	return fmt.Sprintf(`
routes:
  - name: payments
    match: {subject: payment.requested}
    url: %s/payments
%s`, url, extra)
}

func TestHTTPEffectRetriesKeepTheSameIdempotencyKey(t *testing.T) {
	t.Parallel()
	b := setupFake(t, fakedownstream.Options{})
	b.fake.FailNext(2, fakedownstream.FaultErrorBefore)
	r := mustRouter(t, oneRoute(b.url, ""), nil, b.log)
	msg := newMsg("msg-1", "payment.requested", `{"amount":10}`)
	eff := mustEffect(t, r, msg)

	var attempts []int
	err := fastPolicy.Do(context.Background(), func(ctx context.Context) error {
		return eff.Perform(ctx, msg, "msg-1")
	}, func(n int, err error) {
		attempts = append(attempts, n)
		if got := Classify(err); got != OutcomeUnknown {
			t.Errorf("attempt %d: outcome %v, want unknown (500): %v", n, got, err)
		}
	})
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	if fmt.Sprint(attempts) != "[1 2]" {
		t.Errorf("failed attempts = %v, want [1 2]", attempts)
	}
	hs := b.fake.Headers("msg-1")
	if len(hs) != 3 {
		t.Fatalf("fake saw %d requests with key msg-1, want 3 (keys seen: %v)", len(hs), b.fake.Keys())
	}
	for i, h := range hs {
		if got := h.Get("Idempotency-Key"); got != "msg-1" {
			t.Errorf("request %d: Idempotency-Key = %q, want msg-1", i, got)
		}
	}
	if got := b.fake.Effects("msg-1"); got != 1 {
		t.Errorf("effects = %d, want 1", got)
	}
}

func TestHTTPEffectPerformedThenResponseLost(t *testing.T) {
	t.Parallel()
	b := setupFake(t, fakedownstream.Options{})
	// The first request is performed, then the fake hangs past the route
	// timeout: the caller cannot know the effect happened.
	b.fake.FailNext(1, fakedownstream.FaultHang)
	r := mustRouter(t, oneRoute(b.url, "    timeout: 200ms\n"), nil, b.log)
	msg := newMsg("msg-lost", "payment.requested", `{"amount":10}`)
	eff := mustEffect(t, r, msg)

	var firstErr error
	err := fastPolicy.Do(context.Background(), func(ctx context.Context) error {
		return eff.Perform(ctx, msg, "msg-lost")
	}, func(n int, err error) {
		if n == 1 {
			firstErr = err
		}
	})
	if err != nil {
		t.Fatalf("final outcome: %v (want ok)", err)
	}
	if Classify(firstErr) != OutcomeUnknown {
		t.Errorf("first attempt: outcome %v, want unknown: %v", Classify(firstErr), firstErr)
	}
	if !strings.Contains(fmt.Sprint(firstErr), "after the request was written") {
		t.Errorf("first attempt error does not say the request was written: %v", firstErr)
	}
	if got := b.fake.Effects("msg-lost"); got != 1 {
		t.Errorf("effects = %d, want 1", got)
	}
	if got := b.fake.Requests("msg-lost"); got != 2 {
		t.Errorf("requests = %d, want 2", got)
	}
}

func TestHTTPEffectDialErrorIsRetryable(t *testing.T) {
	t.Parallel()
	// A port nobody listens on: listen, note the address, close.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	logger, _ := testLogger(t)
	r := mustRouter(t, oneRoute("http://"+addr, ""), nil, logger)
	msg := newMsg("msg-dial", "payment.requested", `{}`)
	err = mustEffect(t, r, msg).Perform(context.Background(), msg, "msg-dial")
	if got := Classify(err); got != OutcomeRetryable {
		t.Fatalf("outcome %v, want retryable: %v", got, err)
	}
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "dial" {
		t.Errorf("error does not wrap the dial *net.OpError: %v", err)
	}
}

func TestHTTPEffectDNSErrorIsRetryable(t *testing.T) {
	t.Parallel()
	logger, _ := testLogger(t)
	r := mustRouter(t, oneRoute("http://sbclaim-no-such-host.invalid", ""), nil, logger)
	msg := newMsg("msg-dns", "payment.requested", `{}`)
	err := mustEffect(t, r, msg).Perform(context.Background(), msg, "msg-dns")
	if got := Classify(err); got != OutcomeRetryable {
		t.Fatalf("outcome %v, want retryable: %v", got, err)
	}
}

func TestHTTPEffect500AfterBodySentIsUnknown(t *testing.T) {
	t.Parallel()
	b := setupFake(t, fakedownstream.Options{})
	b.fake.FailNext(1, fakedownstream.FaultErrorAfter)
	r := mustRouter(t, oneRoute(b.url, ""), nil, b.log)
	msg := newMsg("msg-500", "payment.requested", `{"amount":1}`)
	err := mustEffect(t, r, msg).Perform(context.Background(), msg, "msg-500")
	if got := Classify(err); got != OutcomeUnknown {
		t.Fatalf("outcome %v, want unknown: %v", got, err)
	}
	if got := b.fake.Effects("msg-500"); got != 1 {
		t.Errorf("the fake performed %d effects, want 1 (the 500 came after the effect)", got)
	}
}

func TestHTTPEffectTimeoutBeforeConnectingIsRetryable(t *testing.T) {
	t.Parallel()
	// A context that is already over: nothing can have been sent.
	logger, _ := testLogger(t)
	b := setupFake(t, fakedownstream.Options{})
	r := mustRouter(t, oneRoute(b.url, ""), nil, logger)
	msg := newMsg("msg-ctx", "payment.requested", `{}`)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := mustEffect(t, r, msg).Perform(ctx, msg, "msg-ctx")
	if got := Classify(err); got != OutcomeRetryable {
		t.Fatalf("outcome %v, want retryable: %v", got, err)
	}
	if b.fake.Requests("msg-ctx") != 0 {
		t.Errorf("the fake saw a request")
	}
}

// TestHTTPEffectStatuses runs every row of the classification table
// through a real request.
func TestHTTPEffectStatuses(t *testing.T) {
	t.Parallel()
	var status atomic.Int64
	var retryAfter atomic.Value
	retryAfter.Store("")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if ra := retryAfter.Load().(string); ra != "" {
			w.Header().Set("Retry-After", ra)
		}
		if s := int(status.Load()); s >= 300 && s < 400 {
			w.Header().Set("Location", "http://127.0.0.1:1/elsewhere")
		}
		w.WriteHeader(int(status.Load()))
		fmt.Fprint(w, "answer body")
	}))
	t.Cleanup(srv.Close)
	logger, _ := testLogger(t)
	r := mustRouter(t, oneRoute(srv.URL, ""), nil, logger)
	msg := newMsg("msg-status", "payment.requested", `{}`)
	eff := mustEffect(t, r, msg)

	httpDate := time.Now().Add(90 * time.Second).UTC().Format(http.TimeFormat)
	tests := []struct {
		status     int
		retryAfter string
		want       Outcome
		wantAfter  time.Duration // exact, or a lower bound for HTTP dates
	}{
		{200, "", OutcomeOK, 0},
		{201, "", OutcomeOK, 0},
		{204, "", OutcomeOK, 0},
		{301, "", OutcomePermanent, 0},
		{302, "", OutcomePermanent, 0},
		{307, "", OutcomePermanent, 0},
		{400, "", OutcomePermanent, 0},
		// A configuration answer (DefaultConfigErrors): not performed,
		// and marked Misconfigured for the route's breaker.
		{401, "", OutcomeRetryable, 0},
		{403, "", OutcomeRetryable, 0},
		{404, "", OutcomePermanent, 0},
		{408, "3", OutcomeRetryable, 3 * time.Second},
		{409, "", OutcomeUnknown, 0},
		{410, "", OutcomePermanent, 0},
		{422, "", OutcomeConflict, 0},
		{429, "7", OutcomeRetryable, 7 * time.Second},
		{429, httpDate, OutcomeRetryable, 60 * time.Second},
		{429, "", OutcomeRetryable, 0},
		{500, "", OutcomeUnknown, 0},
		{501, "", OutcomeUnknown, 0},
		{502, "", OutcomeUnknown, 0},
		{503, "2", OutcomeRetryable, 2 * time.Second},
		{503, httpDate, OutcomeRetryable, 60 * time.Second},
		{504, "", OutcomeUnknown, 0},
		{599, "", OutcomeUnknown, 0},
	}
	for _, tt := range tests {
		status.Store(int64(tt.status))
		retryAfter.Store(tt.retryAfter)
		err := eff.Perform(context.Background(), msg, "msg-status")
		if got := Classify(err); got != tt.want {
			t.Errorf("status %d: outcome %v, want %v (%v)", tt.status, got, tt.want, err)
			continue
		}
		config := tt.status == 401 || tt.status == 403
		if IsMisconfigured(err) != config {
			t.Errorf("status %d: IsMisconfigured = %v, want %v (%v)", tt.status, !config, config, err)
		}
		if got := StatusOutcome(tt.status); got != tt.want && !config {
			t.Errorf("StatusOutcome(%d) = %v, want %v", tt.status, got, tt.want)
		}
		if err == nil {
			continue
		}
		if !strings.Contains(err.Error(), fmt.Sprint(tt.status)) || !strings.Contains(err.Error(), "answer body") {
			t.Errorf("status %d: error does not carry the status and body excerpt: %v", tt.status, err)
		}
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("status %d: not an *Error: %v", tt.status, err)
		}
		switch {
		case tt.retryAfter == httpDate:
			if e.RetryAfter < tt.wantAfter || e.RetryAfter > 91*time.Second {
				t.Errorf("status %d: RetryAfter = %v for an HTTP date 90s ahead", tt.status, e.RetryAfter)
			}
		case e.RetryAfter != tt.wantAfter:
			t.Errorf("status %d: RetryAfter = %v, want %v", tt.status, e.RetryAfter, tt.wantAfter)
		}
	}
}

func TestHTTPEffectRequestHeaders(t *testing.T) {
	t.Parallel()
	b := setupFake(t, fakedownstream.Options{})
	r := mustRouter(t, oneRoute(b.url, `    contentType: application/vnd.test+json
    headers:
      Authorization: {fromEnv: PAYMENTS_TOKEN}
      X-Source: {value: sbclaim-test}
`), map[string]string{"PAYMENTS_TOKEN": "Bearer s3cr3t"}, b.log)

	msg := newMsg("msg-h", "payment.requested", `{}`)
	msg.ApplicationProperties["traceparent"] = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	msg.ApplicationProperties["Diagnostic-Id"] = "diag-1"
	if err := mustEffect(t, r, msg).Perform(context.Background(), msg, "msg-h"); err != nil {
		t.Fatal(err)
	}
	ct := "text/plain"
	msg2 := newMsg("msg-h2", "payment.requested", `{}`)
	msg2.ContentType = &ct
	if err := mustEffect(t, r, msg2).Perform(context.Background(), msg2, "msg-h2"); err != nil {
		t.Fatal(err)
	}

	h := b.fake.Headers("msg-h")[0]
	want := map[string]string{
		"Idempotency-Key": "msg-h",
		"Content-Type":    "application/vnd.test+json",
		"Authorization":   "Bearer s3cr3t",
		"X-Source":        "sbclaim-test",
		"Traceparent":     "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"Diagnostic-Id":   "diag-1",
	}
	for k, v := range want {
		if got := h.Get(k); got != v {
			t.Errorf("header %s = %q, want %q", k, got, v)
		}
	}
	if got := b.fake.Headers("msg-h2")[0].Get("Content-Type"); got != "text/plain" {
		t.Errorf("the message's ContentType was not sent: %q", got)
	}
	if got := b.fake.Headers("msg-h2")[0].Get("Traceparent"); got != "" {
		t.Errorf("traceparent sent for a message without one: %q", got)
	}
}

func TestHTTPEffectSteps(t *testing.T) {
	t.Parallel()
	b := setupFake(t, fakedownstream.Options{})
	r := mustRouter(t, fmt.Sprintf(`
routes:
  - name: order
    match: {subject: order.placed}
    headers:
      X-Route: {value: order}
    steps:
      - name: reserve
        url: %[1]s/stock
      - name: charge
        method: PUT
        url: %[1]s/payments
        headers:
          X-Route: {value: order-charge}
`, b.url), nil, b.log)
	msg := newMsg("m7", "order.placed", `{"sku":"x"}`)
	eff := mustEffect(t, r, msg)

	// Step 2 fails before its effect; the retry re-sends step 1 with the
	// same key, which the downstream replays.
	b.fake.FailKey("m7:charge", 1, fakedownstream.FaultUnavailable)
	var first error
	err := fastPolicy.Do(context.Background(), func(ctx context.Context) error {
		return eff.Perform(ctx, msg, "m7")
	}, func(n int, err error) { first = err })
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	// Step 1 was performed, so even a "not performed" answer of step 2
	// makes the attempt's outcome unknown (never a release).
	if Classify(first) != OutcomeUnknown || !strings.Contains(first.Error(), "step charge") {
		t.Errorf("step 2 failure: %v (outcome %v), want unknown naming the step", first, Classify(first))
	}
	if got := b.fake.Keys(); fmt.Sprint(got) != "[m7:charge m7:reserve]" {
		t.Errorf("keys = %v", got)
	}
	if b.fake.Effects("m7:reserve") != 1 || b.fake.Requests("m7:reserve") != 2 {
		t.Errorf("step reserve: %d effects / %d requests, want 1 / 2", b.fake.Effects("m7:reserve"), b.fake.Requests("m7:reserve"))
	}
	if b.fake.Effects("m7:charge") != 1 || b.fake.Requests("m7:charge") != 2 {
		t.Errorf("step charge: %d effects / %d requests, want 1 / 2", b.fake.Effects("m7:charge"), b.fake.Requests("m7:charge"))
	}
	if got := b.fake.Headers("m7:charge")[0].Get("X-Route"); got != "order-charge" {
		t.Errorf("step header did not override the route header: %q", got)
	}
	if got := b.fake.Headers("m7:reserve")[0].Get("X-Route"); got != "order" {
		t.Errorf("route header not sent on step: %q", got)
	}

	// A conflict in step 2 after step 1 was performed is the downstream's
	// final word about step 2's key: conflict (never repeated), naming the
	// performed steps. (A permanent one is partial, unknown:
	// TestLaterStepFailureIsUnknown.)
	msg8 := newMsg("m8", "order.placed", `{"sku":"x"}`)
	// Make step 2 conflict: same key, another payload, sent first.
	req, _ := http.NewRequest(http.MethodPut, b.url+"/payments", strings.NewReader(`other`))
	req.Header.Set("Idempotency-Key", "m8:charge")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	err = eff.Perform(context.Background(), msg8, "m8")
	if Classify(err) != OutcomeConflict || !strings.Contains(err.Error(), "earlier steps were performed (reserve)") {
		t.Errorf("conflict in step 2 after step 1: %v (outcome %v), want conflict naming step reserve", err, Classify(err))
	}
}

func TestHTTPEffectNoRedirects(t *testing.T) {
	t.Parallel()
	var hits atomic.Int64
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	t.Cleanup(target.Close)
	srv := httptest.NewServer(http.RedirectHandler(target.URL, http.StatusTemporaryRedirect))
	t.Cleanup(srv.Close)
	logger, _ := testLogger(t)
	r := mustRouter(t, oneRoute(srv.URL, ""), nil, logger)
	msg := newMsg("m", "payment.requested", `{}`)
	err := mustEffect(t, r, msg).Perform(context.Background(), msg, "m")
	if Classify(err) != OutcomePermanent {
		t.Errorf("outcome %v, want permanent: %v", Classify(err), err)
	}
	if hits.Load() != 0 {
		t.Errorf("the redirect was followed")
	}
}

// BenchmarkHTTPEffectPerform measures one single-step HTTP effect against
// the in-process fake (a new key per iteration, so every call performs).
func BenchmarkHTTPEffectPerform(b *testing.B) {
	fake := fakedownstream.New(fakedownstream.Options{})
	srv := httptest.NewServer(fake)
	defer srv.Close()
	r, err := ParseRoutes([]byte(oneRoute(srv.URL, "")), nil, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	msg := newMsg("bench", "payment.requested", `{"amount":1}`)
	h, err := r.Route(msg)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	i := 0
	for b.Loop() {
		i++
		if err := h.Effect.Perform(ctx, msg, fmt.Sprint("k", i)); err != nil {
			b.Fatal(err)
		}
	}
	if fake.TotalEffects() != i {
		b.Fatalf("effects = %d, want %d", fake.TotalEffects(), i)
	}
}

// TestLaterStepFailureIsUnknown: once step 1 was performed, any failure of
// step 2 — even a "not performed" one — leaves the whole effect unknown, so
// the claim is kept rather than released.
func TestLaterStepFailureIsUnknown(t *testing.T) {
	for _, status := range []int{http.StatusServiceUnavailable, http.StatusBadRequest} {
		charge := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) }))
		notify := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(status) }))
		router, err := ParseRoutes([]byte(fmt.Sprintf(`
routes:
  - name: pay
    match: {subject: pay}
    steps:
      - {name: charge, url: %q}
      - {name: notify, url: %q}
`, charge.URL, notify.URL)), func(string) string { return "" }, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		subject := "pay"
		msg := &azservicebus.ReceivedMessage{MessageID: "m", Subject: &subject, Body: []byte("{}")}
		h, err := router.Route(msg)
		if err != nil {
			t.Fatal(err)
		}
		err = h.Effect.Perform(context.Background(), msg, "m")
		if got := Classify(err); got != OutcomeUnknown {
			t.Errorf("step 2 answered %d after step 1 was performed: outcome %v, want unknown", status, got)
		}
		charge.Close()
		notify.Close()
	}
}

// TestURLQuerySecretsNeverLeak: an API key in a route URL's query string
// (Azure Functions' ?code=) never appears in an error; nor does the path
// (TestURLPathSecretsNeverLeak).
func TestURLQuerySecretsNeverLeak(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	addr := srv.URL
	srv.Close() // a dial error: net/http quotes the URL
	router, err := ParseRoutes([]byte(fmt.Sprintf(`
routes:
  - name: fn
    match: {subject: fn}
    url: "%s/api/charge?code=SUPERSECRETKEY"
`, addr)), func(string) string { return "" }, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	subject := "fn"
	msg := &azservicebus.ReceivedMessage{MessageID: "m", Subject: &subject}
	h, _ := router.Route(msg)
	err = h.Effect.Perform(context.Background(), msg, "m")
	if err == nil {
		t.Fatal("no error from a closed port")
	}
	if strings.Contains(err.Error(), "SUPERSECRETKEY") {
		t.Errorf("error leaks the URL's key: %v", err)
	}
	if strings.Contains(err.Error(), "/api/charge") {
		t.Errorf("error shows the URL's path: %v", err)
	}
	if !strings.Contains(err.Error(), "route fn at 127.0.0.1:") {
		t.Errorf("error does not say which route and host failed: %v", err)
	}
}
