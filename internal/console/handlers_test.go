package console_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/console"
	"github.com/sbclaim/sbclaim/internal/reconciler"
	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
	"github.com/sbclaim/sbclaim/internal/testkit/testissuer"
)

const (
	alice   = "alice@contoso.example"
	aliceID = "6f1c2e9a-0000-4000-8000-00000000a11c"
)

func resolveForm(token, as, note string) url.Values {
	return url.Values{"csrf": {token}, "as": {as}, "note": {note}}
}

// A request with forged identity headers and no valid token is refused
// 401 on every route, reads included, before any handler runs: no page
// shows a claim, no POST changes one. A token of the wrong audience or
// issuer, an expired one, one signed with a key the issuer does not
// publish, or one whose signature was tampered with is no identity either;
// the issuer's own token for the same route is accepted.
func TestForgedIdentityIsRefusedOnEveryRoute(t *testing.T) {
	f := setup(t, nil)
	c := f.flagged("billing", "order-secret-42", `{"card":"4242 4242 4242 4242"}`, nil, "no heartbeat since x")
	claimPath := fmt.Sprintf("/claims/%d", c.ID)
	gets := []string{"/", "/claims", "/claims?state=flagged", claimPath, "/claims/987654", "/bulk?action=resolve",
		"/bulk?action=redrive&consumer=billing", "/static/console.css", "/healthz", "/metrics", "/nowhere"}
	posts := map[string]url.Values{
		claimPath + "/redrive": {"note": {"x"}},
		claimPath + "/resolve": resolveForm("", "discarded", "forged"),
		"/bulk":                {"action": {"resolve"}, "id": {fmt.Sprint(c.ID)}, "as": {"discarded"}, "note": {"n"}},
	}
	good := f.client(alice, aliceID)
	token := good.token(claimPath) // a real token of alice's, for the forged form
	for id, cl := range map[string]*client{
		"forged headers": f.client("", ""),
		"wrong audience": f.client("", ""),
		"wrong issuer":   f.client("", ""),
		"expired":        f.client("", ""),
		"bad signature":  f.client("", ""),
		"tampered":       f.client("", ""),
		"alg none":       f.client("", ""),
		"bearer garbage": f.client("", ""),
	} {
		cl.headers.Set(console.HeaderPrincipalName, alice)
		cl.headers.Set(console.HeaderPrincipalID, aliceID)
		cl.headers.Set("X-Ms-Client-Principal", "eyJhdXRoX3R5cCI6ImFhZCJ9")
		switch id {
		case "wrong audience":
			cl.headers.Set(console.HeaderIDToken, f.iss.Token(alice, aliceID, testissuer.Claims{"aud": "another-app"}))
		case "wrong issuer":
			cl.headers.Set(console.HeaderIDToken, f.iss.Token(alice, aliceID, testissuer.Claims{"iss": "https://login.microsoftonline.com/evil/v2.0"}))
		case "expired":
			cl.headers.Set(console.HeaderIDToken, f.iss.Token(alice, aliceID, testissuer.Claims{"exp": time.Now().Add(-time.Minute).Unix()}))
		case "bad signature":
			cl.headers.Set(console.HeaderIDToken, f.iss.Forged(alice, aliceID))
		case "tampered":
			// alice's valid token with mallory's claims spliced in.
			parts := strings.Split(f.iss.Token(alice, aliceID, nil), ".")
			evil := strings.Split(f.iss.Token("mallory@evil.example", "ma11", nil), ".")
			cl.headers.Set(console.HeaderIDToken, parts[0]+"."+evil[1]+"."+parts[2])
		case "alg none":
			hdr := base64.RawURLEncoding.EncodeToString([]byte(`{"alg":"none","typ":"JWT"}`))
			body := strings.Split(f.iss.Token(alice, aliceID, nil), ".")[1]
			cl.headers.Set(console.HeaderIDToken, hdr+"."+body+".")
		case "bearer garbage":
			cl.headers.Set("Authorization", "Bearer not-a-token")
		}
		for _, p := range gets {
			r := cl.getPage(p)
			mustStatus(t, id+": GET "+p, r, http.StatusUnauthorized)
			if strings.Contains(r.body, c.MessageID) || strings.Contains(r.body, "4242") || strings.Contains(r.body, `name="csrf"`) {
				t.Errorf("%s: GET %s shows the claim or a form", id, p)
			}
			if got := r.header.Get("WWW-Authenticate"); !strings.HasPrefix(got, "Bearer") {
				t.Errorf("%s: GET %s: WWW-Authenticate %q", id, p, got)
			}
		}
		for p, form := range posts {
			form.Set("csrf", token)
			r := cl.post(p, form)
			mustStatus(t, id+": POST "+p, r, http.StatusUnauthorized)
			mustContain(t, id+": POST "+p, r, "Not signed in", "Nothing was read or changed")
		}
	}
	if got := f.get(c.ID); got.State != claim.StateFlagged || f.fake.Requests(c.MessageID) != 0 {
		t.Fatalf("a refused request changed the claim: %s, downstream requests %d", got.State, f.fake.Requests(c.MessageID))
	}
	// The issuer's token, in the header or as a bearer token, is accepted.
	mustStatus(t, "alice's token", good.getPage(claimPath), http.StatusOK)
	bearer := f.client("", "")
	bearer.headers.Set("Authorization", "Bearer "+f.iss.Token(alice, aliceID, nil))
	r := bearer.getPage(claimPath)
	mustStatus(t, "alice's bearer token", r, http.StatusOK)
	mustContain(t, "alice's bearer token", r, c.MessageID, `id="who">`+alice+`</div>`)
}

