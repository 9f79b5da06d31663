package sbclaim_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/sbclaimtest"
)

// headerTransport sets a header on every request it sends.
type headerTransport struct {
	base http.RoundTripper
	sent atomic.Int64
}

func (t *headerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.sent.Add(1)
	req = req.Clone(req.Context())
	req.Header.Set("X-Through", "the user's client")
	return t.base.RoundTrip(req)
}

// A routes file held in memory (ParseRoutesFile) sends its requests
// through the program's own HTTP client (RoutesFileOptions.HTTPClient),
// with the claim's idempotency key.
func TestParseRoutesFileSendsThroughTheGivenClient(t *testing.T) {
	var (
		mu   sync.Mutex
		seen []http.Header
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Clone())
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	tr := &headerTransport{base: http.DefaultTransport}
	routes := "version: 1\nroutes:\n  - name: charge\n    match: {subject: payment.requested}\n    url: " + srv.URL + "/charges\n"
	file, err := sbclaim.ParseRoutesFile([]byte(routes), &sbclaim.RoutesFileOptions{HTTPClient: &http.Client{Transport: tr}})
	if err != nil {
		t.Fatal(err)
	}
	if got := file.Names(); len(got) != 1 || got[0] != "charge" {
		t.Fatalf("Names() = %q, want [charge]", got)
	}
	var router sbclaim.Router
	if err := router.AddRoutesFile(file); err != nil {
		t.Fatal(err)
	}
	st := sbclaimtest.NewStore(t)
	q := sbclaimtest.NewQueue(nil)
	sbclaimtest.Start(t, sbclaim.ProcessorConfig{Consumer: "billing", Store: st, Router: &router}, q)
	send(t, q, message("order-7", "payment.requested", `{"amount":1999}`))
	waitIdle(t, q)

	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || tr.sent.Load() != 1 {
		t.Fatalf("%d requests reached the API, %d went through the client: want 1 and 1", len(seen), tr.sent.Load())
	}
	cl := onlyClaim(t, st)
	if seen[0].Get("X-Through") == "" || seen[0].Get("Idempotency-Key") != cl.IdempotencyKey {
		t.Errorf("request headers %v: want X-Through and Idempotency-Key %q", seen[0], cl.IdempotencyKey)
	}
	if cl.State != sbclaim.StateProcessed || cl.Route != "charge" {
		t.Errorf("claim %+v: want processed on route charge", cl)
	}
}

// ParseRoutesFile refuses a bad file as LoadRoutesFile does, naming the
// route and field.
func TestParseRoutesFileRefusesBadFiles(t *testing.T) {
	_, err := sbclaim.ParseRoutesFile([]byte("version: 1\nroutes:\n  - name: charge\n    url: ftp://example.com/x\n"), nil)
	if err == nil || !strings.Contains(err.Error(), "charge") {
		t.Fatalf("ParseRoutesFile: %v, want an error naming route charge", err)
	}
	if _, err := sbclaim.ParseRoutesFile([]byte(": not yaml"), nil); err == nil {
		t.Fatal("ParseRoutesFile accepted a file that is not YAML")
	}
}
