package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
)

// TestRetryFailedClaims: a downstream answers 401 (the API key lacked
// "Bearer "), so a tick fails every claim; after the fix `retry --failed`
// runs each once with its key, `retry` of a claim that is no longer failed
// is refused, and --note is required.
func TestRetryFailedClaims(t *testing.T) {
	eachDatabase(t, func(t *testing.T, url string) {
		fake := fakedownstream.New(fakedownstream.Options{})
		var broken atomic.Bool
		broken.Store(true)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if broken.Load() {
				http.Error(w, `{"error":{"message":"Invalid API Key provided"}}`, http.StatusUnauthorized)
				return
			}
			fake.ServeHTTP(w, r)
		}))
		t.Cleanup(srv.Close)
		routes := filepath.Join(t.TempDir(), "routes.yaml")
		writeFile(t, routes, fmt.Sprintf(`version: 1
routes:
  - name: payments
    key: raw
    match: {subject: payment}
    url: %q
    timeout: 5s
    answers:
      - {status: 401, outcome: permanent}
`, srv.URL+"/payments"))
		c := newCLI(t, map[string]string{
			"SBCLAIM_DATABASE_URL": url, "SBCLAIM_STALE_AFTER": "1s", "SBCLAIM_HEARTBEAT_INTERVAL": "300ms",
			"SBCLAIM_ROUTES": routes, "SBCLAIM_HTTP_ADDR": "127.0.0.1:0", "SBCLAIM_RECOVERY_MAX_ATTEMPTS": "1",
		})
		c.mustRun("migrate")
		st := openStore(t, url)
		var cs []*claim.Claim
		for i := range 3 {
			cs = append(cs, claimMessage(t, st, fmt.Sprintf("pay-%d", i), "payment", []byte(`{"amount":42}`), true))
		}
		waitStale(t, st, time.Second, cs...)
		c.mustRun("once")
		for _, cl := range cs {
			if got, _ := st.Get(t.Context(), cl.ID); got.State != claim.StateFailed {
				t.Fatalf("%s after the misconfigured tick: %s, want failed", cl.MessageID, got.State)
			}
		}
		if r := c.run("retry", "--failed"); r.code != exitUsage || !strings.Contains(r.stderr, "--note") {
			t.Errorf("retry without --note: %d %q", r.code, r.stderr)
		}
		broken.Store(false)
		r := c.mustRun("retry", "--failed", "--note", "API key fixed: Bearer prefix")
		if !strings.Contains(r.stdout, "3 retried, 0 refused, 0 failed again, of 3") {
			t.Errorf("retry --failed said %q", r.stdout)
		}
		for _, cl := range cs {
			got, _ := st.Get(t.Context(), cl.ID)
			if got.State != claim.StateResolved || fake.Effects(cl.MessageID) != 1 {
				t.Errorf("%s after the retry: %s, %d effects; want resolved, 1", cl.MessageID, got.State, fake.Effects(cl.MessageID))
			}
		}
		r = c.mustRun("show", strconv.FormatInt(cs[0].ID, 10))
		for _, want := range []string{"retried", "failed → claimed via operator", "API key fixed: Bearer prefix", "resolved"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("show after the retry lacks %q:\n%s", want, r.stdout)
			}
		}
		if r := c.run("retry", strconv.FormatInt(cs[0].ID, 10), "--note", "fixed"); r.code != exitFailure || !strings.Contains(r.stderr, "not failed") {
			t.Errorf("retry of a resolved claim: %d %q", r.code, r.stderr)
		}
		// Nothing is failed any more: a second bulk retry does nothing.
		if r := c.mustRun("retry", "--failed", "--note", "again"); !strings.Contains(r.stdout, "no failed claims match") {
			t.Errorf("second retry --failed said %q", r.stdout)
		}
	})
}