// While the issuer cannot be reached, no token can be verified: every
// request is refused 401, saying why.
func TestUnreachableIssuerRefusesEveryone(t *testing.T) {
	down := httptest.NewServer(http.NotFoundHandler())
	gone := down.URL
	down.Close()
	f := setup(t, func(o *console.Options) { o.OIDC.Issuer = gone })
	r := f.client(alice, aliceID).getPage("/")
	mustStatus(t, "GET /", r, http.StatusUnauthorized)
	mustContain(t, "GET /", r, "discovery document could not be read")
}

// The identity is the token's verified claims, never the headers beside
// it: alice's token with bob's principal headers acts as alice.
func TestTokenClaimsAreTheIdentity(t *testing.T) {
	f := setup(t, nil)
	c := f.flagged("billing", "", `{"amount":1}`, nil, "no heartbeat since x")
	a := f.client(alice, aliceID)
	a.headers.Set(console.HeaderPrincipalName, "bob@contoso.example")
	a.headers.Set(console.HeaderPrincipalID, "b0b")
	path := fmt.Sprintf("/claims/%d", c.ID)
	mustStatus(t, "resolve", a.post(path+"/resolve", resolveForm(a.token(path), "done", "checked")), http.StatusSeeOther)
	if got := f.get(c.ID).ResolvedBy; got != alice+" (id "+aliceID+")" {
		t.Errorf("ResolvedBy %q, want alice's verified identity", got)
	}
}

// With an allow-list, a verified token acts only when its oid or one of
// its groups is on it; another user of the tenant gets 403 and sees
// nothing.
func TestAllowedGroupsAndPrincipals(t *testing.T) {
	const operators, bobID = "0b5e7a1c-0000-4000-8000-0000000000a1", "b0b00000-0000-4000-8000-000000000b0b"
	f := setup(t, func(o *console.Options) {
		o.OIDC.AllowedGroups = []string{operators}
		o.OIDC.AllowedPrincipals = []string{strings.ToUpper(bobID)}
	})
	c := f.flagged("billing", "order-77", `{"amount":1}`, nil, "no heartbeat since x")
	path := fmt.Sprintf("/claims/%d", c.ID)
	for name, tc := range map[string]struct {
		token string
		want  int
	}{
		"in the group":        {f.iss.Token(alice, aliceID, testissuer.Claims{"groups": []string{"other", operators}}), http.StatusOK},
		"an allowed oid":      {f.iss.Token("bob@contoso.example", bobID, nil), http.StatusOK},
		"another group":       {f.iss.Token(alice, aliceID, testissuer.Claims{"groups": []string{"other"}}), http.StatusForbidden},
		"no groups (overage)": {f.iss.Token(alice, aliceID, nil), http.StatusForbidden},
	} {
		cl := f.client("", "")
		cl.headers.Set(console.HeaderIDToken, tc.token)
		r := cl.getPage(path)
		mustStatus(t, name, r, tc.want)
		if tc.want == http.StatusForbidden {
			mustContain(t, name, r, "Refused: not an operator")
			if strings.Contains(r.body, c.MessageID) {
				t.Errorf("%s: the page shows the claim", name)
			}
			mustStatus(t, name+" POST", cl.post(path+"/resolve", resolveForm("", "done", "x")), http.StatusForbidden)
		}
	}
	if f.get(c.ID).State != claim.StateFlagged {
		t.Error("a refused operator changed the claim")
	}
}

