package groupcommit

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// batcher collects concurrent callers' requests and hands them to flush in
// batches. A request is flushed at once when fewer than maxInFlight
// flushes are running (so a lone caller waits for no one); otherwise it
// waits for a running flush to end and goes with everything that queued
// meanwhile, up to maxBatch. That is group commit: under load, batches grow
// by themselves to what the database's latency lets pile up; idle, nothing
// is delayed. window, when positive, lets a flush wait that long for more
// requests before it starts while another flush is running.
type batcher[R any] struct {
	flush func(ctx context.Context, reqs []R) []error
	// key, when set, keeps two requests with one key out of one batch:
	// the later one waits for the next batch, so requests with one key
	// are written in the order they came.
	key         func(R) int64
	maxBatch    int
	maxInFlight int
	window      time.Duration
	timeout     time.Duration

	mu       sync.Mutex
	pending  []*call[R]
	busy     map[int64]bool // keys of the requests being flushed
	inFlight int
	closed   bool
	wg       sync.WaitGroup
}

type call[R any] struct {
	req      R
	deadline time.Time  // the caller's (zero: none)
	done     chan error // buffered: the flush never blocks on a caller that left
	span     trace.Span // the caller's, linked to its batch's (tracing.go)
}

var errClosed = errors.New("groupcommit: closed")

func newBatcher[R any](flush func(context.Context, []R) []error, key func(R) int64, maxBatch, maxInFlight int, window, timeout time.Duration) *batcher[R] {
	return &batcher[R]{flush: flush, key: key, maxBatch: maxBatch, maxInFlight: maxInFlight, window: window, timeout: timeout}
}

// do queues req and waits for its own result. When ctx ends before req's
// batch was taken, req is withdrawn and ctx's error returned; once taken,
// do waits for the batch's result (a write that may have committed is
// never reported as not done). A batch runs until the earliest deadline
// of its callers (at most timeout), so no caller waits past its own
// deadline by more than the statement's reaction to it.
func (b *batcher[R]) do(ctx context.Context, req R) error {
	c := &call[R]{req: req, done: make(chan error, 1), span: trace.SpanFromContext(ctx)}
	c.deadline, _ = ctx.Deadline()
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return errClosed
	}
	b.pending = append(b.pending, c)
	b.startLocked()
	b.mu.Unlock()

	select {
	case err := <-c.done:
		return err
	case <-ctx.Done():
	}
	b.mu.Lock()
	for i, p := range b.pending {
		if p == c {
			b.pending = append(b.pending[:i], b.pending[i+1:]...)
			b.mu.Unlock()
			return ctx.Err()
		}
	}
	b.mu.Unlock()
	return <-c.done // taken: its batch is running
}

// startLocked starts a flush when one may run and requests are waiting.
func (b *batcher[R]) startLocked() {
	if len(b.pending) == 0 || b.inFlight >= b.maxInFlight {
		return
	}
	b.inFlight++
	wait := b.window > 0 && b.inFlight > 1
	b.wg.Add(1)
	go b.run(wait)
}

func (b *batcher[R]) run(wait bool) {
	defer b.wg.Done()
	if wait {
		time.Sleep(b.window)
	}
	for {
		b.mu.Lock()
		batch := b.takeLocked()
		if len(batch) == 0 {
			b.inFlight--
			b.mu.Unlock()
			return
		}
		b.mu.Unlock()
		n := len(batch)

		reqs := make([]R, n)
		for i, c := range batch {
			reqs[i] = c.req
		}
		deadline := time.Now().Add(b.timeout)
		for _, c := range batch {
			if !c.deadline.IsZero() && c.deadline.Before(deadline) {
				deadline = c.deadline
			}
		}
		ctx, cancel := context.WithDeadline(context.Background(), deadline)
		endSpan := traceBatch(batch)
		errs := b.flush(ctx, reqs)
		endSpan(errs)
		cancel()
		b.mu.Lock()
		b.releaseLocked(batch)
		b.mu.Unlock()
		for i, c := range batch {
			c.done <- errs[i]
		}
		// Keep going while requests queued during the flush: they are the
		// next batch.
	}
}

// takeLocked removes the next batch from pending: the oldest requests, at
// most maxBatch, and with a key at most one per key and none whose key a
// running flush holds (such a request stays, in its place, for a later
// batch).
func (b *batcher[R]) takeLocked() []*call[R] {
	var batch []*call[R]
	rest := b.pending[:0]
	for _, c := range b.pending {
		if len(batch) == b.maxBatch {
			rest = append(rest, c)
			continue
		}
		if b.key != nil {
			k := b.key(c.req)
			if b.busy[k] {
				rest = append(rest, c)
				continue
			}
			if b.busy == nil {
				b.busy = map[int64]bool{}
			}
			b.busy[k] = true
		}
		batch = append(batch, c)
	}
	clear(b.pending[len(rest):])
	b.pending = rest
	return batch
}

// releaseLocked frees the keys of a flushed batch.
func (b *batcher[R]) releaseLocked(batch []*call[R]) {
	if b.key == nil {
		return
	}
	for _, c := range batch {
		delete(b.busy, b.key(c.req))
	}
}

// close refuses new requests and waits for the running flushes, which
// drain what is queued.
func (b *batcher[R]) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.wg.Wait()
}
