package sideeffects

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
)

func TestJSONPointer(t *testing.T) {
	t.Parallel()
	// RFC 6901 section 5.
	doc, ok := decodeJSON([]byte(`{"foo":["bar","baz"],"":0,"a/b":1,"c%d":2,"e^f":3,"g|h":4,"i\\j":5,"k\"l":6," ":7,"m~n":8}`))
	if !ok {
		t.Fatal("example document does not decode")
	}
	for ptr, want := range map[string]string{
		"/foo": `["bar","baz"]`, "/foo/0": "bar", "/": "0", "/a~1b": "1", "/c%d": "2", "/e^f": "3",
		"/g|h": "4", `/i\j`: "5", `/k"l`: "6", "/ ": "7", "/m~0n": "8",
	} {
		tokens, err := parsePointer(ptr)
		if err != nil {
			t.Errorf("parsePointer(%q): %v", ptr, err)
			continue
		}
		v, ok := lookupPointer(doc, tokens)
		if !ok || jsonText(v) != want {
			t.Errorf("%q = %v (%v), want %s", ptr, jsonText(v), ok, want)
		}
	}
	if tokens, _ := parsePointer("/~01"); len(tokens) != 1 || tokens[0] != "~1" {
		t.Errorf(`"/~01" = %q, want the name "~1"`, tokens)
	}
	for _, bad := range []string{"foo", "/~", "/~2", "/a~b"} {
		if _, err := parsePointer(bad); err == nil {
			t.Errorf("parsePointer(%q) accepted", bad)
		}
	}
	for _, missing := range []string{"/foo/2", "/foo/-", "/foo/01", "/foo/x", "/nope", "/foo/0/deeper"} {
		tokens, _ := parsePointer(missing)
		if _, ok := lookupPointer(doc, tokens); ok {
			t.Errorf("%q found", missing)
		}
	}
	for _, notOne := range []string{`{"a":1} {"b":2}`, `not json`, ``, `{"a":`} {
		if _, ok := decodeJSON([]byte(notOne)); ok {
			t.Errorf("decodeJSON(%q) accepted", notOne)
		}
	}
}

// scripted is a downstream whose next answer the test sets.
type scripted struct {
	mu      sync.Mutex
	status  int
	body    string
	headers map[string]string
	srv     *httptest.Server
}