// Header-only identity is refused unless the console is told it runs
// behind a trusted front (TrustIdentityHeaders); then it is marked
// unverified on every page and in the audit.
func TestTrustIdentityHeaders(t *testing.T) {
	f := setup(t, func(o *console.Options) { o.TrustIdentityHeaders = true })
	c := f.flagged("billing", "", `{"amount":1}`, nil, "no heartbeat since x")
	path := fmt.Sprintf("/claims/%d", c.ID)
	anon := f.client("", "")
	mustStatus(t, "no headers", anon.getPage(path), http.StatusUnauthorized)
	half := f.client("", "")
	half.headers.Set(console.HeaderPrincipalName, alice)
	mustStatus(t, "name without id", half.getPage(path), http.StatusUnauthorized)
	h := f.client("", "")
	h.headers.Set(console.HeaderPrincipalName, alice)
	h.headers.Set(console.HeaderPrincipalID, aliceID)
	page := h.getPage(path)
	mustStatus(t, "headers", page, http.StatusOK)
	mustContain(t, "headers", page, `id="unverified-banner"`, "SBCLAIM_CONSOLE_INSECURE_TRUST_IDENTITY_HEADERS")
	mustStatus(t, "resolve", h.post(path+"/resolve", resolveForm(h.token(path), "done", "checked")), http.StatusSeeOther)
	if got := f.get(c.ID).ResolvedBy; got != alice+" (id "+aliceID+", unverified header)" {
		t.Errorf("ResolvedBy %q", got)
	}
	for _, bad := range []console.Options{
		{Store: f.store},
		{Store: f.store, TrustIdentityHeaders: true, LocalOperator: "dev"},
		{Store: f.store, TrustIdentityHeaders: true, OIDC: &console.OIDC{Issuer: f.iss.URL, Audience: "x"}},
		{Store: f.store, OIDC: &console.OIDC{Issuer: f.iss.URL}},
	} {
		if _, err := console.New(bad); err == nil {
			t.Errorf("console.New accepted %+v", bad)
		}
	}
}

// A POST without the CSRF token, with a wrong one, with one taken under
// another identity, or with one of another console process, is refused
// and changes nothing; the right one works. The token is bound to the
// verified identity, not to a cookie the caller could choose: no cookie
// is set.
func TestPostWithoutOrWithWrongCSRFTokenIsRefused(t *testing.T) {
	f := setup(t, nil)
	c := f.flagged("billing", "", `{"amount":1}`, nil, "no heartbeat since x")
	path := fmt.Sprintf("/claims/%d", c.ID)
	a := f.client(alice, aliceID)
	token := a.token(path)
	bob := f.client("bob@contoso.example", "b0b")
	bobToken := bob.token(path)
	// alice's token from another console process (another CSRF key).
	other := setup(t, nil)
	oc := other.flagged("billing", "", `{"amount":1}`, nil, "no heartbeat since x")
	otherToken := other.client(alice, aliceID).token(fmt.Sprintf("/claims/%d", oc.ID))

	for name, form := range map[string]url.Values{
		"no token":          resolveForm("", "done", "checked"),
		"wrong token":       resolveForm(strings.Repeat("0", len(token)), "done", "checked"),
		"bob's token":       resolveForm(bobToken, "done", "checked"),
		"truncated token":   resolveForm(token[:10], "done", "checked"),
		"another console's": resolveForm(otherToken, "done", "checked"),
	} {
		r := a.post(path+"/resolve", form)
		mustStatus(t, name, r, http.StatusForbidden)
		mustContain(t, name, r, "security token is missing or wrong", "Nothing was changed")
		r = a.post(path+"/redrive", url.Values{"csrf": form["csrf"]})
		mustStatus(t, name+" (redrive)", r, http.StatusForbidden)
	}
	if got := f.get(c.ID); got.State != claim.StateFlagged || f.fake.Requests(c.MessageID) != 0 {
		t.Fatalf("a refused POST changed the claim: %s, downstream requests %d", got.State, f.fake.Requests(c.MessageID))
	}
	// The right one.
	r := a.post(path+"/resolve", resolveForm(token, "done", "checked in the PSP dashboard"))
	mustStatus(t, "right token", r, http.StatusSeeOther)
	if got := f.get(c.ID); got.State != claim.StateResolved || got.ResolvedBy != alice+" (id "+aliceID+")" || got.ResolutionNote != "checked in the PSP dashboard" {
		t.Fatalf("after resolve: %s by %q note %q", got.State, got.ResolvedBy, got.ResolutionNote)
	}
}

