package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// `show` lists a claim's follow-ups and whether each was sent.
func TestShowListsFollowUps(t *testing.T) {
	url := "sqlite:" + filepath.Join(t.TempDir(), "claims.db")
	c := newCLI(t, map[string]string{"SBCLAIM_DATABASE_URL": url})
	c.mustRun("migrate")
	st := openStore(t, url)
	cl := claimMessage(t, st, "pay-1", "payment", []byte(`{}`), true)
	ctx := context.Background()
	fus := claim.NumberFollowUps(cl.Consumer, cl.MessageID, []claim.FollowUp{{To: "receipts", Subject: "payment.charged"}, {To: "audit"}})
	if err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: cl.ID, Owner: cl.Owner, FollowUps: fus}); err != nil {
		t.Fatal(err)
	}
	ob := st.(claim.Outbox)
	relay := uuid.New()
	leased, err := ob.LeaseFollowUps(ctx, &claim.LeaseFollowUpsParams{Owner: relay, For: time.Minute, ClaimID: cl.ID, Limit: 1})
	if err != nil || len(leased) != 1 {
		t.Fatalf("lease: %v %v", leased, err)
	}
	if err := ob.MarkFollowUpSent(ctx, &claim.FollowUpLeaseParams{ClaimID: cl.ID, Position: 1, Owner: relay}); err != nil {
		t.Fatal(err)
	}
	id := strconv.FormatInt(cl.ID, 10)
	r := c.mustRun("show", id)
	for _, want := range []string{"Follow-ups", "to receipts", "payment.charged", fus[0].MessageID, "sent ", "to audit", fus[1].MessageID, "pending"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("show lacks %q:\n%s", want, r.stdout)
		}
	}
	r = c.mustRun("show", id, "--json")
	var j struct {
		FollowUps []struct {
			MessageID string `json:"message_id"`
			Sent      bool   `json:"sent"`
		} `json:"follow_ups"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &j); err != nil {
		t.Fatal(err)
	}
	if len(j.FollowUps) != 2 || !j.FollowUps[0].Sent || j.FollowUps[1].Sent || j.FollowUps[1].MessageID != fus[1].MessageID {
		t.Fatalf("show --json follow-ups: %+v", j.FollowUps)
	}
}
