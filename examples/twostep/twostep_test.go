package twostep_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/examples/twostep"
	"github.com/sbclaim/sbclaim/sbclaimtest"
)

// api is the downstream: it creates customers and charges, keeps each
// Idempotency-Key's first answer and replays it, as Stripe does. fail
// says how the first charge request fails.
type api struct {
	fail string // "before": answer 500 without charging; "after": charge, then lose the answer

	mu        sync.Mutex
	requests  []string          // "path key", in order
	answers   map[string][]byte // by path and key
	customers int
	charges   int
	failed    bool
}

func (a *api) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	var in map[string]any
	if err := json.NewDecoder(r.Body).Decode(&in); err != nil || key == "" {
		http.Error(w, "bad request", http.StatusBadRequest)
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.requests = append(a.requests, r.URL.Path+" "+key)
	if prev, ok := a.answers[r.URL.Path+" "+key]; ok {
		w.Header().Set("Idempotent-Replayed", "true")
		w.Write(prev)
		return
	}
	var out []byte
	switch r.URL.Path {
	case "/customers":
		a.customers++
		out = fmt.Appendf(nil, `{"id":"cus_%d"}`, a.customers)
	case "/charges":
		if a.fail == "before" && !a.failed {
			a.failed = true
			http.Error(w, "internal error", http.StatusInternalServerError)
			return
		}
		a.charges++
		out = fmt.Appendf(nil, `{"id":"ch_%d","customer":%q}`, a.charges, in["customer"])
		a.answers[r.URL.Path+" "+key] = out
		if a.fail == "after" && !a.failed {
			a.failed = true
			conn, _, err := w.(http.Hijacker).Hijack() // charged; the answer is lost
			if err == nil {
				conn.Close()
			}
			return
		}
	default:
		http.NotFound(w, r)
		return
	}
	a.answers[r.URL.Path+" "+key] = out
	w.Write(out)
}

// A failure after step 1 (the charge request fails before charging, or
// charges and loses its answer): the handler is run again, step 1 is sent
// again with the same key and replayed (one customer), and step 2 is
// performed once.
func TestRetryRepeatsStepOneAndChargesOnce(t *testing.T) {
	for _, fail := range []string{"before", "after"} {
		t.Run("charge fails "+fail+" charging", func(t *testing.T) {
			t.Parallel()
			downstream := &api{fail: fail, answers: map[string][]byte{}}
			srv := httptest.NewServer(downstream)
			t.Cleanup(srv.Close)
			// No keep-alive: net/http would itself resend a request
			// carrying an Idempotency-Key that failed on a reused
			// connection, and the test wants the handler to see the
			// failure.
			hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

			router, err := sbclaim.NewRouter(sbclaim.Route{
				Name:    "customer-charge",
				Handler: twostep.Handler(&twostep.Client{BaseURL: srv.URL, HTTP: hc}),
			})
			if err != nil {
				t.Fatal(err)
			}
			store := sbclaimtest.NewStore(t)
			queue := sbclaimtest.NewQueue(nil)
			sbclaimtest.Start(t, sbclaim.ProcessorConfig{Consumer: "billing", Store: store, Router: router}, queue)
			id := "order-42"
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := queue.Send(ctx, &azservicebus.Message{MessageID: &id,
				Body: []byte(`{"order":42,"amount_cents":1999,"email":"ada@example.com"}`)}); err != nil {
				t.Fatal(err)
			}
			if err := queue.WaitIdle(ctx); err != nil {
				t.Fatal(err)
			}

			downstream.mu.Lock()
			defer downstream.mu.Unlock()
			cs, err := store.Claims(ctx, sbclaim.ClaimFilter{})
			if err != nil || len(cs) != 1 || cs[0].State != sbclaim.StateProcessed {
				t.Fatalf("claims %v (%v), want one processed", cs, err)
			}
			if downstream.customers != 1 || downstream.charges != 1 {
				t.Errorf("%d customers and %d charges, want one of each", downstream.customers, downstream.charges)
			}
			r := downstream.requests
			_, customerKey, _ := strings.Cut(r[0], " ")
			_, chargeKey, _ := strings.Cut(r[len(r)-1], " ")
			if len(r) != 4 || r[0] != r[2] || r[1] != r[3] || customerKey == chargeKey {
				t.Errorf("requests %q: want customer, charge, then both again with the same keys, the two keys distinct", r)
			}
		})
	}
}