// A browser's cross-site POST is refused before any handler runs.
func TestCrossOriginPostIsRefused(t *testing.T) {
	f := setup(t, nil)
	c := f.flagged("billing", "", `{"amount":1}`, nil, "no heartbeat since x")
	a := f.client(alice, aliceID)
	path := fmt.Sprintf("/claims/%d", c.ID)
	token := a.token(path)
	for name, h := range map[string]http.Header{
		"Sec-Fetch-Site": {"Sec-Fetch-Site": {"cross-site"}},
		"Origin":         {"Origin": {"https://evil.example"}},
	} {
		r := a.do("POST", path+"/resolve", resolveForm(token, "done", "n"), h)
		mustStatus(t, name, r, http.StatusForbidden)
		mustContain(t, name, r, "cross-origin")
	}
	if f.get(c.ID).State != claim.StateFlagged {
		t.Fatal("a cross-origin POST changed the claim")
	}
}

// Producer-controlled text renders escaped on every page.
func TestHostileTextRendersEscaped(t *testing.T) {
	f := setup(t, nil)
	const (
		idScript   = `<script>alert("id")</script>`
		bodyScript = `{"note":"<script>alert('body')</script>"}`
	)
	c := f.flagged("billing", idScript, bodyScript, map[string]string{"<script>k</script>": `<script>alert("prop")</script>`, "rtl": "a\u202eevil"},
		`<img src=x onerror=alert("reason")>`)
	plain := f.claimMsg("billing", "plain-<b>bold</b>", "<script>alert(2)</script>\x00\x1b[31m", nil)
	a := f.client(alice, aliceID)
	pages := []string{
		"/", fmt.Sprintf("/claims/%d", c.ID), fmt.Sprintf("/claims/%d", plain.ID), "/claims", "/claims?state=flagged",
		"/claims?reason=" + url.QueryEscape(`<img src=x`), "/bulk?action=resolve&consumer=billing",
		"/claims?consumer=" + url.QueryEscape(`<script>alert("q")</script>`) + "&state=" + url.QueryEscape(`<script>`),
	}
	for _, p := range pages {
		r := a.getPage(p)
		if r.status != http.StatusOK && r.status != http.StatusBadRequest {
			t.Fatalf("GET %s: %d", p, r.status)
		}
		// The one script element is the console's own file.
		if n := strings.Count(strings.ToLower(r.body), "<script"); n != 1 || !strings.Contains(r.body, `<script src="/static/console.js" defer></script>`) {
			t.Errorf("GET %s: %d script elements", p, n)
		}
		for _, raw := range []string{"<script>alert", "<img src=x", "<b>bold", "\u202e", "\x1b"} {
			if strings.Contains(r.body, raw) {
				t.Errorf("GET %s: %q reached the page unescaped", p, raw)
			}
		}
	}
	claimPage := a.getPage(fmt.Sprintf("/claims/%d", c.ID)).body
	for _, want := range []string{
		`&lt;script&gt;alert(&#34;id&#34;)&lt;/script&gt;`,   // message id
		`&lt;script&gt;alert(&#39;body&#39;)&lt;/script&gt;`, // payload
		`&lt;script&gt;alert(&#34;prop&#34;)&lt;/script&gt;`, // property value
		`&lt;script&gt;k&lt;/script&gt;`,                     // property key
		`&lt;img src=x onerror=alert(&#34;reason&#34;)&gt;`,  // reason
		`a\u202eevil`, // a bidi override, shown as an escape
	} {
		if !strings.Contains(claimPage, want) {
			t.Errorf("claim page lacks the escaped %s", want)
		}
	}
	if !strings.Contains(a.getPage(fmt.Sprintf("/claims/%d", plain.ID)).body, `\x00\x1b[31m`) {
		t.Error("control characters of a text payload are not shown as escapes")
	}
}

