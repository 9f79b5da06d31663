package reconciler_test

import (
	"context"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/reconciler"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
)

// publishingRouter routes every message to an effect that publishes one
// follow-up.
type publishingRouter struct{}

func (publishingRouter) Route(*azservicebus.ReceivedMessage) (sideeffects.Handler, error) {
	return sideeffects.Handler{Name: "payments", Effect: sideeffects.EffectFunc(func(ctx context.Context, msg *azservicebus.ReceivedMessage, key string) error {
		return claim.FollowUpSinkOf(ctx).Publish(claim.FollowUp{To: "receipts", Body: []byte(key)})
	})}, nil
}

// A recovery that re-runs an effect records the follow-ups it published
// with the outcome, with the claim's MessageIds; the processors' relay
// sends them.
func TestRecoveryRecordsFollowUps(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		c := claimN(t, tdb.store, "fu", 1, nil)[0]
		tdb.backdateHeartbeat(t, time.Hour, c.ID)
		res, err := recoveryRec(t, tdb.store, reconciler.Routes{"billing": publishingRouter{}}).RunOnce(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if res.Recovered != 1 {
			t.Fatalf("recovered %d, want 1", res.Recovered)
		}
		fus, err := tdb.store.(claim.Outbox).FollowUps(ctx, c.ID)
		if err != nil {
			t.Fatal(err)
		}
		if len(fus) != 1 || fus[0].MessageID != claim.FollowUpMessageID("billing", c.MessageID, 1) || fus[0].State != claim.FollowUpPending ||
			string(fus[0].Body) != c.MessageID {
			t.Fatalf("follow-ups %+v", fus)
		}
	})
}
