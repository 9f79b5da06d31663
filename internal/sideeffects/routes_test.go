package sideeffects

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/redact"
	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
)

// parseErr parses yml and returns its error text, failing if it parsed.
func parseErr(t *testing.T, yml string, env map[string]string) string {
	t.Helper()
	_, err := ParseRoutes([]byte(yml), mapEnv(env), nil, nil)
	if err == nil {
		t.Fatalf("ParseRoutes accepted:\n%s", yml)
	}
	t.Logf("error: %v", err)
	var re *RoutesError
	if !errors.As(err, &re) {
		t.Errorf("error is not a *RoutesError: %v", err)
	}
	return err.Error()
}

func TestParseRoutesSchemaErrorsNameTheField(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		yml  string
		want []string // substrings of the error
	}{
		{"unknown field", `
routes:
  - name: payments
    match: {subject: s}
    url: https://example.com/p
    retries: 3
`, []string{`route "payments"`, `field "retries"`, "unknown field"}},
		{"missing url", `
routes:
  - name: payments
    match: {subject: s}
    method: POST
`, []string{`route "payments"`, `field "url"`, "missing"}},
		{"bad method", `
routes:
  - name: payments
    match: {subject: s}
    method: FETCH
    url: https://example.com/p
`, []string{`route "payments"`, `field "method"`, "POST"}},
		{"bad timeout", `
routes:
  - name: payments
    match: {subject: s}
    url: https://example.com/p
    timeout: 5 seconds
`, []string{`route "payments"`, `field "timeout"`, "not a duration"}},
		{"bad header name", `
routes:
  - name: payments
    match: {subject: s}
    url: https://example.com/p
    headers:
      "X Bad": {value: v}
`, []string{`route "payments"`, `field "headers.X Bad"`, "not a valid HTTP header name"}},
		{"numeric timeout", `
routes:
  - name: payments
    match: {subject: s}
    url: https://example.com/p
    timeout: 5
`, []string{`route "payments"`, `field "timeout"`, "want string"}},
		{"zero timeout", `
routes:
  - name: payments
    match: {subject: s}
    url: https://example.com/p
    timeout: 0s
`, []string{`route "payments"`, `field "timeout"`, "greater than zero"}},
		{"unknown field in a step", `
routes:
  - name: order
    match: {subject: s}
    steps:
      - name: a
        url: https://example.com/a
        body: json
`, []string{`route "order"`, `field "steps[0].body"`, "unknown field"}},
		{"url beside steps", `
routes:
  - name: order
    match: {subject: s}
    url: https://example.com/a
    steps:
      - name: a
        url: https://example.com/a
`, []string{`route "order"`, `field "url"`, "not allowed in a route with steps"}},
		{"route without name", `
routes:
  - match: {subject: s}
    url: https://example.com/a
`, []string{`route "routes[0]"`, `field "name"`, "missing"}},
		{"missing subject", `
routes:
  - name: p
    match: {}
    url: https://example.com/a
`, []string{`route "p"`, `field "match.subject"`, "missing"}},
		{"header without source", `
routes:
  - name: p
    match: {subject: s}
    url: https://example.com/a
    headers:
      Authorization: {}
`, []string{`route "p"`, `field "headers.Authorization"`}},
		{"header with a secret in the file", `
routes:
  - name: p
    match: {subject: s}
    url: https://example.com/a
    headers:
      Authorization: {secret: abc}
`, []string{`route "p"`, `field "headers.Authorization.secret"`, "unknown field"}},
		{"unknown top-level field", `
route:
  - name: p
`, []string{`field "route"`, "unknown field"}},
		{"no routes", `routes: []`, []string{`field "routes"`}},
		{"not yaml", "routes: [", []string{"not valid YAML"}},
		{"duplicate names", `
routes:
  - name: p
    match: {subject: s}
    url: https://example.com/a
  - name: p
    match: {subject: t}
    url: https://example.com/b
`, []string{`route "p"`, `field "name"`, "two routes"}},
		{"reserved header", `
routes:
  - name: p
    match: {subject: s}
    url: https://example.com/a
    headers:
      idempotency-key: {value: fixed}
`, []string{`route "p"`, `field "headers.idempotency-key"`, "set by sbclaim"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := parseErr(t, tt.yml, nil)
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("error %q does not contain %q", got, w)
				}
			}
		})
	}
}

