package sbclaim_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/sbclaimtest"
)

// TestHTTPOutcomeFollowsTheRoutesFileRules: one call maps every kind of
// answer, and a Retry-After is carried to the delayed retries.
func TestHTTPOutcomeFollowsTheRoutesFileRules(t *testing.T) {
	cases := []struct {
		status     int
		retryAfter string
		outcome    sideeffects.Outcome
		config     bool
		wait       time.Duration
	}{
		{200, "", sideeffects.OutcomeOK, false, 0},
		{201, "", sideeffects.OutcomeOK, false, 0},
		{429, "120", sideeffects.OutcomeRetryable, false, 2 * time.Minute},
		{503, "", sideeffects.OutcomeRetryable, false, 0},
		{401, "", sideeffects.OutcomeRetryable, true, 0},
		{403, "", sideeffects.OutcomeRetryable, true, 0},
		{409, "7", sideeffects.OutcomeUnknown, false, 7 * time.Second},
		{422, "", sideeffects.OutcomeConflict, false, 0},
		{400, "60", sideeffects.OutcomePermanent, false, 0},
		{402, "", sideeffects.OutcomePermanent, false, 0},
		{500, "", sideeffects.OutcomeUnknown, false, 0},
		{504, "", sideeffects.OutcomeUnknown, false, 0},
	}
	for _, c := range cases {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			if c.retryAfter != "" {
				w.Header().Set("Retry-After", c.retryAfter)
			}
			w.WriteHeader(c.status)
		}))
		resp, err := http.Get(srv.URL)
		if err == nil {
			_ = resp.Body.Close()
		}
		got := sbclaim.HTTPOutcome(resp, err)
		srv.Close()
		if o := sideeffects.Classify(got); o != c.outcome {
			t.Errorf("%d: outcome %s (%v), want %s", c.status, o, got, c.outcome)
			continue
		}
		if got == nil {
			continue
		}
		var e *sideeffects.Error
		if !errors.As(got, &e) {
			t.Fatalf("%d: %T is not classified", c.status, got)
		}
		if e.Config != c.config || e.RetryAfter != c.wait {
			t.Errorf("%d: config %v, retry after %s; want %v, %s", c.status, e.Config, e.RetryAfter, c.config, c.wait)
		}
		if e.Answer == nil || e.Answer.Status != c.status {
			t.Errorf("%d: answer %+v does not carry the status", c.status, e.Answer)
		}
		if !strings.Contains(got.Error(), "HTTP ") {
			t.Errorf("%d: %q does not name the status", c.status, got)
		}
	}
}

// TestHTTPOutcomeOfATransportError: a refused connection was not
// performed; a request cut after it left may have been.
func TestHTTPOutcomeOfATransportError(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	_, err = http.Get("http://" + addr)
	if err == nil {
		t.Skip("the closed port answered")
	}
	if o := sideeffects.Classify(sbclaim.HTTPOutcome(nil, err)); o != sideeffects.OutcomeRetryable {
		t.Fatalf("refused connection: %s, want retryable", o)
	}

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		conn, _, _ := w.(http.Hijacker).Hijack()
		_ = conn.Close() // read the request, then hang up without an answer
	}))
	defer srv.Close()
	_, err = http.Get(srv.URL)
	if err == nil {
		t.Fatal("a hung-up request succeeded")
	}
	if o := sideeffects.Classify(sbclaim.HTTPOutcome(nil, err)); o != sideeffects.OutcomeUnknown {
		t.Fatalf("hung up after the request: %s, want unknown", o)
	}
	if o := sideeffects.Classify(sbclaim.HTTPOutcome(nil, context.DeadlineExceeded)); o != sideeffects.OutcomeUnknown {
		t.Fatalf("deadline: %s, want unknown", o)
	}
}

// TestNotPerformedAfterDelaysTheRetry: the delayed retry waits at least
// the handler's delay, not the route's much shorter backoff.
func TestNotPerformedAfterDelaysTheRetry(t *testing.T) {
	st, q, ran := startOneRoute(t, sbclaim.Backoff{First: time.Millisecond, Jitter: 0}, func(context.Context, *sbclaim.Delivery) error {
		return sbclaim.NotPerformedAfter(errors.New("quota spent"), time.Hour)
	})
	before := time.Now()
	send(t, q, message("m-1", "charge", `{}`))
	// DueAt is recorded once the message is deferred at the broker
	// (SetDue, after the postponement's write): wait for it.
	c := waitClaim(t, st, func(c *sbclaim.Claim) bool { return c.Postponements > 0 && c.DueAt != nil })
	if ran.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1 (the retry is an hour away)", ran.Load())
	}
	if c.DueAt == nil || c.DueAt.Before(before.Add(59*time.Minute)) {
		t.Fatalf("claim due at %v, want an hour after %v (state %s, error %q)", c.DueAt, before, c.State, c.LastError)
	}
	if !strings.Contains(c.LastError, "quota spent") {
		t.Fatalf("last error %q does not carry the handler's", c.LastError)
	}
	if e := sbclaim.NotPerformedAfter(nil, time.Minute); sideeffects.Classify(e) != sideeffects.OutcomeRetryable || !strings.Contains(e.Error(), "1m0s") {
		t.Fatalf("NotPerformedAfter(nil, 1m) = %v", e)
	}
}

// startOneRoute runs a processor with one route, "charge", whose handler
// h is counted in ran; the in-delivery retry makes one attempt.
func startOneRoute(t *testing.T, b sbclaim.Backoff, h sbclaim.HandlerFunc) (*sbclaim.Store, *sbclaimtest.Queue, *atomic.Int64) {
	t.Helper()
	st := sbclaimtest.NewStore(t)
	var ran atomic.Int64
	router, err := sbclaim.NewRouter(sbclaim.Route{Name: "charge", Match: sbclaim.MatchSubject("charge"), Backoff: b,
		Handler: func(ctx context.Context, d *sbclaim.Delivery) error {
			ran.Add(1)
			return h(ctx, d)
		}})
	if err != nil {
		t.Fatal(err)
	}
	q := sbclaimtest.NewQueue(nil)
	sbclaimtest.Start(t, sbclaim.ProcessorConfig{Consumer: "billing", Entity: "payments", Store: st, Router: router,
		Retry: sbclaim.RetryPolicy{MaxAttempts: 1}}, q)
	return st, q, &ran
}

// waitClaim polls the store's only claim until ok holds (a minute at
// most): the queue is never idle while a message waits deferred.
func waitClaim(t *testing.T, st *sbclaim.Store, ok func(*sbclaim.Claim) bool) *sbclaim.Claim {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		cs, err := st.Claims(context.Background(), sbclaim.ClaimFilter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(cs) == 1 && ok(cs[0]) {
			return cs[0]
		}
		if time.Now().After(deadline) {
			t.Fatalf("claims %+v never reached the wanted state", cs)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
