package console_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// The claim page lists the claim's follow-ups and whether each was sent.
func TestClaimPageListsFollowUps(t *testing.T) {
	f := setup(t, nil)
	c := f.claimMsg("billing", "", `{"amount":10}`, nil)
	ctx := context.Background()
	fus := claim.NumberFollowUps(c.Consumer, c.MessageID, []claim.FollowUp{{To: "receipts", Subject: "payment.charged"}, {To: "audit"}})
	if err := f.store.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: c.ID, Owner: c.Owner, FollowUps: fus}); err != nil {
		t.Fatal(err)
	}
	relay := uuid.New()
	if _, err := f.store.LeaseFollowUps(ctx, &claim.LeaseFollowUpsParams{Owner: relay, For: time.Minute, ClaimID: c.ID, Limit: 2}); err != nil {
		t.Fatal(err)
	}
	if err := f.store.MarkFollowUpSent(ctx, &claim.FollowUpLeaseParams{ClaimID: c.ID, Position: 1, Owner: relay}); err != nil {
		t.Fatal(err)
	}
	if err := f.store.RetryFollowUp(ctx, &claim.RetryFollowUpParams{FollowUpLeaseParams: claim.FollowUpLeaseParams{ClaimID: c.ID, Position: 2, Owner: relay},
		Error: "entity audit not found", RetryIn: time.Minute}); err != nil {
		t.Fatal(err)
	}
	a := f.client("ann", "ann")
	r := a.getPage("/claims/" + strconv.FormatInt(c.ID, 10))
	mustContain(t, "the claim page", r, `id="followups"`, "receipts", "payment.charged", fus[0].MessageID, "sent 20",
		"audit", fus[1].MessageID, "pending: entity audit not found")
}
