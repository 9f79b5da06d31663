package groupcommit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A lone request is flushed at once, alone.
func TestBatcherLoneRequestIsNotDelayed(t *testing.T) {
	var sizes []int
	b := newBatcher(func(_ context.Context, reqs []int) []error {
		sizes = append(sizes, len(reqs))
		return make([]error, len(reqs))
	}, nil, 64, 1, time.Hour, time.Second) // a window of an hour must not apply
	defer b.close()
	done := make(chan error)
	go func() { done <- b.do(context.Background(), 1) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a lone request waited for company")
	}
	if len(sizes) != 1 || sizes[0] != 1 {
		t.Fatalf("flushes %v, want [1]", sizes)
	}
}

// Requests that arrive while a flush runs go together in the next one, and
// each caller gets its own result.
func TestBatcherGroupsWhileAFlushRuns(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var batches [][]int
	b := newBatcher(func(_ context.Context, reqs []int) []error {
		mu.Lock()
		batches = append(batches, append([]int(nil), reqs...))
		first := len(batches) == 1
		mu.Unlock()
		if first {
			<-release // hold the first flush until the others queued
		}
		errs := make([]error, len(reqs))
		for i, r := range reqs {
			if r%2 == 1 {
				errs[i] = fmt.Errorf("odd %d", r)
			}
		}
		return errs
	}, nil, 64, 1, 0, time.Second)
	defer b.close()

	results := make([]error, 11)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); results[0] = b.do(context.Background(), 0) }()
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(batches) == 1 })
	for i := 1; i <= 10; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); results[i] = b.do(context.Background(), i) }()
	}
	waitFor(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return len(b.pending) == 10 })
	close(release)
	wg.Wait()

	if len(batches) != 2 || len(batches[0]) != 1 || len(batches[1]) != 10 {
		t.Fatalf("batches %v, want [[0] [the other ten]]", batches)
	}
	for i, err := range results {
		if (i%2 == 1) != (err != nil) {
			t.Errorf("request %d got %v", i, err)
		}
	}
}

func TestBatcherBoundsTheBatch(t *testing.T) {
	var max, firstSize atomic.Int64
	gate := make(chan struct{})
	var first atomic.Bool
	b := newBatcher(func(_ context.Context, reqs []int) []error {
		if first.CompareAndSwap(false, true) {
			firstSize.Store(int64(len(reqs)))
			<-gate
		}
		if n := int64(len(reqs)); n > max.Load() {
			max.Store(n)
		}
		return make([]error, len(reqs))
	}, nil, 4, 1, 0, time.Second)
	defer b.close()
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() { defer wg.Done(); _ = b.do(context.Background(), i) }()
	}
	// Everything not in the first (held) flush has queued.
	waitFor(t, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return firstSize.Load() > 0 && int64(len(b.pending))+firstSize.Load() == 20
	})
	close(gate)
	wg.Wait()
	if max.Load() != 4 { // at least 16 queued behind the first flush
		t.Fatalf("largest batch %d, want 4", max.Load())
	}
}

// A caller whose context ends before its batch was taken is withdrawn and
// never written; one whose batch is running gets the batch's result.
func TestBatcherWithdrawsCancelledWaiters(t *testing.T) {
	gate := make(chan struct{})
	var written sync.Map
	b := newBatcher(func(_ context.Context, reqs []int) []error {
		for _, r := range reqs {
			written.Store(r, true)
		}
		if _, ok := written.Load(0); ok && len(reqs) == 1 && reqs[0] == 0 {
			<-gate
		}
		return make([]error, len(reqs))
	}, nil, 64, 1, 0, time.Second)
	defer b.close()
	first := make(chan error)
	go func() { first <- b.do(context.Background(), 0) }()
	waitFor(t, func() bool { _, ok := written.Load(0); return ok })

	ctx, cancel := context.WithCancel(context.Background())
	second := make(chan error)
	go func() { second <- b.do(ctx, 1) }()
	waitFor(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return len(b.pending) == 1 })
	cancel()
	if err := <-second; !errors.Is(err, context.Canceled) {
		t.Fatalf("withdrawn caller got %v", err)
	}
	close(gate)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	b.close()
	if _, ok := written.Load(1); ok {
		t.Fatal("a withdrawn request was written")
	}
}

