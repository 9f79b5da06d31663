package sideeffects

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
)

const followUpRoutes = `
routes:
  - name: charges
    match: {subject: order.paid}
    url: "%s/v1/charges"
    record:
      fields: [/id]
    followUps:
      - to: payment-charged
        subject: payment.charged
        json:
          order: {pointer: /order}
          charge: {answer: /id}
          meta[source]: {value: sbclaim}
          note: {pointer: /note, optional: true}
        properties:
          order: {pointer: /order}
          kind: {value: receipt}
        sessionId: {pointer: /customer}
      - to: audit
`

// A route's follow-ups are built from the message and the downstream's
// recorded answer, and published into the effect's outbox once the
// effect succeeded.
func TestRouteFollowUpsArePublishedAfterTheEffect(t *testing.T) {
	t.Parallel()
	b := setupFake(t, fakedownstream.Options{})
	r := mustRouter(t, strings.ReplaceAll(followUpRoutes, "%s", b.url), nil, b.log)
	if got := r.FollowUpTargets(); strings.Join(got, ",") != "audit,payment-charged" {
		t.Fatalf("targets %v", got)
	}
	msg := jsonMsg("m1", "order.paid", `{"order":42,"customer":"cus_7"}`)
	ctx, sink := claim.CollectFollowUps(context.Background())
	if err := mustEffect(t, r, msg).Perform(ctx, msg, "order-42"); err != nil {
		t.Fatal(err)
	}
	fus := sink.List()
	if len(fus) != 2 {
		t.Fatalf("%d follow-ups, want 2", len(fus))
	}
	f := fus[0]
	var body map[string]any
	if err := json.Unmarshal(f.Body, &body); err != nil {
		t.Fatal(err)
	}
	charge, _ := body["charge"].(string)
	if f.To != "payment-charged" || f.Subject != "payment.charged" || f.SessionID != "cus_7" || f.ContentType != "application/json" ||
		body["order"] != float64(42) || !strings.HasPrefix(charge, "fx_") || body["meta"].(map[string]any)["source"] != "sbclaim" ||
		body["note"] != nil || f.Properties["order"] != "42" || f.Properties["kind"] != "receipt" {
		t.Fatalf("follow-up %+v, body %s", f, f.Body)
	}
	if fus[1].To != "audit" || string(fus[1].Body) != "{}" {
		t.Fatalf("second follow-up %+v", fus[1])
	}
}

// A message the follow-ups cannot be built from is refused when routed,
// before any claim; a processor without an outbox is told before any
// request is sent.
func TestRouteFollowUpsRefuseWhatTheyCannotPublish(t *testing.T) {
	t.Parallel()
	b := setupFake(t, fakedownstream.Options{})
	r := mustRouter(t, strings.ReplaceAll(followUpRoutes, "%s", b.url), nil, b.log)
	_, err := r.Route(jsonMsg("m2", "order.paid", `{"customer":"cus_7"}`))
	var ie *InputError
	if !errors.As(err, &ie) || ie.Reason != ReasonMappingFailed || !strings.Contains(ie.Description, "/order") {
		t.Fatalf("Route of a message without /order: %v", err)
	}
	msg := jsonMsg("m3", "order.paid", `{"order":43,"customer":"cus_7"}`)
	err = mustEffect(t, r, msg).Perform(context.Background(), msg, "order-43")
	if Classify(err) != OutcomeRetryable || !errors.Is(err, claim.ErrNoOutbox) {
		t.Fatalf("Perform without an outbox: %v (%s)", err, Classify(err))
	}
	if n := b.fake.Requests("order-43"); n != 0 {
		t.Fatalf("%d requests sent without an outbox", n)
	}
}

func TestRouteFollowUpsAreChecked(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct{ yml, want string }{
		"an answer field that is not recorded": {`
      - to: x
        json: {charge: {answer: /charge}}`, "record.fields has no /charge"},
		"an answer source with a type": {`
      - to: x
        json: {charge: {answer: /id, pointer: /x}}`, "answer source names only"},
		"no target": {`
      - subject: s`, "to"},
		"a value and an object": {`
      - to: x
        json: {a: {value: 1}, "a[b]": {value: 2}}`, "set as a value, and as an object"},
	} {
		t.Run(name, func(t *testing.T) {
			yml := `
routes:
  - name: charges
    match: {subject: order.paid}
    url: "https://example.com/v1/charges"
    record:
      fields: [/id]
    followUps:` + tc.yml + "\n"
			_, err := ParseRoutes([]byte(yml), mapEnv(nil), nil, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ParseRoutes: %v, want an error saying %q", err, tc.want)
			}
		})
	}
	// Follow-ups change the route's fingerprint; none keeps it.
	plain := `
routes:
  - name: charges
    match: {subject: order.paid}
    url: "https://example.com/v1/charges"
`
	with := plain + `    followUps:
      - to: x
`
	fp := func(yml string) string {
		r, err := ParseRoutes([]byte(yml), mapEnv(nil), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r.routes[0].fingerprint
	}
	if fp(plain) == fp(with) {
		t.Fatal("follow-ups do not change the route's fingerprint")
	}
}
