package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/console"
	"github.com/sbclaim/sbclaim/internal/reconciler"
)

// A failed claim's page offers "Retry" (a note is required) and, on a
// route with allowNewKey, "Retry under a new key"; the retry runs the
// effect once and the page says so; a new-key retry on a route without
// allowNewKey is refused.
func TestRetryAFailedClaimFromItsPage(t *testing.T) {
	f := setup(t, nil)
	c := f.fail(f.claimSubject("charge", "billing", "", `{"amount":1}`, nil), claim.FailPermanent, "charges: HTTP 401: invalid API key", nil, nil)
	p := f.fail(f.claimSubject("payment", "billing", "", `{"amount":2}`, nil), claim.FailPermanent, "payments: HTTP 400: wrong content type", nil, nil)
	a := f.client(alice, aliceID)
	path := fmt.Sprintf("/claims/%d", c.ID)
	page := a.getPage(path)
	mustContain(t, "failed charge", page, `id="retry-form"`, `id="retry-new-key-form"`, fmt.Sprintf("%s:r1", c.Key()))
	token := csrfInput.FindStringSubmatch(page.body)[1]
	if pp := a.getPage(fmt.Sprintf("/claims/%d", p.ID)); !strings.Contains(pp.body, `id="retry-form"`) || strings.Contains(pp.body, `id="retry-new-key-form"`) {
		t.Error("the failed payment's page: want a retry form and no new-key retry (its route does not allow one)")
	}
	if anon := f.client("", "").getPage(path); strings.Contains(anon.body, `id="retry-form"`) {
		t.Error("the retry form is offered without an identity")
	}

	before := f.get(c.ID)
	r := a.post(path+"/retry", url.Values{"csrf": {token}})
	mustStatus(t, "retry without a note", r, http.StatusBadRequest)
	mustContain(t, "retry without a note", r, "a note is required", "Nothing was changed")
	r = a.post(fmt.Sprintf("/claims/%d/retry", p.ID), url.Values{"csrf": {token}, "note": {"fixed"}, "new_key": {"1"}})
	mustStatus(t, "new-key retry on a route without allowNewKey", r, http.StatusConflict)
	mustContain(t, "new-key retry on a route without allowNewKey", r, "allowNewKey")
	if got := f.get(c.ID); got.State != before.State || f.get(p.ID).State != claim.StateFailed {
		t.Fatal("a refused retry changed a claim")
	}

	r = a.post(path+"/retry", url.Values{"csrf": {token}, "note": {"API key fixed: Bearer prefix"}})
	mustStatus(t, "retry", r, http.StatusSeeOther)
	got := f.get(c.ID)
	if got.State != claim.StateResolved || got.Resolution != claim.ResolutionRedriven || f.fake.Effects(c.Key()) != 1 {
		t.Fatalf("after the retry: %s %s, %d effects", got.State, got.Resolution, f.fake.Effects(c.Key()))
	}
	page = a.getPage(path + "?done=retried")
	mustContain(t, "after the retry", page, "Retried", "completes as a duplicate", "retried", "failed → claimed via operator", "API key fixed: Bearer prefix")
	// Again: refused, it is no longer failed.
	r = a.post(path+"/retry", url.Values{"csrf": {token}, "note": {"again"}})
	mustStatus(t, "second retry", r, http.StatusConflict)
	mustContain(t, "second retry", r, "not failed")
	if f.fake.Effects(c.Key()) != 1 {
		t.Errorf("%d effects after a refused second retry", f.fake.Effects(c.Key()))
	}
}

// The bulk retry acts on failed claims only, at most BulkLimit, needs a
// note, and goes claim by claim through the guarded retry: one someone
// retried meanwhile is refused, the others run once.
func TestBulkRetryIsConfirmedBoundedAndGuarded(t *testing.T) {
	f := setup(t, func(o *console.Options) { o.BulkLimit = 2 })
	var failed []*claim.Claim
	for i := range 3 {
		failed = append(failed, f.fail(f.claimSubject("payment", "billing", "", fmt.Sprintf(`{"amount":%d}`, i), nil),
			claim.FailPermanent, "payments: HTTP 401", nil, nil))
	}
	flagged := f.flagged("billing", "", `{"amount":9}`, nil, "no heartbeat since x")
	a := f.client(alice, aliceID)
	list := a.getPage("/claims?state=failed")
	mustContain(t, "failed list", list, `id="bulk-retry"`)

	page := a.getPage("/bulk?action=retry&consumer=billing")
	mustStatus(t, "confirm", page, http.StatusOK)
	mustContain(t, "confirm", page, "More than 2 failed claims match", "state: failed", "Retry these 2 claim(s)", "payments: HTTP 401")
	ids := hiddenID.FindAllStringSubmatch(page.body, -1)
	if len(ids) != 2 || ids[0][1] != fmt.Sprint(failed[0].ID) || ids[1][1] != fmt.Sprint(failed[1].ID) {
		t.Fatalf("the confirm form names %v, want the first two failed claims", ids)
	}
	token := csrfInput.FindStringSubmatch(page.body)[1]
	form := func(note string, ids ...int64) url.Values {
		v := url.Values{"csrf": {token}, "action": {"retry"}, "filter": {"consumer=billing"}, "note": {note}}
		for _, id := range ids {
			v.Add("id", fmt.Sprint(id))
		}
		return v
	}
	before := snapshot(t, f.store)
	mustStatus(t, "three ids", a.post("/bulk", form("fixed", failed[0].ID, failed[1].ID, failed[2].ID)), http.StatusBadRequest)
	mustStatus(t, "no note", a.post("/bulk", form("", failed[0].ID)), http.StatusBadRequest)
	if after := snapshot(t, f.store); after != before {
		t.Fatal("a refused bulk retry changed claims")
	}

	// Bob retries the second one meanwhile.
	if _, err := reconciler.Retry(context.Background(), f.store, &reconciler.RetryParams{ID: failed[1].ID, By: "bob", Note: "fixed",
		Routes: reconciler.Routes{"": f.router}}); err != nil {
		t.Fatal(err)
	}
	r := a.post("/bulk", form("API key fixed", failed[0].ID, failed[1].ID))
	mustStatus(t, "bulk retry", r, http.StatusOK)
	mustContain(t, "bulk retry", r, "1 retried, 1 refused, nothing changed", "not failed")
	for _, c := range failed[:2] {
		if got := f.get(c.ID); got.State != claim.StateResolved || f.fake.Effects(c.Key()) != 1 {
			t.Errorf("claim %d: %s, %d effects; want resolved, 1", c.ID, got.State, f.fake.Effects(c.Key()))
		}
	}
	if f.get(failed[2].ID).State != claim.StateFailed {
		t.Error("a failed claim outside the bulk was touched")
	}
	// A flagged claim named in a bulk retry is refused.
	r = a.post("/bulk", form("fixed", flagged.ID))
	mustContain(t, "bulk retry of a flagged claim", r, "1 refused, nothing changed")
	if f.get(flagged.ID).State != claim.StateFlagged {
		t.Error("the flagged claim was touched")
	}
}
