package console_test

import (
	"fmt"
	"net/http"
	"net/url"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
)

// declined is the answer a payment API gives a declined card, as the
// charges route records it.
func declined(charge string) *claim.Answer {
	return &claim.Answer{Status: 402, Headers: map[string]string{"Request-Id": "req_7"},
		Fields: map[string]string{"/error/charge": charge, "/error/code": "card_declined"}}
}

// A failed claim's page says when and why it failed, which delivery
// dead-letters it and what the downstream answered, and offers no redrive
// or resolve (only a retry after a fix): a redrive or resolve posted
// anyway is refused and changes nothing.
func TestFailedClaimShowsItsFieldsAndOffersNoAction(t *testing.T) {
	f := setup(t, nil)
	seqNo := int64(4711)
	c := f.fail(f.claimSubject("charge", "billing", "", `{"amount":1}`, nil), claim.FailRejected,
		"charges: HTTP 402 (answers[0]): card_declined", declined("fx_9"), &seqNo)
	// A token of this operator and browser, from a page that has a form.
	other := f.flag(f.claimSubject("charge", "billing", "", `{"amount":2}`, nil), "no heartbeat since x")
	a := f.client(alice, aliceID)
	token := a.token(fmt.Sprintf("/claims/%d", other.ID))

	path := fmt.Sprintf("/claims/%d", c.ID)
	page := a.getPage(path)
	mustStatus(t, "failed claim", page, http.StatusOK)
	mustContain(t, "failed claim", page,
		`<span class="state failed">failed</span>`, `id="failed"`, `id="no-actions"`,
		"the downstream gave a final answer for this key",
		claim.FailRejected, "the downstream&#39;s final business answer (such as a card decline)",
		"charges: HTTP 402 (answers[0]): card_declined",
		"the delivery with sequence number 4711",
		"HTTP 402", "header Request-Id", "req_7", "field /error/charge", "fx_9",
		`id="retry-form"`, "Retry after a fix")
	for _, form := range []string{`id="actions"`, `id="redrive-form"`, `id="resolve-form"`, `id="new-key-form"`} {
		if strings.Contains(page.body, form) {
			t.Errorf("the failed claim's page offers an action (%s)", form)
		}
	}
	if !regexp.MustCompile(`(?s)<td>failed</td><td>[^<]+</td><td>claimed → failed: EffectRejected: charges: HTTP 402`).MatchString(page.body) {
		t.Error("the audit trail has no failed event with its reason and description")
	}

	before := f.get(c.ID)
	for name, tc := range map[string]struct {
		path string
		form url.Values
	}{
		"redrive":            {path + "/redrive", url.Values{"csrf": {token}}},
		"redrive, a new key": {path + "/redrive", url.Values{"csrf": {token}, "new_key": {"1"}, "note": {"checked"}}},
		"resolve as done":    {path + "/resolve", resolveForm(token, "done", "checked")},
		"resolve, discarded": {path + "/resolve", resolveForm(token, "discarded", "checked")},
		"bulk resolve of it": {"/bulk", url.Values{"csrf": {token}, "action": {"resolve"}, "id": {fmt.Sprint(c.ID)}, "as": {"done"}, "note": {"n"}}},
		"bulk redrive of it": {"/bulk", url.Values{"csrf": {token}, "action": {"redrive"}, "id": {fmt.Sprint(c.ID)}}},
	} {
		r := a.post(tc.path, tc.form)
		if tc.path == "/bulk" {
			mustStatus(t, name, r, http.StatusOK)
			mustContain(t, name, r, "1 refused, nothing changed", "it is failed (EffectRejected at ")
			continue
		}
		mustStatus(t, name, r, http.StatusConflict)
		mustContain(t, name, r, "Refused", "it is failed (EffectRejected at ", "nothing was changed", `id="no-actions"`)
	}
	if after := f.get(c.ID); !reflect.DeepEqual(before, after) {
		t.Errorf("the claim changed:\n before %+v\n  after %+v", before, after)
	}
	if n := f.fake.Requests(c.Key()) + f.fake.Requests(claim.RevisedKey(c.MessageID, 1)); n != 0 {
		t.Errorf("a refused action reached the downstream (%d requests)", n)
	}

	// A claim failed by the reconciler or a redrive has no delivery yet.
	noDL := f.fail(f.claimSubject("charge", "billing", "", `{"amount":3}`, nil), claim.FailConflict, "key used with another payload", nil, nil)
	mustContain(t, "failed without a dead letter", a.getPage(fmt.Sprintf("/claims/%d", noDL.ID)),
		claim.FailConflict, "none yet: the next delivery of its message, if one comes, is dead-lettered",
		"No answer recorded")
}

