package console_test

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// claimInSession claims a message of session for consumer.
func (f *fixture) claimInSession(session, consumer, body string) *claim.Claim {
	f.t.Helper()
	id := fmt.Sprintf("ledger-%d", seq.Add(1))
	res, err := f.store.ClaimBatch(f.t.Context(), &claim.ClaimBatchParams{Host: "processor-1", Claims: []claim.ClaimParams{{
		KeyForm: claim.KeyFormRaw, MessageID: id, Consumer: consumer, Owner: uuid.New(), Entity: "ledger", SessionID: session,
		Subject: "payment", ContentType: "application/json", PayloadHash: claim.HashPayload([]byte(body)), Payload: []byte(body), DeliveryCount: 1,
	}}})
	if err != nil || res[0].Outcome != claim.OutcomeWon {
		f.t.Fatalf("claim %s: %v %v", id, err, res)
	}
	return res[0].Claim
}

// The console shows sessions: the list filters by session, a claim's
// page names its session and links to the session's claims, and the
// overview lists the failed or flagged claims of sessions (those a
// route that holds its session on failure is waiting on).
func TestSessionsInTheConsole(t *testing.T) {
	f := setup(t, nil)
	a1 := f.claimInSession("account <7>", "ledger", `{"n":1}`)
	a2 := f.claimInSession("account <7>", "ledger", `{"n":2}`)
	f.claimInSession("account 8", "ledger", `{"n":3}`)
	f.claimMsg("billing", "", `{"amount":1}`, nil) // no session
	held := f.fail(a1, claim.FailRejected, "HTTP 402: declined", nil, nil)
	f.flagged("billing", "", `{"amount":2}`, nil, "no heartbeat") // flagged, but of no session

	a := f.client(alice, aliceID)
	page := a.getPage("/claims?session=" + url.QueryEscape("account <7>"))
	mustStatus(t, "session filter", page, http.StatusOK)
	var got []string
	for _, m := range rowID.FindAllStringSubmatch(page.body, -1) {
		got = append(got, m[1])
	}
	if want := []string{fmt.Sprint(a1.ID), fmt.Sprint(a2.ID)}; !slices.Equal(got, want) {
		t.Errorf("session filter lists %v, want %v", got, want)
	}
	mustContain(t, "session filter", page, `name="session" value="account &lt;7&gt;"`)

	page = a.getPage(fmt.Sprintf("/claims/%d", held.ID))
	mustStatus(t, "claim page", page, http.StatusOK)
	mustContain(t, "claim page", page, `<td id="session"><a href="/claims?session=account%20%3c7%3e">account &lt;7&gt;</a>`)

	page = a.getPage("/")
	mustStatus(t, "overview", page, http.StatusOK)
	mustContain(t, "overview", page, `id="held-sessions"`, fmt.Sprintf(`<a href="/claims/%d">%d</a>`, held.ID, held.ID))
	if n := strings.Count(page.body, `href="/claims?session=`); n != 1 {
		t.Errorf("the overview lists %d held sessions, want 1 (only a failed or flagged claim of a session)", n)
	}
}
