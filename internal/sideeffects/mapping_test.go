package sideeffects

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
)

// jsonMsg is a message with a JSON body and ContentType application/json,
// as a producer of events sends it.
func jsonMsg(id, subject, body string) *azservicebus.ReceivedMessage {
	m := newMsg(id, subject, body)
	ct := "application/json"
	m.ContentType = &ct
	return m
}

// perform routes msg and performs its effect with key, failing the test
// on an error.
func perform(t *testing.T, r Router, msg *azservicebus.ReceivedMessage, key string) {
	t.Helper()
	if err := mustEffect(t, r, msg).Perform(context.Background(), msg, key); err != nil {
		t.Fatalf("Perform: %v", err)
	}
}

func TestRequestMappingFormBody(t *testing.T) {
	t.Parallel()
	b := setupFake(t, fakedownstream.Options{StripeRequests: true, ConflictStyle: fakedownstream.ConflictStripe})
	r := mustRouter(t, `
routes:
  - name: charges
    match: {subject: order.paid}
    url: "`+b.url+`/v1/payment_intents"
    headers:
      Authorization: {fromEnv: STRIPE_AUTHORIZATION}
    request:
      form:
        amount: {pointer: /amount_cents, type: integer}
        currency: {value: usd}
        confirm: {value: true}
        metadata[order]: {pointer: /order}
        metadata[note]: {pointer: /note, optional: true}
        "description": {pointer: /customer/name}
        "a~b": {pointer: "/we~1ird~0key"}
`, map[string]string{"STRIPE_AUTHORIZATION": "Bearer sk_test_123"}, b.log)

	msg := jsonMsg("m1", "order.paid", `{"order":42,"amount_cents":1999,"customer":{"name":"Ada & Bob"},"we/ird~key":"x=y"}`)
	perform(t, r, msg, "order-42")
	// A retry sends the same bytes: the downstream replays its answer
	// instead of answering "same key, other parameters".
	perform(t, r, msg, "order-42")

	bodies := b.fake.Bodies("order-42")
	if len(bodies) != 2 || bodies[0] != bodies[1] {
		t.Fatalf("bodies %q: want two identical requests", bodies)
	}
	got, err := url.ParseQuery(bodies[0])
	if err != nil {
		t.Fatal(err)
	}
	want := url.Values{
		"amount": {"1999"}, "currency": {"usd"}, "confirm": {"true"}, "metadata[order]": {"42"},
		"description": {"Ada & Bob"}, "a~b": {"x=y"},
	}
	if len(got) != len(want) {
		t.Errorf("form %v, want %v (a missing optional field is left out)", got, want)
	}
	for k, v := range want {
		if got.Get(k) != v[0] {
			t.Errorf("form field %s = %q, want %q (body %s)", k, got.Get(k), v[0], bodies[0])
		}
	}
	h := b.fake.Headers("order-42")[0]
	if ct := h.Get("Content-Type"); ct != "application/x-www-form-urlencoded" {
		t.Errorf("Content-Type %q, want the form's, not the message's", ct)
	}
	if h.Get("Idempotency-Key") != "order-42" || h.Get("Authorization") != "Bearer sk_test_123" {
		t.Errorf("headers %v", h)
	}
	if b.fake.Effects("order-42") != 1 || b.fake.Replays("order-42") != 1 || b.fake.Conflicts("order-42") != 0 {
		t.Errorf("effects %d replays %d conflicts %d, want 1/1/0", b.fake.Effects("order-42"), b.fake.Replays("order-42"), b.fake.Conflicts("order-42"))
	}
}

