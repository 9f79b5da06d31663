package groupcommit

import (
	"context"
	"errors"
	"fmt"
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
	queued   time.Time  // when the caller queued it
	deadline time.Time  // the caller's (zero: none)
	done     chan error // buffered: the flush never blocks on a caller that left
	span     trace.Span // the caller's, linked to its batch's (tracing.go)
}

var errClosed = errors.New("groupcommit: closed")

// spentError is the result of a request that was never written because
// its caller's deadline was spent (or nearly) waiting for a batch: it was
// withdrawn when its context ended, or dropped from its batch because it
// had waited longer than it had left. It is the caller's own context's
// error; it says nothing about the store.
type spentError struct {
	waited time.Duration
	err    error // the caller's context's error (context.DeadlineExceeded when dropped)
}

func (e *spentError) Error() string {
	return fmt.Sprintf("its deadline was spent waiting %s for a batch, not written: %v", e.waited.Round(time.Millisecond), e.err)
}

func (e *spentError) Unwrap() error { return e.err }

// leftError is the result of a caller whose context ended while its
// request's batch was being written: the batch may still commit it.
type leftError struct{ err error }

func (e *leftError) Error() string {
	return fmt.Sprintf("its context ended while its batch was being written (it may still commit): %v", e.err)
}

func (e *leftError) Unwrap() error { return e.err }

func newBatcher[R any](flush func(context.Context, []R) []error, key func(R) int64, maxBatch, maxInFlight int, window, timeout time.Duration) *batcher[R] {
	return &batcher[R]{flush: flush, key: key, maxBatch: maxBatch, maxInFlight: maxInFlight, window: window, timeout: timeout}
}

// do queues req and waits for its own result, never past ctx's end.
//
// When ctx ends before req's batch was taken, req is withdrawn, never
// written: a *spentError. A request that has waited longer than it has
// left when its batch is taken is dropped from the batch, never written,
// and its caller gets a *spentError at once: its deadline is too close for
// the write, and the batch does not shorten itself to it. A batch runs
// until its own timeout, whatever its callers' deadlines, so one caller's
// spent deadline never fails the others' writes; a caller whose ctx ends
// while its batch runs gets a *leftError (the batch may still commit its
// write), as a single write whose statement outlives its deadline.
func (b *batcher[R]) do(ctx context.Context, req R) error {
	c := &call[R]{req: req, queued: time.Now(), done: make(chan error, 1), span: trace.SpanFromContext(ctx)}
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
			return &spentError{waited: time.Since(c.queued), err: ctx.Err()}
		}
	}
	b.mu.Unlock()
	select {
	case err := <-c.done: // answered meanwhile (or dropped)
		return err
	default:
		return &leftError{err: ctx.Err()} // taken: its batch is running
	}
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

		// A request that has waited longer than it has left is dropped,
		// unwritten: its deadline would cut the batch short for everyone.
		now := time.Now()
		var kept, dropped []*call[R]
		for _, c := range batch {
			if !c.deadline.IsZero() && c.deadline.Sub(now) < now.Sub(c.queued) {
				dropped = append(dropped, c)
			} else {
				kept = append(kept, c)
			}
		}
		if len(dropped) > 0 {
			b.mu.Lock()
			b.releaseLocked(dropped)
			b.mu.Unlock()
			for _, c := range dropped {
				c.done <- &spentError{waited: now.Sub(c.queued), err: context.DeadlineExceeded}
			}
		}
		if len(kept) == 0 {
			continue
		}
		reqs := make([]R, len(kept))
		for i, c := range kept {
			reqs[i] = c.req
		}
		ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
		endSpan := traceBatch(kept)
		errs := b.flush(ctx, reqs)
		endSpan(errs)
		cancel()
		b.mu.Lock()
		b.releaseLocked(kept)
		b.mu.Unlock()
		for i, c := range kept {
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