func TestBatcherClosed(t *testing.T) {
	b := newBatcher(func(_ context.Context, reqs []int) []error { return make([]error, len(reqs)) }, nil, 8, 1, 0, time.Second)
	b.close()
	if err := b.do(context.Background(), 1); !errors.Is(err, errClosed) {
		t.Fatalf("do after close = %v", err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// Two requests with one key never share a batch, nor run in two batches at
// once: the later waits and goes in order.
func TestBatcherOneRequestPerKeyAtATime(t *testing.T) {
	gate := make(chan struct{})
	var mu sync.Mutex
	var batches [][]int
	b := newBatcher(func(_ context.Context, reqs []int) []error {
		mu.Lock()
		batches = append(batches, append([]int(nil), reqs...))
		first := len(batches) == 1
		mu.Unlock()
		if first {
			<-gate
		}
		return make([]error, len(reqs))
	}, func(r int) int64 { return int64(r / 10) }, 64, 2, 0, time.Second)
	defer b.close()
	var wg sync.WaitGroup
	do := func(r int) { wg.Add(1); go func() { defer wg.Done(); _ = b.do(context.Background(), r) }() }
	do(10) // key 1: the first batch, held
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(batches) == 1 })
	do(11) // key 1 again: must wait for the first batch, although a second may run
	waitFor(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return len(b.pending) == 1 })
	do(20) // key 2: free, goes in the second flush at once
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(batches) == 2 })
	mu.Lock()
	if got := batches[1]; len(got) != 1 || got[0] != 20 {
		t.Errorf("second batch %v, want [20] (11 waits for its key)", got)
	}
	mu.Unlock()
	close(gate)
	wg.Wait()
	if len(batches) != 3 || batches[2][0] != 11 {
		t.Fatalf("batches %v, want [[10] [20] [11]]", batches)
	}
}

// A batch runs until its own timeout, not the earliest of its callers'
// deadlines (one caller's short deadline must not fail the others'
// writes); a caller whose deadline passes while its batch runs still
// returns at once, with its context's error.
func TestBatcherCallerNeverWaitsPastItsDeadline(t *testing.T) {
	got := make(chan time.Time, 1)
	gate := make(chan struct{})
	b := newBatcher(func(ctx context.Context, reqs []int) []error {
		d, _ := ctx.Deadline()
		got <- d
		<-gate
		return make([]error, len(reqs))
	}, nil, 8, 1, 0, time.Hour)
	defer b.close()
	defer close(gate)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	done := make(chan error)
	go func() { done <- b.do(ctx, 1) }()
	if d := <-got; d.Sub(start) < 59*time.Minute {
		t.Fatalf("batch deadline %v after the start, want the hour-long timeout (not the caller's minute)", d.Sub(start))
	}
	cancel() // the caller's context ends while its batch is held
	err := <-done
	var left *leftError
	if !errors.As(err, &left) || !errors.Is(err, context.Canceled) {
		t.Fatalf("caller whose context ended during its batch got %v, want a leftError with its context's error", err)
	}
}

// A request that has waited longer than it has left when its batch is
// taken is dropped, unwritten, with a spentError; the others are written.
func TestBatcherDropsASpentRequest(t *testing.T) {
	release := make(chan struct{})
	var mu sync.Mutex
	var batches [][]int
	b := newBatcher(func(_ context.Context, reqs []int) []error {
		mu.Lock()
		batches = append(batches, append([]int(nil), reqs...))
		first := len(batches) == 1
		mu.Unlock()
		if first {
			<-release
		}
		return make([]error, len(reqs))
	}, nil, 8, 1, 0, time.Hour)
	defer b.close()
	first := make(chan error)
	go func() { first <- b.do(context.Background(), 0) }()
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(batches) == 1 })

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	spent, fresh := make(chan error), make(chan error)
	go func() { spent <- b.do(ctx, 1) }()
	waitFor(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return len(b.pending) == 1 })
	// Make request 1 look as if it had waited longer than it has left.
	b.mu.Lock()
	b.pending[0].queued = b.pending[0].deadline.Add(-2 * time.Minute)
	b.mu.Unlock()
	go func() { fresh <- b.do(context.Background(), 2) }()
	waitFor(t, func() bool { b.mu.Lock(); defer b.mu.Unlock(); return len(b.pending) == 2 })
	close(release)

	var se *spentError
	if err := <-spent; !errors.As(err, &se) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("spent request got %v, want a spentError with DeadlineExceeded", err)
	}
	if err := <-fresh; err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(batches) != 2 || len(batches[1]) != 1 || batches[1][0] != 2 {
		t.Fatalf("batches %v, want [[0] [2]] (1 dropped, never written)", batches)
	}
}