// The list's state filter takes failed: it lists the failed claims and
// nothing else, with their fail reasons.
func TestListFilterStateFailed(t *testing.T) {
	f := setup(t, nil)
	var want []string
	for i := range 3 {
		f.flagged("billing", "", `{"amount":1}`, nil, "no heartbeat since x")
		f.claimMsg("billing", "", `{"amount":2}`, nil)
		c := f.fail(f.claimSubject("charge", "billing", "", fmt.Sprintf(`{"amount":%d}`, i), nil), claim.FailPermanent,
			fmt.Sprintf("HTTP 400 number %d", i), nil, nil)
		want = append(want, fmt.Sprint(c.ID))
	}
	done := f.claimMsg("billing", "", `{"amount":3}`, nil)
	if err := f.store.MarkProcessed(t.Context(), &claim.MarkProcessedParams{ID: done.ID, Owner: done.Owner}); err != nil {
		t.Fatal(err)
	}
	a := f.client(alice, aliceID)
	page := a.getPage("/claims?state=failed")
	mustStatus(t, "state=failed", page, http.StatusOK)
	var got []string
	for _, m := range rowID.FindAllStringSubmatch(page.body, -1) {
		got = append(got, m[1])
	}
	if !slices.Equal(got, want) {
		t.Errorf("state=failed lists %v, want the failed claims %v", got, want)
	}
	mustContain(t, "state=failed", page, `value="failed" checked`, claim.FailPermanent, "HTTP 400 number 2")
	if strings.Count(page.body, `<span class="state failed">failed</span>`) != len(want) {
		t.Error("a listed claim is not shown as failed")
	}
	// Bulk actions act on flagged claims: a list of failed ones offers none.
	if strings.Contains(page.body, `id="bulk-redrive"`) {
		t.Error("the list of failed claims offers a bulk action")
	}
}

// The downstream's recorded answer is shown on the claim page — status,
// step, every header and field, the truncated flag, when — and escaped
// like every other producer-controlled text.
func TestAnswerRendersEscaped(t *testing.T) {
	f := setup(t, nil)
	c := f.claimSubject("charge", "billing", "", `{"amount":1}`, nil)
	answer := &claim.Answer{Status: 503, Step: `auth<i>`,
		Headers:   map[string]string{"Request-Id": `<script>alert("hdr")</script>`, "Retry-After": "7"},
		Fields:    map[string]string{`/error/<b>x</b>`: "a\u202eb", "/error/code": "over_capacity"},
		Truncated: true}
	if err := f.store.RecordAttempt(t.Context(), &claim.RecordAttemptParams{ID: c.ID, Owner: c.Owner, Error: "HTTP 503", Answer: answer}); err != nil {
		t.Fatal(err)
	}
	c = f.flag(c, "recovery: the outcome is still unknown after 5 attempt(s)")
	if c.Answer == nil || c.AnswerAt == nil {
		t.Fatal("the store kept no answer")
	}
	page := f.client(alice, aliceID).getPage(fmt.Sprintf("/claims/%d", c.ID))
	mustStatus(t, "claim page", page, http.StatusOK)
	mustContain(t, "claim page", page,
		`<td id="answer-status">HTTP 503</td>`, `<td id="answer-step">auth&lt;i&gt;</td>`,
		`header Request-Id</th><td class="mono">&lt;script&gt;alert(&#34;hdr&#34;)&lt;/script&gt;</td>`,
		`header Retry-After</th><td class="mono">7</td>`,
		`field /error/&lt;b&gt;x&lt;/b&gt;</th><td class="mono">a\u202eb</td>`,
		`field /error/code</th><td class="mono">over_capacity</td>`,
		`id="answer-truncated"`, `<td id="answer-at">`+stampOf(*c.AnswerAt))
	for _, raw := range []string{`<script>alert("hdr")`, "<b>x</b>", "<i>", "\u202e"} {
		if strings.Contains(page.body, raw) {
			t.Errorf("%q reached the page unescaped", raw)
		}
	}
	// Headers, then fields, each sorted by name.
	order := regexp.MustCompile(`<tr class="answer-(?:header|field)"><th class="mono">([^<]*)<`).FindAllStringSubmatch(page.body, -1)
	var names []string
	for _, m := range order {
		names = append(names, m[1])
	}
	if want := []string{"header Request-Id", "header Retry-After", "field /error/&lt;b&gt;x&lt;/b&gt;", "field /error/code"}; !slices.Equal(names, want) {
		t.Errorf("answer rows %q, want %q", names, want)
	}
}

