package operator_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/operator"
	"github.com/sbclaim/sbclaim/sbclaimtest"
)

// payments is a downstream that answers 401 while misconfigured (the API
// key lacked "Bearer ": refused before its idempotency layer, so nothing
// is stored under the key), and performs each key once when fixed.
type payments struct {
	broken atomic.Bool
	mu     sync.Mutex
	done   map[string]int // effects by idempotency key
	calls  int
}

func (p *payments) handler(ctx context.Context, d *sbclaim.Delivery) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if p.broken.Load() {
		d.ReportAnswer(ctx, http.StatusUnauthorized, nil, nil)
		return sbclaim.Permanent(errors.New("HTTP 401: invalid API key"))
	}
	if p.done[d.IdempotencyKey()] == 0 {
		p.done[d.IdempotencyKey()]++
	}
	return nil
}

func (p *payments) effects() (total int, keys int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, n := range p.done {
		total += n
	}
	return total, len(p.done)
}

// TestRetryAfterAMisconfiguration is the operator's recovery end to end:
// a downstream answers 401 for a while, every claim fails and its message
// is dead-lettered; re-submitting the dead letters then runs nothing.
// After the fix, a bulk retry performs each effect exactly once, and
// re-submitting the dead letters afterwards completes them as duplicates.
func TestRetryAfterAMisconfiguration(t *testing.T) {
	st := sbclaimtest.NewStore(t)
	ctx := context.Background()
	down := &payments{done: map[string]int{}}
	down.broken.Store(true)
	router, err := sbclaim.NewRouter(sbclaim.Route{Name: "charge", Match: sbclaim.MatchSubject("charge"), Handler: down.handler})
	if err != nil {
		t.Fatal(err)
	}
	q := sbclaimtest.NewQueue(nil)
	sbclaimtest.Start(t, sbclaim.ProcessorConfig{Consumer: "billing", Entity: "payments", Store: st, Router: router}, q)
	const n = 20
	var msgs []*azservicebus.Message
	for i := range n {
		msgs = append(msgs, message(fmt.Sprintf("pay-%02d", i), "charge", fmt.Sprintf(`{"amount":%d}`, i)))
	}
	send(t, q, msgs...)
	waitIdle(t, q)
	failed, err := st.Claims(ctx, sbclaim.ClaimFilter{States: []sbclaim.ClaimState{sbclaim.StateFailed}})
	if err != nil || len(failed) != n {
		t.Fatalf("failed claims: %d, %v; want %d", len(failed), err, n)
	}
	if dl := q.DeadLetters(); len(dl) != n {
		t.Fatalf("%d dead letters, want %d", len(dl), n)
	}
	resubmit := func() {
		t.Helper()
		var copies []*azservicebus.Message
		for _, d := range q.DeadLetters()[:n] {
			copies = append(copies, &azservicebus.Message{MessageID: &d.MessageID, Subject: d.Subject, Body: d.Body})
		}
		send(t, q, copies...)
		waitIdle(t, q)
	}

	// The operator fixes the key and re-submits the dead letters without
	// the retry action: each copy completes as a duplicate of a failed
	// claim, nothing runs.
	down.broken.Store(false)
	callsBefore := down.calls
	resubmit()
	if total, _ := down.effects(); total != 0 || down.calls != callsBefore {
		t.Fatalf("re-submitting without the retry ran the handler %d times (%d effects)", down.calls-callsBefore, total)
	}
	if still, _ := st.Claims(ctx, sbclaim.ClaimFilter{States: []sbclaim.ClaimState{sbclaim.StateFailed}}); len(still) != n {
		t.Fatalf("%d claims still failed, want %d", len(still), n)
	}

	// The bulk retry, concurrently by two operators: each claim runs once.
	routers := map[string]*sbclaim.Router{"billing": router}
	var wg sync.WaitGroup
	var refused atomic.Int64
	for _, by := range []string{"alice", "bob"} {
		wg.Go(func() {
			for _, c := range failed {
				_, err := operator.Retry(ctx, st, c.ID, operator.RetryOptions{By: by, Note: "API key fixed: Bearer prefix", Routers: routers})
				var ae *operator.ActionError
				switch {
				case err == nil:
				case errors.As(err, &ae) && ae.Kind == operator.ActionRefused && (errors.Is(err, operator.ErrNotFailed) || errors.Is(err, operator.ErrStateChanged)):
					refused.Add(1)
				default:
					t.Errorf("retry of claim %d by %s: %v", c.ID, by, err)
				}
			}
		})
	}
	wg.Wait()
	if total, keys := down.effects(); total != n || keys != n || refused.Load() != n {
		t.Fatalf("after the bulk retry: %d effects on %d keys, %d retries refused; want %d, %d, %d", total, keys, refused.Load(), n, n, n)
	}
	for _, c := range failed {
		got, err := st.Claim(ctx, c.ID)
		if err != nil || got.State != sbclaim.StateResolved || got.Resolution != sbclaim.ResolutionRedriven || got.FailedAt == nil {
			t.Fatalf("claim %d after the retry: %+v, %v", c.ID, got, err)
		}
		h, err := operator.History(ctx, st, c.ID)
		if err != nil {
			t.Fatal(err)
		}
		var retried int
		for _, e := range h {
			if e.What == "retried" {
				retried++
			}
		}
		if retried != 1 {
			t.Fatalf("claim %d has %d retried rows in its history, want 1: %+v", c.ID, retried, h)
		}
	}

	// The dead letters re-submitted after the retry: duplicates.
	resubmit()
	if total, _ := down.effects(); total != n {
		t.Fatalf("re-submitting after the retry: %d effects, want %d", total, n)
	}
}