func TestParseRoutesReportsEveryProblem(t *testing.T) {
	t.Parallel()
	got := parseErr(t, `
routes:
  - name: a
    match: {subject: s}
    method: GET
    url: https://example.com/a
  - name: b
    match: {subject: t}
`, nil)
	for _, w := range []string{`route "a": field "method"`, `route "b": field "url"`} {
		if !strings.Contains(got, w) {
			t.Errorf("error %q does not contain %q", got, w)
		}
	}
}

func TestParseRoutesRejectsURLsFromMessageContent(t *testing.T) {
	t.Parallel()
	for _, u := range []string{
		"https://api.example.com/orders/{orderId}",
		"https://api.example.com/orders/{{.Body.id}}",
		"https://api.example.com/orders/${ORDER_ID}",
		"https://api.example.com/orders/$id",
		"https://api.example.com/orders/%7BorderId%7D",
		"https://api.example.com/orders/%7borderId%7d",
		"https://api.example.com/orders/%24id",
		"https://{host}/orders",
		"https://api.example.com/orders?to=<to>",
		"/relative/path",
		"api.example.com/orders",
		"ftp://api.example.com/orders",
		"file:///etc/passwd",
		"https://user:pass@api.example.com/orders",
	} {
		t.Run(u, func(t *testing.T) {
			t.Parallel()
			got := parseErr(t, fmt.Sprintf(`
routes:
  - name: orders
    match: {subject: s}
    url: %q
`, u), nil)
			if !strings.Contains(got, `route "orders": field "url"`) {
				t.Errorf("error does not name the route and field: %s", got)
			}
			if strings.Contains(got, "pass@") {
				t.Errorf("error shows URL credentials: %s", got)
			}
		})
	}
	// Also inside a step.
	got := parseErr(t, `
routes:
  - name: orders
    match: {subject: s}
    steps:
      - name: one
        url: https://api.example.com/orders/{id}
`, nil)
	if !strings.Contains(got, `field "steps[0].url"`) {
		t.Errorf("step URL error does not name the field: %s", got)
	}
}

func TestParseRoutesMissingEnvVar(t *testing.T) {
	t.Parallel()
	got := parseErr(t, `
routes:
  - name: payments
    match: {subject: s}
    url: https://example.com/p
    headers:
      Authorization: {fromEnv: PAYMENTS_TOKEN}
`, map[string]string{"OTHER": "x"})
	for _, w := range []string{`route "payments"`, "Authorization", "PAYMENTS_TOKEN", "not set"} {
		if !strings.Contains(got, w) {
			t.Errorf("error %q does not contain %q", got, w)
		}
	}
}

func TestSecretHeaderValuesNeverLeak(t *testing.T) {
	t.Parallel()
	const secret = "tok-7f3a9c-very-secret"
	b := setupFake(t, fakedownstream.Options{})
	logger, logs := testLogger(t)
	env := map[string]string{"PAYMENTS_TOKEN": "Bearer " + secret, "BAD_TOKEN": "line1\nline2-" + secret}

	var errs []string
	r := mustRouter(t, oneRoute(b.url, `    headers:
      Authorization: {fromEnv: PAYMENTS_TOKEN}
`), env, logger)
	msg := newMsg("msg-secret", "payment.requested", `{}`)
	eff := mustEffect(t, r, msg)

	// Failures of every kind: before the effect, after it, a conflict.
	b.fake.FailNext(1, fakedownstream.FaultErrorAfter)
	b.fake.FailNext(1, fakedownstream.FaultUnavailable)
	for range 3 {
		if err := eff.Perform(context.Background(), msg, "msg-secret"); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) != 2 {
		t.Errorf("got %d errors, want 2: %q", len(errs), errs)
	}
	if got := b.fake.Headers("msg-secret")[0].Get("Authorization"); got != "Bearer "+secret {
		t.Fatalf("the secret was not sent: %q", got)
	}

	// A downstream that echoes the Authorization header in its error.
	echoSrv := newEchoServer(t)
	r2 := mustRouter(t, oneRoute(echoSrv, `    headers:
      Authorization: {fromEnv: PAYMENTS_TOKEN}
`), env, logger)
	if err := mustEffect(t, r2, msg).Perform(context.Background(), msg, "k"); err != nil {
		errs = append(errs, err.Error())
	} else {
		t.Error("the echo server's 400 was not an error")
	}

	// Start-up errors about a bad secret value.
	_, err := ParseRoutes([]byte(oneRoute(b.url, `    headers:
      Authorization: {fromEnv: BAD_TOKEN}
`)), mapEnv(env), nil, logger)
	if err == nil {
		t.Fatal("a header value with a newline was accepted")
	}
	errs = append(errs, err.Error())
	logger.Info("sanity line")

	all := strings.Join(errs, "\n") + "\n" + logs.String()
	if !strings.Contains(all, "sanity line") || !strings.Contains(all, redact.Mask) {
		t.Fatalf("nothing captured or no redaction happened:\n%s", all)
	}
	if strings.Contains(all, secret) {
		t.Errorf("the secret leaked into logs or errors:\n%s", all)
	}
}

