package main

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"sync"
	"testing"

	"github.com/stripe/stripe-go/v82"
	"github.com/stripe/stripe-mock/embedded"
	"github.com/stripe/stripe-mock/server"
)

// declinedAmount is the amount the test API declines, as Stripe declines
// the test card 4000 0000 0000 0002.
const declinedAmount = 402

// failedAmount is the amount the test API fails inside, with a 500 it
// stores under the key and replays, as Stripe does.
const failedAmount = 500

// stripeAPI is Stripe's API for the tests: Stripe's official stripe-mock,
// run in-process (it checks every request against Stripe's OpenAPI spec
// and answers with Stripe's fixtures), behind the two things stripe-mock
// does not do (it is stateless): Idempotency-Key replay, as Stripe keeps
// a key's first answer and replays it, and a card decline.
type stripeAPI struct {
	mock http.Handler

	mu       sync.Mutex
	requests []string             // the Idempotency-Key of each POST /v1/payment_intents
	answers  map[string]*recorded // by Idempotency-Key
	charges  int                  // PaymentIntents stripe-mock created
	declines int
	replays  int
	limit    int // answer this many requests 429 before doing anything
	// Answer this many requests before doing anything (nothing is stored
	// under the key): unauthorized with 401 (a wrong or rotated API key),
	// inUse with 409 idempotency_key_in_use (another request with the key
	// is still running), conflict with 400 idempotency_error (the key was
	// used with other parameters).
	unauthorized, inUse, conflict int
}

type recorded struct {
	status int
	body   []byte
	form   string
}

var (
	stubOnce sync.Once
	stub     *server.StubServer
	stubErr  error
)

// newStripe starts the test API on 127.0.0.1 and returns it with a stripe-go
// client pointed at it (no network retries: sbclaim retries).
func newStripe(t *testing.T) (*stripeAPI, *stripe.Client) {
	t.Helper()
	stubOnce.Do(func() {
		spec, err := server.LoadSpec(embedded.OpenAPISpec, "")
		if err != nil {
			stubErr = err
			return
		}
		fixtures, err := server.LoadFixtures(embedded.OpenAPIFixtures, "")
		if err != nil {
			stubErr = err
			return
		}
		stub, stubErr = server.NewStubServer(fixtures, spec, false, false)
	})
	if stubErr != nil {
		t.Fatalf("stripe-mock: %v", stubErr)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", stub.HandleRequest)
	api := &stripeAPI{mock: &server.DoubleSlashFixHandler{Mux: mux}, answers: map[string]*recorded{}}
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)

	sc := stripe.NewClient("sk_test_sbclaim", stripe.WithBackends(stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		URL:               stripe.String(srv.URL),
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})))
	return api, sc
}

func (a *stripeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/payment_intents" {
		a.mock.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	form, _ := url.ParseQuery(string(body))
	key := r.Header.Get("Idempotency-Key")

	a.mu.Lock() // one request at a time: Stripe locks a key while it runs
	defer a.mu.Unlock()
	a.requests = append(a.requests, key)
	switch {
	case a.limit > 0:
		a.limit--
		writeError(w, http.StatusTooManyRequests, "invalid_request_error", "rate_limit", nil)
		return // nothing done, nothing stored under the key
	case a.unauthorized > 0:
		a.unauthorized--
		writeError(w, http.StatusUnauthorized, "invalid_request_error", "", nil)
		return
	case a.inUse > 0:
		a.inUse--
		writeError(w, http.StatusConflict, "invalid_request_error", "idempotency_key_in_use", nil)
		return
	case a.conflict > 0:
		a.conflict--
		writeError(w, http.StatusBadRequest, "idempotency_error", "", nil)
		return
	}
	if prev, ok := a.answers[key]; ok && key != "" {
		if prev.form != form.Encode() {
			writeError(w, http.StatusBadRequest, "idempotency_error", "", nil)
			return
		}
		a.replays++
		w.Header().Set("Idempotent-Replayed", "true")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(prev.status)
		w.Write(prev.body)
		return
	}

	rec := httptest.NewRecorder()
	if amount, _ := strconv.Atoi(form.Get("amount")); amount == declinedAmount {
		writeError(rec, http.StatusPaymentRequired, "card_error", "card_declined", map[string]string{"decline_code": "generic_decline"})
		a.declines++
	} else if amount == failedAmount {
		writeError(rec, http.StatusInternalServerError, "api_error", "", nil)
	} else {
		r.Body = io.NopCloser(bytes.NewReader(body))
		a.mock.ServeHTTP(rec, r)
		if rec.Code == http.StatusOK {
			a.charges++
		}
	}
	if key != "" {
		a.answers[key] = &recorded{status: rec.Code, body: rec.Body.Bytes(), form: form.Encode()}
	}
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	w.Write(rec.Body.Bytes())
}

func writeError(w http.ResponseWriter, status int, typ, code string, extra map[string]string) {
	e := `{"error":{"type":"` + typ + `","message":"test API: ` + typ + `"`
	if code != "" {
		e += `,"code":"` + code + `"`
	}
	for k, v := range extra {
		e += `,"` + k + `":"` + v + `"`
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	io.WriteString(w, e+"}}")
}

// seen returns the Idempotency-Keys of the requests, the PaymentIntents
// created, the declines and the replays.
func (a *stripeAPI) seen() (keys []string, charges, declines, replays int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.requests...), a.charges, a.declines, a.replays
}