func newScripted(t *testing.T) *scripted {
	s := &scripted{status: 200}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		defer s.mu.Unlock()
		for k, v := range s.headers {
			w.Header().Set(k, v)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(s.status)
		fmt.Fprint(w, s.body)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *scripted) answer(status int, body string, headers map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.status, s.body, s.headers = status, body, headers
}

// stripeRoute is the README's worked example for a Stripe-style API.
func stripeRoute(url string) string {
	return fmt.Sprintf(`
routes:
  - name: payments
    match: {subject: payment.requested}
    url: %s/v1/charges
    headers:
      Authorization: {fromEnv: STRIPE_KEY}
    answers:
      - {status: 402, outcome: rejected}
      - {status: 400, field: /error/type, equals: idempotency_error, outcome: conflict}
      - {status: 409, outcome: retryable}
    record:
      headers: [Request-Id]
      fields: [/id, /status, /error/code, /error/charge]
`, url)
}

func TestAnswerRulesStripeStyle(t *testing.T) {
	t.Parallel()
	s := newScripted(t)
	logger, logs := testLogger(t)
	r := mustRouter(t, stripeRoute(s.srv.URL), map[string]string{"STRIPE_KEY": "Bearer sk_test_x"}, logger)
	msg := newMsg("m1", "payment.requested", `amount=1000`)
	eff := mustEffect(t, r, msg)
	run := func() (*Answer, error) {
		ctx, rec := RecordAnswers(context.Background())
		err := eff.Perform(ctx, msg, "m1")
		return rec.Last(), err
	}

	// 2xx: the charge id is recorded.
	s.answer(200, `{"id":"ch_123","object":"charge","status":"succeeded","amount":1000}`, map[string]string{"Request-Id": "req_abc"})
	a, err := run()
	if err != nil || a == nil || a.Status != 200 || a.Fields["/id"] != "ch_123" || a.Fields["/status"] != "succeeded" || a.Headers["Request-Id"] != "req_abc" {
		t.Errorf("2xx: %v, answer %+v", err, a)
	}
	if _, ok := a.Fields["/error/code"]; ok {
		t.Errorf("a field the answer does not have was recorded: %+v", a.Fields)
	}

	// A card decline is a final answer, with the failed charge recorded.
	s.answer(402, `{"error":{"type":"card_error","code":"card_declined","decline_code":"generic_decline","charge":"ch_456"}}`, map[string]string{"Request-Id": "req_def"})
	a, err = run()
	if Classify(err) != OutcomeRejected || !strings.Contains(err.Error(), "answers[0]") {
		t.Errorf("402: %v (outcome %v), want rejected by answers[0]", err, Classify(err))
	}
	if a == nil || a.Status != 402 || a.Fields["/error/charge"] != "ch_456" || a.Fields["/error/code"] != "card_declined" {
		t.Errorf("402 answer: %+v", a)
	}
	if ea := AnswerOf(err); ea == nil || ea.Fields["/error/charge"] != "ch_456" {
		t.Errorf("the error does not carry the answer: %+v", ea)
	}

	// Stripe's idempotency error is a conflict; any other 400 falls back
	// to the table (permanent).
	s.answer(400, `{"error":{"type":"idempotency_error","message":"Keys for idempotent requests can only be used with the same parameters they were first used with."}}`, nil)
	if _, err := run(); Classify(err) != OutcomeConflict || !strings.Contains(err.Error(), "answers[1]") {
		t.Errorf("400 idempotency_error: %v, want conflict by answers[1]", err)
	}
	s.answer(400, `{"error":{"type":"invalid_request_error","param":"amount"}}`, nil)
	if _, err := run(); Classify(err) != OutcomePermanent || strings.Contains(err.Error(), "answers[") {
		t.Errorf("other 400: %v, want permanent by the table", err)
	}
	s.answer(400, `not json at all`, nil)
	if _, err := run(); Classify(err) != OutcomePermanent {
		t.Errorf("400 without a JSON body: %v, want permanent by the table", err)
	}

	// 409: retried later with the same key, honouring Retry-After.
	s.answer(409, `{"error":{"type":"idempotency_error"}}`, map[string]string{"Retry-After": "4"})
	_, err = run()
	var e *Error
	if Classify(err) != OutcomeRetryable || !errors.As(err, &e) || e.RetryAfter != 4*time.Second {
		t.Errorf("409: %v (%+v), want retryable with Retry-After 4s", err, e)
	}
	if !strings.Contains(logs.String(), "answer_rule=answers[2]") {
		t.Error("the log line does not name the rule that decided")
	}

	// A cached 500 (stored and replayed by the downstream) is unknown by
	// the table, every time.
	s.answer(500, `{"error":{"type":"api_error"}}`, nil)
	for range 2 {
		if a, err := run(); Classify(err) != OutcomeUnknown || a.Status != 500 {
			t.Errorf("cached 500: %v, answer %+v", err, a)
		}
	}
}

func TestAnswerRuleKinds(t *testing.T) {
	t.Parallel()
	s := newScripted(t)
	logger, _ := testLogger(t)
	r := mustRouter(t, fmt.Sprintf(`
routes:
  - name: p
    match: {subject: s}
    url: %s/p
    answers:
      - {status: 200, field: /ok, equals: false, outcome: permanent}        # a 200 that says it failed
      - {status: 200-299, field: /state, equals: declined, outcome: rejected}
      - {status: 404, outcome: ok}                                          # "already deleted" is done
      - {status: 418, field: /n, equals: 7, outcome: conflict}               # numbers compare as numbers
      - {status: 418, field: /n, equals: 7.5, outcome: unknown}
      - {status: 418, field: "/a~1b/0", equals: x, outcome: rejected}
      - {status: 4xx, outcome: rejected}                                    # a class
      - {status: "500-503", outcome: retryable}                            # a range
      - {status: 500, outcome: unknown}                                    # never reached: first match wins
`, s.srv.URL), nil, logger)
	msg := newMsg("m", "s", `{}`)
	eff := mustEffect(t, r, msg)
	tests := []struct {
		status int
		body   string
		want   Outcome
		rule   string // "" for the default table
	}{
		{200, `{"ok":true}`, OutcomeOK, ""},
		{200, `{"ok":false}`, OutcomePermanent, "answers[0]"},
		{200, `{"ok":"false"}`, OutcomeOK, ""}, // a string is not a boolean
		{201, `{"state":"declined"}`, OutcomeRejected, "answers[1]"},
		{201, `{"state":"approved"}`, OutcomeOK, ""},
		{404, `{}`, OutcomeOK, "answers[2]"},
		{418, `{"n":7}`, OutcomeConflict, "answers[3]"},
		{418, `{"n":7.0}`, OutcomeConflict, "answers[3]"},
		{418, `{"n":"7"}`, OutcomeRejected, "answers[6]"},
		{418, `{"n":7.5}`, OutcomeUnknown, "answers[4]"},
		{418, `{"a/b":["x"]}`, OutcomeRejected, "answers[5]"},
		{499, `{}`, OutcomeRejected, "answers[6]"},
		{500, `{}`, OutcomeRetryable, "answers[7]"},
		{503, `{}`, OutcomeRetryable, "answers[7]"},
		{504, `{}`, OutcomeUnknown, ""}, // the table
		{301, `{}`, OutcomePermanent, ""},
	}
	for _, tt := range tests {
		s.answer(tt.status, tt.body, nil)
		err := eff.Perform(context.Background(), msg, "m")
		if got := Classify(err); got != tt.want {
			t.Errorf("%d %s: outcome %v, want %v (%v)", tt.status, tt.body, got, tt.want, err)
			continue
		}
		if err != nil && tt.rule != "" && !strings.Contains(err.Error(), "("+tt.rule+")") {
			t.Errorf("%d %s: error does not name %s: %v", tt.status, tt.body, tt.rule, err)
		}
		if err != nil && tt.rule == "" && strings.Contains(err.Error(), "answers[") {
			t.Errorf("%d %s: error names a rule, want the table: %v", tt.status, tt.body, err)
		}
	}
}

func TestAnswerRulesRetryAfter(t *testing.T) {
	t.Parallel()
	s := newScripted(t)
	logger, _ := testLogger(t)
	r := mustRouter(t, oneRoute(s.srv.URL, `    answers:
      - {status: "402", outcome: rejected}   # a quoted code is a code
      - {status: 425, outcome: unknown}
      - {status: 420, outcome: retryable}
`), nil, logger)
	msg := newMsg("m", "payment.requested", `{}`)
	eff := mustEffect(t, r, msg)
	for status, want := range map[int]time.Duration{402: 0, 425: 3 * time.Second, 420: 3 * time.Second} {
		s.answer(status, `{}`, map[string]string{"Retry-After": "3"})
		var e *Error
		if err := eff.Perform(context.Background(), msg, "m"); !errors.As(err, &e) || e.RetryAfter != want {
			t.Errorf("%d: %v (%+v), want RetryAfter %v", status, err, e, want)
		}
	}
}

// TestExcerptOff: with excerpt: false, no body text reaches an error (a
// downstream that echoes the request puts personal data there); the
// status, the rule and the recorded fields still do their job.
func TestExcerptOff(t *testing.T) {
	t.Parallel()
	s := newScripted(t)
	const pii = "jane.doe@example.com"
	s.answer(400, `{"error":{"code":"invalid_email","echo":{"email":"`+pii+`"}}}`, nil)
	for _, off := range []bool{false, true} {
		extra := "    record: {fields: [/error/code]}\n"
		if off {
			extra += "    excerpt: false\n"
		}
		logger, logs := testLogger(t)
		r := mustRouter(t, oneRoute(s.srv.URL, extra), nil, logger)
		msg := newMsg("m", "payment.requested", `{}`)
		ctx, rec := RecordAnswers(context.Background())
		err := mustEffect(t, r, msg).Perform(ctx, msg, "m")
		if Classify(err) != OutcomePermanent || !strings.Contains(err.Error(), "HTTP 400") {
			t.Fatalf("excerpt off=%v: %v", off, err)
		}
		if got := strings.Contains(err.Error(), pii); got == off {
			t.Errorf("excerpt off=%v: body text in the error = %v: %v", off, got, err)
		}
		if rec.Last().Fields["/error/code"] != "invalid_email" {
			t.Errorf("recorded fields lost: %+v", rec.Last())
		}
		if got := strings.Contains(logs.String(), pii); got == off {
			t.Errorf("excerpt off=%v: body text in the log = %v", off, got)
		}
	}
}

func TestAllowNewKey(t *testing.T) {
	t.Parallel()
	r := mustRouter(t, `
routes:
  - {name: a, match: {subject: a}, url: "https://example.com/a", allowNewKey: true}
  - {name: b, match: {subject: b}, url: "https://example.com/b"}
`, nil, nil)
	for subject, want := range map[string]bool{"a": true, "b": false} {
		h, err := r.Route(newMsg("m", subject, `{}`))
		if err != nil || h.AllowNewKey != want {
			t.Errorf("route %s: AllowNewKey %v (%v), want %v", subject, h.AllowNewKey, err, want)
		}
	}
	eff := EffectFunc(func(context.Context, *azservicebus.ReceivedMessage, string) error { return nil })
	rs, _ := NewRouter(Route{Name: "g", Match: Match{Subject: AnySubject}, Effect: eff, AllowNewKey: true})
	if h, _ := rs.Route(newMsg("m", "x", "")); !h.AllowNewKey {
		t.Error("in-code Route.AllowNewKey not carried to the Handler")
	}
	if got := parseErr(t, `
routes:
  - {name: a, match: {subject: a}, url: "https://example.com/a", allowNewKey: "yes"}
`, nil); !strings.Contains(got, `route "a": field "allowNewKey"`) {
		t.Errorf("allowNewKey: %s", got)
	}
}

// TestStepsAnswers: a step's rules come before the route's, its record
// replaces the route's, the recorder's last answer is the last step's, and
// a rejected step 2 after a performed step 1 is rejected (final), naming
// the performed step.
func TestStepsAnswers(t *testing.T) {
	t.Parallel()
	reserve, charge := newScripted(t), newScripted(t)
	logger, _ := testLogger(t)
	r := mustRouter(t, fmt.Sprintf(`
routes:
  - name: order
    match: {subject: order}
    answers:
      - {status: 402, outcome: permanent}
    record: {fields: [/id]}
    steps:
      - {name: reserve, url: "%s/reserve"}
      - name: charge
        url: "%s/charge"
        answers:
          - {status: 402, outcome: rejected}
        record: {fields: [/error/charge]}
`, reserve.srv.URL, charge.srv.URL), nil, logger)
	msg := newMsg("m", "order", `{}`)
	eff := mustEffect(t, r, msg)

	reserve.answer(201, `{"id":"res_1"}`, nil)
	charge.answer(402, `{"id":"x","error":{"charge":"ch_9"}}`, nil)
	ctx, rec := RecordAnswers(context.Background())
	err := eff.Perform(ctx, msg, "m")
	if Classify(err) != OutcomeRejected || !strings.Contains(err.Error(), "step charge") || !strings.Contains(err.Error(), "earlier steps were performed (reserve)") {
		t.Errorf("step 2 declined: %v (outcome %v)", err, Classify(err))
	}
	a := rec.Last()
	if rec.Count() != 2 || a.Step != "charge" || a.Status != 402 || a.Fields["/error/charge"] != "ch_9" || a.Fields["/id"] != "" {
		t.Errorf("last answer %+v (of %d), want step charge's, with its own record", a, rec.Count())
	}
	if ea := AnswerOf(err); ea == nil || ea.Step != "charge" {
		t.Errorf("error answer: %+v", ea)
	}
	// Step 1 uses the route's rules: its 402 is permanent (not performed,
	// nothing before it).
	reserve.answer(402, `{"id":"res_2"}`, nil)
	ctx, rec = RecordAnswers(context.Background())
	if err := eff.Perform(ctx, msg, "m"); Classify(err) != OutcomePermanent {
		t.Errorf("step 1 402: %v, want permanent by the route's rule", err)
	}
	if a := rec.Last(); a.Step != "reserve" || a.Fields["/id"] != "res_2" {
		t.Errorf("step 1 answer: %+v", a)
	}
	b, _ := json.Marshal(rec.Last())
	if !strings.Contains(string(b), `"step":"reserve"`) {
		t.Errorf("answer JSON: %s", b)
	}
}

func TestAnswerRulesSchemaErrors(t *testing.T) {
	t.Parallel()
	route := func(extra string) string {
		return "routes:\n  - name: payments\n    match: {subject: s}\n    url: https://example.com/p\n    headers:\n      X-Api-Key: {fromEnv: KEY}\n" + extra
	}
	env := map[string]string{"KEY": "k"}
	tests := []struct {
		name, yml string
		want      []string
	}{
		{"status out of range", route("    answers:\n      - {status: 402, outcome: rejected}\n      - {status: 700, outcome: ok}\n"),
			[]string{`route "payments": field "answers[1].status"`, "700 is not a status"}},
		{"status not a range", route("    answers:\n      - {status: 4xy, outcome: ok}\n"),
			[]string{`field "answers[0].status"`, `"4xy" is not a status`}},
		{"status float", route("    answers:\n      - {status: 402.5, outcome: ok}\n"),
			[]string{`field "answers[0].status"`, "not a status"}},
		{"range backwards", route("    answers:\n      - {status: 499-400, outcome: ok}\n"),
			[]string{`field "answers[0].status"`, "starts after it ends"}},
		{"missing outcome", route("    answers:\n      - {status: 402}\n"),
			[]string{`field "answers[0].outcome"`, "missing"}},
		{"bad outcome", route("    answers:\n      - {status: 402, outcome: failed}\n"),
			[]string{`field "answers[0].outcome"`, "rejected"}},
		{"bad pointer", route("    answers:\n      - {status: 400, field: error.type, equals: x, outcome: conflict}\n"),
			[]string{`field "answers[0].field"`, "not a JSON Pointer"}},
		{"bad pointer escape", route("    answers:\n      - {status: 400, field: /a~2, equals: x, outcome: conflict}\n"),
			[]string{`field "answers[0].field"`, "not a JSON Pointer"}},
		{"field without equals", route("    answers:\n      - {status: 400, field: /error/type, outcome: conflict}\n"),
			[]string{`field "answers[0].equals"`, "missing", "field needs equals"}},
		{"equals without field", route("    answers:\n      - {status: 400, equals: x, outcome: conflict}\n"),
			[]string{`field "answers[0].field"`, "missing"}},
		{"equals an object", route("    answers:\n      - {status: 400, field: /e, equals: {a: 1}, outcome: conflict}\n"),
			[]string{`field "answers[0].equals"`}},
		{"unknown rule field", route("    answers:\n      - {status: 400, outcome: ok, when: x}\n"),
			[]string{`field "answers[0].when"`, "unknown field"}},
		{"empty answers", route("    answers: []\n"), []string{`field "answers"`}},
		{"record Authorization", route("    record: {headers: [Request-Id, authorization]}\n"),
			[]string{`field "record.headers[1]"`, "Authorization carries a secret"}},
		{"record Set-Cookie", route("    record: {headers: [Set-Cookie]}\n"),
			[]string{`field "record.headers[0]"`, "secret"}},
		{"record a fromEnv header", route("    record: {headers: [x-api-key]}\n"),
			[]string{`field "record.headers[0]"`, "X-Api-Key carries a secret"}},
		{"record twice", route("    record: {headers: [Request-Id, request-id]}\n"),
			[]string{`field "record.headers[1]"`, "twice"}},
		{"record bad header", route("    record: {headers: [\"Request Id\"]}\n"),
			[]string{`field "record.headers[0]"`, "header name"}},
		{"record bad pointer", route("    record: {fields: [id]}\n"),
			[]string{`field "record.fields[0]"`, "not a JSON Pointer"}},
		{"record empty", route("    record: {}\n"), []string{`field "record"`, "headers, fields or both"}},
		{"record too much", route("    record: {headers: [A, B, C, D, E, F, G, H, I], fields: [/a, /b, /c, /d, /e, /f, /g, /h]}\n"),
			[]string{`field "record"`, "at most 16"}},
		{"excerpt not a boolean", route("    excerpt: off\n"), []string{`field "excerpt"`}},
		{"step rule", `
routes:
  - name: order
    match: {subject: s}
    steps:
      - name: a
        url: https://example.com/a
        answers:
          - {status: 1000, outcome: ok}
`, []string{`route "order": field "steps[0].answers[0].status"`}},
		{"step record", `
routes:
  - name: order
    match: {subject: s}
    steps:
      - name: a
        url: https://example.com/a
        record: {headers: [Cookie]}
`, []string{`route "order": field "steps[0].record.headers[0]"`, "Cookie carries a secret"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := parseErr(t, tt.yml, env)
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("error %q does not contain %q", got, w)
				}
			}
		})
	}
}

