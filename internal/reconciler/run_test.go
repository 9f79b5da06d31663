package reconciler_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/reconciler"
)

// blockingStore blocks FlagStale until release is closed (or its context
// ends), reporting each entry on entered.
type blockingStore struct {
	claim.Store
	entered chan struct{}
	release chan struct{}
	ctxErr  chan error
}

func (b *blockingStore) FlagStale(ctx context.Context, p *claim.FlagStaleParams) ([]*claim.Claim, error) {
	b.entered <- struct{}{}
	select {
	case <-b.release:
		b.ctxErr <- nil
		return b.Store.FlagStale(ctx, p)
	case <-ctx.Done():
		b.ctxErr <- ctx.Err()
		return nil, ctx.Err()
	}
}

func newBlocking(st claim.Store) *blockingStore {
	return &blockingStore{Store: st, entered: make(chan struct{}, 10), release: make(chan struct{}), ctxErr: make(chan error, 10)}
}

// On shutdown Run waits for the running tick to finish, and the tick is
// not cancelled by the shutdown itself.
func TestRunWaitsForRunningTick(t *testing.T) {
	tdb := openSQLite(t)
	bs := newBlocking(tdb.store)
	rec := newRec(t, bs, reconciler.Config{Schedule: "@every 1s", ShutdownTimeout: time.Minute, QueryTimeout: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rec.Run(ctx) }()

	waitFor(t, bs.entered, "a tick to start")
	cancel()
	select {
	case err := <-done:
		t.Fatalf("Run returned (%v) while a tick was still running", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(bs.release)
	if err := waitFor(t, done, "Run to return"); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := <-bs.ctxErr; err != nil {
		t.Fatalf("the running tick's context ended (%v); shutdown must let it finish", err)
	}
}

// A tick that outlives ShutdownTimeout is cancelled and Run returns.
func TestRunShutdownTimeoutCancelsTick(t *testing.T) {
	tdb := openSQLite(t)
	bs := newBlocking(tdb.store)
	rec := newRec(t, bs, reconciler.Config{Schedule: "@every 1s", ShutdownTimeout: 100 * time.Millisecond, QueryTimeout: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rec.Run(ctx) }()

	waitFor(t, bs.entered, "a tick to start")
	cancel()
	if err := waitFor(t, done, "Run to return after the shutdown timeout"); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := <-bs.ctxErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("tick context error = %v, want canceled", err)
	}
}

func TestRunRejectsBadSchedule(t *testing.T) {
	tdb := openSQLite(t)
	if _, err := reconciler.New(tdb.store, reconciler.Config{Schedule: "every minute"}, nil, nil); err == nil || !strings.Contains(err.Error(), "Schedule") {
		t.Fatalf("New with a bad schedule: %v, want an error naming Schedule", err)
	}
}

func waitFor[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(30 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
	var zero T
	return zero
}