// TestRetryWithoutRoutersRunsOnTheResubmittedDeadLetter: a retry without
// the handler (the console, for a Go handler) hands the claim off: it is
// released, and the re-submitted dead letter runs it, once; a second copy
// completes as a duplicate.
func TestRetryWithoutRoutersRunsOnTheResubmittedDeadLetter(t *testing.T) {
	st := sbclaimtest.NewStore(t)
	ctx := context.Background()
	down := &payments{done: map[string]int{}}
	down.broken.Store(true)
	router, err := sbclaim.NewRouter(sbclaim.Route{Name: "charge", Match: sbclaim.MatchSubject("charge"), Handler: down.handler})
	if err != nil {
		t.Fatal(err)
	}
	q := sbclaimtest.NewQueue(nil)
	sbclaimtest.Start(t, sbclaim.ProcessorConfig{Consumer: "billing", Entity: "payments", Store: st, Router: router}, q)
	send(t, q, message("pay-1", "charge", `{"amount":1}`))
	waitIdle(t, q)
	c := onlyClaim(t, st)
	if c.State != sbclaim.StateFailed {
		t.Fatalf("claim %s, want failed", c.State)
	}
	down.broken.Store(false)
	// The console lacks the Go handler: the retry hands the claim off.
	got, err := operator.Retry(ctx, st, c.ID, operator.RetryOptions{By: "alice", Note: "API key fixed"})
	if err != nil || got.State != sbclaim.StateReleased {
		t.Fatalf("hand-off retry: %+v, %v", got, err)
	}
	dl := q.DeadLetters()[0]
	send(t, q, &azservicebus.Message{MessageID: &dl.MessageID, Subject: dl.Subject, Body: dl.Body})
	waitIdle(t, q)
	send(t, q, &azservicebus.Message{MessageID: &dl.MessageID, Subject: dl.Subject, Body: dl.Body})
	waitIdle(t, q)
	if total, _ := down.effects(); total != 1 {
		t.Fatalf("%d effects, want 1", total)
	}
	if now, _ := st.Claim(ctx, c.ID); now.State != sbclaim.StateProcessed {
		t.Fatalf("claim %s, want processed", now.State)
	}
}