// TestFakeDownstreamAnswersLikeAPaymentAPI runs the README's Stripe-style
// rules against the fake's decline, conflict and cached-failure replies.
func TestFakeDownstreamAnswersLikeAPaymentAPI(t *testing.T) {
	t.Parallel()
	b := setupFake(t, fakedownstream.Options{ConflictStyle: fakedownstream.ConflictStripe})
	r := mustRouter(t, stripeRoute(b.url)+"    timeout: 300ms\n", map[string]string{"STRIPE_KEY": "Bearer sk_test_x"}, b.log)
	perform := func(key, body string) (*Answer, error) {
		msg := newMsg(key, "payment.requested", body)
		ctx, rec := RecordAnswers(context.Background())
		err := fastPolicy.Do(ctx, func(ctx context.Context) error {
			return mustEffect(t, r, msg).Perform(ctx, msg, key)
		}, nil)
		return rec.Last(), err
	}

	// A charge: ok, its id recorded.
	a, err := perform("ok-1", "amount=1")
	if err != nil || a == nil || !strings.HasPrefix(a.Fields["/id"], "fx_") || !strings.HasPrefix(a.Headers["Request-Id"], "req_") {
		t.Errorf("charge: %v, answer %+v", err, a)
	}

	// A decline: rejected, the failed charge recorded; every copy of the
	// message gets the replayed decline and nothing more is performed.
	b.fake.SetKeyReply("dec-1", fakedownstream.ReplyDecline)
	for range 3 {
		a, err = perform("dec-1", "amount=1")
		if Classify(err) != OutcomeRejected || a.Status != 402 || !strings.HasPrefix(a.Fields["/error/charge"], "fx_") {
			t.Errorf("decline: %v, answer %+v", err, a)
		}
	}
	if b.fake.Rejections("dec-1") != 1 || b.fake.Effects("dec-1") != 0 || b.fake.Requests("dec-1") != 3 {
		t.Errorf("decline counts: rejections %d effects %d requests %d", b.fake.Rejections("dec-1"), b.fake.Effects("dec-1"), b.fake.Requests("dec-1"))
	}

	// The decline whose first answer was lost: attempt 1 is unknown, the
	// replayed 402 ends it (the downstream's final word about the key).
	b.fake.SetKeyReply("dec-2", fakedownstream.ReplyDecline)
	b.fake.FailKey("dec-2", 1, fakedownstream.FaultHang)
	if _, err := perform("dec-2", "amount=1"); Classify(err) != OutcomeRejected || b.fake.Rejections("dec-2") != 1 {
		t.Errorf("lost decline: %v (outcome %v), rejections %d", err, Classify(err), b.fake.Rejections("dec-2"))
	}

	// The same key with other parameters: Stripe's 400 idempotency_error
	// is a conflict.
	if _, err := perform("ok-1", "amount=2"); Classify(err) != OutcomeConflict {
		t.Errorf("key reused: %v, want conflict", err)
	}
	b.fake.SetKeyReply("taken", fakedownstream.ReplyConflict)
	if a, err := perform("taken", "amount=1"); Classify(err) != OutcomeConflict || a.Status != 400 {
		t.Errorf("preset conflict: %v %+v", err, a)
	}

	// A cached 500: unknown on every attempt (the claim is kept and
	// flagged); only a new key gets through.
	b.fake.SetKeyReply("c-1", fakedownstream.ReplyCachedFailure)
	if a, err := perform("c-1", "amount=1"); Classify(err) != OutcomeUnknown || a.Status != 500 {
		t.Errorf("cached failure: %v %+v", err, a)
	}
	if b.fake.Requests("c-1") != fastPolicy.MaxAttempts || b.fake.Replays("c-1") != fastPolicy.MaxAttempts-1 || b.fake.CachedFailures("c-1") != 1 {
		t.Errorf("cached failure: %d requests, %d replays", b.fake.Requests("c-1"), b.fake.Replays("c-1"))
	}
	if a, err := perform("c-1:r1", "amount=1"); err != nil || a.Status != 201 || b.fake.Effects("c-1:r1") != 1 {
		t.Errorf("new key: %v %+v", err, a)
	}
}