// A concurrent action (someone resolved the claim first; a redrive holds
// it) is refused with the RefusedError's words, and changes nothing.
func TestConcurrentActionShowsAClearMessageAndChangesNothing(t *testing.T) {
	f := setup(t, nil)
	ctx := context.Background()
	a := f.client(alice, aliceID)

	// Bob resolved it after Alice opened the page.
	c := f.flagged("billing", "", `{"amount":1}`, nil, "no heartbeat since x")
	path := fmt.Sprintf("/claims/%d", c.ID)
	token := a.token(path)
	if _, err := reconciler.Resolve(ctx, f.store, &reconciler.ResolveParams{ID: c.ID, Resolution: claim.ResolutionDiscarded, By: "bob", Note: "duplicate order"}); err != nil {
		t.Fatal(err)
	}
	before := f.get(c.ID)
	for _, action := range []struct {
		path string
		form url.Values
	}{
		{path + "/resolve", resolveForm(token, "done", "checked")},
		{path + "/redrive", url.Values{"csrf": {token}}},
	} {
		r := a.post(action.path, action.form)
		mustStatus(t, action.path, r, http.StatusConflict)
		mustContain(t, action.path, r, "Refused", "it is resolved (discarded by bob", "nothing was changed")
	}
	if after := f.get(c.ID); !reflect.DeepEqual(before, after) {
		t.Errorf("the claim changed:\n before %+v\n  after %+v", before, after)
	}
	if n := f.fake.Requests(c.MessageID); n != 0 {
		t.Errorf("a refused redrive reached the downstream (%d requests)", n)
	}

	// A redrive holds it (taken over by path operator, effect in flight).
	c = f.flagged("billing", "", `{"amount":2}`, nil, "no heartbeat since x")
	path = fmt.Sprintf("/claims/%d", c.ID)
	token = a.token(path)
	if _, err := f.store.TakeOver(ctx, &claim.TakeOverParams{ID: c.ID, PreviousOwner: c.Owner, Owner: uuid.New(), Path: claim.PathOperator,
		By: "operator:carol", Reason: "redrive by carol: redriven", Route: c.Route, Fingerprint: c.Fingerprint}); err != nil {
		t.Fatal(err)
	}
	before = f.get(c.ID)
	r := a.post(path+"/resolve", resolveForm(token, "done", "checked"))
	mustStatus(t, "resolve while a redrive holds it", r, http.StatusConflict)
	mustContain(t, "resolve while a redrive holds it", r, "it is being redriven by operator:carol", "nothing was changed")
	r = a.post(path+"/redrive", url.Values{"csrf": {token}})
	mustStatus(t, "redrive while a redrive holds it", r, http.StatusConflict)
	mustContain(t, "redrive while a redrive holds it", r, "it is being redriven by operator:carol")
	if after := f.get(c.ID); !reflect.DeepEqual(before, after) {
		t.Errorf("the claim changed:\n before %+v\n  after %+v", before, after)
	}
}

