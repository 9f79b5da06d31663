package reconciler_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/reconciler"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/sideeffects/routesfile"
	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
)

// downstream is the fake idempotent API behind a routes file.
func downstream(t *testing.T) (*fakedownstream.Server, *sideeffects.HTTPRouter) {
	t.Helper()
	fake := fakedownstream.New(fakedownstream.Options{})
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	routes := fmt.Sprintf(`version: 1
routes:
  - name: payments
    key: raw
    match: {subject: payment}
    method: POST
    url: %q
    timeout: 5s
    body: json
`, srv.URL+"/payments")
	router, err := routesfile.Parse([]byte(routes), func(string) string { return "" }, nil, testLogger(t))
	if err != nil {
		t.Fatalf("routes: %v", err)
	}
	return fake, router
}

var fastRetry = sideeffects.RetryPolicy{MaxAttempts: 2, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond}

// flaggedClaim claims one message and flags it (heartbeat stopped).
func flaggedClaim(t *testing.T, tdb *testDB, prefix string) *claim.Claim {
	t.Helper()
	c := claimN(t, tdb.store, prefix, 1, nil)[0]
	tdb.backdateHeartbeat(t, time.Hour, c.ID)
	res, err := newRec(t, tdb.store, reconciler.Config{StaleAfter: time.Minute}).RunOnce(context.Background())
	if err != nil || len(res.Flagged) != 1 {
		t.Fatalf("flag claim: err=%v flagged=%d", err, len(res.Flagged))
	}
	return mustGet(t, tdb.store, c.ID)
}

// The original attempt performed the effect and died before recording it;
// the redrive sends the same key, the downstream replays, one effect.
func TestRedriveAfterPerformedEffectIsOneEffect(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		fake, router := downstream(t)
		c := claimN(t, tdb.store, "redrive", 1, nil)[0]

		// The original attempt: the effect happens, then the process dies.
		msg := reconciler.MessageFromClaim(mustGet(t, tdb.store, c.ID))
		h, err := router.Route(msg)
		if err != nil {
			t.Fatal(err)
		}
		if err := h.Effect.Perform(ctx, msg, c.MessageID); err != nil {
			t.Fatalf("original effect: %v", err)
		}
		tdb.backdateHeartbeat(t, time.Hour, c.ID)
		if res, err := newRec(t, tdb.store, reconciler.Config{StaleAfter: time.Minute}).RunOnce(ctx); err != nil || len(res.Flagged) != 1 {
			t.Fatalf("flag: err=%v flagged=%d", err, len(res.Flagged))
		}

		got, err := reconciler.Redrive(ctx, tdb.store, &reconciler.RedriveParams{ID: c.ID, By: "alice", Routes: reconciler.Routes{"": router}, Retry: fastRetry, Logger: testLogger(t)})
		if err != nil {
			t.Fatalf("redrive: %v", err)
		}
		if e, r := fake.Effects(c.MessageID), fake.Requests(c.MessageID); e != 1 || r != 2 {
			t.Errorf("downstream saw %d effect(s) in %d request(s) for key %s, want 1 effect in 2 requests", e, r, c.MessageID)
		}
		if got.State != claim.StateResolved || got.Resolution != claim.ResolutionRedriven || got.ResolvedBy != "alice" ||
			got.ProcessedAt == nil || got.ResolvedAt == nil || got.ResolutionNote != "redriven" {
			t.Errorf("after redrive: %+v, want resolved/redriven by alice, processed", got)
		}
		// A second redrive is refused: the claim is no longer flagged.
		if _, err := reconciler.Redrive(ctx, tdb.store, &reconciler.RedriveParams{ID: c.ID, By: "bob", Routes: reconciler.Routes{"": router}, Retry: fastRetry}); !errors.Is(err, reconciler.ErrNotFlagged) {
			t.Errorf("second redrive: %v, want ErrNotFlagged", err)
		}
		if r := fake.Requests(c.MessageID); r != 2 {
			t.Errorf("refused redrive still called downstream (%d requests)", r)
		}
	})
}