func TestRouteMatching(t *testing.T) {
	t.Parallel()
	logger, _ := testLogger(t)
	r := mustRouter(t, `
routes:
  - name: vip-payments
    match:
      subject: payment.requested
      property: {name: tier, value: vip}
    body: json
    url: https://example.com/vip
  - name: payments
    match: {subject: payment.requested}
    body: json
    url: https://example.com/p
  - name: emails
    match: {subject: email.requested}
    url: https://example.com/e
`, nil, logger)
	if got := r.Names(); fmt.Sprint(got) != "[vip-payments payments emails]" {
		t.Errorf("Names() = %v", got)
	}
	vip := newMsg("1", "payment.requested", `{}`)
	vip.ApplicationProperties["tier"] = "vip"
	plain := newMsg("2", "payment.requested", `{}`)
	other := newMsg("3", "payment.requested", `{}`)
	other.ApplicationProperties["tier"] = "gold"
	email := newMsg("4", "email.requested", `not json is fine here`)
	cases := []struct {
		msg  *azservicebus.ReceivedMessage
		want string
	}{{vip, "vip-payments"}, {plain, "payments"}, {other, "payments"}, {email, "emails"}}
	for _, c := range cases {
		h, err := r.Route(c.msg)
		if err != nil || h.Name != c.want {
			t.Errorf("message %s routed to %q (%v), want %q", c.msg.MessageID, h.Name, err, c.want)
		}
	}

	// No route.
	_, err := r.Route(newMsg("5", "unknown.subject", `{}`))
	var ie *InputError
	if !errors.As(err, &ie) || ie.Reason != ReasonNoRoute || !strings.Contains(ie.Description, "unknown.subject") {
		t.Errorf("unknown subject: %v, want NoRoute naming the subject", err)
	}
	noSubject := newMsg("6", "", `{}`)
	noSubject.Subject = nil
	if _, err := r.Route(noSubject); !errors.As(err, &ie) || ie.Reason != ReasonNoRoute {
		t.Errorf("message without subject: %v, want NoRoute", err)
	}

	// Malformed body on a json route, found by Route (before any claim).
	for _, body := range []string{`{"amount":`, ``, `not json`} {
		_, err = r.Route(newMsg("7", "payment.requested", body))
		if !errors.As(err, &ie) || ie.Reason != ReasonMalformedBody {
			t.Errorf("body %q: %v, want MalformedBody", body, err)
		}
	}
}

func TestLoadRoutesExampleFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join("..", "..", "examples", "routes.yaml")
	if _, err := os.Stat(path); err != nil {
		t.Skipf("no example file: %v", err)
	}
	logger, _ := testLogger(t)
	env := map[string]string{"STRIPE_AUTHORIZATION": "Bearer x", "EMAILS_API_KEY": "k"}
	r, err := LoadRoutes(path, mapEnv(env), logger)
	if err != nil {
		t.Fatalf("examples/routes.yaml: %v", err)
	}
	if len(r.Names()) == 0 {
		t.Error("no routes")
	}
	h, err := r.Route(newMsg("m", "payment.requested", `{"order":42,"amount_cents":1999,"payment_method":"pm_card_visa"}`))
	if err != nil || !h.AllowNewKey {
		t.Errorf("payments: %v, AllowNewKey %v (the example allows a new key)", err, h.AllowNewKey)
	}
	if _, err := LoadRoutes(path, mapEnv(nil), logger); err == nil || !strings.Contains(err.Error(), "STRIPE_AUTHORIZATION") {
		t.Errorf("missing env var not reported: %v", err)
	}
}

