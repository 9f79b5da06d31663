package processor_test

import (
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/sideeffects/routesfile"
	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
	"github.com/sbclaim/sbclaim/internal/testkit/membus"
)

// A routes file with a request mapping, through the processor: the JSON
// event is charged once, form-encoded, against a Stripe-like API; every
// message the mapping refuses is dead-lettered MappingFailed with a reason
// naming the field, and never claimed or sent.
func TestRequestMappingDeadLettersBeforeTheClaim(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		fake := fakedownstream.New(fakedownstream.Options{StripeRequests: true, ConflictStyle: fakedownstream.ConflictStripe})
		srv := httptest.NewServer(fake)
		t.Cleanup(srv.Close)
		router, err := routesfile.Parse([]byte(`version: 1
routes:
  - name: customers
    match: {subject: "*"}
    url: "`+srv.URL+`/v1/customers/{customer}"
    headers:
      Authorization: {fromEnv: STRIPE_AUTHORIZATION}
    request:
      path: {customer: {pointer: /customer_id}}
      form:
        amount: {pointer: /amount_cents, type: integer}
        currency: {value: usd}
        metadata[order]: {pointer: /order}
`), func(string) string { return "Bearer sk_test_123" }, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		opts := b.options()
		opts.Router = router
		b.start(opts)

		b.send("good", "order", `{"customer_id":"cus_1","order":42,"amount_cents":1999}`, nil)
		bad := map[string]string{ // message id → body
			"traversal": `{"customer_id":"../admin","order":1,"amount_cents":1}`,
			"slash":     `{"customer_id":"a/b","order":1,"amount_cents":1}`,
			"encoded":   `{"customer_id":"%2F","order":1,"amount_cents":1}`,
			"url":       `{"customer_id":"http://evil","order":1,"amount_cents":1}`,
			"empty":     `{"customer_id":"","order":1,"amount_cents":1}`,
			"missing":   `{"customer_id":"cus_2","order":1}`,
			"type":      `{"customer_id":"cus_3","order":1,"amount_cents":"19.99"}`,
			"notjson":   `customer_id=cus_4`,
		}
		for id, body := range bad {
			b.send(id, "order", body, nil)
		}
		b.waitIdle()

		got := b.deadLetterReasons()
		for id := range bad {
			if got[id] != sideeffects.ReasonMappingFailed {
				t.Errorf("%s: dead-letter reason %q, want %s", id, got[id], sideeffects.ReasonMappingFailed)
			}
		}
		for _, m := range b.q.DeadLetters() {
			if d := m.DeadLetterErrorDescription; d == nil || !strings.Contains(*d, `route "customers"`) {
				t.Errorf("%s: description %v does not name the route", m.MessageID, d)
			}
		}
		if got["good"] != "" {
			t.Errorf("good: dead-lettered %q", got["good"])
		}
		cs := b.claims()
		if len(cs) != 1 || cs[0].MessageID != "good" {
			t.Fatalf("%d claims, want only the good message's: a mapping error is never claimed", len(cs))
		}
		if fake.TotalRequests() != 1 || fake.EffectsAt("/v1/customers/cus_1", "billing/good") != 1 {
			t.Errorf("downstream: %d requests, %d effects at the mapped path; want 1 and 1", fake.TotalRequests(), fake.EffectsAt("/v1/customers/cus_1", "billing/good"))
		}
		form, err := url.ParseQuery(fake.Bodies("billing/good")[0])
		if err != nil || form.Get("amount") != "1999" || form.Get("currency") != "usd" || form.Get("metadata[order]") != "42" {
			t.Errorf("form %v (%v)", form, err)
		}
		if c := b.claimOf("good"); c.State != claim.StateProcessed {
			t.Errorf("good: claim %s, want processed", c.State)
		}
	})
}
