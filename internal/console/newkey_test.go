package console_test

import (
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/console"
	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
)

func newKeyForm(token, note string) url.Values {
	return url.Values{"csrf": {token}, "new_key": {"1"}, "note": {note}}
}

// The form of a redrive under a new key is on the page of a flagged claim
// whose route allows it (allowNewKey), with its warning and the key it
// would use; not on a route without it, not to a read-only visitor, and
// not on a bulk action's page.
func TestNewKeyFormOnlyWhereTheRouteAllowsIt(t *testing.T) {
	f := setup(t, nil)
	charge := f.flag(f.claimSubject("charge", "billing", "", `{"amount":1}`, nil), "no heartbeat since x")
	payment := f.flagged("billing", "", `{"amount":2}`, nil, "no heartbeat since x")
	a := f.client(alice, aliceID)

	page := a.getPage(fmt.Sprintf("/claims/%d", charge.ID))
	mustStatus(t, "allowNewKey route", page, http.StatusOK)
	mustContain(t, "allowNewKey route", page, `id="new-key-form"`, `name="new_key" value="1"`, `id="new-key-note"`,
		`<strong class="mono" id="new-key">`+charge.MessageID+`:r1</strong>`,
		"It is safe only when you checked in the downstream that it did not perform the effect under the old key",
		"Never use it for a merely unknown outcome, or for a decline",
		// The same-key redrive and the resolve are still there.
		`id="redrive-form"`, `id="resolve-form"`)
	if !strings.Contains(page.body, `<textarea name="note" required maxlength="2000" rows="2" id="new-key-note">`) {
		t.Error("the new-key form's note is not required")
	}
	mustContain(t, "allowNewKey route", page, `<dd id="idempotency-key"><span class="mono">`+charge.MessageID+`</span> <span class="muted">(raw: the message id)</span>`, `<dd id="key-form">raw</dd>`)

	for name, r := range map[string]response{
		"route without allowNewKey": a.getPage(fmt.Sprintf("/claims/%d", payment.ID)),
		"bulk redrive":              a.getPage("/bulk?action=redrive&consumer=billing"),
	} {
		mustStatus(t, name, r, http.StatusOK)
		if strings.Contains(r.body, `id="new-key-form"`) || strings.Contains(r.body, `name="new_key"`) {
			t.Errorf("%s: the page offers a redrive under a new key", name)
		}
	}
	// Without the routes, no redrive at all is offered.
	off := setup(t, func(o *console.Options) { o.Routes = nil })
	c := off.flag(off.claimSubject("charge", "billing", "", `{"amount":1}`, nil), "no heartbeat since x")
	if r := off.client(alice, aliceID).getPage(fmt.Sprintf("/claims/%d", c.ID)); strings.Contains(r.body, `id="new-key-form"`) {
		t.Error("a console without routes offers a redrive under a new key")
	}
}

// A redrive under a new key (new_key=1 and a note) runs the effect under
// <id>:r1 once and never under the old key, records the key, the operator
// and the note on the claim, and the page after it says which key
// succeeded.
func TestRedriveUnderANewKey(t *testing.T) {
	f := setup(t, nil)
	c := f.flag(f.claimSubject("charge", "billing", "", `{"amount":1}`, nil), "no heartbeat since x")
	// The downstream stored a failure under the key: a redrive with it only
	// gets the stored 500 back.
	f.fake.SetKeyReply(c.MessageID, fakedownstream.ReplyCachedFailure)
	a := f.client(alice, aliceID)
	path := fmt.Sprintf("/claims/%d", c.ID)
	token := a.token(path)
	r := a.post(path+"/redrive", url.Values{"csrf": {token}})
	mustStatus(t, "same-key redrive", r, http.StatusBadGateway)
	mustContain(t, "same-key redrive", r, "The claim is flagged again")
	if f.fake.CachedFailures(c.MessageID) != 1 || f.fake.Effects(c.MessageID) != 0 {
		t.Fatalf("the old key: %d stored failures, %d effects", f.fake.CachedFailures(c.MessageID), f.fake.Effects(c.MessageID))
	}
	oldRequests := f.fake.Requests(c.MessageID)

	const why = "PSP support confirmed: no charge under the old key, a 500 is stored for it"
	r = a.post(path+"/redrive", newKeyForm(token, why))
	mustStatus(t, "new-key redrive", r, http.StatusSeeOther)
	if loc := r.header.Get("Location"); loc != path+"?done=redriven" {
		t.Fatalf("redirect to %q", loc)
	}
	newKey := c.MessageID + ":r1"
	if e, n := f.fake.Effects(newKey), f.fake.Requests(newKey); e != 1 || n != 1 {
		t.Errorf("under the new key the downstream got %d requests and performed %d effects, want 1 and 1", n, e)
	}
	if e, n := f.fake.Effects(c.MessageID), f.fake.Requests(c.MessageID); e != 0 || n != oldRequests {
		t.Errorf("under the old key: %d effects, %d requests (was %d)", e, n, oldRequests)
	}
	got := f.get(c.ID)
	by := alice + " (id " + aliceID + ")"
	if got.Key() != newKey || got.KeyRevision != 1 || got.KeyRevisedBy != "operator:"+by ||
		!strings.HasSuffix(got.KeyRevisionNote, ": "+why) || got.KeyRevisedAt == nil {
		t.Errorf("the claim's key: %q revision %d by %q at %v, note %q", got.Key(), got.KeyRevision, got.KeyRevisedBy, got.KeyRevisedAt, got.KeyRevisionNote)
	}
	if got.State != claim.StateResolved || got.Resolution != claim.ResolutionRedriven || got.ResolvedBy != by {
		t.Errorf("after the new-key redrive: %s/%s by %q", got.State, got.Resolution, got.ResolvedBy)
	}
	page := a.getPage(path + "?done=redriven")
	mustContain(t, "after the new-key redrive", page,
		"The effect succeeded with idempotency key &#34;"+newKey+"&#34; (a new key, revision 1, chosen by "+got.KeyRevisedBy+")",
		`<span class="mono">`+newKey+`</span>`, `id="key-revision"`, "revision 1, chosen by "+got.KeyRevisedBy, why,
		"<td>redriven</td>", "flagged → claimed via operator", "(key "+newKey+")")
}