func TestRequestMappingJSONBody(t *testing.T) {
	t.Parallel()
	b := setupFake(t, fakedownstream.Options{})
	r := mustRouter(t, `
routes:
  - name: mail
    match: {subject: mail}
    url: "`+b.url+`/v3/send"
    request:
      json:
        to: {pointer: /recipient/email, type: string}
        template: {value: welcome}
        priority: {value: 2}
        track: {value: false}
        vars[order]: {pointer: /order}
        vars[lines]: {pointer: /lines}
        vars[big]: {pointer: /big}
        vars[missing]: {pointer: /nope, optional: true}
`, nil, b.log)
	msg := jsonMsg("m1", "mail", `{"recipient":{"email":"a@example.com"},"order":42,"lines":[{"sku":"x","qty":1}],"big":12345678901234567890123,"other":"not sent"}`)
	perform(t, r, msg, "mail-1")

	body := b.fake.Bodies("mail-1")[0]
	const want = `{"priority":2,"template":"welcome","to":"a@example.com","track":false,"vars":{"big":12345678901234567890123,"lines":[{"qty":1,"sku":"x"}],"order":42}}`
	if body != want {
		t.Errorf("body\n %s\nwant\n %s", body, want)
	}
	if ct := b.fake.Headers("mail-1")[0].Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
}

func TestRequestMappingPathSegments(t *testing.T) {
	t.Parallel()
	// The fake logs its paths; the logs checked are sbclaim's.
	b := setupFake(t, fakedownstream.Options{Logger: slog.New(slog.DiscardHandler)})
	r := mustRouter(t, `
routes:
  - name: customers
    match: {subject: customer.updated}
    url: "`+b.url+`/v1/customers/{customer}/notes/{n}?expand=x"
    request:
      path:
        customer: {pointer: /customer_id}
        n: {pointer: /note, type: integer}
`, nil, b.log)
	msg := jsonMsg("m1", "customer.updated", `{"customer_id":"cus_A-1.b~2","note":7}`)
	perform(t, r, msg, "c-1")
	if got := b.fake.EffectsAt("/v1/customers/cus_A-1.b~2/notes/7", "c-1"); got != 1 {
		t.Errorf("effects at the mapped path %d, want 1 (counts %+v)", got, b.fake.Snapshot().Keys["c-1"])
	}
	// Without a form or json mapping, the body is sent unchanged.
	if got := b.fake.Bodies("c-1"); len(got) != 1 || got[0] != string(msg.Body) {
		t.Errorf("body %q, want the message's", got)
	}
	if ct := b.fake.Headers("c-1")[0].Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want the message's", ct)
	}
	if logs := b.logs.String(); strings.Contains(logs, "cus_A") {
		t.Errorf("the logs show the mapped path:\n%s", logs)
	}
}

// A step has its own mapping, or the route's.
func TestRequestMappingSteps(t *testing.T) {
	t.Parallel()
	b := setupFake(t, fakedownstream.Options{})
	r := mustRouter(t, `
routes:
  - name: orders
    match: {subject: order}
    request:
      form: {order: {pointer: /order}}
    steps:
      - name: reserve
        url: "`+b.url+`/v1/reservations"
      - name: capture
        url: "`+b.url+`/v1/orders/{order}/capture"
        request:
          json: {amount: {pointer: /amount_cents}}
          path: {order: {pointer: /order}}
`, nil, b.log)
	perform(t, r, jsonMsg("m1", "order", `{"order":42,"amount_cents":1999}`), "o-42")
	if got := b.fake.Bodies("o-42:reserve"); len(got) != 1 || got[0] != "order=42" {
		t.Errorf("reserve body %q, want the route's form", got)
	}
	if got := b.fake.Bodies("o-42:capture"); len(got) != 1 || got[0] != `{"amount":1999}` {
		t.Errorf("capture body %q, want the step's json", got)
	}
	if b.fake.EffectsAt("/v1/orders/42/capture", "o-42:capture") != 1 {
		t.Error("capture not sent to its mapped path")
	}
}

