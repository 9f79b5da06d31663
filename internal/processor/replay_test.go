package processor_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/metricreg"
	"github.com/sbclaim/sbclaim/internal/processor"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/sideeffects/routesfile"
	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
	"github.com/sbclaim/sbclaim/internal/testkit/membus"
)

// TestReplayedStoredFailureIsFlaggedAtOnce: Stripe stores a 500 under the
// key and replays it, with Idempotent-Replayed: true, to every repeat. A
// route whose answer rule says so (outcome flag) sends ONE request for the
// delivery and flags its claim at once, with the answer, instead of
// retrying it until the broker gives up; the message is completed, and a
// later copy of the key completes as a duplicate without a request.
func TestReplayedStoredFailureIsFlaggedAtOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b := setup(t, be, membus.QueueOptions{})
		fake := fakedownstream.New(fakedownstream.Options{ConflictStyle: fakedownstream.ConflictStripe})
		srv := httptest.NewServer(fake)
		t.Cleanup(srv.Close)
		router, err := routesfile.Parse([]byte(`version: 1
routes:
  - name: payments
    match: {subject: "*"}
    url: "`+srv.URL+`/v1/charges"
    answers:
      - {status: 402, outcome: rejected}
      - {status: 5xx, header: Idempotent-Replayed, value: "true", outcome: flag}
    record:
      headers: [Idempotent-Replayed]
`), func(string) string { return "" }, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		// The key's first request failed inside the API, which stored the
		// 500 under the key (an earlier attempt whose answer was lost).
		const key = "billing/pay-1" // the claim's key: scoped to the consumer
		fake.SetKeyReply(key, fakedownstream.ReplyCachedFailure)
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(`{"amount":1000}`))
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusInternalServerError || fake.CachedFailures(key) != 1 {
			t.Fatalf("seeding the stored failure: %d, %d stored", resp.StatusCode, fake.CachedFailures(key))
		}

		opts := b.options()
		opts.Router, opts.Metrics = router, metricreg.ProcessorMetrics(nil)
		opts.Retry = sideeffects.RetryPolicy{MaxAttempts: 5, InitialInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond}
		b.start(opts)
		b.send("pay-1", "payment", `{"amount":1000}`, nil)
		b.waitIdle()

		if got := fake.Requests(key) - 1; got != 1 {
			t.Errorf("the delivery sent %d requests, want 1 (the replay is final for the key)", got)
		}
		c := b.claimOf("pay-1")
		if c.State != claim.StateFlagged || !strings.Contains(c.FlagReason, "needs an operator") ||
			!strings.Contains(c.FlagReason, "HTTP 500 (answers[1])") || !strings.Contains(c.FlagReason, "a person must decide") {
			t.Errorf("claim %s, flag reason %q; want flagged at once, naming the rule", c.State, c.FlagReason)
		}
		if c.Answer == nil || c.Answer.Status != 500 || c.Answer.Headers["Idempotent-Replayed"] != "true" || c.Attempts != 1 || c.TakeOvers != 0 {
			t.Errorf("answer %+v, attempts %d, take-overs %d; want the replayed 500 recorded by its one attempt", c.Answer, c.Attempts, c.TakeOvers)
		}
		if countCompleted(b.q, "pay-1") != 1 || len(b.q.DeadLetters()) != 0 {
			t.Errorf("completed %d, dead letters %d; want the message completed", countCompleted(b.q, "pay-1"), len(b.q.DeadLetters()))
		}
		// A later copy completes against the flagged claim.
		b.send("pay-1", "payment", `{"amount":1000}`, nil)
		b.waitIdle()
		if got := fake.Requests(key) - 1; got != 1 {
			t.Errorf("after a second copy: %d requests, want still 1", got)
		}
		b.eventually("one flagged and one duplicate outcome", func() bool {
			return outcomes(opts.Metrics, processor.ResultFlagged) == 1 && outcomes(opts.Metrics, processor.ResultDuplicate) == 1
		})
	})
}

// TestNeedsOperatorFromAGoEffect: an effect's own NeedsOperator error
// ends the retries and flags the claim at once.
func TestNeedsOperatorFromAGoEffect(t *testing.T) {
	b := setup(t, "sqlite", membus.QueueOptions{})
	b.eff.behave = func(_, _ string, _ int) error {
		return sideeffects.NeedsOperator(sideeffects.Unknown(errReplayed))
	}
	opts := b.options()
	opts.Retry = sideeffects.RetryPolicy{MaxAttempts: 5, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond}
	b.start(opts)
	b.send("m1", "pay", `{}`, nil)
	b.waitIdle()
	c := b.claimOf("m1")
	if b.eff.Calls("m1") != 1 || c.State != claim.StateFlagged || !strings.Contains(c.FlagReason, "needs an operator") || !strings.Contains(c.LastError, errReplayed.Error()) {
		t.Errorf("calls %d, claim %s (%q, last error %q); want one call and the claim flagged", b.eff.Calls("m1"), c.State, c.FlagReason, c.LastError)
	}
}