// newEchoServer answers 400 with the request's Authorization header in the
// body, like a careless downstream.
func newEchoServer(t *testing.T) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "bad credentials: "+r.Header.Get("Authorization"), http.StatusBadRequest)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestRoutesRecoveryAndFingerprint(t *testing.T) {
	t.Parallel()
	parse := func(yml string) *HTTPRouter {
		t.Helper()
		r, err := ParseRoutes([]byte(yml), mapEnv(nil), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	route := func(r *HTTPRouter, subject string) Handler {
		t.Helper()
		h, err := r.Route(&azservicebus.ReceivedMessage{Subject: &subject})
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	base := parse(`
routes:
  - {name: pay, match: {subject: p}, url: "https://example.com/charges"}
  - {name: mail, match: {subject: m}, recovery: manual, url: "https://example.com/mail"}
`)
	pay, mail := route(base, "p"), route(base, "m")
	if pay.Recovery != RecoveryAuto || pay.Manual() {
		t.Errorf("pay: recovery %q, want auto by default", pay.Recovery)
	}
	if mail.Recovery != RecoveryManual || !mail.Manual() {
		t.Errorf("mail: recovery %q, want manual", mail.Recovery)
	}
	if pay.Fingerprint == "" || pay.Fingerprint == mail.Fingerprint {
		t.Errorf("fingerprints %q and %q: want non-empty and different", pay.Fingerprint, mail.Fingerprint)
	}
	// Same method and URL, another timeout or header: same fingerprint.
	same := parse(`
routes:
  - name: pay
    match: {subject: p}
    url: "https://example.com/charges"
    timeout: 3s
    headers: {X-Team: {value: a}}
`)
	if got := route(same, "p").Fingerprint; got != pay.Fingerprint {
		t.Errorf("timeout/header change altered the fingerprint: %q vs %q", got, pay.Fingerprint)
	}
	for name, yml := range map[string]string{
		"other URL":    `{name: pay, match: {subject: p}, url: "https://example.com/charges/v2"}`,
		"other method": `{name: pay, match: {subject: p}, method: PUT, url: "https://example.com/charges"}`,
		"steps":        `{name: pay, match: {subject: p}, steps: [{name: a, url: "https://example.com/charges"}]}`,
	} {
		if got := route(parse("routes:\n  - "+yml+"\n"), "p").Fingerprint; got == pay.Fingerprint {
			t.Errorf("%s: fingerprint unchanged (%q)", name, got)
		}
	}
	renamed := parse(`
routes:
  - {name: pay, match: {subject: p}, steps: [{name: a, url: "https://example.com/x"}, {name: b, url: "https://example.com/y"}]}
`)
	renamedStep := parse(`
routes:
  - {name: pay, match: {subject: p}, steps: [{name: a, url: "https://example.com/x"}, {name: c, url: "https://example.com/y"}]}
`)
	if route(renamed, "p").Fingerprint == route(renamedStep, "p").Fingerprint {
		t.Error("renaming a step did not change the fingerprint (the step keys change with it)")
	}
	msg := parseErr(t, `
routes:
  - {name: pay, match: {subject: p}, recovery: sometimes, url: "https://example.com/charges"}
`, nil)
	if !strings.Contains(msg, `route "pay"`) || !strings.Contains(msg, `field "recovery"`) {
		t.Errorf("bad recovery: error %q does not name the route and field", msg)
	}
}

func TestInCodeRoutesRecoveryAndFingerprint(t *testing.T) {
	t.Parallel()
	eff := EffectFunc(func(context.Context, *azservicebus.ReceivedMessage, string) error { return nil })
	if _, err := NewRouter(Route{Name: "a", Match: Match{Subject: AnySubject}, Effect: eff, Recovery: "maybe"}); err == nil {
		t.Error("NewRouter accepted Recovery \"maybe\"")
	}
	r1, _ := NewRouter(Route{Name: "a", Match: Match{Subject: AnySubject}, Effect: eff})
	r2, _ := NewRouter(Route{Name: "a", Match: Match{Subject: AnySubject}, Effect: eff, Version: "2", Recovery: RecoveryManual})
	h1, _ := r1.Route(&azservicebus.ReceivedMessage{})
	h2, _ := r2.Route(&azservicebus.ReceivedMessage{})
	if h1.Recovery != RecoveryAuto || h2.Recovery != RecoveryManual {
		t.Errorf("recovery %q, %q; want auto, manual", h1.Recovery, h2.Recovery)
	}
	if h1.Fingerprint == "" || h1.Fingerprint == h2.Fingerprint {
		t.Errorf("fingerprints %q, %q: want non-empty, changed by Version", h1.Fingerprint, h2.Fingerprint)
	}
}
