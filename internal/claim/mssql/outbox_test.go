package mssql

import (
	"context"
	"database/sql/driver"
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// MarkProcessed with follow-ups runs the guarded UPDATE and the INSERT of
// the follow-ups in one transaction, and inserts nothing when the guard
// did not hold. (The conformance suite runs the statements on a SQL
// Server; this checks the control flow and the parameters without one.)
func TestMarkProcessedWritesFollowUpsInItsTransaction(t *testing.T) {
	for _, guardHeld := range []bool{true, false} {
		db, rec := newFakeDB(t, func(req fakeRequest) fakeResult {
			if strings.Contains(req.Query, "UPDATE dbo.Claims") && guardHeld {
				return fakeResult{Sets: [][][]driver.Value{{{int64(7)}}}}
			}
			return fakeResult{}
		})
		fus := claim.NumberFollowUps("payments", "m-1", []claim.FollowUp{{To: "receipts", Body: []byte("a")}, {To: "audit"}})
		err := New(db).MarkProcessed(context.Background(), &claim.MarkProcessedParams{ID: 7, Owner: uuid.New(), FollowUps: fus})
		reqs := rec.requests()
		if !guardHeld {
			if !errors.Is(err, claim.ErrStateChanged) || len(reqs) != 1 {
				t.Fatalf("guard failed: %v after %d requests, want ErrStateChanged after 1", err, len(reqs))
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(reqs) != 2 || !reqs[0].InTx || !reqs[1].InTx || !strings.Contains(reqs[1].Query, "INSERT INTO dbo.ClaimFollowUps") {
			t.Fatalf("requests: %+v", reqs)
		}
		if n := len(reqs[1].Args); n != 1+2*10 {
			t.Fatalf("the insert sends %d parameters, want 21", n)
		}
		if !strings.Contains(reqs[1].Query, "WHERE NOT EXISTS") {
			t.Errorf("the insert is not idempotent:\n%s", reqs[1].Query)
		}
	}
}
