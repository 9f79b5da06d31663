package reconciler_test

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/reconciler"
)

// TestTickSpans: a tick that recovers a stale claim makes a reconcile
// span, its recover and purge passes, a recover-claim span for the claim
// (take-over path reconciler) and the effect attempt under it, with the
// HTTP request under the attempt.
func TestTickSpans(t *testing.T) {
	tdb := openSQLite(t)
	ctx := context.Background()
	_, router := routesFile(t, paymentRoutes)
	cs := claimN(t, tdb.store, "span", 1, nil)
	if err := tdb.store.Release(ctx, &claim.ReleaseParams{ID: cs[0].ID, Owner: cs[0].Owner, Error: "503"}); err != nil {
		t.Fatal(err)
	}
	tdb.backdateHeartbeat(t, time.Hour, cs[0].ID)
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	rec := newRec(t, tdb.store, reconciler.Config{StaleAfter: time.Minute, HeartbeatInterval: 50 * time.Millisecond,
		Routes: reconciler.Routes{"billing": router}, TracerProvider: tp})
	res, err := rec.RunOnce(ctx)
	if err != nil || res.Recovered != 1 {
		t.Fatalf("RunOnce = %+v, %v; want 1 recovered", res, err)
	}

	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range sr.Ended() {
		byName[s.Name()] = s
	}
	parentOf := map[string]string{"recover pass": "reconcile", "purge pass": "reconcile", "recover claim": "recover pass",
		"effect attempt": "recover claim", "POST": "effect attempt"}
	for child, parent := range parentOf {
		c, p := byName[child], byName[parent]
		if c == nil || p == nil {
			t.Fatalf("no %q or %q span; got %v", child, parent, byName)
		}
		if c.Parent().SpanID() != p.SpanContext().SpanID() {
			t.Errorf("%q's parent is %s, want %q (%s)", child, c.Parent().SpanID(), parent, p.SpanContext().SpanID())
		}
	}
	attrs := map[string]string{}
	for _, kv := range byName["recover claim"].Attributes() {
		attrs[string(kv.Key)] = kv.Value.String()
	}
	if attrs["sbclaim.takeover.path"] != "reconciler" || attrs["sbclaim.outcome"] != "recovered" || attrs["sbclaim.claim.id"] == "" {
		t.Errorf("recover claim attributes %v", attrs)
	}
}
