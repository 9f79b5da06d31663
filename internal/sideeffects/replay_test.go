package sideeffects

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
)

// Answer rules match a response header: the name without case, the value
// without case and surrounding white space, any of its field lines.
func TestAnswerRuleHeader(t *testing.T) {
	t.Parallel()
	s := newScripted(t)
	logger, _ := testLogger(t)
	r := mustRouter(t, `
routes:
  - name: payments
    match: {subject: payment.requested}
    url: `+s.srv.URL+`/v1/charges
    answers:
      - {status: 500-599, header: idempotent-replayed, value: true, outcome: flag}
      - {status: 200, header: X-State, value: Pending, field: /done, equals: false, outcome: retryable}
`, nil, logger)
	msg := newMsg("m1", "payment.requested", `amount=1`)
	eff := mustEffect(t, r, msg)
	tests := []struct {
		name     string
		status   int
		body     string
		headers  map[string]string
		outcome  Outcome
		operator bool
	}{
		{"replayed 500", 500, `{}`, map[string]string{"Idempotent-Replayed": "true"}, OutcomeUnknown, true},
		{"replayed 502, value in capitals", 502, `{}`, map[string]string{"IDEMPOTENT-REPLAYED": " TRUE "}, OutcomeUnknown, true},
		{"fresh 500", 500, `{}`, nil, OutcomeUnknown, false},
		{"500 not replayed", 500, `{}`, map[string]string{"Idempotent-Replayed": "false"}, OutcomeUnknown, false},
		{"replayed 503: the default table", 503, `{}`, map[string]string{"Idempotent-Replayed": "yes"}, OutcomeRetryable, false},
		{"replayed 201", 201, `{}`, map[string]string{"Idempotent-Replayed": "true"}, OutcomeOK, false},
		{"header and field", 200, `{"done":false}`, map[string]string{"X-State": "pending"}, OutcomeRetryable, false},
		{"header without the field", 200, `{"done":true}`, map[string]string{"X-State": "pending"}, OutcomeOK, false},
		{"field without the header", 200, `{"done":false}`, nil, OutcomeOK, false},
	}
	for _, tt := range tests {
		s.answer(tt.status, tt.body, tt.headers)
		err := eff.Perform(context.Background(), msg, "m1")
		if Classify(err) != tt.outcome || ForOperator(err) != tt.operator {
			t.Errorf("%s: %v (outcome %v, needs an operator %v), want %v, %v", tt.name, err, Classify(err), ForOperator(err), tt.outcome, tt.operator)
		}
		if tt.operator && (!strings.Contains(err.Error(), "(answers[0])") || !strings.Contains(err.Error(), "a person must decide")) {
			t.Errorf("%s: error %q does not name the rule and say a person must decide", tt.name, err)
		}
		var e *Error
		if tt.operator && (!errors.As(err, &e) || e.Answer == nil || e.Answer.Status != tt.status || e.RetryAfter != 0) {
			t.Errorf("%s: error %+v, want the answer attached and no Retry-After", tt.name, e)
		}
	}
}

// A replayed stored failure, with the replay rule, ends the retry loop at
// the replay: the first request fails (a fresh 500, stored under the key),
// the second gets the replay and nothing more is sent. Without the rule
// every attempt is spent on replays.
func TestReplayedStoredFailureStopsTheRetries(t *testing.T) {
	t.Parallel()
	b := setupFake(t, fakedownstream.Options{ConflictStyle: fakedownstream.ConflictStripe})
	env := map[string]string{"STRIPE_KEY": "Bearer sk_test_x"}
	plain := mustRouter(t, stripeRoute(b.url), env, b.log)
	withRule := mustRouter(t, strings.Replace(stripeRoute(b.url), "    answers:\n",
		"    answers:\n      - {status: 5xx, header: Idempotent-Replayed, value: \"true\", outcome: flag}\n", 1), env, b.log)
	perform := func(r Router, key string) error {
		msg := newMsg(key, "payment.requested", "amount=1")
		return fastPolicy.Do(context.Background(), func(ctx context.Context) error {
			return mustEffect(t, r, msg).Perform(ctx, msg, key)
		}, nil)
	}
	b.fake.SetKeyReply("plain", fakedownstream.ReplyCachedFailure)
	if err := perform(plain, "plain"); Classify(err) != OutcomeUnknown || ForOperator(err) || b.fake.Requests("plain") != fastPolicy.MaxAttempts {
		t.Errorf("without the rule: %v, %d requests, want unknown after %d", err, b.fake.Requests("plain"), fastPolicy.MaxAttempts)
	}
	b.fake.SetKeyReply("rule", fakedownstream.ReplyCachedFailure)
	err := perform(withRule, "rule")
	if Classify(err) != OutcomeUnknown || !ForOperator(err) {
		t.Errorf("with the rule: %v, want unknown and needs an operator", err)
	}
	if b.fake.Requests("rule") != 2 || b.fake.Replays("rule") != 1 {
		t.Errorf("with the rule: %d requests, %d replays; want 2 and 1 (the fresh failure, then its replay)", b.fake.Requests("rule"), b.fake.Replays("rule"))
	}
}

