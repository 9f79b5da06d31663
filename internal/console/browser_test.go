package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/console"
	"github.com/sbclaim/sbclaim/internal/testkit"
)

// Environment of the browser test.
const (
	// ChromiumEnv is the Chromium binary (default: Debian's chromium).
	ChromiumEnv     = "SBCLAIM_TEST_CHROMIUM"
	defaultChromium = "/usr/bin/chromium"
	// ScreenshotsEnv is the directory the screenshots are written to
	// (default: the test's temporary directory). The README's screenshot
	// is made with SBCLAIM_TEST_SCREENSHOTS=$PWD/docs.
	ScreenshotsEnv = "SBCLAIM_TEST_SCREENSHOTS"
)

// chromium returns the browser binary, or skips (fails when
// SBCLAIM_TEST_REQUIRE names browser) when there is none.
func chromium(t *testing.T) string {
	t.Helper()
	path := os.Getenv(ChromiumEnv)
	if path == "" {
		path = defaultChromium
	}
	if _, err := os.Stat(path); err == nil {
		return path
	}
	if testkit.Required("browser") {
		t.Fatalf("the browser test is required (%s=%q) but there is no Chromium at %s: install Debian's chromium or set %s",
			testkit.RequireEnv, os.Getenv(testkit.RequireEnv), path, ChromiumEnv)
	}
	t.Skipf("no Chromium at %s: set %s to a Chromium binary (Debian: apt-get install chromium) to run the browser test", path, ChromiumEnv)
	return ""
}

// easyAuth stands in for the platform's built-in authentication with its
// token store: it removes the identity headers and tokens a client sent
// and forwards the signed-in user's ID token, which the test issuer
// signed; the console verifies it against the issuer's published key.
func easyAuth(next http.Handler, idToken string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, h := range []string{console.HeaderPrincipalName, console.HeaderPrincipalID, "Authorization"} {
			r.Header.Del(h)
		}
		r.Header.Set(console.HeaderIDToken, idToken)
		next.ServeHTTP(w, r)
	})
}

// backdate moves every time of a claim back by d (the SQLite harness's
// statement), so the seeded claims were flagged over the last day.
func (f *fixture) backdate(id int64, d time.Duration) {
	f.t.Helper()
	_, err := f.store.DB().ExecContext(f.t.Context(), `UPDATE claims SET
		claimed_utc   = strftime('%Y-%m-%dT%H:%M:%f', claimed_utc,   '-' || ?1 || ' seconds'),
		heartbeat_utc = strftime('%Y-%m-%dT%H:%M:%f', heartbeat_utc, '-' || ?1 || ' seconds'),
		released_utc  = strftime('%Y-%m-%dT%H:%M:%f', released_utc,  '-' || ?1 || ' seconds'),
		flagged_utc   = strftime('%Y-%m-%dT%H:%M:%f', flagged_utc,   '-' || ?1 || ' seconds')
		WHERE id = ?2`, int64(d/time.Second), id)
	if err != nil {
		f.t.Fatal(err)
	}
}

// cspWatch records, in every page, the Content-Security-Policy violations
// the page meets (a CDP script runs whatever the policy says).
const cspWatch = `window.__csp = []; document.addEventListener("securitypolicyviolation", function (e) { window.__csp.push(e.violatedDirective + " " + e.blockedURI); });`

func addScript(src string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		_, err := cdp.Call(ctx, t, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: src})
		return chromedp.Void{}, err
	}
}