var errReplayed = errString("HTTP 500 replayed")

type errString string

func (e errString) Error() string { return string(e) }

// clockAhead is a store whose clock (Now) reads shift ahead of the
// database's: the claims look shift older to whoever judges a key's age.
type clockAhead struct {
	claim.Store
	shift atomic.Int64
}

func (s *clockAhead) Now(ctx context.Context) (time.Time, error) {
	now, err := s.Store.Now(ctx)
	return now.Add(time.Duration(s.shift.Load())), err
}

// lifetimeRouter gives the test router's routes a key lifetime.
type lifetimeRouter struct {
	*router
	lifetime time.Duration
}

func (r lifetimeRouter) Route(msg *azservicebus.ReceivedMessage) (sideeffects.Handler, error) {
	h, err := r.router.Route(msg)
	h.KeyLifetime = r.lifetime
	return h, err
}

// TestKeyLifetimeFlagsTheTakeOver: on a route whose downstream keeps keys
// for 24h, a redelivery does not take over a claim older than that (its
// holder silent with an unknown outcome, or released): it flags it, with
// a reason naming the lifetime, and repeats nothing. A younger claim is
// taken over as usual. Without a stored payload the flagged claim has
// only its message to keep the body: the redelivery is dead-lettered
// ClaimFlagged instead of completed.
func TestKeyLifetimeFlagsTheTakeOver(t *testing.T) {
	for _, tt := range []struct {
		name      string
		first     error // the first attempt's outcome
		age       time.Duration
		noPayload bool
	}{
		{"silent holder, 25h", errPerformedThenLost, 25 * time.Hour, false},
		{"released, 25h", sideeffects.Retryable(errString("503")), 25 * time.Hour, false},
		{"silent holder, 23h", errPerformedThenLost, 23 * time.Hour, false},
		{"silent holder, 25h, no payload", errPerformedThenLost, 25 * time.Hour, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			forEachBackend(t, func(t *testing.T, be string) {
				b := setup(t, be, membus.QueueOptions{})
				b.eff.behave = func(_, _ string, call int) error {
					if call == 1 {
						return tt.first
					}
					return nil
				}
				st := &clockAhead{Store: b.store}
				st.shift.Store(int64(tt.age))
				opts := b.options()
				opts.Store, opts.Router, opts.Metrics = st, lifetimeRouter{router: b.router, lifetime: 24 * time.Hour}, metricreg.ProcessorMetrics(nil)
				opts.StorePayload = !tt.noPayload
				b.start(opts)
				b.send("m1", "pay", `{}`, nil)
				b.waitIdle()
				c := b.claimOf("m1")
				if tt.age < 24*time.Hour {
					if c.State != claim.StateProcessed || b.eff.Calls("m1") != 2 || c.TakeOvers != 1 {
						t.Errorf("claim %s, calls %d, take-overs %d; want taken over and processed", c.State, b.eff.Calls("m1"), c.TakeOvers)
					}
					return
				}
				want := "the downstream keeps keys for 24h; this claim is 25h old: a repeat would not be deduplicated"
				if c.State != claim.StateFlagged || c.FlagReason != want || b.eff.Calls("m1") != 1 || c.TakeOvers != 0 {
					t.Errorf("claim %s (%q), calls %d, take-overs %d; want flagged (%q), never repeated", c.State, c.FlagReason, b.eff.Calls("m1"), c.TakeOvers, want)
				}
				switch {
				case tt.noPayload:
					if got := b.deadLetterReasons()["m1"]; got != processor.ReasonClaimFlagged || countCompleted(b.q, "m1") != 0 {
						t.Errorf("dead-letter reason %q, completed %d; want the redelivery dead-lettered %s (the claim keeps no body)",
							got, countCompleted(b.q, "m1"), processor.ReasonClaimFlagged)
					}
				case countCompleted(b.q, "m1") != 1 || len(b.q.DeadLetters()) != 0:
					t.Errorf("completed %d, dead letters %d; want the redelivery completed", countCompleted(b.q, "m1"), len(b.q.DeadLetters()))
				}
				b.eventually("the flagged outcome", func() bool { return outcomes(opts.Metrics, processor.ResultFlagged) == 1 })
			})
		})
	}
}
