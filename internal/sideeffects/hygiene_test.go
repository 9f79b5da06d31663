package sideeffects

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
)

func TestCheckContentType(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"", "application/json", "application/json; charset=utf-8", "text/plain;charset=\"us-ascii\"", "application/vnd.api+json", "*/*"} {
		if err := CheckContentType(ok); err != nil {
			t.Errorf("CheckContentType(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{
		"application/json\r\nX-Injected: 1",
		"application/json\n",
		"text/plain\x00",
		"text/plain\t; charset=utf-8",
		"application/jsön",
		"json",
		"application/",
		"a/b; x",
		"/",
		"application/" + strings.Repeat("x", MaxContentTypeBytes),
	} {
		err := CheckContentType(bad)
		var ie *InputError
		if !errors.As(err, &ie) || ie.Reason != ReasonInvalidContentType {
			t.Errorf("CheckContentType(%q) = %v, want an InvalidContentType *InputError", bad, err)
			continue
		}
		if strings.ContainsAny(ie.Description, "\r\n\x00") || len(ie.Description) > 200 {
			t.Errorf("description carries raw control characters or is unbounded: %q", ie.Description)
		}
	}
}

// TestContentTypeWithCRLF: the finding was a producer-controlled
// ContentType with CR/LF that net/http refused before connecting,
// classified retryable, looping until the broker dead-lettered it.
func TestContentTypeWithCRLF(t *testing.T) {
	t.Parallel()
	b := setupFake(t, fakedownstream.Options{})
	r := mustRouter(t, oneRoute(b.url, ""), nil, b.log)
	msg := newMsg("msg-ct", "payment.requested", `{}`)
	ct := "application/json\r\nX-Injected: yes"
	msg.ContentType = &ct

	// Route refuses it before any claim...
	_, err := r.Route(msg)
	var ie *InputError
	if !errors.As(err, &ie) || ie.Reason != ReasonInvalidContentType {
		t.Fatalf("Route: %v, want InvalidContentType", err)
	}
	// ...and the effect, called anyway, never sends it: permanent, not a
	// retry loop.
	h, _ := r.Route(newMsg("msg-ct", "payment.requested", `{}`))
	calls := 0
	err = fastPolicy.Do(context.Background(), func(ctx context.Context) error {
		calls++
		return h.Effect.Perform(ctx, msg, "msg-ct")
	}, nil)
	if Classify(err) != OutcomePermanent || calls != 1 || !strings.Contains(err.Error(), "not sent") {
		t.Errorf("outcome %v after %d calls: %v, want permanent after one", Classify(err), calls, err)
	}
	if b.fake.Requests("msg-ct") != 0 {
		t.Error("the request was sent")
	}
	// A route's own contentType is checked at start.
	got := parseErr(t, oneRoute(b.url, "    contentType: \"json\"\n"), nil)
	if !strings.Contains(got, `route "payments": field "contentType"`) {
		t.Errorf("bad route contentType: %s", got)
	}
}

func TestExcerptIsBoundedAndClean(t *testing.T) {
	t.Parallel()
	body := strings.Repeat("é", 150) + "\x1b[2J\r\n" + strings.Repeat("x", 1000)
	e := excerpt(body)
	if len(e) > MaxExcerptBytes || !utf8.ValidString(e) || strings.ContainsAny(e, "\x1b\r\n") {
		t.Errorf("excerpt: %d bytes, valid %v: %q", len(e), utf8.ValidString(e), e)
	}
	if got := excerpt("short\n\n  answer\xff"); got != "short answer\uFFFD" {
		t.Errorf("excerpt = %q", got)
	}
}

// TestSecretCutByTheExcerptNeverShows: the secret is redacted in the whole
// body before the excerpt is cut, so a secret straddling the cut is not
// shown half.
func TestSecretCutByTheExcerptNeverShows(t *testing.T) {
	t.Parallel()
	const secret = "sk_live_0123456789abcdefghijklmnopqrstuvwxyz"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprint(w, strings.Repeat("a", MaxExcerptBytes-20)+r.Header.Get("Authorization"))
	}))
	t.Cleanup(srv.Close)
	logger, logs := testLogger(t)
	r := mustRouter(t, oneRoute(srv.URL, "    headers:\n      Authorization: {fromEnv: TOKEN}\n"), map[string]string{"TOKEN": secret}, logger)
	msg := newMsg("m", "payment.requested", `{}`)
	err := mustEffect(t, r, msg).Perform(context.Background(), msg, "m")
	if err == nil {
		t.Fatal("no error")
	}
	for _, part := range []string{secret[:12], secret[len(secret)-12:]} {
		if strings.Contains(err.Error()+logs.String(), part) {
			t.Errorf("part of the secret %q shows: %v", part, err)
		}
	}
}

// TestURLPathSecretsNeverLeak: a webhook URL carrying its secret in the
// path (Slack, Teams) and a key in the query never appear in a log line,
// an error or an Answer — not even when the downstream echoes its URL.
func TestURLPathSecretsNeverLeak(t *testing.T) {
	t.Parallel()
	const pathSecret, querySecret = "T0001/B0002/XyZsecretPATHtoken", "QUERYsecret123"
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Location", r.URL.String())
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"url":%q,"path":%q,"error":"no_service at %s"}`, r.URL.String(), r.URL.Path, r.URL.RequestURI())
	}))
	t.Cleanup(srv.Close)
	logger, logs := testLogger(t)
	yml := fmt.Sprintf(`
routes:
  - name: alerts
    match: {subject: alert}
    url: "%s/services/%s?code=%s"
    record: {headers: [Location], fields: [/url, /path, /error]}
`, srv.URL, pathSecret, querySecret)
	r := mustRouter(t, yml, nil, logger)
	msg := newMsg("m", "alert", `{"text":"hi"}`)
	eff := mustEffect(t, r, msg)

	var texts []string
	for _, st := range []int{200, 404, 500, 429} {
		status = st
		ctx, rec := RecordAnswers(context.Background())
		err := eff.Perform(ctx, msg, "m")
		if err != nil {
			texts = append(texts, err.Error())
		}
		a := rec.Last()
		if a == nil || a.Status != st {
			t.Fatalf("status %d: answer %+v", st, a)
		}
		texts = append(texts, fmt.Sprint(a.Headers, a.Fields), fmt.Sprint(AnswerOf(err)))
	}
	// No answer at all: net/http's *url.Error quotes the URL.
	srv.Close()
	err := eff.Perform(context.Background(), msg, "m")
	if err == nil {
		t.Fatal("no error from a closed server")
	}
	texts = append(texts, err.Error())
	if !strings.Contains(err.Error(), "route alerts at 127.0.0.1:") {
		t.Errorf("the error does not name the route and host: %v", err)
	}
	all := strings.Join(texts, "\n") + "\n" + logs.String()
	if !strings.Contains(all, "http effect attempt failed") || !strings.Contains(all, "host=127.0.0.1:") {
		t.Fatalf("nothing captured:\n%s", all)
	}
	for _, secret := range []string{pathSecret, querySecret, "XyZsecret", "/services/"} {
		if strings.Contains(all, secret) {
			t.Errorf("%q leaked into logs, errors or answers:\n%s", secret, all)
		}
	}
	// The route's URL problems at start-up do not show the URL either.
	got := parseErr(t, fmt.Sprintf(`
routes:
  - {name: alerts, match: {subject: a}, url: "https://hooks.example.com/services/%s/{x}"}
`, pathSecret), nil)
	if strings.Contains(got, pathSecret) || !strings.Contains(got, `field "url"`) {
		t.Errorf("start-up error: %s", got)
	}
}
