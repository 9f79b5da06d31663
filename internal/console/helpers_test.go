package console_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/sqlite"
	"github.com/sbclaim/sbclaim/internal/console"
	"github.com/sbclaim/sbclaim/internal/reconciler"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/sideeffects/routesfile"
	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
	"github.com/sbclaim/sbclaim/internal/testkit/testissuer"
)

// fixture is a console on a SQLite store holding flagged claims, with the
// fake idempotent downstream behind the routes redrive uses: route
// payments (subject payment) and route charges (subject charge), which
// answers like a payment API (a 402 is a final decline, the charge id and
// Request-Id are recorded) and allows a redrive under a new key.
type fixture struct {
	t      *testing.T
	store  *sqlite.Store
	fake   *fakedownstream.Server
	router sideeffects.Router
	srv    *console.Server
	ts     *httptest.Server
	// iss is the identity provider the console trusts (Options.OIDC):
	// an RSA key of the test's, its discovery document and JWKS on
	// 127.0.0.1.
	iss *testissuer.Issuer
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

var fastRetry = sideeffects.RetryPolicy{MaxAttempts: 2, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond}

// setup starts a console that verifies tokens of the fixture's test
// issuer; edit may change its options (opts.Store is the fixture's store
// unless edit replaces it; setting LocalOperator or TrustIdentityHeaders
// drops the issuer).
func setup(t *testing.T, edit func(*console.Options)) *fixture {
	t.Helper()
	st, err := sqlite.Open(t.Context(), "sqlite:"+filepath.Join(t.TempDir(), "claims.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := sqlite.Migrate(t.Context(), st.DB()); err != nil {
		t.Fatal(err)
	}
	fake := fakedownstream.New(fakedownstream.Options{})
	down := httptest.NewServer(fake)
	t.Cleanup(down.Close)
	router, err := routesfile.Parse([]byte(fmt.Sprintf(`version: 1
routes:
  - name: payments
    key: raw
    match: {subject: payment}
    method: POST
    url: %q
    timeout: 5s
    body: json
  - name: charges
    key: raw
    match: {subject: charge}
    method: POST
    url: %q
    timeout: 5s
    body: json
    answers:
      - {status: 402, outcome: rejected}
    record:
      headers: [Request-Id]
      fields: [/error/charge, /error/code]
    allowNewKey: true
`, down.URL+"/payments", down.URL+"/charges")), func(string) string { return "" }, nil, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	iss := testissuer.New(t)
	opts := console.Options{Store: st, Routes: reconciler.Routes{"": router}, Logger: testLogger(t), Retry: fastRetry,
		HeartbeatInterval: time.Second, StoreTimeout: 10 * time.Second,
		OIDC: &console.OIDC{Issuer: iss.URL, Audience: testissuer.Audience}}
	if edit != nil {
		edit(&opts)
	}
	if opts.LocalOperator != "" || opts.TrustIdentityHeaders {
		opts.OIDC = nil
	}
	srv, err := console.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	return &fixture{t: t, store: st, fake: fake, router: router, srv: srv, ts: ts, iss: iss}
}

var seq atomic.Int64

// claimMsg claims a payment message for consumer, routed as the processor
// would route it (route and fingerprint recorded).
func (f *fixture) claimMsg(consumer, id, body string, props map[string]string) *claim.Claim {
	f.t.Helper()
	return f.claimSubject("payment", consumer, id, body, props)
}

// claimSubject claims a message with subject (payment or charge) for
// consumer, routed as claimMsg routes it.
func (f *fixture) claimSubject(subject, consumer, id, body string, props map[string]string) *claim.Claim {
	f.t.Helper()
	if id == "" {
		id = fmt.Sprintf("%s-%d", subject, seq.Add(1))
	}
	// A body the route cannot take (not JSON) is claimed without a route,
	// as before routes were recorded.
	var route, print string
	if h, err := f.router.Route(reconciler.MessageFromClaim(&claim.Claim{MessageID: id, Subject: subject, Payload: []byte(body)})); err == nil {
		route, print = h.Name, h.Fingerprint
	}
	res, err := f.store.ClaimBatch(f.t.Context(), &claim.ClaimBatchParams{Host: "processor-1", Claims: []claim.ClaimParams{{
		KeyForm:   claim.KeyFormRaw,
		MessageID: id, Consumer: consumer, Owner: uuid.New(), Route: route, Fingerprint: print,
		Entity: "payments", Subject: subject, ContentType: "application/json", Properties: props,
		PayloadHash: claim.HashPayload([]byte(body)), Payload: []byte(body), DeliveryCount: 1,
	}}})
	if err != nil || res[0].Outcome != claim.OutcomeWon {
		f.t.Fatalf("claim %s: %v %v", id, err, res)
	}
	return res[0].Claim
}

// flagged claims a message and flags it with reason.
func (f *fixture) flagged(consumer, id, body string, props map[string]string, reason string) *claim.Claim {
	f.t.Helper()
	return f.flag(f.claimMsg(consumer, id, body, props), reason)
}

// flag records an attempt of unknown outcome on a claim the fixture just
// claimed, and flags it with reason.
func (f *fixture) flag(c *claim.Claim, reason string) *claim.Claim {
	f.t.Helper()
	if err := f.store.RecordAttempt(f.t.Context(), &claim.RecordAttemptParams{ID: c.ID, Owner: c.Owner, Error: "timeout: outcome unknown"}); err != nil {
		f.t.Fatal(err)
	}
	fl, err := f.store.Flag(f.t.Context(), &claim.FlagParams{ID: c.ID, Owner: c.Owner, State: claim.StateClaimed, Reason: reason})
	if err != nil {
		f.t.Fatal(err)
	}
	return fl
}

// fail fails a claim the fixture just claimed, as a processor does on a
// final answer.
func (f *fixture) fail(c *claim.Claim, reason, desc string, answer *claim.Answer, deadLetterSeq *int64) *claim.Claim {
	f.t.Helper()
	if err := f.store.Fail(f.t.Context(), &claim.FailParams{ID: c.ID, Owner: c.Owner, Reason: reason, Error: desc, Answer: answer,
		DeadLetterSeq: deadLetterSeq}); err != nil {
		f.t.Fatal(err)
	}
	return f.get(c.ID)
}

func (f *fixture) get(id int64) *claim.Claim {
	f.t.Helper()
	c, err := f.store.Get(context.Background(), id)
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

// client is a browser: a cookie jar, and the headers the platform's
// sign-in would add: the signed-in user's ID token from the test issuer
// (none for an anonymous one).
type client struct {
	f       *fixture
	hc      *http.Client
	headers http.Header
}

func (f *fixture) client(name, id string) *client {
	jar, _ := cookiejar.New(nil)
	h := http.Header{}
	if name != "" {
		h.Set(console.HeaderIDToken, f.iss.Token(name, id, nil))
	}
	return &client{f: f, headers: h, hc: &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}}
}

type response struct {
	status int
	header http.Header
	body   string
}

func (c *client) do(method, path string, form url.Values, extra http.Header) response {
	c.f.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, c.f.ts.URL+path, body)
	if err != nil {
		c.f.t.Fatal(err)
	}
	for k, v := range c.headers {
		req.Header[k] = v
	}
	for k, v := range extra {
		if k == "Host" {
			req.Host = v[0] // what a browser sends for the name it resolved
			continue
		}
		req.Header[k] = v
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		c.f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

func (c *client) getPage(path string) response { c.f.t.Helper(); return c.do("GET", path, nil, nil) }

func (c *client) post(path string, form url.Values) response {
	c.f.t.Helper()
	return c.do("POST", path, form, nil)
}

var csrfInput = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// token reads the CSRF token from a page's form (GET first: it also sets
// the cookie).
func (c *client) token(path string) string {
	c.f.t.Helper()
	r := c.getPage(path)
	m := csrfInput.FindStringSubmatch(r.body)
	if m == nil {
		c.f.t.Fatalf("GET %s (%d): no CSRF token in the page", path, r.status)
	}
	return m[1]
}

func mustContain(t *testing.T, what string, r response, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(r.body, w) {
			t.Errorf("%s: the page lacks %q (status %d)", what, w, r.status)
		}
	}
}

func mustStatus(t *testing.T, what string, r response, want int) {
	t.Helper()
	if r.status != want {
		t.Fatalf("%s: status %d, want %d\n%s", what, r.status, want, flashOf(r.body))
	}
}

var flashRE = regexp.MustCompile(`(?s)<section class="flash.*?</section>`)

func flashOf(body string) string { return flashRE.FindString(body) }