func TestHoldSessionOnFailure(t *testing.T) {
	t.Parallel()
	r := mustRouter(t, `
routes:
  - {name: a, match: {subject: a}, url: "https://example.com/a", holdSessionOnFailure: true}
  - {name: b, match: {subject: b}, url: "https://example.com/b"}
`, nil, nil)
	for subject, want := range map[string]bool{"a": true, "b": false} {
		h, err := r.Route(newMsg("m", subject, `{}`))
		if err != nil || h.HoldSessionOnFailure != want {
			t.Errorf("route %s: HoldSessionOnFailure %v (%v), want %v", subject, h.HoldSessionOnFailure, err, want)
		}
	}
	eff := EffectFunc(func(context.Context, *azservicebus.ReceivedMessage, string) error { return nil })
	rs, _ := NewRouter(Route{Name: "g", Match: Match{Subject: AnySubject}, Effect: eff, HoldSessionOnFailure: true})
	if h, _ := rs.Route(newMsg("m", "x", "")); !h.HoldSessionOnFailure {
		t.Error("in-code Route.HoldSessionOnFailure not carried to the Handler")
	}
	if got := parseErr(t, `
routes:
  - {name: a, match: {subject: a}, url: "https://example.com/a", holdSessionOnFailure: "yes"}
`, nil); !strings.Contains(got, `route "a": field "holdSessionOnFailure"`) {
		t.Errorf("holdSessionOnFailure: %s", got)
	}
}