// A redrive under a new key without a note, or with a new_key the form
// never sends, is refused with 400; on a route without allowNewKey with
// 409 and the refusal's words; without identity with 403. None of them
// changes anything or reaches the downstream.
func TestRedriveUnderANewKeyIsRefused(t *testing.T) {
	f := setup(t, nil)
	charge := f.flag(f.claimSubject("charge", "billing", "", `{"amount":1}`, nil), "no heartbeat since x")
	payment := f.flagged("billing", "", `{"amount":2}`, nil, "no heartbeat since x")
	a := f.client(alice, aliceID)
	token := a.token(fmt.Sprintf("/claims/%d", charge.ID))
	for _, tc := range []struct {
		name   string
		c      *claim.Claim
		client *client
		form   url.Values
		status int
		says   []string
	}{
		{"no note", charge, a, newKeyForm(token, ""), http.StatusBadRequest, []string{"a redrive under a new key needs a note", "Nothing was changed"}},
		{"a blank note", charge, a, newKeyForm(token, " \n "), http.StatusBadRequest, []string{"needs a note"}},
		{"new_key=true", charge, a, url.Values{"csrf": {token}, "new_key": {"true"}, "note": {"checked"}}, http.StatusBadRequest,
			[]string{"new_key must be 1 or absent"}},
		{"route without allowNewKey", payment, a, newKeyForm(token, "checked the PSP"), http.StatusConflict,
			[]string{"Refused", "route &#34;payments&#34; does not allow a new idempotency key", "nothing was changed"}},
		{"no identity", charge, f.client("", ""), newKeyForm("", "checked"), http.StatusUnauthorized, []string{"Not signed in"}},
		{"no token", charge, a, newKeyForm("", "checked"), http.StatusForbidden, []string{"security token is missing or wrong"}},
	} {
		before := f.get(tc.c.ID)
		r := tc.client.post(fmt.Sprintf("/claims/%d/redrive", tc.c.ID), tc.form)
		mustStatus(t, tc.name, r, tc.status)
		mustContain(t, tc.name, r, tc.says...)
		if after := f.get(tc.c.ID); !reflect.DeepEqual(before, after) {
			t.Errorf("%s: the claim changed:\n before %+v\n  after %+v", tc.name, before, after)
		}
	}
	for _, c := range []*claim.Claim{charge, payment} {
		if n := f.fake.Requests(c.MessageID) + f.fake.Requests(c.MessageID+":r1"); n != 0 {
			t.Errorf("a refused redrive of claim %d reached the downstream (%d requests)", c.ID, n)
		}
	}
}

// A bulk redrive never chooses a new key, even when the form says so: each
// claim is redriven with its own key.
func TestBulkRedriveNeverUsesANewKey(t *testing.T) {
	f := setup(t, nil)
	c := f.flag(f.claimSubject("charge", "billing", "", `{"amount":1}`, nil), "no heartbeat since x")
	a := f.client(alice, aliceID)
	form := url.Values{"csrf": {a.token(fmt.Sprintf("/claims/%d", c.ID))}, "action": {"redrive"}, "id": {fmt.Sprint(c.ID)},
		"new_key": {"1"}, "note": {"try a new key"}}
	r := a.post("/bulk", form)
	mustStatus(t, "bulk redrive", r, http.StatusOK)
	mustContain(t, "bulk redrive", r, "1 redriven")
	if got := f.get(c.ID); got.KeyRevision != 0 || got.Key() != c.MessageID || f.fake.Effects(c.MessageID) != 1 || f.fake.Requests(c.MessageID+":r1") != 0 {
		t.Errorf("bulk redrive: key %q revision %d, %d effects under the old key, %d requests under the new",
			got.Key(), got.KeyRevision, f.fake.Effects(c.MessageID), f.fake.Requests(c.MessageID+":r1"))
	}
}