// Every message the mapping cannot build a request from is refused by
// Route — before any claim — as MappingFailed, with a reason naming the
// route, the field and the problem, never the whole hostile value.
func TestRequestMappingRefusals(t *testing.T) {
	t.Parallel()
	r := mustRouter(t, `
routes:
  - name: customers
    match: {subject: s}
    url: https://api.example.com/v1/customers/{customer}
    request:
      path:
        customer: {pointer: /customer_id}
      form:
        amount: {pointer: /amount, type: integer}
        metadata[order]: {pointer: /order}
`, nil, nil)
	tests := []struct {
		name, body string
		want       []string // substrings of the description
		hidden     string   // must not appear in it
	}{
		{"dot dot slash", `{"customer_id":"../admin","amount":1,"order":1}`, []string{"request.path.customer", "/customer_id", `holds "/"`}, "../admin"},
		{"slash", `{"customer_id":"a/b","amount":1,"order":1}`, []string{`holds "/"`}, "a/b"},
		{"encoded slash", `{"customer_id":"%2F","amount":1,"order":1}`, []string{`holds "%"`}, "%2F"},
		{"encoded dot dot", `{"customer_id":"%2e%2e","amount":1,"order":1}`, []string{`holds "%"`}, "%2e%2e"},
		{"scheme and host", `{"customer_id":"http://evil","amount":1,"order":1}`, []string{`holds ":"`}, "http://evil"},
		{"at", `{"customer_id":"u@evil","amount":1,"order":1}`, []string{`holds "@"`}, "u@evil"},
		{"query", `{"customer_id":"a?x=1","amount":1,"order":1}`, []string{`holds "?"`}, "a?x=1"},
		{"space", `{"customer_id":"a b","amount":1,"order":1}`, []string{`holds " "`}, ""},
		{"CRLF", `{"customer_id":"a\r\nb","amount":1,"order":1}`, []string{"holds byte 0x0d"}, ""},
		{"non-ASCII", `{"customer_id":"caf\u00e9","amount":1,"order":1}`, []string{"holds byte 0xc3"}, ""},
		{"empty", `{"customer_id":"","amount":1,"order":1}`, []string{"is empty"}, ""},
		{"dot", `{"customer_id":".","amount":1,"order":1}`, []string{"dot segment"}, ""},
		{"dot dot", `{"customer_id":"..","amount":1,"order":1}`, []string{"dot segment"}, ""},
		{"too long", `{"customer_id":"` + strings.Repeat("a", MaxPathValueBytes+1) + `","amount":1,"order":1}`, []string{"257 bytes long"}, strings.Repeat("a", 64)},
		{"path missing", `{"amount":1,"order":1}`, []string{"request.path.customer", "no field /customer_id"}, ""},
		{"path object", `{"customer_id":{"id":"x"},"amount":1,"order":1}`, []string{"is an object", "a string or an integer"}, ""},
		{"path float", `{"customer_id":1.5,"amount":1,"order":1}`, []string{"is a number", "a string or an integer"}, ""},
		{"path bool", `{"customer_id":true,"amount":1,"order":1}`, []string{"is a boolean"}, ""},
		{"path null", `{"customer_id":null,"amount":1,"order":1}`, []string{"is null"}, ""},
		{"form missing", `{"customer_id":"c1","amount":1}`, []string{"request.form.metadata[order]", "no field /order"}, ""},
		{"form wrong declared type", `{"customer_id":"c1","amount":"19.99","order":1}`, []string{"request.form.amount", "is a string; want an integer"}, ""},
		{"form float for integer", `{"customer_id":"c1","amount":19.99,"order":1}`, []string{"is a number; want an integer"}, ""},
		{"form object", `{"customer_id":"c1","amount":1,"order":{"a":1}}`, []string{"request.form.metadata[order]", "is an object", "a form value"}, ""},
		{"form array", `{"customer_id":"c1","amount":1,"order":[1]}`, []string{"is an array"}, ""},
		{"not JSON", `customer_id=c1&amount=1`, []string{"not valid JSON"}, ""},
		{"empty body", ``, []string{"not valid JSON"}, ""},
		{"two documents", `{"customer_id":"c1"} {}`, []string{"not valid JSON"}, ""},
		{"not an object", `["c1"]`, []string{"no field /customer_id"}, ""},
	}
	for _, tc := range tests {
		_, err := r.Route(jsonMsg("m", "s", tc.body))
		var ie *InputError
		if !errors.As(err, &ie) || ie.Reason != ReasonMappingFailed {
			t.Errorf("%s: %v, want MappingFailed", tc.name, err)
			continue
		}
		if !strings.Contains(ie.Description, `route "customers"`) {
			t.Errorf("%s: %q does not name the route", tc.name, ie.Description)
		}
		for _, w := range tc.want {
			if !strings.Contains(ie.Description, w) {
				t.Errorf("%s: %q does not say %q", tc.name, ie.Description, w)
			}
		}
		if tc.hidden != "" && strings.Contains(ie.Description, tc.hidden) {
			t.Errorf("%s: %q quotes the value", tc.name, ie.Description)
		}
	}
	// The good message is routed.
	if _, err := r.Route(jsonMsg("m", "s", `{"customer_id":"cus_1","amount":1,"order":1}`)); err != nil {
		t.Errorf("good message: %v", err)
	}

	// A route that also says body: json keeps its MalformedBody.
	rj := mustRouter(t, `
routes:
  - {name: j, match: {subject: s}, body: json, url: "https://api.example.com/x", request: {form: {a: {pointer: /a}}}}
`, nil, nil)
	var ie *InputError
	if _, err := rj.Route(jsonMsg("m", "s", `nope`)); !errors.As(err, &ie) || ie.Reason != ReasonMalformedBody {
		t.Errorf("body: json route: %v, want MalformedBody", err)
	}
}