func TestRedriveRefusals(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		fake, router := downstream(t)

		t.Run("not flagged", func(t *testing.T) {
			c := claimN(t, tdb.store, "claimed", 1, nil)[0]
			_, err := reconciler.Redrive(ctx, tdb.store, &reconciler.RedriveParams{ID: c.ID, By: "a", Routes: reconciler.Routes{"": router}, Retry: fastRetry})
			if !errors.Is(err, reconciler.ErrNotFlagged) {
				t.Fatalf("err = %v, want ErrNotFlagged", err)
			}
		})
		t.Run("not found", func(t *testing.T) {
			_, err := reconciler.Redrive(ctx, tdb.store, &reconciler.RedriveParams{ID: 987654, By: "a", Routes: reconciler.Routes{"": router}, Retry: fastRetry})
			if !errors.Is(err, claim.ErrNotFound) {
				t.Fatalf("err = %v, want ErrNotFound", err)
			}
		})
		t.Run("no payload", func(t *testing.T) {
			body := []byte(`{"x":1}`)
			res, err := tdb.store.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "h", Claims: []claim.ClaimParams{{
				KeyForm:   claim.KeyFormRaw,
				Owner:     uuid.New(),
				MessageID: "nopayload-1", Consumer: "billing", Subject: "payment", PayloadHash: claim.HashPayload(body), DeliveryCount: 1,
			}}})
			if err != nil {
				t.Fatal(err)
			}
			id := res[0].Claim.ID
			tdb.backdateHeartbeat(t, time.Hour, id)
			if _, err := newRec(t, tdb.store, reconciler.Config{StaleAfter: time.Minute}).RunOnce(ctx); err != nil {
				t.Fatal(err)
			}
			_, err = reconciler.Redrive(ctx, tdb.store, &reconciler.RedriveParams{ID: id, By: "a", Routes: reconciler.Routes{"": router}, Retry: fastRetry})
			if !errors.Is(err, reconciler.ErrNoPayload) {
				t.Fatalf("err = %v, want ErrNoPayload", err)
			}
		})
		t.Run("transactional route", func(t *testing.T) {
			c := flaggedClaim(t, tdb, "tx")
			txRouter, err := sideeffects.NewRouter(sideeffects.Route{Name: "ledger", Match: sideeffects.Match{Subject: "payment"},
				TxEffect: sideeffects.TxEffectFunc(func(context.Context, *sql.Tx, *azservicebus.ReceivedMessage, string) error { return nil })})
			if err != nil {
				t.Fatal(err)
			}
			_, err = reconciler.Redrive(ctx, tdb.store, &reconciler.RedriveParams{ID: c.ID, By: "a", Routes: reconciler.Routes{"": txRouter}, Retry: fastRetry})
			if !errors.Is(err, reconciler.ErrNotRedrivable) {
				t.Fatalf("err = %v, want ErrNotRedrivable", err)
			}
			if got := mustGet(t, tdb.store, c.ID); got.State != claim.StateFlagged {
				t.Errorf("claim is %s, want still flagged", got.State)
			}
		})
		t.Run("effect fails", func(t *testing.T) {
			c := flaggedClaim(t, tdb, "fails")
			fake.FailKey(c.MessageID, 0, fakedownstream.FaultErrorBefore)
			_, err := reconciler.Redrive(ctx, tdb.store, &reconciler.RedriveParams{ID: c.ID, By: "a", Routes: reconciler.Routes{"": router}, Retry: fastRetry})
			var ee *reconciler.EffectError
			if !errors.As(err, &ee) || ee.Attempts != 2 || ee.Outcome == sideeffects.OutcomeOK {
				t.Fatalf("err = %v, want an EffectError after 2 attempts", err)
			}
			if got := mustGet(t, tdb.store, c.ID); got.State != claim.StateFlagged || got.ResolvedAt != nil {
				t.Errorf("claim is %s, want still flagged", got.State)
			}
			if e := fake.Effects(c.MessageID); e != 0 {
				t.Errorf("downstream performed %d effects, want 0", e)
			}
		})
	})
}

func TestMessageFromClaim(t *testing.T) {
	c := &claim.Claim{MessageID: "m-1", Payload: []byte("body"), Subject: "payment", ContentType: "application/json",
		Properties: map[string]string{"tenant": "t1"}}
	msg := reconciler.MessageFromClaim(c)
	if msg.MessageID != "m-1" || string(msg.Body) != "body" || msg.Subject == nil || *msg.Subject != "payment" ||
		msg.ContentType == nil || *msg.ContentType != "application/json" || msg.ApplicationProperties["tenant"] != "t1" {
		t.Fatalf("message = %+v", msg)
	}
	*msg.Subject = "changed"
	if c.Subject != "payment" {
		t.Fatal("the message aliases the claim's fields")
	}
	if m := reconciler.MessageFromClaim(&claim.Claim{MessageID: "m-2"}); m.Subject != nil || m.ContentType != nil || m.ApplicationProperties != nil {
		t.Fatalf("empty fields should stay nil: %+v", m)
	}
}

// TestRedriveOfAManualRouteStopsAtAnUnknownOutcome: the downstream of a
// `recovery: manual` route does not honour the idempotency key, so a
// redrive whose request was performed but answered 500 must not send it
// again, whatever retry policy its caller (the console: a zero policy; the
// CLI: none) passes: exactly one request, the claim flagged again.
func TestRedriveOfAManualRouteStopsAtAnUnknownOutcome(t *testing.T) {
	eachDB(t, func(t *testing.T, tdb *testDB) {
		ctx := context.Background()
		fake, router := routesFile(t, `version: 1
routes:
  - {name: mail, match: {subject: payment}, recovery: manual, url: "%s/mail", timeout: 5s}
`)
		for _, retry := range []struct {
			name   string
			policy sideeffects.RetryPolicy
		}{
			{"caller's policy", sideeffects.RetryPolicy{MaxAttempts: 5, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond}},
			{"zero policy", sideeffects.RetryPolicy{InitialInterval: time.Millisecond, MaxInterval: time.Millisecond}},
		} {
			t.Run(retry.name, func(t *testing.T) {
				c := flaggedClaim(t, tdb, "manual-"+strings.ReplaceAll(retry.name, " ", "-"))
				// Every request is performed, then answered 500: unknown.
				fake.FailKey(c.MessageID, 0, fakedownstream.FaultErrorAfter)
				_, err := reconciler.Redrive(ctx, tdb.store, &reconciler.RedriveParams{ID: c.ID, By: "alice",
					Routes: reconciler.Routes{"": router}, Retry: retry.policy, Logger: testLogger(t)})
				var ee *reconciler.EffectError
				if !errors.As(err, &ee) || ee.Outcome != sideeffects.OutcomeUnknown {
					t.Fatalf("err = %v, want an EffectError with outcome unknown", err)
				}
				if r := fake.Requests(c.MessageID); r != 1 || ee.Attempts != 1 {
					t.Errorf("downstream got %d request(s) (%d attempt(s)) for key %s, want exactly 1: a manual route's unknown outcome is never repeated", r, ee.Attempts, c.MessageID)
				}
				if got := mustGet(t, tdb.store, c.ID); got.State != claim.StateFlagged || !ee.Reflagged {
					t.Errorf("claim is %s (reflagged %v), want flagged again", got.State, ee.Reflagged)
				}
			})
		}
	})
}
