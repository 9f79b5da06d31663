package held

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
)

// TestPeriodicRepeatsUntilRunSaysStop: run is called again after the
// delay it returns until it returns false; the calls never overlap.
func TestPeriodicRepeatsUntilRunSaysStop(t *testing.T) {
	var calls, inside atomic.Int32
	ended := make(chan struct{})
	stop := Periodic(context.Background(), time.Time{}, 0, func(ctx context.Context) (time.Duration, bool) {
		if inside.Add(1) != 1 {
			t.Error("two calls at once")
		}
		defer inside.Add(-1)
		if calls.Add(1) == 3 {
			close(ended)
			return 0, false
		}
		return 0, true
	})
	<-ended
	stop()
	if n := calls.Load(); n != 3 {
		t.Errorf("%d calls, want 3", n)
	}
}

// TestPeriodicStopCancelsAndWaits: stop cancels the call in progress and
// returns only once it has returned; no call starts after it.
func TestPeriodicStopCancelsAndWaits(t *testing.T) {
	var calls atomic.Int32
	started := make(chan struct{})
	var returned atomic.Bool
	stop := Periodic(context.Background(), time.Time{}, 0, func(ctx context.Context) (time.Duration, bool) {
		if calls.Add(1) == 1 {
			close(started)
		}
		<-ctx.Done()
		returned.Store(true)
		return 0, true
	})
	<-started
	stop()
	if !returned.Load() {
		t.Fatal("stop returned before the call in progress")
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("%d calls, want 1 (none after stop)", n)
	}
}

// TestPeriodicEndsWithItsParentAndDeadline: a call's context ends with the
// parent; past the deadline no call starts.
func TestPeriodicEndsWithItsParentAndDeadline(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	started, seen := make(chan struct{}), make(chan error, 1)
	stop := Periodic(parent, time.Time{}, 0, func(ctx context.Context) (time.Duration, bool) {
		close(started)
		<-ctx.Done()
		seen <- ctx.Err()
		return 0, true // the parent has ended: no call follows
	})
	<-started
	cancel()
	if err := <-seen; err == nil {
		t.Error("the call's context did not end with its parent")
	}
	stop()

	var calls atomic.Int32
	stop = Periodic(context.Background(), time.Now().Add(-time.Second), 0, func(context.Context) (time.Duration, bool) {
		calls.Add(1)
		return 0, true
	})
	// The timer has fired or is stopped by stop; either way nothing ran.
	stop()
	if n := calls.Load(); n != 0 {
		t.Errorf("%d calls past the deadline, want 0", n)
	}
}