// The effect called without Route (it never is) still refuses to send a
// request it cannot build, as permanent.
func TestRequestMappingPerformRefusesWithoutSending(t *testing.T) {
	t.Parallel()
	b := setupFake(t, fakedownstream.Options{})
	r := mustRouter(t, `
routes:
  - name: c
    match: {subject: s}
    url: "`+b.url+`/v1/customers/{id}"
    request: {path: {id: {pointer: /id}}}
`, nil, b.log)
	eff := mustEffect(t, r, jsonMsg("m", "s", `{"id":"ok"}`))
	err := eff.Perform(context.Background(), jsonMsg("m", "s", `{"id":"../x"}`), "k")
	if Classify(err) != OutcomePermanent || !strings.Contains(err.Error(), "not sent") {
		t.Errorf("Perform with a hostile value: %v (%v), want permanent, not sent", err, Classify(err))
	}
	if b.fake.TotalRequests() != 0 {
		t.Errorf("%d requests sent", b.fake.TotalRequests())
	}
}

func TestRequestMappingLoadTimeRefusals(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, route string
		want        []string
	}{
		{"placeholder in host", `url: "https://{tenant}.example.com/v1/x"
    request: {path: {tenant: {pointer: /t}}}`, []string{`field "url"`, "host and port are fixed"}},
		{"placeholder as host", `url: "https://{host}/v1/x"
    request: {path: {host: {pointer: /h}}}`, []string{`field "url"`, "host and port are fixed"}},
		{"placeholder in port", `url: "https://api.example.com:{port}/v1/x"
    request: {path: {port: {pointer: /p}}}`, []string{`field "url"`, "host and port are fixed"}},
		{"placeholder in scheme", `url: "{scheme}://api.example.com/v1/x"
    request: {path: {scheme: {pointer: /s}}}`, []string{`field "url"`, "scheme is fixed"}},
		{"placeholder as the whole URL", `url: "{url}"
    request: {path: {url: {pointer: /u}}}`, []string{`field "url"`}},
		{"placeholder in query", `url: "https://api.example.com/v1/x?id={id}"
    request: {path: {id: {pointer: /id}}}`, []string{`field "url"`, "query and fragment are fixed"}},
		{"placeholder in fragment", `url: "https://api.example.com/v1/x#{id}"
    request: {path: {id: {pointer: /id}}}`, []string{`field "url"`, "query and fragment are fixed"}},
		{"part of a segment", `url: "https://api.example.com/v1/cus_{id}"
    request: {path: {id: {pointer: /id}}}`, []string{`field "url"`, "whole path segment"}},
		{"template syntax", `url: "https://api.example.com/v1/{{.id}}"
    request: {path: {id: {pointer: /id}}}`, []string{`field "url"`, "whole path segment"}},
		{"encoded brace", `url: "https://api.example.com/v1/%7Bid%7D/{id}"
    request: {path: {id: {pointer: /id}}}`, []string{`field "url"`, "template syntax"}},
		{"placeholder without entry", `url: "https://api.example.com/v1/{id}"
    request: {form: {a: {value: b}}}`, []string{`field "url"`, "placeholder {id} has no entry in request.path"}},
		{"placeholder without request", `url: "https://api.example.com/v1/{id}"`, []string{`field "url"`, "request.path"}},
		{"entry without placeholder", `url: "https://api.example.com/v1/x"
    request: {path: {id: {pointer: /id}}}`, []string{`field "request.path.id"`, "no placeholder {id}"}},
		{"fixed path value", `url: "https://api.example.com/v1/{id}"
    request: {path: {id: {value: abc}}}`, []string{`field "request.path.id.value"`, "write a fixed segment into the url"}},
		{"form and json", `url: "https://api.example.com/v1/x"
    request: {form: {a: {value: b}}, json: {a: {value: b}}}`, []string{`field "request"`, "form or json, not both"}},
		{"pointer and value", `url: "https://api.example.com/v1/x"
    request: {form: {a: {value: b, pointer: /a}}}`, []string{`field "request.form.a"`, "exactly one of pointer"}},
		{"neither", `url: "https://api.example.com/v1/x"
    request: {form: {a: {}}}`, []string{`field "request.form.a"`, "exactly one of pointer"}},
		{"type on a value", `url: "https://api.example.com/v1/x"
    request: {form: {a: {value: b, type: string}}}`, []string{`field "request.form.a.pointer"`, "type applies to a field of the message"}},
		{"bad pointer", `url: "https://api.example.com/v1/x"
    request: {form: {a: {pointer: amount}}}`, []string{`field "request.form.a.pointer"`, "not a JSON Pointer"}},
		{"bad type", `url: "https://api.example.com/v1/x"
    request: {form: {a: {pointer: /a, type: money}}}`, []string{`field "request.form.a.type"`}},
		{"bad field name", `url: "https://api.example.com/v1/x"
    request: {form: {"metadata[order": {pointer: /a}}}`, []string{`field "request.form.metadata[order"`, "not a field name"}},
		{"bad placeholder name", `url: "https://api.example.com/v1/x"
    request: {path: {"a-b": {pointer: /a}}}`, []string{`field "request.path.a-b"`, "not a placeholder name"}},
		{"empty request", `url: "https://api.example.com/v1/x"
    request: {}`, []string{`field "request"`, "set form, json or path"}},
		{"unknown field", `url: "https://api.example.com/v1/x"
    request: {query: {a: {value: b}}}`, []string{`field "request.query"`, "unknown field"}},
		{"json value and object", `url: "https://api.example.com/v1/x"
    request: {json: {meta: {value: x}, "meta[a]": {value: y}}}`, []string{`field "request.json.meta"`, "meta[a]"}},
		{"content type mismatch", `url: "https://api.example.com/v1/x"
    contentType: application/json
    request: {form: {a: {value: b}}}`, []string{`field "contentType"`, "does not match request.form"}},
		{"path in a step", `steps:
      - name: one
        url: "https://{h}.example.com/x"
        request: {path: {h: {pointer: /h}}}`, []string{`field "steps[0].url"`, "host and port are fixed"}},
		{"route mapping, step placeholder", `request: {form: {a: {value: b}}}
    steps:
      - name: one
        url: "https://api.example.com/x/{id}"`, []string{`field "steps[0].url"`, "placeholder {id} has no entry in request.path"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := parseErr(t, `
routes:
  - name: mapped
    match: {subject: s}
    `+tc.route+"\n", nil)
			for _, w := range append([]string{`route "mapped"`}, tc.want...) {
				if !strings.Contains(got, w) {
					t.Errorf("error %q does not say %q", got, w)
				}
			}
		})
	}
}

