package sideeffects

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

func TestRoutesFileBreaker(t *testing.T) {
	r, err := ParseRoutes([]byte(`version: 1
routes:
  - name: charges
    match: {subject: charge}
    url: https://api.example.com/charges
    breaker: {failures: 3, probeAfter: 1m}
  - name: emails
    match: {subject: email}
    url: https://api.example.com/emails
  - name: pings
    match: {subject: ping}
    url: https://api.example.com/pings
    breaker: {off: true}
`), mapEnv(nil), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for subj, want := range map[string]Breaker{
		"charge": {Failures: 3, ProbeAfter: time.Minute},
		"email":  {},
		"ping":   {Failures: 5, ProbeAfter: 30 * time.Second, Off: true},
	} {
		h, err := r.Route(&azservicebus.ReceivedMessage{Subject: &subj})
		if err != nil {
			t.Fatal(err)
		}
		if h.Breaker != want {
			t.Errorf("%s: breaker %+v, want %+v", subj, h.Breaker, want)
		}
	}
}

func TestRoutesFileBreakerErrorsNameTheField(t *testing.T) {
	for yml, want := range map[string]string{
		"breaker: {failures: -1}":      `breaker`,
		"breaker: {probeAfter: 10x}":   `probeAfter`,
		"configErrors: [401, 500]":     `configErrors`,
		"breaker: {failures: 1, x: 1}": `x`,
	} {
		got := parseErr(t, `version: 1
routes:
  - name: charges
    match: {subject: charge}
    url: https://api.example.com/charges
    `+yml+"\n", nil)
		if !strings.Contains(got, want) {
			t.Errorf("%s: error %q, want it to mention %q", yml, got, want)
		}
	}
}

// TestRoutesFileConfigErrors: 401, 403 and 407 are configuration answers
// by default (Misconfigured: retryable, not permanent); a route's
// configErrors list replaces them, and an empty list leaves the answer
// table's outcome.
func TestRoutesFileConfigErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/401":
			w.WriteHeader(401)
		case "/407":
			w.WriteHeader(407)
		default:
			w.WriteHeader(418)
		}
	}))
	t.Cleanup(srv.Close)
	r, err := ParseRoutes([]byte(`version: 1
routes:
  - name: default
    match: {subject: default}
    url: `+srv.URL+`/401
  - name: proxy
    match: {subject: proxy}
    url: `+srv.URL+`/407
  - name: none
    match: {subject: none}
    url: `+srv.URL+`/401
    configErrors: []
  - name: teapot
    match: {subject: teapot}
    url: `+srv.URL+`/418
    configErrors: [418]
`), mapEnv(nil), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for subj, want := range map[string]bool{"default": true, "proxy": true, "none": false, "teapot": true} {
		msg := &azservicebus.ReceivedMessage{Subject: &subj, Body: []byte(`{}`)}
		h, err := r.Route(msg)
		if err != nil {
			t.Fatal(err)
		}
		err = h.Effect.Perform(context.Background(), msg, "k1")
		if IsMisconfigured(err) != want {
			t.Errorf("%s: IsMisconfigured(%v) = %v, want %v", subj, err, !want, want)
		}
		if want && Classify(err) != OutcomeRetryable {
			t.Errorf("%s: outcome %v, want retryable", subj, Classify(err))
		}
		if want && AnswerOf(err) == nil {
			t.Errorf("%s: the answer is lost: %v", subj, err)
		}
	}
}

// TestRetryStopsAtMisconfigured: the retry loop does not repeat a
// configuration answer.
func TestRetryStopsAtMisconfigured(t *testing.T) {
	calls := 0
	err := RetryPolicy{MaxAttempts: 5, InitialInterval: time.Millisecond, Budget: time.Minute}.Do(context.Background(), func(context.Context) error {
		calls++
		return Misconfigured(Permanent(errorString("HTTP 401")))
	}, nil)
	if calls != 1 || !IsMisconfigured(err) {
		t.Fatalf("calls %d, err %v; want one call and a Misconfigured error", calls, err)
	}
	if got := err.Error(); got != "retryable: HTTP 401" {
		t.Errorf("error text %q, want one outcome in it", got)
	}
}

type errorString string

func (e errorString) Error() string { return string(e) }

// TestAnswerRuleWinsOverConfigErrors: a route that maps 401 with an
// answer rule keeps that outcome.
func TestAnswerRuleWinsOverConfigErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(401) }))
	t.Cleanup(srv.Close)
	r, err := ParseRoutes([]byte(`version: 1
routes:
  - name: strict
    match: {subject: strict}
    url: `+srv.URL+`
    answers:
      - {status: 401, outcome: permanent}
`), mapEnv(nil), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	subj := "strict"
	msg := &azservicebus.ReceivedMessage{Subject: &subj, Body: []byte(`{}`)}
	h, err := r.Route(msg)
	if err != nil {
		t.Fatal(err)
	}
	err = h.Effect.Perform(context.Background(), msg, "k1")
	if IsMisconfigured(err) || Classify(err) != OutcomePermanent {
		t.Fatalf("%v: want permanent, as the rule says", err)
	}
}