// snapshot is every claim of the store and the overview's counts.
func snapshot(t *testing.T, st claim.Store) string {
	t.Helper()
	all, err := st.List(context.Background(), &claim.ListParams{Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, c := range all {
		fmt.Fprintf(&b, "%+v\n", *c)
	}
	return b.String()
}

// GET never changes anything: every page, with every query the console
// itself links to, leaves the table as it was; an action's URL by GET is
// not an action.
func TestGetNeverChangesAnything(t *testing.T) {
	f := setup(t, nil)
	c := f.flagged("billing", "", `{"amount":1}`, nil, "no heartbeat since x")
	f.flagged("shipping", "", `{"amount":2}`, nil, "route changed: x")
	f.claimMsg("billing", "", `{"amount":3}`, nil)
	if err := f.srv.Sampler().Sample(context.Background()); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, f.store)
	a := f.client(alice, aliceID)
	id := fmt.Sprint(c.ID)
	for _, p := range []string{
		"/", "/claims", "/claims?state=flagged", "/claims?state=flagged&consumer=billing&older=1h&reason=no", "/claims?after=1",
		"/claims/" + id, "/claims/" + id + "?done=redriven", "/claims/" + id + "?done=resolved",
		"/claims/" + id + "/redrive", "/claims/" + id + "/resolve?as=done&note=x", "/claims/" + id + "/redrive?csrf=x",
		"/bulk?action=redrive&state=flagged", "/bulk?action=resolve&as=done&note=x&id=" + id, "/bulk",
		"/healthz", "/static/console.css", "/static/console.js", "/nowhere",
	} {
		r := a.getPage(p)
		if r.status >= 500 {
			t.Errorf("GET %s: %d", p, r.status)
		}
		if strings.HasSuffix(p, "/redrive") || strings.Contains(p, "/resolve?") || strings.Contains(p, "/redrive?") {
			if r.status != http.StatusMethodNotAllowed {
				t.Errorf("GET %s: %d, want 405 (actions are POST only)", p, r.status)
			}
		}
	}
	if after := snapshot(t, f.store); after != before {
		t.Errorf("GET changed the claims:\n before %s\n  after %s", before, after)
	}
	if f.fake.Requests(c.MessageID) != 0 {
		t.Error("a GET reached the downstream")
	}
	// ?done= shows nothing the claim does not say.
	if r := a.getPage("/claims/" + id + "?done=redriven"); strings.Contains(r.body, `id="flash"`) {
		t.Errorf("?done=redriven on an unredriven claim shows %s", flashOf(r.body))
	}
}

// Every response carries the security headers.
func TestSecurityHeaders(t *testing.T) {
	f := setup(t, nil)
	c := f.flagged("billing", "", `{"amount":1}`, nil, "no heartbeat since x")
	a := f.client(alice, aliceID)
	for _, p := range []string{"/", "/claims", fmt.Sprintf("/claims/%d", c.ID), "/static/console.css", "/nowhere", "/bulk?action=x"} {
		r := a.getPage(p)
		csp := r.header.Get("Content-Security-Policy")
		for _, want := range []string{"default-src 'self'", "script-src 'self'", "frame-ancestors 'none'", "object-src 'none'"} {
			if !strings.Contains(csp, want) {
				t.Errorf("GET %s: CSP %q lacks %s", p, csp, want)
			}
		}
		if strings.Contains(csp, "unsafe-inline") || strings.Contains(csp, "unsafe-eval") {
			t.Errorf("GET %s: CSP allows inline code: %q", p, csp)
		}
		for h, want := range map[string]string{"X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin"} {
			if got := r.header.Get(h); got != want {
				t.Errorf("GET %s: %s = %q, want %q", p, h, got, want)
			}
		}
	}
	// The pages hold no inline script or style the CSP would block.
	for _, p := range []string{"/", "/claims", fmt.Sprintf("/claims/%d", c.ID)} {
		body := a.getPage(p).body
		if strings.Contains(body, " style=") || strings.Contains(body, "<style") || strings.Contains(body, " onclick=") || strings.Contains(body, "<script>") {
			t.Errorf("GET %s: inline style or script", p)
		}
	}
	// The refusal carries them too; no page sets a cookie (the CSRF token
	// is bound to the verified identity).
	if r := f.client("", "").getPage("/"); r.header.Get("Content-Security-Policy") == "" || r.header.Get("X-Frame-Options") != "DENY" {
		t.Errorf("the 401 page lacks the security headers: %v", r.header)
	}
	if r := a.do("GET", fmt.Sprintf("/claims/%d", c.ID), nil, http.Header{"X-Forwarded-Proto": {"https"}}); r.header.Get("Set-Cookie") != "" {
		t.Errorf("a page sets a cookie: %q", r.header.Get("Set-Cookie"))
	}
}

// failingResolve makes a redrive's own resolution fail: the effect was
// performed, the record was not.
type failingResolve struct{ claim.Store }

func (s failingResolve) Resolve(ctx context.Context, p *claim.ResolveParams) (*claim.Claim, error) {
	if p.Owner != uuid.Nil {
		return nil, errors.New("the disk is full")
	}
	return s.Store.Resolve(ctx, p)
}

// A redrive whose effect was performed but not recorded says so plainly.
func TestRedriveRecordErrorSaysTheEffectWasPerformed(t *testing.T) {
	f := setup(t, func(o *console.Options) { o.Store = failingResolve{o.Store} })
	c := f.flagged("billing", "", `{"amount":1}`, nil, "no heartbeat since x")
	a := f.client(alice, aliceID)
	path := fmt.Sprintf("/claims/%d", c.ID)
	r := a.post(path+"/redrive", url.Values{"csrf": {a.token(path)}})
	mustStatus(t, "redrive", r, http.StatusInternalServerError)
	mustContain(t, "redrive", r, "The effect WAS performed, but recording it failed", "Do NOT redrive it again", c.MessageID, "the disk is full")
	if n := f.fake.Effects(c.MessageID); n != 1 {
		t.Errorf("the downstream performed %d effects, want 1", n)
	}
}

// A redrive whose effect fails says how, and the claim is flagged again.
func TestRedriveEffectFailure(t *testing.T) {
	f := setup(t, nil)
	c := f.flagged("billing", "", `{"amount":1}`, nil, "no heartbeat since x")
	f.fake.FailKey(c.MessageID, 0, fakedownstream.FaultErrorBefore)
	a := f.client(alice, aliceID)
	path := fmt.Sprintf("/claims/%d", c.ID)
	r := a.post(path+"/redrive", url.Values{"csrf": {a.token(path)}})
	mustStatus(t, "redrive", r, http.StatusBadGateway)
	mustContain(t, "redrive", r, "The redrive&#39;s effect failed", "flagged again")
	if got := f.get(c.ID); got.State != claim.StateFlagged || !strings.HasPrefix(got.FlagReason, "redrive by "+alice) {
		t.Errorf("after a failed redrive: %s, reason %q", got.State, got.FlagReason)
	}
}

// The redrive and the resolution are recorded with the identity, and the
// page after each says what happened.
func TestRedriveAndResolveRecordTheIdentity(t *testing.T) {
	f := setup(t, nil)
	a := f.client(alice, aliceID)
	c := f.flagged("billing", "", `{"amount":1}`, nil, "no heartbeat since x")
	path := fmt.Sprintf("/claims/%d", c.ID)
	r := a.post(path+"/redrive", url.Values{"csrf": {a.token(path)}, "note": {"PSP was down"}})
	mustStatus(t, "redrive", r, http.StatusSeeOther)
	if loc := r.header.Get("Location"); loc != path+"?done=redriven" {
		t.Fatalf("redirect to %q", loc)
	}
	page := a.getPage(path + "?done=redriven")
	mustContain(t, "after redrive", page, "Redriven", "resolved as redriven by "+alice)
	got := f.get(c.ID)
	by := alice + " (id " + aliceID + ")"
	if got.State != claim.StateResolved || got.Resolution != claim.ResolutionRedriven || got.ResolvedBy != by ||
		got.ClaimedBy != "operator:"+by || got.TakeOverPath != claim.PathOperator || got.ResolutionNote != "PSP was down" {
		t.Errorf("after redrive: %+v", got)
	}

	c = f.flagged("billing", "", `{"amount":2}`, nil, "no heartbeat since x")
	path = fmt.Sprintf("/claims/%d", c.ID)
	token := a.token(path)
	// A note is required.
	r = a.post(path+"/resolve", resolveForm(token, "discarded", "  "))
	mustStatus(t, "resolve without a note", r, http.StatusBadRequest)
	mustContain(t, "resolve without a note", r, "a note is required", "Nothing was changed")
	r = a.post(path+"/resolve", resolveForm(token, "redriven", "n"))
	mustStatus(t, "resolve as redriven", r, http.StatusBadRequest)
	r = a.post(path+"/resolve", resolveForm(token, "discarded", "order cancelled"))
	mustStatus(t, "resolve", r, http.StatusSeeOther)
	page = a.getPage(path + "?done=resolved")
	mustContain(t, "after resolve", page, "Resolved as discarded by "+alice, "order cancelled")
}

// In local-development mode every page says so, the identity headers are
// ignored, the audit marks the name as not signed in, and only requests
// addressed to a loopback host are answered (DNS rebinding: a page on
// rebind.evil.example, resolving to 127.0.0.1, sends its own name).
func TestLocalOperator(t *testing.T) {
	f := setup(t, func(o *console.Options) { o.LocalOperator = "dev" })
	c := f.flagged("billing", "", `{"amount":1}`, nil, "no heartbeat since x")
	forged := f.client("mallory@evil.example", "forged")
	for _, p := range []string{"/", "/claims", fmt.Sprintf("/claims/%d", c.ID), "/claims/987654", "/bulk?action=resolve"} {
		mustContain(t, p, forged.getPage(p), `id="local-banner"`, "Local development, not signed in")
	}
	path := fmt.Sprintf("/claims/%d", c.ID)
	r := forged.post(path+"/resolve", resolveForm(forged.token(path), "done", "seen"))
	mustStatus(t, "resolve", r, http.StatusSeeOther)
	if got := f.get(c.ID).ResolvedBy; got != "dev (local, not signed in)" {
		t.Errorf("ResolvedBy %q", got)
	}
	other := f.flagged("billing", "", `{"amount":1}`, nil, "no heartbeat since x")
	otherPath := fmt.Sprintf("/claims/%d", other.ID)
	for _, host := range []string{"localhost", "localhost:8082", "LOCALHOST:1", "127.0.0.1:9", "[::1]:8082", "[::1]"} {
		mustStatus(t, "Host "+host, forged.do("GET", otherPath, nil, http.Header{"Host": {host}}), http.StatusOK)
	}
	token := forged.token(otherPath)
	for _, host := range []string{"rebind.evil.example", "rebind.evil.example:8082", "localhost.evil.example:8082", "127.0.0.1.nip.io:8082",
		"127.0.0.2:8082", "10.0.0.5:8082", "[::ffff:127.0.0.1]:8082", "0.0.0.0:8082"} {
		h := http.Header{"Host": {host}}
		r := forged.do("GET", otherPath, nil, h)
		mustStatus(t, "GET with Host "+host, r, http.StatusForbidden)
		if strings.Contains(r.body, other.MessageID) {
			t.Errorf("Host %q: the page shows the claim", host)
		}
		r = forged.do("POST", otherPath+"/resolve", resolveForm(token, "discarded", "rebound"), h)
		mustStatus(t, "POST with Host "+host, r, http.StatusForbidden)
		mustContain(t, "POST with Host "+host, r, "answers only on localhost")
	}
	if got := f.get(other.ID); got.State != claim.StateFlagged {
		t.Errorf("a request to a non-loopback host changed the claim: %s", got.State)
	}
	for _, bad := range []string{" dev", "", "a\x1bb", strings.Repeat("x", 151)} {
		if bad == "" {
			continue
		}
		if _, err := console.New(console.Options{Store: f.store, LocalOperator: bad}); err == nil {
			t.Errorf("LocalOperator %q accepted", bad)
		}
	}
}

var rowID = regexp.MustCompile(`<tr id="claim-(\d+)">`)

// The list filters by state, consumer, route and reason prefix, pages by
// id (after=), and every page's address is a link that shows it again.
func TestListFiltersAndKeysetPaging(t *testing.T) {
	f := setup(t, nil)
	var want []string
	for i := range console.PageSize + 2 {
		reason := "no heartbeat since x"
		if i%2 == 1 {
			reason = "route changed: y"
		}
		c := f.flagged("billing", "", `{"amount":1}`, nil, reason)
		if i%2 == 1 {
			want = append(want, fmt.Sprint(c.ID))
		}
	}
	f.flagged("shipping", "", `{"amount":1}`, nil, "route changed: z")
	f.claimMsg("billing", "", `{"amount":1}`, nil)
	a := f.client(alice, aliceID)
	ids := func(r response) []string {
		var out []string
		for _, m := range rowID.FindAllStringSubmatch(r.body, -1) {
			out = append(out, m[1])
		}
		return out
	}
	page := a.getPage("/claims?state=flagged&consumer=billing&route=payments&reason=" + url.QueryEscape("route changed"))
	mustStatus(t, "filtered", page, http.StatusOK)
	if got := ids(page); !slices.Equal(got, want) {
		t.Errorf("filtered list %v, want %v", got, want)
	}
	all := a.getPage("/claims?state=flagged")
	first := ids(all)
	if len(first) != console.PageSize {
		t.Fatalf("first page has %d rows, want %d", len(first), console.PageSize)
	}
	next := regexp.MustCompile(`<a href="([^"]+)" id="next-page">`).FindStringSubmatch(all.body)
	if next == nil {
		t.Fatal("no next-page link")
	}
	link := strings.ReplaceAll(next[1], "&amp;", "&")
	if link != "/claims?after="+first[len(first)-1]+"&state=flagged" {
		t.Errorf("next-page link %q", link)
	}
	second := a.getPage(link)
	if got := ids(second); len(got) != 3 || slices.Contains(first, got[0]) {
		t.Errorf("second page %v", got)
	}
	mustContain(t, "second page", second, `id="first-page"`)
	if strings.Contains(second.body, `id="next-page"`) {
		t.Error("the last page links to a next one")
	}
	bad := a.getPage("/claims?state=bogus&older=soon")
	mustStatus(t, "bad filter", bad, http.StatusBadRequest)
	mustContain(t, "bad filter", bad, "state &#34;bogus&#34; is not a claim state", "older than")
}