// TestConsoleInBrowser drives the console in headless Chromium through
// overview → list → claim → redrive → resolve (and a bulk resolve) on a
// store holding flagged claims, behind a stand-in for the platform's
// sign-in that forwards an ID token of the test's own issuer (the console
// verifies it: discovery, JWKS, signature, issuer, audience, expiry), and
// asserts what each page shows. The console's own port, without the
// stand-in, answers the browser 401. It waits on the DOM only.
func TestConsoleInBrowser(t *testing.T) {
	exe := chromium(t)
	f := setup(t, nil)
	const who, whoID = "alice@contoso.example", "6f1c2e9a-0000-4000-8000-00000000a11c"

	// Flagged claims over the last day, by several reasons and consumers,
	// and some unfinished ones.
	type seed struct {
		consumer, reason string
		hoursAgo         int
	}
	seeds := []seed{
		{"billing", "no heartbeat since 2026-11-30T09:58:01Z", 0},
		{"billing", "recovery: the outcome is still unknown after 5 attempt(s): timeout", 2},
		{"billing", "no heartbeat since 2026-11-30T07:12:44Z", 3},
		{"notifications", "route changed: the claim was taken for route \"email\" (fingerprint 1a2b), the routes file now routes it to \"email-v2\" (fingerprint 3c4d)", 5},
		{"notifications", "no heartbeat since 2026-11-30T02:40:09Z", 8},
		{"shipping", "recovery: the downstream answered permanent: 422 address_invalid", 13},
		{"shipping", "recovery: the downstream answered permanent: 422 address_invalid", 13},
		{"billing", "no heartbeat since 2026-11-29T14:03:30Z", 20},
	}
	var flagged []*claim.Claim
	for i, s := range seeds {
		c := f.flagged(s.consumer, fmt.Sprintf("order-%04d", 1000+i), fmt.Sprintf(`{"order":%d,"amount_cents":%d,"currency":"EUR"}`, 1000+i, 1999+i*100),
			map[string]string{"ce_source": "shop", "ce_type": "order.paid"}, s.reason)
		if s.hoursAgo > 0 {
			f.backdate(c.ID, time.Duration(s.hoursAgo)*time.Hour+17*time.Minute)
		}
		flagged = append(flagged, c)
	}
	for i, ago := range []time.Duration{40 * time.Second, 3 * time.Minute, 12 * time.Minute, 50 * time.Minute} {
		c := f.claimMsg("billing", fmt.Sprintf("order-%04d", 2000+i), `{"order":2000}`, nil)
		f.backdate(c.ID, ago)
	}
	for range 3 {
		if err := f.srv.Sampler().Sample(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	platform := httptest.NewServer(easyAuth(f.srv, f.iss.Token(who, whoID, nil)))
	t.Cleanup(platform.Close)

	shots := os.Getenv(ScreenshotsEnv)
	if shots == "" {
		shots = t.TempDir()
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(t.Context(),
		chromedp.ExecPath(exe), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.Flag("disable-extensions", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1360, 1000))
	defer cancelAlloc()
	ctx, cancelTab := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	defer cancelTab()
	// A guard against a wedged browser, not an assertion on speed.
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()

	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return strings.TrimSpace(s)
	}
	eval := func(js string) int {
		t.Helper()
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](js))
		if err != nil {
			t.Fatalf("%s: %v", js, err)
		}
		return n
	}
	noCSPViolations := func(where string) {
		t.Helper()
		v, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`window.__csp || []`))
		if err != nil {
			t.Fatal(err)
		}
		if len(v) > 0 {
			t.Errorf("%s: the Content-Security-Policy blocked %q", where, v)
		}
	}
	screenshot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		path := filepath.Join(shots, name)
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", path)
	}

	// The console's port reached directly: no identity, nothing shown.
	do("open the console without the sign-in", chromedp.Navigate(f.ts.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#flash")))
	if got := text("#flash h2"); got != "Not signed in" {
		t.Errorf("without the sign-in the console says %q", got)
	}
	if n := eval(`document.querySelectorAll("#count-flagged").length`); n != 0 {
		t.Error("without the sign-in the console shows the overview")
	}

	// Overview, signed in.
	do("open the overview", addScript(cspWatch), chromedp.Navigate(platform.URL+"/"), chromedp.WaitVisible(chromedp.CSS("#count-flagged")))
	if got := text("#count-flagged"); got != strconv.Itoa(len(seeds)) {
		t.Errorf("overview: %s flagged, want %d", got, len(seeds))
	}
	if got := text("#count-claimed"); !strings.HasPrefix(got, "4") {
		t.Errorf("overview: %s claimed, want 4", got)
	}
	if n := eval(`document.querySelectorAll("#flagged-per-hour rect.bar").length`); n != 24 {
		t.Errorf("flagged-per-hour chart has %d bars, want 24", n)
	}
	if n := eval(`document.querySelectorAll("#by-reason tbody tr").length`); n != 4 {
		t.Errorf("reasons table has %d rows, want 4 (no heartbeat, still unknown, refused, route changed)", n)
	}
	if got := text("#who"); got != who {
		t.Errorf("signed in as %q, want %q", got, who)
	}
	noCSPViolations("overview")
	screenshot("console-overview.png")

	// List: the flagged claims, then only billing's, by the filter form.
	do("open the flagged list", chromedp.Click(chromedp.CSS("#card-flagged")), chromedp.WaitVisible(chromedp.CSS("#claims")))
	if n := eval(`document.querySelectorAll("#claims tbody tr").length`); n != len(seeds) {
		t.Errorf("flagged list: %d rows, want %d", n, len(seeds))
	}
	do("filter by consumer", chromedp.SetValue(chromedp.CSS(`#filters input[name="consumer"]`), "billing"),
		chromedp.Submit(chromedp.CSS("#filters")), chromedp.WaitVisible(chromedp.CSS(`#claims tbody tr`)))
	loc, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(loc, "consumer=billing") || !strings.Contains(loc, "state=flagged") {
		t.Errorf("the filtered list's address %s does not carry the filter", loc)
	}
	// The form's submit replaced the page; wait for the filtered one.
	do("filtered list", chromedp.WaitVisible(chromedp.CSS(`#filters input[name="consumer"][value="billing"]`)))
	if n := eval(`document.querySelectorAll("#claims tbody tr").length`); n != 4 {
		t.Errorf("billing's flagged claims: %d rows, want 4", n)
	}
	noCSPViolations("list")

	// Claim page, then redrive it.
	first := flagged[0]
	do("open the claim", chromedp.Click(chromedp.CSS(fmt.Sprintf("#claim-%d a", first.ID))), chromedp.WaitVisible(chromedp.CSS("#message-id")))
	if got := text("#message-id"); got != first.MessageID {
		t.Errorf("claim page shows message id %q, want %q", got, first.MessageID)
	}
	if got := text("h1 .state"); got != "flagged" {
		t.Errorf("claim page shows state %q", got)
	}
	if n := eval(`document.querySelectorAll("#trail tbody tr").length`); n < 2 {
		t.Errorf("audit trail has %d rows, want claimed and flagged", n)
	}
	noCSPViolations("claim")
	screenshot("console-claim.png")
	do("redrive", chromedp.SendKeys(chromedp.CSS("#redrive-note"), "PSP outage is over"), chromedp.Click(chromedp.CSS("#redrive")),
		chromedp.WaitVisible(chromedp.CSS("#flash")))
	if got := text("#flash"); !strings.Contains(got, "Redriven") || !strings.Contains(got, "resolved as redriven by "+who) {
		t.Errorf("after redrive the page says %q", got)
	}
	if got := text("h1 .state"); got != "resolved" {
		t.Errorf("after redrive the claim is %q", got)
	}
	if got := text("#resolution"); !strings.Contains(got, "redriven by "+who) || !strings.Contains(got, "PSP outage is over") {
		t.Errorf("after redrive the resolution reads %q", got)
	}
	if e := f.fake.Effects(first.MessageID); e != 1 {
		t.Errorf("the downstream performed %d effects for %s, want 1", e, first.MessageID)
	}
	if n := eval(`document.querySelectorAll("#redrive-form, #resolve-form").length`); n != 0 {
		t.Errorf("a resolved claim still offers %d action forms", n)
	}

	// Resolve another by hand as discarded (the note is required).
	second := flagged[1]
	do("open the second claim", chromedp.Navigate(fmt.Sprintf("%s/claims/%d", platform.URL, second.ID)), chromedp.WaitVisible(chromedp.CSS("#resolve-form")))
	do("resolve as discarded", chromedp.Click(chromedp.CSS("#as-discarded")),
		chromedp.SendKeys(chromedp.CSS("#resolve-note"), "order cancelled by the customer"),
		chromedp.Click(chromedp.CSS("#resolve")), chromedp.WaitVisible(chromedp.CSS("#flash")))
	if got := text("#flash"); !strings.Contains(got, "Resolved as discarded by "+who) {
		t.Errorf("after resolve the page says %q", got)
	}
	if got := text("#trail"); !strings.Contains(got, "flagged → resolved: discarded: order cancelled by the customer") {
		t.Errorf("the audit trail reads %q", got)
	}
	if c := f.get(second.ID); c.State != claim.StateResolved || c.Resolution != claim.ResolutionDiscarded || c.ResolvedBy != who+" (id "+whoID+")" {
		t.Errorf("the store has %s/%s by %q", c.State, c.Resolution, c.ResolvedBy)
	}

	// Bulk: resolve shipping's two flagged claims as done; the confirm
	// page says how many first.
	do("open the bulk confirm page", chromedp.Navigate(platform.URL+"/bulk?action=resolve&consumer=shipping"), chromedp.WaitVisible(chromedp.CSS("#bulk-count")))
	if got := text("#bulk-count"); !strings.Contains(got, "2 flagged claim(s) match") {
		t.Errorf("the confirm page says %q", got)
	}
	do("bulk resolve", chromedp.Click(chromedp.CSS(`#bulk-form input[value="done"]`)),
		chromedp.SendKeys(chromedp.CSS("#bulk-note"), "address corrected, re-shipped by hand"),
		chromedp.Click(chromedp.CSS("#bulk-submit")), chromedp.WaitVisible(chromedp.CSS("#bulk-summary")))
	if got := text("#bulk-summary"); got != "2 resolved as done" {
		t.Errorf("the bulk summary says %q", got)
	}
	noCSPViolations("bulk")

	// Back to the overview: four fewer flagged.
	do("overview again", chromedp.Click(chromedp.CSS(`header nav a[href="/"]`)), chromedp.WaitVisible(chromedp.CSS("#count-flagged")))
	if got := text("#count-flagged"); got != strconv.Itoa(len(seeds)-4) {
		t.Errorf("overview after the actions: %s flagged, want %d", got, len(seeds)-4)
	}
}
