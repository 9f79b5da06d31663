package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/console"
	"github.com/sbclaim/sbclaim/internal/reconciler"
)

var hiddenID = regexp.MustCompile(`name="id" value="(\d+)"`)

// A bulk action first shows how many claims it touches, which, and the
// filter; it takes at most BulkLimit claims; each claim goes through the
// guarded action, so one someone else resolved meanwhile is refused and
// the others go on.
func TestBulkIsConfirmedBoundedAndGuarded(t *testing.T) {
	f := setup(t, func(o *console.Options) { o.BulkLimit = 2 })
	var billing []*claim.Claim
	for range 3 {
		billing = append(billing, f.flagged("billing", "", `{"amount":1}`, nil, "no heartbeat since x"))
	}
	shipping := f.flagged("shipping", "", `{"amount":2}`, nil, "no heartbeat since y")
	open := f.claimMsg("billing", "", `{"amount":3}`, nil)
	a := f.client(alice, aliceID)

	page := a.getPage("/bulk?action=resolve&consumer=billing&state=claimed")
	mustStatus(t, "confirm", page, http.StatusOK)
	mustContain(t, "confirm", page, "More than 2 flagged claims match", "consumer: &#34;billing&#34;", "state: flagged", "Resolve these 2 claim(s)")
	ids := hiddenID.FindAllStringSubmatch(page.body, -1)
	if len(ids) != 2 || ids[0][1] != fmt.Sprint(billing[0].ID) || ids[1][1] != fmt.Sprint(billing[1].ID) {
		t.Fatalf("the confirm form names %v, want the first two billing claims", ids)
	}
	token := csrfInput.FindStringSubmatch(page.body)[1]
	mustStatus(t, "unknown action", a.getPage("/bulk?action=delete"), http.StatusBadRequest)

	before := snapshot(t, f.store)
	form := func(action string, ids ...int64) url.Values {
		v := url.Values{"csrf": {token}, "action": {action}, "filter": {"consumer=billing"}, "as": {"done"}, "note": {"checked in the ledger"}}
		for _, id := range ids {
			v.Add("id", fmt.Sprint(id))
		}
		return v
	}
	r := a.post("/bulk", form("resolve", billing[0].ID, billing[1].ID, billing[2].ID))
	mustStatus(t, "three ids", r, http.StatusBadRequest)
	mustContain(t, "three ids", r, "at most 2", "Nothing was changed")
	noNote := form("resolve", billing[0].ID)
	noNote.Set("note", "")
	mustStatus(t, "no note", a.post("/bulk", noNote), http.StatusBadRequest)
	noCSRF := form("resolve", billing[0].ID)
	noCSRF.Del("csrf")
	mustStatus(t, "no token", a.post("/bulk", noCSRF), http.StatusForbidden)
	if after := snapshot(t, f.store); after != before {
		t.Fatal("a refused bulk action changed claims")
	}

	// Bob resolves the second one meanwhile.
	if _, err := reconciler.Resolve(context.Background(), f.store, &reconciler.ResolveParams{ID: billing[1].ID,
		Resolution: claim.ResolutionDiscarded, By: "bob", Note: "duplicate"}); err != nil {
		t.Fatal(err)
	}
	r = a.post("/bulk", form("resolve", billing[0].ID, billing[1].ID))
	mustStatus(t, "bulk resolve", r, http.StatusOK)
	mustContain(t, "bulk resolve", r, "1 resolved as done, 1 refused, nothing changed", "it is resolved (discarded by bob")
	if c := f.get(billing[0].ID); c.State != claim.StateResolved || c.ResolvedBy != alice+" (id "+aliceID+")" || c.ResolutionNote != "checked in the ledger" {
		t.Errorf("first claim: %s by %q", c.State, c.ResolvedBy)
	}
	if c := f.get(billing[1].ID); c.ResolvedBy != "bob" || c.Resolution != claim.ResolutionDiscarded {
		t.Errorf("bob's claim was changed: %s by %q", c.Resolution, c.ResolvedBy)
	}

	// A bulk redrive: each effect once, with its own key; a claim that is
	// not flagged is refused.
	r = a.post("/bulk", form("redrive", billing[2].ID, open.ID))
	mustStatus(t, "bulk redrive", r, http.StatusOK)
	mustContain(t, "bulk redrive", r, "1 redriven, 1 refused, nothing changed", "it is claimed by processor-1, not flagged")
	if e := f.fake.Effects(billing[2].MessageID); e != 1 {
		t.Errorf("the redriven claim's effect ran %d times", e)
	}
	if f.fake.Requests(open.MessageID) != 0 || f.get(open.ID).State != claim.StateClaimed {
		t.Error("the refused claim was touched")
	}
	if f.get(shipping.ID).State != claim.StateFlagged {
		t.Error("a claim outside the bulk was touched")
	}
	// Without identity, the confirm page shows nothing: not the count,
	// not the form.
	anon := f.client("", "")
	page = anon.getPage("/bulk?action=resolve")
	mustStatus(t, "anonymous confirm", page, http.StatusUnauthorized)
	if strings.Contains(page.body, `id="bulk-form"`) || strings.Contains(page.body, `id="bulk-count"`) {
		t.Error("the confirm page shows the claims or offers the form without an identity")
	}
}
