package sbclaimtest_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/sbclaimtest"
)

type order struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

func router(t *testing.T, h sbclaim.HandlerFunc) *sbclaim.Router {
	t.Helper()
	r, err := sbclaim.NewRouter(sbclaim.Route{Name: "charge", Handler: h})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestWorkReportsEachOutcome: one delivery through the real protocol,
// and what became of it.
func TestWorkReportsEachOutcome(t *testing.T) {
	start := time.Now()
	st := sbclaimtest.NewStore(t)
	var calls atomic.Int32
	ok := router(t, sbclaim.JSON(func(_ context.Context, d *sbclaim.Delivery, o order) error {
		calls.Add(1)
		if o.Amount <= 0 {
			return sbclaim.Rejected(errors.New("no amount"))
		}
		return nil
	}))
	cfg := sbclaim.ProcessorConfig{Consumer: "billing", Store: st, Router: ok}

	res := sbclaimtest.Work(t, cfg, sbclaimtest.Message(t, "o-1", "", order{ID: "o-1", Amount: 5}))
	if res.Settlement != sbclaimtest.Completed || res.Outcome != sbclaim.OutcomeOK || res.Calls != 1 || res.Err != nil {
		t.Fatalf("ok: %+v", res)
	}
	if res.Claim == nil || res.Claim.State != sbclaim.StateProcessed || res.Claim.DedupKey != "o-1" || len(res.History) == 0 {
		t.Fatalf("ok: claim %+v, history %+v", res.Claim, res.History)
	}

	// The same message again, on the same store: a duplicate.
	res = sbclaimtest.Work(t, cfg, sbclaimtest.Message(t, "o-1", "", order{ID: "o-1", Amount: 5}))
	if res.Settlement != sbclaimtest.Completed || res.Calls != 0 || res.Outcome != "" || res.Claim == nil || res.Claim.State != sbclaim.StateProcessed {
		t.Fatalf("duplicate: %+v", res)
	}
	if calls.Load() != 1 {
		t.Fatalf("the handler ran %d times, want 1", calls.Load())
	}

	res = sbclaimtest.Work(t, cfg, sbclaimtest.Message(t, "o-2", "", order{ID: "o-2"}))
	if res.Settlement != sbclaimtest.DeadLettered || res.DeadLetterReason != "EffectRejected" || res.Outcome != sbclaim.OutcomeRejected ||
		res.Claim == nil || res.Claim.State != sbclaim.StateFailed {
		t.Fatalf("rejected: %+v, claim %+v", res, res.Claim)
	}

	res = sbclaimtest.Work(t, cfg, sbclaimtest.Message(t, "o-3", "", `{"id":`))
	if res.Settlement != sbclaimtest.DeadLettered || res.Outcome != sbclaim.OutcomePermanent || !strings.Contains(res.DeadLetterDescription, "does not decode") {
		t.Fatalf("bad body: %+v", res)
	}

	// Not performed: deferred for a delayed retry, which Work does not
	// wait for.
	busy := router(t, func(context.Context, *sbclaim.Delivery) error {
		return sbclaim.NotPerformedAfter(errors.New("HTTP 503"), time.Hour)
	})
	res = sbclaimtest.Work(t, sbclaim.ProcessorConfig{Router: busy}, sbclaimtest.Message(t, "o-4", "", "{}"))
	if res.Settlement != sbclaimtest.Deferred || res.Outcome != sbclaim.OutcomeRetryable || res.Calls != 1 ||
		res.Claim == nil || res.Claim.DueAt == nil || time.Until(*res.Claim.DueAt) < 59*time.Minute {
		t.Fatalf("not performed: %+v, claim %+v", res, res.Claim)
	}

	// A panic is unknown; the in-delivery retries repeat it.
	var n atomic.Int32
	panicky := router(t, func(context.Context, *sbclaim.Delivery) error {
		if n.Add(1) == 1 {
			panic("boom")
		}
		return nil
	})
	res = sbclaimtest.Work(t, sbclaim.ProcessorConfig{Router: panicky}, sbclaimtest.Message(t, "o-5", "", "{}"))
	if res.Settlement != sbclaimtest.Completed || res.Calls != 2 || res.Outcome != sbclaim.OutcomeOK || res.Claim.Attempts != 1 ||
		!strings.Contains(res.Claim.LastError, "panicked") {
		t.Fatalf("panic: %+v, claim %+v", res, res.Claim)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("five Work calls took %s", d) // each is well under a second unloaded
	}
}

// TestSendAndWaitWithFastDelays: a handler that is not performed on its
// whole first delivery (five attempts) succeeds on the delayed retry,
// which the kit's defaults make come at once; ClaimByKey finds it.
func TestSendAndWaitWithFastDelays(t *testing.T) {
	st := sbclaimtest.NewStore(t)
	var n atomic.Int32
	r := router(t, func(context.Context, *sbclaim.Delivery) error {
		if n.Add(1) <= 5 {
			return sbclaim.NotPerformed(errors.New("HTTP 503"))
		}
		return nil
	})
	q := sbclaimtest.NewQueue(nil)
	sbclaimtest.Start(t, sbclaim.ProcessorConfig{Store: st, Router: r}, q)
	start := time.Now()
	q.SendAndWait(t, sbclaimtest.Message(t, "o-1", "charge", map[string]int{"amount": 5}))
	took := time.Since(start)
	c := sbclaimtest.ClaimByKey(t, st, "o-1")
	if c == nil || c.State != sbclaim.StateProcessed || c.Postponements != 1 || n.Load() != 6 {
		t.Fatalf("claim %+v after %d calls; want processed after one postponement and 6 calls", c, n.Load())
	}
	if sbclaimtest.ClaimByKey(t, st, "o-2") != nil {
		t.Fatal("a claim for a key never sent")
	}
	if took > 5*time.Second {
		t.Errorf("the delayed retry took %s: the kit's backoff and poll are not short", took) // production: 10s + 5s poll
	}
}

// TestMessageBuilder: raw bodies as they are, values as JSON.
func TestMessageBuilder(t *testing.T) {
	m := sbclaimtest.Message(t, "m-1", "charge", order{ID: "x", Amount: 2})
	if string(m.Body) != `{"id":"x","amount":2}` || *m.MessageID != "m-1" || *m.Subject != "charge" || *m.ContentType != "application/json" {
		t.Fatalf("%+v", m)
	}
	m = sbclaimtest.Message(t, "m-2", "", "not json")
	if string(m.Body) != "not json" || m.Subject != nil || m.ContentType != nil {
		t.Fatalf("%+v", m)
	}
}
