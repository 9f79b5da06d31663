package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim"
	ops "github.com/sbclaim/sbclaim/operator"
	"github.com/sbclaim/sbclaim/sbclaimtest"
)

// TestRedriveHandOffOfUserCode: a claim whose route is a Go handler in the
// user's own binary cannot be redriven by the CLI, which has only the
// routes file: the refusal says to hand it off, `redrive --handoff`
// releases it (note required, audited, once), and the reconciler passes
// running in the user's binary re-run it with the claim's own key.
func TestRedriveHandOffOfUserCode(t *testing.T) {
	eachDatabase(t, func(t *testing.T, url string) {
		routes := filepath.Join(t.TempDir(), "routes.yaml")
		writeFile(t, routes, "version: 1\nroutes:\n  - name: payments\n    match: {subject: payment}\n    url: http://127.0.0.1:1/payments\n    body: json\n")
		c := newCLI(t, map[string]string{"SBCLAIM_DATABASE_URL": url, "SBCLAIM_ROUTES": routes})
		c.mustRun("migrate")

		// The user's binary: a processor and the reconciler passes with a
		// Go handler on a manual route, whose first attempt ends unknown.
		ctx := context.Background()
		st, err := sbclaim.OpenStore(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		var (
			mu   sync.Mutex
			keys []string
		)
		router, err := sbclaim.NewRouter(sbclaim.Route{Name: "refund", Match: sbclaim.MatchSubject("refund"), Recovery: sbclaim.RecoveryManual,
			Handler: func(ctx context.Context, d *sbclaim.Delivery) error {
				mu.Lock()
				defer mu.Unlock()
				keys = append(keys, d.IdempotencyKey())
				if len(keys) == 1 {
					return errors.New("read timeout: the refund may have happened")
				}
				return nil
			}})
		if err != nil {
			t.Fatal(err)
		}
		q := sbclaimtest.NewQueue(&sbclaimtest.QueueOptions{LockDuration: 300 * time.Millisecond})
		sbclaimtest.Start(t, sbclaim.ProcessorConfig{Consumer: "refunds", Store: st, Router: router}, q)
		id, subject := "refund-7", "refund"
		if err := q.Send(ctx, &azservicebus.Message{MessageID: &id, Subject: &subject, Body: []byte(`{"amount":7}`)}); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		if err := q.WaitIdle(wctx); err != nil {
			t.Fatal(err)
		}
		rec, err := ops.NewReconciler(ops.ReconcilerConfig{Store: st, Routers: map[string]*sbclaim.Router{"refunds": router},
			HeartbeatInterval: 100 * time.Millisecond, StaleAfter: 300 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		tick := func(want func(ops.TickResult) bool) {
			t.Helper()
			deadline := time.Now().Add(30 * time.Second)
			for {
				res, err := rec.RunOnce(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if want(res) {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("the reconciler never did it; last tick %+v", res)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
		tick(func(r ops.TickResult) bool { return r.Flagged == 1 })
		cs, err := st.Claims(ctx, sbclaim.ClaimFilter{States: []sbclaim.ClaimState{sbclaim.StateFlagged}, Route: "refund"})
		if err != nil || len(cs) != 1 {
			t.Fatalf("flagged refund claims: %v, %v", cs, err)
		}
		cl := cs[0]
		cid := strconv.FormatInt(cl.ID, 10)

		// The CLI does not have the handler: its redrive is refused, and
		// says what to do instead.
		r := c.run("redrive", cid)
		if r.code != exitFailure || !strings.Contains(r.stderr, "refused") || !strings.Contains(r.stderr, "nothing was changed") ||
			!strings.Contains(r.stderr, `route "refund" is not in the routes file`) || !strings.Contains(r.stderr, "reconciler redrive "+cid+" --handoff --note") {
			t.Errorf("redrive of a user-code claim: %d %q, want a refusal offering the hand-off", r.code, r.stderr)
		}
		if r := c.run("redrive", cid, "--handoff"); r.code != exitUsage || !strings.Contains(r.stderr, "--handoff needs --note") {
			t.Errorf("--handoff without a note: %d %q", r.code, r.stderr)
		}
		if r := c.run("redrive", cid, "--handoff", "--new-key", "--note", "x"); r.code != exitUsage {
			t.Errorf("--handoff with --new-key: %d, want a usage error", r.code)
		}
		if got, _ := st.Claim(ctx, cl.ID); got.State != sbclaim.StateFlagged {
			t.Fatalf("refused actions changed the claim: %+v", got)
		}

		// The hand-off needs no routes file.
		delete(c.env, "SBCLAIM_ROUTES")
		r = c.mustRun("redrive", cid, "--handoff", "--by", "alice", "--note", "checked the PSP: no refund")
		if want := fmt.Sprintf("claim %d handed off by alice", cl.ID); !strings.Contains(r.stdout, want) || !strings.Contains(r.stdout, "refund-7") {
			t.Errorf("hand-off said %q, want %q and the key", r.stdout, want)
		}
		got, err := st.Claim(ctx, cl.ID)
		if err != nil || got.State != sbclaim.StateReleased || got.TakeOverPath != sbclaim.TakeOverOperator ||
			!strings.Contains(got.TakeOverReason, "alice") || !strings.Contains(got.TakeOverReason, "checked the PSP: no refund") {
			t.Fatalf("after the hand-off: %+v (%v), want released by the operator, audited", got, err)
		}
		r = c.mustRun("show", cid)
		for _, want := range []string{"released", "via operator", "redrive handed off by alice: checked the PSP: no refund"} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("show after the hand-off lacks %q", want)
			}
		}
		if r := c.run("redrive", cid, "--handoff", "--by", "bob", "--note", "me too"); r.code != exitFailure || !strings.Contains(r.stderr, "refused") {
			t.Errorf("second hand-off: %d %q, want refused", r.code, r.stderr)
		}

		// The user's binary re-runs it, once, with the claim's key.
		tick(func(r ops.TickResult) bool { return r.Recovered == 1 })
		mu.Lock()
		defer mu.Unlock()
		if len(keys) != 2 || keys[0] != keys[1] || keys[0] != "refunds/refund-7" {
			t.Errorf("handler keys %q: want the original attempt and one re-run, both with the scoped key refunds/refund-7", keys)
		}
		if got, _ := st.Claim(ctx, cl.ID); got.State != sbclaim.StateProcessed {
			t.Errorf("claim %+v, want processed by the user's binary", got)
		}
	})
}