func TestRequestMappingFingerprint(t *testing.T) {
	t.Parallel()
	fp := func(route string) string {
		t.Helper()
		r := mustRouter(t, "routes:\n  - name: pay\n    match: {subject: p}\n    "+route+"\n", nil, nil)
		return r.routes[0].fingerprint
	}
	const u = `url: "https://api.example.com/v1/customers/{c}"`
	base := fp(u + `
    request: {path: {c: {pointer: /c}}, form: {amount: {pointer: /amount}, currency: {value: usd}}}`)
	// A route without a mapping keeps the fingerprint it always had.
	if got, want := fp(`url: "https://api.example.com/v1/charges"`), Fingerprint("", "POST", "https://api.example.com/v1/charges"); got != want {
		t.Errorf("unmapped route fingerprint %s, want %s as before mappings", got, want)
	}
	// The same mapping written in another order: the same fingerprint.
	if got := fp(u + `
    request: {form: {currency: {value: usd}, amount: {pointer: /amount}}, path: {c: {pointer: /c}}}`); got != base {
		t.Errorf("reordered mapping changed the fingerprint")
	}
	for name, route := range map[string]string{
		"template": `url: "https://api.example.com/v2/customers/{c}"
    request: {path: {c: {pointer: /c}}, form: {amount: {pointer: /amount}, currency: {value: usd}}}`,
		"path pointer": u + `
    request: {path: {c: {pointer: /customer}}, form: {amount: {pointer: /amount}, currency: {value: usd}}}`,
		"field pointer": u + `
    request: {path: {c: {pointer: /c}}, form: {amount: {pointer: /total}, currency: {value: usd}}}`,
		"fixed value": u + `
    request: {path: {c: {pointer: /c}}, form: {amount: {pointer: /amount}, currency: {value: eur}}}`,
		"field name": u + `
    request: {path: {c: {pointer: /c}}, form: {amount: {pointer: /amount}, cur: {value: usd}}}`,
		"encoding": u + `
    request: {path: {c: {pointer: /c}}, json: {amount: {pointer: /amount}, currency: {value: usd}}}`,
		"type": u + `
    request: {path: {c: {pointer: /c}}, form: {amount: {pointer: /amount, type: integer}, currency: {value: usd}}}`,
		"optional": u + `
    request: {path: {c: {pointer: /c}}, form: {amount: {pointer: /amount, optional: true}, currency: {value: usd}}}`,
		"no body mapping": u + `
    request: {path: {c: {pointer: /c}}}`,
		"value type": u + `
    request: {path: {c: {pointer: /c}}, form: {amount: {pointer: /amount}, currency: {value: "1"}}}`,
	} {
		if got := fp(route); got == base {
			t.Errorf("%s changed, fingerprint did not", name)
		}
	}
	if fp(u+`
    request: {path: {c: {pointer: /c}}, form: {amount: {pointer: /amount}, currency: {value: "1"}}}`) == fp(u+`
    request: {path: {c: {pointer: /c}}, form: {amount: {pointer: /amount}, currency: {value: 1}}}`) {
		t.Error(`value "1" and value 1 share a fingerprint (they differ in a JSON body)`)
	}
}

