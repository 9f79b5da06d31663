package console_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/internal/bridge"
	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/console"
	"github.com/sbclaim/sbclaim/internal/reconciler"
	"github.com/sbclaim/sbclaim/sbclaimtest"
)

// claimRoute claims a message of subject for route (with fingerprint)
// on st and flags it, as a processor running route's Go handler would
// leave a claim whose outcome is unknown.
func claimRoute(t *testing.T, st claim.Store, id, subject, route, fingerprint string) *claim.Claim {
	t.Helper()
	ctx := context.Background()
	res, err := st.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "user-binary-1", Claims: []claim.ClaimParams{{
		MessageID: id, Consumer: "refunds", Owner: uuid.New(), Route: route, Fingerprint: fingerprint,
		Entity: "refunds", Subject: subject, PayloadHash: claim.HashPayload([]byte(`{"amount":5}`)), Payload: []byte(`{"amount":5}`), DeliveryCount: 1,
	}}})
	if err != nil || res[0].Outcome != claim.OutcomeWon {
		t.Fatalf("claim %s: %v %v", id, err, res)
	}
	c := res[0].Claim
	fl, err := st.Flag(ctx, &claim.FlagParams{ID: c.ID, Owner: c.Owner, State: claim.StateClaimed, Reason: "route \"" + route + "\" is manual: the outcome is unknown"})
	if err != nil {
		t.Fatal(err)
	}
	return fl
}

// A flagged claim whose route the console's routes do not have (a Go
// handler in the user's binary) offers the hand-off; the hand-off needs a
// note, releases the claim audited with the operator, happens once, and
// runs nothing here. A claim the routes do have offers no hand-off.
func TestHandOffOfAClaimTheRoutesDoNotHave(t *testing.T) {
	f := setup(t, nil)
	a := f.client(alice, aliceID)
	c := claimRoute(t, f.store, "refund-5", "refund", "refund", "go:refund")
	path := fmt.Sprintf("/claims/%d", c.ID)
	page := a.getPage(path)
	mustStatus(t, "claim page", page, http.StatusOK)
	mustContain(t, "claim page", page, `id="handoff-form"`, `action="/claims/`+fmt.Sprint(c.ID)+`/handoff"`,
		"Hand off to the binary that runs this route", "is not in the processors&#39; routes", "with the same idempotency key")

	token := a.token(path)
	r := a.post(path+"/handoff", url.Values{"csrf": {token}, "note": {"  "}})
	mustStatus(t, "hand-off without a note", r, http.StatusBadRequest)
	mustContain(t, "hand-off without a note", r, "a note is required", "Nothing was changed")
	if got := f.get(c.ID); got.State != claim.StateFlagged {
		t.Fatalf("a refused hand-off changed the claim: %s", got.State)
	}

	r = a.post(path+"/handoff", url.Values{"csrf": {token}, "note": {"checked the PSP: no refund"}})
	mustStatus(t, "hand-off", r, http.StatusSeeOther)
	if loc := r.header.Get("Location"); loc != path+"?done=handedoff" {
		t.Fatalf("redirect to %q", loc)
	}
	page = a.getPage(path + "?done=handedoff")
	mustContain(t, "after the hand-off", page, "Handed off", "Released for the reconciler that runs route", "refund-5")
	got := f.get(c.ID)
	if got.State != claim.StateReleased || got.TakeOverPath != claim.PathOperator || !strings.Contains(got.TakeOverReason, alice) ||
		!strings.Contains(got.TakeOverReason, "checked the PSP: no refund") || got.Route != "refund" || got.Fingerprint != "go:refund" {
		t.Errorf("after the hand-off: %+v, want released by the operator, audited, route kept", got)
	}
	if strings.Contains(page.body, `id="handoff-form"`) {
		t.Error("a released claim still offers the hand-off")
	}

	r = a.post(path+"/handoff", url.Values{"csrf": {token}, "note": {"me too"}})
	mustStatus(t, "second hand-off", r, http.StatusConflict)
	mustContain(t, "second hand-off", r, "Refused", "nothing was changed")
	if n := f.fake.TotalRequests(); n != 0 {
		t.Errorf("the hand-off reached the downstream: %d requests", n)
	}

	// A claim the routes run is redriven here: no hand-off.
	p := f.flagged("billing", "", `{"amount":1}`, nil, "no heartbeat since x")
	page = a.getPage(fmt.Sprintf("/claims/%d", p.ID))
	if !strings.Contains(page.body, `id="redrive-form"`) || strings.Contains(page.body, `id="handoff-form"`) {
		t.Error("a claim the console's routes run should offer the redrive and no hand-off")
	}
}

// NewPublic serves the console on the public API's store and routers: a
// claim of a Go route the router has is redriven here; one of a route it
// does not have is handed off.
func TestNewPublic(t *testing.T) {
	st := sbclaimtest.NewStore(t)
	router, err := sbclaim.NewRouter(sbclaim.Route{Name: "refund", Match: sbclaim.MatchSubject("refund"),
		Handler: func(context.Context, *sbclaim.Delivery) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := console.NewPublic(st, map[string]*sbclaim.Router{"": router}, console.Options{LocalOperator: "dev", Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)

	internal := bridge.StoreOf(st)
	msg := &claim.Claim{MessageID: "refund-1", Subject: "refund", Payload: []byte(`{"amount":5}`)}
	h, err := bridge.RouterOf(router).Route(reconciler.MessageFromClaim(msg))
	if err != nil {
		t.Fatal(err)
	}
	here := claimRoute(t, internal, "refund-1", "refund", h.Name, h.Fingerprint)
	elsewhere := claimRoute(t, internal, "mail-1", "mail", "mail", "go:mail")
	get := func(id int64) string {
		t.Helper()
		resp, err := http.Get(fmt.Sprintf("%s/claims/%d", ts.URL, id))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET claim %d: %s", id, resp.Status)
		}
		return string(b)
	}
	if b := get(here.ID); !strings.Contains(b, `id="redrive-form"`) || strings.Contains(b, `id="handoff-form"`) {
		t.Error("the claim of a route the router has: want the redrive and no hand-off")
	}
	if b := get(elsewhere.ID); !strings.Contains(b, `id="handoff-form"`) {
		t.Error("the claim of a route the router does not have: want the hand-off")
	}
	if _, err := console.NewPublic(nil, nil, console.Options{LocalOperator: "dev"}); err == nil {
		t.Error("NewPublic without a store: no error")
	}
}
