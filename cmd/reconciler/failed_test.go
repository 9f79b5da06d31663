package main

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
)

// TestFailedClaimsAndNewKeys: against a Stripe-style downstream, a tick
// fails the declined claim (a final answer) and flags the one whose 500 is
// stored under its key; list --state failed and show present the failed
// claim with its answer; a failed claim is never redriven; --new-key needs
// a note and a route that allows it, then settles the cached failure under
// <key>:r1, which show and --json report with the operator.
func TestFailedClaimsAndNewKeys(t *testing.T) {
	eachDatabase(t, func(t *testing.T, url string) {
		fake := fakedownstream.New(fakedownstream.Options{ConflictStyle: fakedownstream.ConflictStripe})
		srv := httptest.NewServer(fake)
		t.Cleanup(srv.Close)
		routes := filepath.Join(t.TempDir(), "routes.yaml")
		writeFile(t, routes, fmt.Sprintf(`version: 1
routes:
  - name: payments
    key: raw
    match: {subject: payment}
    url: %q
    timeout: 5s
    answers:
      - {status: 402, outcome: rejected}
      - {status: 400, field: /error/type, equals: idempotency_error, outcome: conflict}
    record:
      headers: [Request-Id]
      fields: [/id, /error/charge]
    allowNewKey: true
  - {key: raw, name: mail, match: {subject: mail}, url: %q, timeout: 5s}
`, srv.URL+"/payments", srv.URL+"/mail"))
		c := newCLI(t, map[string]string{
			"SBCLAIM_DATABASE_URL": url, "SBCLAIM_STALE_AFTER": "1s", "SBCLAIM_HEARTBEAT_INTERVAL": "300ms",
			"SBCLAIM_ROUTES": routes, "SBCLAIM_HTTP_ADDR": "127.0.0.1:0", "SBCLAIM_RECOVERY_MAX_ATTEMPTS": "1",
		})
		c.mustRun("migrate")
		st := openStore(t, url)
		payload := []byte(`{"amount":42}`)
		declined := claimMessage(t, st, "msg-declined", "payment", payload, true)
		cached := claimMessage(t, st, "msg-cached", "payment", payload, true)
		mail := claimMessage(t, st, "msg-mail", "mail", payload, true)
		fake.SetKeyReply(declined.MessageID, fakedownstream.ReplyDecline)
		fake.SetKeyReply(cached.MessageID, fakedownstream.ReplyCachedFailure)
		fake.SetKeyReply(mail.MessageID, fakedownstream.ReplyCachedFailure)
		waitStale(t, st, time.Second, declined, cached, mail)
		c.mustRun("once")
		for cl, want := range map[*claim.Claim]claim.State{declined: claim.StateFailed, cached: claim.StateFlagged, mail: claim.StateFlagged} {
			if got, _ := st.Get(t.Context(), cl.ID); got.State != want {
				t.Fatalf("%s after once: %s, want %s", cl.MessageID, got.State, want)
			}
		}
		id := func(cl *claim.Claim) string { return strconv.FormatInt(cl.ID, 10) }

		r := c.mustRun("list", "--state", "failed")
		if !strings.Contains(r.stdout, "msg-declined") || !strings.Contains(r.stdout, "EffectRejected: ") || strings.Contains(r.stdout, "msg-cached") {
			t.Errorf("list --state failed:\n%s", r.stdout)
		}
		r = c.mustRun("list", "--state", "failed", "--json")
		var listed []map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &listed); err != nil || len(listed) != 1 {
			t.Fatalf("list --state failed --json: %v %s", err, r.stdout)
		}
		answer, _ := listed[0]["answer"].(map[string]any)
		fields, _ := answer["fields"].(map[string]any)
		if listed[0]["state"] != "failed" || listed[0]["fail_reason"] != "EffectRejected" || listed[0]["failed_at"] == nil ||
			answer["status"] != float64(402) || fields["/error/charge"] == nil || listed[0]["idempotency_key"] != "msg-declined" {
			t.Errorf("list --json of the failed claim: %v", listed[0])
		}
		r = c.mustRun("show", id(declined))
		for _, want := range []string{"state:", "failed", "failed at:", "fail reason:", "EffectRejected", "answer:", "HTTP 402", "/error/charge=",
			"Request-Id=", "dead letter:", "none yet", "idempotency key:", "(raw: the message id)", "key form:", "History (one row per change", "claimed → failed: EffectRejected", "amount"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("show of the failed claim lacks %q", want)
			}
		}
		if r := c.run("redrive", id(declined)); r.code != exitFailure || !strings.Contains(r.stderr, "it is failed") {
			t.Errorf("redrive of a failed claim: %d %q", r.code, r.stderr)
		}

		if r := c.run("redrive", id(cached), "--new-key"); r.code != exitUsage || !strings.Contains(r.stderr, "--note") {
			t.Errorf("--new-key without --note: %d %q", r.code, r.stderr)
		}
		if r := c.run("redrive", id(mail), "--new-key", "--note", "checked"); r.code != exitFailure || !strings.Contains(r.stderr, "allowNewKey") {
			t.Errorf("--new-key on a route without allowNewKey: %d %q", r.code, r.stderr)
		}
		if r := c.run("redrive", id(cached)); r.code != exitFailure || !strings.Contains(r.stderr, "outcome unknown") || !strings.Contains(r.stderr, "MAY have been performed") {
			t.Errorf("a same-key redrive of a cached failure: %d %q", r.code, r.stderr)
		}
		r = c.mustRun("redrive", id(cached), "--new-key", "--note", "no charge under msg-cached in the dashboard")
		if !strings.Contains(r.stdout, "the new idempotency key msg-cached:r1 (revision 1") || !strings.Contains(r.stdout, "answer: HTTP 201") {
			t.Errorf("redrive --new-key said %q", r.stdout)
		}
		if fake.Effects("msg-cached:r1") != 1 || fake.Effects("msg-cached") != 0 {
			t.Errorf("effects under the new key %d, the old %d; want 1 and 0", fake.Effects("msg-cached:r1"), fake.Effects("msg-cached"))
		}
		r = c.mustRun("show", id(cached))
		for _, want := range []string{"msg-cached:r1", "(raw: the message id, revision 1 chosen by operator:tester)", "redriven", "flagged → claimed via operator",
			"no charge under msg-cached in the dashboard", "resolved", "HTTP 201", "/id="} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("show after --new-key lacks %q", want)
			}
		}
		r = c.mustRun("show", id(cached), "--json")
		var shown map[string]any
		if err := json.Unmarshal([]byte(r.stdout), &shown); err != nil {
			t.Fatal(err)
		}
		if shown["idempotency_key"] != "msg-cached:r1" || shown["key_revision"] != float64(1) || shown["key_revised_by"] != "operator:tester" ||
			shown["key_revised_at"] == nil || !strings.Contains(fmt.Sprint(shown["key_revision_note"]), "no charge") {
			t.Errorf("show --json after --new-key: %v", shown)
		}
	})
}