// readmeStripeRoute returns the documentation's Stripe example (the yaml
// block of README.md or a guide under docs/ that calls api.stripe.com for
// payment.requested; docs/routes.md has it) as a routes file.
func readmeStripeRoute(t *testing.T) string {
	t.Helper()
	guides, _ := filepath.Glob(filepath.Join("..", "..", "docs", "*.md"))
	var b []byte
	for _, f := range append([]string{filepath.Join("..", "..", "README.md")}, guides...) {
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		b = append(b, text...)
	}
	for _, m := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(b), -1) {
		if strings.Contains(m[1], "https://api.stripe.com/") && strings.Contains(m[1], "subject: payment.requested") {
			if !strings.Contains(m[1], "routes:") {
				return "routes:\n" + m[1]
			}
			return m[1]
		}
	}
	t.Fatal("neither README.md nor docs/*.md has a yaml block calling https://api.stripe.com/ for payment.requested")
	return ""
}

// The README's Stripe example and examples/routes.yaml, as written (the
// host pointed at the fake), charge a Stripe-compatible API from a JSON
// event: form-encoded, Bearer key, the message's key as Idempotency-Key.
func TestStripeExamplesAgainstFakeStripe(t *testing.T) {
	t.Parallel()
	example, err := os.ReadFile(filepath.Join("..", "..", "examples", "routes.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for name, file := range map[string]string{"README": readmeStripeRoute(t), "examples/routes.yaml": string(example)} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setupFake(t, fakedownstream.Options{StripeRequests: true, ConflictStyle: fakedownstream.ConflictStripe})
			yml := strings.ReplaceAll(file, "https://api.stripe.com", b.url)
			env := map[string]string{"STRIPE_AUTHORIZATION": "Bearer sk_test_4eC39HqLyjWDarjtT1zdp7dc", "PAYMENTS_TOKEN": "Bearer payments-token", "EMAILS_API_KEY": "emails-api-key"}
			r, err := ParseRoutes([]byte(yml), mapEnv(env), nil, b.log)
			if err != nil {
				t.Fatal(err)
			}
			msg := jsonMsg("evt-1", "payment.requested", `{"order":42,"amount_cents":1999,"payment_method":"pm_card_visa"}`)
			ctx, rec := RecordAnswers(context.Background())
			if err := mustEffect(t, r, msg).Perform(ctx, msg, "evt-1"); err != nil {
				t.Fatalf("Perform: %v", err)
			}
			if b.fake.Effects("evt-1") != 1 {
				t.Fatalf("effects %d, want 1", b.fake.Effects("evt-1"))
			}
			form, err := url.ParseQuery(b.fake.Bodies("evt-1")[0])
			if err != nil {
				t.Fatal(err)
			}
			if form.Get("amount") != "1999" || form.Get("currency") != "usd" || form.Get("metadata[order]") != "42" {
				t.Errorf("form %v, want amount=1999 currency=usd metadata[order]=42", form)
			}
			// A confirmed payment: charged now, with the event's card, not
			// an unconfirmed PaymentIntent left waiting.
			if form.Get("confirm") != "true" || form.Get("payment_method") != "pm_card_visa" ||
				form.Get("automatic_payment_methods[allow_redirects]") != "never" {
				t.Errorf("form %v, want a confirmed PaymentIntent with the event's payment method", form)
			}
			h := b.fake.Headers("evt-1")[0]
			if h.Get("Idempotency-Key") != "evt-1" || h.Get("Authorization") != "Bearer sk_test_4eC39HqLyjWDarjtT1zdp7dc" ||
				h.Get("Content-Type") != "application/x-www-form-urlencoded" {
				t.Errorf("headers %v", h)
			}
			if a := rec.Last(); a == nil || a.Status != http.StatusCreated || a.Fields["/id"] == "" || a.Headers["Request-Id"] == "" {
				t.Errorf("recorded answer %+v, want 201 with the id and Request-Id", a)
			}
			// A decline is rejected, as the example's answer rules say.
			b.fake.SetKeyReply("evt-2", fakedownstream.ReplyDecline)
			msg2 := jsonMsg("evt-2", "payment.requested", `{"order":43,"amount_cents":500,"payment_method":"pm_card_visa"}`)
			if err := mustEffect(t, r, msg2).Perform(context.Background(), msg2, "evt-2"); Classify(err) != OutcomeRejected {
				t.Errorf("decline: %v (%v), want rejected", err, Classify(err))
			}
			// An event without the amount is refused before any claim.
			var ie *InputError
			if _, err := r.Route(jsonMsg("evt-3", "payment.requested", `{"order":44}`)); !errors.As(err, &ie) || ie.Reason != ReasonMappingFailed {
				t.Errorf("event without amount_cents: %v, want MappingFailed", err)
			}
			// Both have the path-segment route.
			upd := jsonMsg("evt-4", "customer.updated", `{"customer_id":"cus_9","email":"ada@example.com"}`)
			if err := mustEffect(t, r, upd).Perform(context.Background(), upd, "evt-4"); err != nil {
				t.Fatalf("customer-updates: %v", err)
			}
			if b.fake.EffectsAt("/v1/customers/cus_9", "evt-4") != 1 || b.fake.Bodies("evt-4")[0] != "email=ada%40example.com" {
				t.Errorf("customer-updates: effects at the path %d, body %q", b.fake.EffectsAt("/v1/customers/cus_9", "evt-4"), b.fake.Bodies("evt-4"))
			}
			if _, err := r.Route(jsonMsg("evt-5", "customer.updated", `{"customer_id":"../admin","email":"x"}`)); !errors.As(err, &ie) || ie.Reason != ReasonMappingFailed {
				t.Errorf("customer_id ../admin: %v, want MappingFailed", err)
			}
		})
	}
}
