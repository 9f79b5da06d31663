package docs_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/operator"
	"github.com/sbclaim/sbclaim/sbclaimtest"
	_ "github.com/sbclaim/sbclaim/store/sqlite"
)

// The README's "Use it as a library" shows these: runBinary and
// TestChargeSurvivesACrash (region handler-test).

// runBinary wires sbclaim into a program of its own: the claims store, a
// router with the program's handler, a processor on a queue and a
// reconciler with the same router, until ctx ends.
func runBinary(ctx context.Context, dbURL, connStr string, charge sbclaim.HandlerFunc, logger *slog.Logger) error {
	if err := sbclaim.Migrate(ctx, dbURL); err != nil { // or `reconciler migrate` once
		return err
	}
	store, err := sbclaim.OpenStore(ctx, dbURL) // sqlserver://, postgres:// or sqlite:
	if err != nil {
		return err
	}
	defer store.Close()
	router, err := sbclaim.NewRouter( // a routes file too: router.AddRoutesFile(f)
		sbclaim.Route{Name: "charge", Match: sbclaim.MatchSubject("payment.requested"), Handler: charge},
	)
	if err != nil {
		return err
	}
	client, err := azservicebus.NewClientFromConnectionString(connStr, nil)
	if err != nil {
		return err
	}
	defer client.Close(context.WithoutCancel(ctx))
	processor, err := sbclaim.NewProcessor(sbclaim.ProcessorConfig{
		Consumer: "billing", Entity: "payments", Store: store, Router: router, Logger: logger,
		NewReceiver: func(context.Context) (sbclaim.Receiver, error) {
			return client.NewReceiverForQueue("payments", nil)
		},
	})
	if err != nil {
		return err
	}
	reconciler, err := operator.NewReconciler(operator.ReconcilerConfig{
		Store: store, Routers: map[string]*sbclaim.Router{"billing": router}, Logger: logger,
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reconciled := make(chan error, 1)
	go func() { reconciled <- reconciler.Run(ctx) }() // recovery with your handlers, flags, purge
	err = processor.Run(ctx)                          // until ctx ends (SIGTERM), then drains in-flight effects
	cancel()
	return errors.Join(err, <-reconciled)
}

// TestRunBinary runs the README's wiring against a SQLite file and a
// Service Bus namespace that does not exist (a .invalid host never
// resolves, so no broker of a developer's, the emulator included, can be
// reached), for a moment: it migrates the store, builds the router, the
// processor and the reconciler, runs them and stops cleanly when its
// context ends.
func TestRunBinary(t *testing.T) {
	dbURL := "sqlite:" + filepath.Join(t.TempDir(), "claims.db")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	const nothingAnswers = "Endpoint=sb://sbclaim-docs-test.invalid/;SharedAccessKeyName=test;SharedAccessKey=bm90LWEta2V5"
	start := time.Now()
	err := runBinary(ctx, dbURL, nothingAnswers, func(context.Context, *sbclaim.Delivery) error { return nil }, slog.New(slog.DiscardHandler))
	if err != nil && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		t.Fatalf("runBinary: %v", err)
	}
	switch took := time.Since(start); {
	case took < time.Second:
		t.Errorf("runBinary returned after %s, before its context ended: it did not run", took)
	case took > 30*time.Second:
		t.Errorf("runBinary took %s to stop after its context ended", took)
	}
	store, err := sbclaim.OpenStore(t.Context(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if _, err := store.Claims(t.Context(), sbclaim.ClaimFilter{}); err != nil {
		t.Errorf("the claims table after runBinary: %v", err)
	}
}

// paymentAPI stands in for an idempotent payment API: one charge per
// Idempotency-Key, a repeat of a key replays it.
type paymentAPI struct {
	mu      sync.Mutex
	charged map[string]bool
	calls   int
}

// Charge performs the charge for key once.
func (p *paymentAPI) Charge(_ context.Context, key string, _ []byte) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if p.charged == nil {
		p.charged = map[string]bool{}
	}
	p.charged[key] = true
	return nil
}

// Charges returns how many charges were performed.
func (p *paymentAPI) Charges() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.charged)
}

// snippet:handler-test
func TestChargeSurvivesACrash(t *testing.T) {
	payments := &paymentAPI{} // one charge per Idempotency-Key
	router, err := sbclaim.NewRouter(sbclaim.Route{Name: "charge", Handler: func(ctx context.Context, d *sbclaim.Delivery) error {
		return payments.Charge(ctx, d.IdempotencyKey(), d.Message().Body)
	}})
	if err != nil {
		t.Fatal(err)
	}
	store := sbclaimtest.NewStore(t)
	queue := sbclaimtest.NewQueue(&sbclaimtest.QueueOptions{LockDuration: 500 * time.Millisecond})
	// The replica dies after the first charge, before recording it.
	sbclaimtest.Start(t, sbclaim.ProcessorConfig{Consumer: "billing", Store: store, Router: router},
		queue, sbclaimtest.CrashAfterEffect(1))

	id := "order-42"
	order := &azservicebus.Message{MessageID: &id, Body: []byte(`{"order":42,"amount_cents":1999}`)}
	if err := queue.Send(t.Context(), order, order); err != nil { // sent twice: a producer's retry
		t.Fatal(err)
	}
	if err := queue.WaitIdle(t.Context()); err != nil {
		t.Fatal(err)
	}

	// A delivery took the claim over and ran the handler again with the
	// same key: the API replayed it, one charge.
	claims, err := store.Claims(t.Context(), sbclaim.ClaimFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if payments.Charges() != 1 || len(claims) != 1 || claims[0].State != sbclaim.StateProcessed || claims[0].TakeOvers < 1 {
		t.Errorf("%d charges, claims %+v: want one charge, one claim processed after a take-over", payments.Charges(), claims)
	}
}

// endsnippet
