package rawhttp_test

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/examples/rawhttp"
	"github.com/sbclaim/sbclaim/sbclaimtest"
)

// api is the payment API: it answers each request with the next status
// of script (then 200), and records the idempotency keys it saw.
type api struct {
	mu         sync.Mutex
	script     []int
	retryAfter string
	keys       []string
}

func (a *api) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.keys = append(a.keys, r.Header.Get("Idempotency-Key"))
	status := http.StatusOK
	if len(a.script) > 0 {
		status, a.script = a.script[0], a.script[1:]
	}
	if a.retryAfter != "" && status != http.StatusOK {
		w.Header().Set("Retry-After", a.retryAfter)
	}
	w.WriteHeader(status)
}

func (a *api) seen() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.keys...)
}

func start(t *testing.T, a *api) *rawhttp.Charger {
	t.Helper()
	srv := httptest.NewServer(a)
	t.Cleanup(srv.Close)
	return &rawhttp.Charger{URL: srv.URL, Client: srv.Client()}
}

func routerFor(t *testing.T, c *rawhttp.Charger) *sbclaim.Router {
	t.Helper()
	r, err := sbclaim.NewRouter(c.Route())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func payment(t *testing.T, id string) *azservicebus.Message {
	return sbclaimtest.Message(t, id, "payment.requested", rawhttp.Payment{Order: 42, AmountCents: 1999})
}

// TestAnswers: each answer of the payment API, one delivery each through
// sbclaimtest.Work.
func TestAnswers(t *testing.T) {
	always := func(status int) []int { return []int{status, status, status, status, status, status} }
	cases := []struct {
		name       string
		script     []int
		retryAfter string
		settlement sbclaimtest.Settlement
		outcome    sbclaim.Outcome
		state      sbclaim.ClaimState
		dueAfter   time.Duration // at least this long before the retry
	}{
		{"ok", nil, "", sbclaimtest.Completed, sbclaim.OutcomeOK, sbclaim.StateProcessed, 0},
		{"429 with Retry-After", always(429), "120", sbclaimtest.Deferred, sbclaim.OutcomeRetryable, sbclaim.StateReleased, 119 * time.Second},
		{"401", always(401), "", sbclaimtest.Deferred, sbclaim.OutcomeRetryable, sbclaim.StateReleased, 0},
		{"409 with Retry-After", always(409), "30", sbclaimtest.Deferred, sbclaim.OutcomeUnknown, sbclaim.StateReleased, 29 * time.Second},
		{"500", always(500), "", sbclaimtest.Deferred, sbclaim.OutcomeUnknown, sbclaim.StateReleased, 0},
		{"400", always(400), "", sbclaimtest.DeadLettered, sbclaim.OutcomePermanent, sbclaim.StateFailed, 0},
		{"503 then ok", []int{503}, "", sbclaimtest.Completed, sbclaim.OutcomeOK, sbclaim.StateProcessed, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := &api{script: c.script, retryAfter: c.retryAfter}
			res := sbclaimtest.Work(t, sbclaim.ProcessorConfig{Consumer: "payments", Router: routerFor(t, start(t, a))}, payment(t, "pay-1"))
			if res.Settlement != c.settlement || res.Outcome != c.outcome || res.Claim == nil || res.Claim.State != c.state {
				t.Fatalf("settlement %s, outcome %s, claim %+v; want %s, %s, %s (err %v)", res.Settlement, res.Outcome, res.Claim, c.settlement, c.outcome, c.state, res.Err)
			}
			for _, k := range a.seen() {
				if k != res.Claim.IdempotencyKey {
					t.Fatalf("the API saw key %q, the claim has %q", k, res.Claim.IdempotencyKey)
				}
			}
			if c.dueAfter > 0 && (res.Claim.DueAt == nil || time.Until(*res.Claim.DueAt) < c.dueAfter) {
				t.Fatalf("due at %v: want at least %s from now (Retry-After)", res.Claim.DueAt, c.dueAfter)
			}
		})
	}
}

// TestUnavailableThenOK: the API is unavailable for the whole first
// delivery (503 to its five attempts), then answers; the delayed retry
// charges once, with the same key. With the kit's delays it takes well
// under a second.
func TestUnavailableThenOK(t *testing.T) {
	a := &api{script: []int{503, 503, 503, 503, 503}}
	store := sbclaimtest.NewStore(t)
	queue := sbclaimtest.NewQueue(nil)
	sbclaimtest.Start(t, sbclaim.ProcessorConfig{Consumer: "payments", Store: store, Router: routerFor(t, start(t, a))}, queue)
	queue.SendAndWait(t, payment(t, "pay-1"))
	c := sbclaimtest.ClaimByKey(t, store, "pay-1")
	if c == nil || c.State != sbclaim.StateProcessed || c.Postponements != 1 {
		t.Fatalf("claim %+v: want processed after one delayed retry", c)
	}
	keys := a.seen()
	if len(keys) != 6 || keys[5] != c.IdempotencyKey || keys[0] != keys[5] {
		t.Fatalf("the API saw keys %q: want 6 requests with the claim's key", keys)
	}
}