func TestNeedsOperator(t *testing.T) {
	t.Parallel()
	base := errors.New("stored failure replayed")
	err := NeedsOperator(base)
	if Classify(err) != OutcomeUnknown || !ForOperator(err) || !errors.Is(err, base) {
		t.Errorf("NeedsOperator: outcome %v, for operator %v", Classify(err), ForOperator(err))
	}
	if wrapped := errors.Join(errors.New("step b"), err); !ForOperator(wrapped) {
		t.Error("a wrapped NeedsOperator error is not seen")
	}
	for _, e := range []error{nil, base, Unknown(base), Retryable(base), Rejected(base)} {
		if ForOperator(e) {
			t.Errorf("ForOperator(%v) = true", e)
		}
	}
	// The retry loop stops at it, even after an unknown attempt.
	calls := 0
	got := fastPolicy.Do(context.Background(), func(context.Context) error {
		calls++
		if calls == 1 {
			return Unknown(errors.New("timeout"))
		}
		return err
	}, nil)
	if calls != 2 || !ForOperator(got) {
		t.Errorf("Do: %d calls, %v; want 2 calls ending at the NeedsOperator error", calls, got)
	}
}

func TestKeyLifetime(t *testing.T) {
	t.Parallel()
	r := mustRouter(t, `
routes:
  - {name: pay, match: {subject: p}, url: "https://example.com/charges", keyLifetime: 24h}
  - {name: mail, match: {subject: m}, url: "https://example.com/mail"}
`, nil, nil)
	for subject, want := range map[string]time.Duration{"p": 24 * time.Hour, "m": 0} {
		h, err := r.Route(&azservicebus.ReceivedMessage{Subject: &subject})
		if err != nil || h.KeyLifetime != want {
			t.Errorf("subject %s: key lifetime %s (%v), want %s", subject, h.KeyLifetime, err, want)
		}
	}
	in, err := NewRouter(Route{Name: "go", Match: Match{Subject: AnySubject}, Effect: EffectFunc(nil), KeyLifetime: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if h, _ := in.Route(&azservicebus.ReceivedMessage{}); h.KeyLifetime != time.Hour {
		t.Errorf("in-code route: key lifetime %s, want 1h", h.KeyLifetime)
	}
	if _, err := NewRouter(Route{Name: "go", Match: Match{Subject: AnySubject}, Effect: EffectFunc(nil), KeyLifetime: -time.Hour}); err == nil ||
		!strings.Contains(err.Error(), `route "go": KeyLifetime`) {
		t.Errorf("negative KeyLifetime: %v", err)
	}
}

// keyLifetime and answer rules (header ones included) are not part of the
// fingerprint: claims taken before a route used them keep matching.
func TestReplayOptionsKeepTheFingerprint(t *testing.T) {
	t.Parallel()
	fp := func(yml string) string {
		t.Helper()
		subject := "p"
		h, err := mustRouter(t, yml, nil, nil).Route(&azservicebus.ReceivedMessage{Subject: &subject})
		if err != nil {
			t.Fatal(err)
		}
		return h.Fingerprint
	}
	plain := fp(`
routes:
  - {name: pay, match: {subject: p}, url: "https://example.com/charges"}
`)
	// The fingerprint of this route as it was before these options.
	if want := Fingerprint("", "POST", "https://example.com/charges"); plain != want {
		t.Errorf("plain route: fingerprint %s, want %s", plain, want)
	}
	with := fp(`
routes:
  - name: pay
    match: {subject: p}
    url: "https://example.com/charges"
    keyLifetime: 24h
    answers:
      - {status: 5xx, header: Idempotent-Replayed, value: "true", outcome: flag}
`)
	if with != plain {
		t.Errorf("keyLifetime and a replay rule changed the fingerprint: %s, was %s", with, plain)
	}
}

func TestReplayOptionsSchemaErrors(t *testing.T) {
	t.Parallel()
	route := func(extra string) string {
		return "routes:\n  - name: payments\n    match: {subject: s}\n    url: https://example.com/p\n" + extra
	}
	tests := []struct {
		name, yml string
		want      []string
	}{
		{"header without value", route("    answers:\n      - {status: 500, header: Idempotent-Replayed, outcome: flag}\n"),
			[]string{`route "payments": field "answers[0].value"`, "missing", "response header"}},
		{"value without header", route("    answers:\n      - {status: 500, value: \"true\", outcome: flag}\n"),
			[]string{`route "payments": field "answers[0].header"`, "missing"}},
		{"bad header name", route("    answers:\n      - {status: 500, header: \"Idempotent Replayed\", value: \"true\", outcome: flag}\n"),
			[]string{`field "answers[0].header"`, "not a valid HTTP header name"}},
		{"value an object", route("    answers:\n      - {status: 500, header: X-A, value: {a: 1}, outcome: flag}\n"),
			[]string{`field "answers[0].value"`}},
		{"value a fraction", route("    answers:\n      - {status: 500, header: X-A, value: 1.5, outcome: flag}\n"),
			[]string{`field "answers[0].value"`}},
		{"bad outcome", route("    answers:\n      - {status: 500, outcome: flagged}\n"),
			[]string{`field "answers[0].outcome"`, "flag"}},
		{"step rule", "routes:\n  - name: order\n    match: {subject: s}\n    steps:\n      - name: a\n        url: https://example.com/a\n        answers:\n          - {status: 500, header: X-A, outcome: flag}\n",
			[]string{`route "order": field "steps[0].answers[0].value"`}},
		{"keyLifetime not a duration", route("    keyLifetime: 1 day\n"),
			[]string{`route "payments": field "keyLifetime"`, `"1 day" is not a duration`}},
		{"keyLifetime zero", route("    keyLifetime: 0s\n"),
			[]string{`route "payments": field "keyLifetime"`, "greater than zero"}},
		{"keyLifetime a number", route("    keyLifetime: 86400\n"),
			[]string{`route "payments": field "keyLifetime"`}},
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

// The README's Stripe example and examples/routes.yaml flag a replayed
// stored failure at once and say Stripe keeps keys for 24h.
func TestStripeExamplesFlagAReplayedFailure(t *testing.T) {
	t.Parallel()
	example, err := os.ReadFile(filepath.Join("..", "..", "examples", "routes.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for name, file := range map[string]string{"README": readmeStripeRoute(t), "examples/routes.yaml": string(example)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setupFake(t, fakedownstream.Options{StripeRequests: true, ConflictStyle: fakedownstream.ConflictStripe})
			env := map[string]string{"STRIPE_AUTHORIZATION": "Bearer sk_test_4eC39HqLyjWDarjtT1zdp7dc", "PAYMENTS_TOKEN": "Bearer payments-token", "EMAILS_API_KEY": "emails-api-key"}
			r := mustRouter(t, strings.ReplaceAll(file, "https://api.stripe.com", b.url), env, b.log)
			msg := jsonMsg("evt-9", "payment.requested", `{"order":45,"amount_cents":700,"payment_method":"pm_card_visa"}`)
			h, err := r.Route(msg)
			if err != nil || h.KeyLifetime != 24*time.Hour || !h.AllowNewKey {
				t.Fatalf("payments: key lifetime %s, allowNewKey %v (%v); want 24h and true", h.KeyLifetime, h.AllowNewKey, err)
			}
			b.fake.SetKeyReply("evt-9", fakedownstream.ReplyCachedFailure)
			err = fastPolicy.Do(context.Background(), func(ctx context.Context) error { return h.Effect.Perform(ctx, msg, "evt-9") }, nil)
			if !ForOperator(err) || b.fake.Requests("evt-9") != 2 {
				t.Errorf("stored failure: %v after %d requests; want flagged for an operator at the first replay (2 requests)", err, b.fake.Requests("evt-9"))
			}
		})
	}
}
