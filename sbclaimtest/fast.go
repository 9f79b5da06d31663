package sbclaimtest

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/sideeffects"
)

// The delays a route that sets none gets under the kit.
var (
	testBackoff = sideeffects.Backoff{First: 10 * time.Millisecond, Max: 100 * time.Millisecond}
	testProbe   = 50 * time.Millisecond
)

// fastRouter gives each route that set no Backoff (or no Breaker probe
// delay) the kit's short one, and reports every effect's result to
// observe (when set).
type fastRouter struct {
	inner   sideeffects.Router
	observe func(ctx context.Context, err error)
}

func (r fastRouter) Route(msg *azservicebus.ReceivedMessage) (sideeffects.Handler, error) {
	h, err := r.inner.Route(msg)
	if err != nil {
		return h, err
	}
	if h.Backoff.First == 0 && h.Backoff.Max == 0 {
		h.Backoff.First, h.Backoff.Max = testBackoff.First, testBackoff.Max
	}
	if h.Breaker.ProbeAfter == 0 {
		h.Breaker.ProbeAfter = testProbe
	}
	if obs := r.observe; obs != nil {
		if h.Effect != nil {
			inner := h.Effect
			h.Effect = sideeffects.EffectFunc(func(ctx context.Context, msg *azservicebus.ReceivedMessage, key string) (err error) {
				defer observed(ctx, obs, &err)
				return inner.Perform(ctx, msg, key)
			})
		}
		if h.TxEffect != nil {
			inner := h.TxEffect
			h.TxEffect = sideeffects.TxEffectFunc(func(ctx context.Context, tx *sql.Tx, msg *azservicebus.ReceivedMessage, key string) (err error) {
				defer observed(ctx, obs, &err)
				return inner.PerformTx(ctx, tx, msg, key)
			})
		}
	}
	return h, nil
}

// observed reports an effect's result, a panic as an unknown outcome (the
// panic goes on to the processor).
func observed(ctx context.Context, obs func(context.Context, error), err *error) {
	if v := recover(); v != nil {
		obs(ctx, errPanicked)
		panic(v)
	}
	obs(ctx, *err)
}

// testLogger returns a logger writing to t.Log until the test ends (a
// processor shutting down after it writes nowhere).
func testLogger(t testing.TB) *slog.Logger {
	w := &tWriter{t: t}
	t.Cleanup(w.close)
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type tWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (w *tWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(string(bytes.TrimRight(p, "\n")))
	}
	return len(p), nil
}

func (w *tWriter) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.done = true
}

// errPanicked is what Work reports for an attempt that panicked.
var errPanicked = errors.New("the handler panicked (outcome unknown)")
