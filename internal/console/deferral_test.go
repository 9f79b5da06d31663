package console_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// TestDeferredClaimShowsWhenItsMessageIsDue: a claim whose message is
// deferred shows its due time, the message's sequence number and its
// postponements on the claim page.
func TestDeferredClaimShowsWhenItsMessageIsDue(t *testing.T) {
	f := setup(t, nil)
	c := f.claimMsg("billing", "", `{"amount":1}`, nil)
	if err := f.store.Defer(context.Background(), &claim.DeferParams{ID: c.ID, Owner: c.Owner, Seq: 4242, DueIn: 10 * time.Minute,
		Grace: time.Hour, Error: "HTTP 503"}); err != nil {
		t.Fatal(err)
	}
	if err := f.store.SetDue(context.Background(), &claim.SetDueParams{ID: c.ID, Owner: c.Owner, Seq: 4242, DueIn: 10 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	page := f.client(alice, aliceID).getPage(fmt.Sprintf("/claims/%d", c.ID))
	mustStatus(t, "deferred claim", page, http.StatusOK)
	mustContain(t, "deferred claim", page, `id="due"`, "sequence number 4242, deferred at Service Bus; a processor fetches it then",
		`id="postponements"`, "the route’s retry horizon counts from it",
		"the reconciler leaves the claim to its deferred message until then")
}