// stampOf is a time as the pages print it.
func stampOf(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000Z") }

// A redrive whose downstream gives a final answer (a decline) fails the
// claim: the flash says the answer was final and the claim is failed, not
// flagged, and the page shows it failed, without actions. In bulk the
// result says so too.
func TestRedriveFinalAnswerFailsTheClaim(t *testing.T) {
	f := setup(t, nil)
	c := f.flag(f.claimSubject("charge", "billing", "", `{"amount":1}`, nil), "no heartbeat since x")
	f.fake.SetKeyReply(c.Key(), fakedownstream.ReplyDecline)
	a := f.client(alice, aliceID)
	path := fmt.Sprintf("/claims/%d", c.ID)
	r := a.post(path+"/redrive", url.Values{"csrf": {a.token(path)}, "note": {"PSP is back"}})
	mustStatus(t, "redrive", r, http.StatusBadGateway)
	mustContain(t, "redrive", r, "The downstream&#39;s answer was final: the claim is failed",
		"got a final answer with idempotency key &#34;"+c.Key()+"&#34;: outcome rejected (HTTP 402)",
		"The claim is now failed, not flagged", `id="failed"`, `id="no-actions"`, "card_declined")
	if strings.Contains(r.body, "The claim is flagged again") || strings.Contains(r.body, `id="actions"`) {
		t.Errorf("the page says the claim is flagged again or offers actions:\n%s", flashOf(r.body))
	}
	got := f.get(c.ID)
	if got.State != claim.StateFailed || got.FailReason != claim.FailRejected || got.FailedAt == nil || got.DeadLetterSeq != nil ||
		got.Answer == nil || got.Answer.Status != 402 || got.Answer.Fields["/error/code"] != "card_declined" {
		t.Errorf("after a declined redrive: %s, reason %q, answer %+v", got.State, got.FailReason, got.Answer)
	}
	if n := f.fake.Rejections(c.Key()); n != 1 {
		t.Errorf("the downstream recorded %d declines, want 1", n)
	}

	// In bulk: one declined, one charged.
	declinedC := f.flag(f.claimSubject("charge", "billing", "", `{"amount":2}`, nil), "no heartbeat since x")
	charged := f.flag(f.claimSubject("charge", "billing", "", `{"amount":3}`, nil), "no heartbeat since x")
	f.fake.SetKeyReply(declinedC.Key(), fakedownstream.ReplyDecline)
	r = a.post("/bulk", url.Values{"csrf": {a.token(fmt.Sprintf("/claims/%d", charged.ID))}, "action": {"redrive"},
		"id": {fmt.Sprint(declinedC.ID), fmt.Sprint(charged.ID)}})
	mustStatus(t, "bulk redrive", r, http.StatusOK)
	mustContain(t, "bulk redrive", r, "1 redriven, 1 final answer, claim failed", "The claim is now failed, not flagged")
	if got := f.get(declinedC.ID); got.State != claim.StateFailed {
		t.Errorf("the declined claim is %s after the bulk redrive", got.State)
	}
	if got := f.get(charged.ID); got.State != claim.StateResolved || f.fake.Effects(charged.Key()) != 1 {
		t.Errorf("the charged claim is %s with %d effects", got.State, f.fake.Effects(charged.Key()))
	}
}
