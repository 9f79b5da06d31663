package routesfile_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/routesfile"
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

// A routes file held in memory (Parse) sends its requests through the
// program's own HTTP client (Options.HTTPClient), with the claim's
// idempotency key.
func TestParseSendsThroughTheGivenClient(t *testing.T) {
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
	file, err := routesfile.Parse([]byte(routes), &routesfile.Options{HTTPClient: &http.Client{Transport: tr}})
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
	q.SendAndWait(t, sbclaimtest.Message(t, "order-7", "payment.requested", `{"amount":1999}`))

	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || tr.sent.Load() != 1 {
		t.Fatalf("%d requests reached the API, %d went through the client: want 1 and 1", len(seen), tr.sent.Load())
	}
	cl := sbclaimtest.ClaimByKey(t, st, "order-7")
	if seen[0].Get("X-Through") == "" || seen[0].Get("Idempotency-Key") != cl.IdempotencyKey {
		t.Errorf("request headers %v: want X-Through and Idempotency-Key %q", seen[0], cl.IdempotencyKey)
	}
	if cl.State != sbclaim.StateProcessed || cl.Route != "charge" {
		t.Errorf("claim %+v: want processed on route charge", cl)
	}
}

// Parse refuses a bad file, naming the route and field; Load refuses one
// the same way and names the file, and a file that cannot be read.
func TestParseAndLoadRefuseBadFiles(t *testing.T) {
	_, err := routesfile.Parse([]byte("version: 1\nroutes:\n  - name: charge\n    match: {subject: s}\n    url: ftp://example.com/x\n"), nil)
	if err == nil || !strings.Contains(err.Error(), "charge") {
		t.Fatalf("Parse: %v, want an error naming route charge", err)
	}
	var re *sideeffects.RoutesError
	if !errors.As(err, &re) || re.Route != "charge" || re.Field != "url" {
		t.Errorf("Parse: %v, want a problem of route charge, field url", err)
	}
	if _, err := routesfile.Parse([]byte(": not yaml"), nil); err == nil || !strings.Contains(err.Error(), "not valid YAML") {
		t.Fatalf("Parse of a file that is not YAML: %v, want it refused as not valid YAML", err)
	}
	path := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(path, []byte("version: 1\nroutes:\n  - name: charge\n    match: {subject: s}\n    url: ftp://example.com/x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := routesfile.Load(path, nil); err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), `route "charge"`) {
		t.Errorf("Load: %v, want an error naming %s and route charge", err, path)
	}
	if _, err := routesfile.Load(filepath.Join(t.TempDir(), "missing.yaml"), nil); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("Load of a missing file: %v, want an error naming it", err)
	}
}
