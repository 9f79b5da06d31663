package held

import (
	"context"
	"sync"
	"time"
)

// Periodic calls run after first, then again after each delay run
// returns, until run returns false, stop is called, parent ends or
// deadline (zero: none) passes. No goroutine waits between the calls: each
// starts on a timer's own goroutine (time.AfterFunc), so a message or a
// claim that is done before its first call costs a timer, not a goroutine,
// a ticker and a context.
//
// run gets a context that ends when stop is called, parent ends or
// deadline passes; stop cancels a call in progress and waits for it to
// return, so that none runs once stop has returned. The calls never
// overlap.
func Periodic(parent context.Context, deadline time.Time, first time.Duration,
	run func(ctx context.Context) (next time.Duration, again bool)) (stop func()) {
	p := &periodic{parent: parent, deadline: deadline, run: run}
	p.mu.Lock()
	p.timer = time.AfterFunc(first, p.fire)
	p.mu.Unlock()
	return p.stop
}

type periodic struct {
	parent   context.Context
	deadline time.Time
	run      func(context.Context) (time.Duration, bool)

	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
	cancel  context.CancelFunc // the call in progress's, nil when none
	done    chan struct{}      // closed when the call in progress returns
}

func (p *periodic) fire() {
	p.mu.Lock()
	if p.stopped || p.parent.Err() != nil || (!p.deadline.IsZero() && !time.Now().Before(p.deadline)) {
		p.mu.Unlock()
		return
	}
	var (
		ctx    context.Context
		cancel context.CancelFunc
	)
	if p.deadline.IsZero() {
		ctx, cancel = context.WithCancel(p.parent)
	} else {
		ctx, cancel = context.WithDeadline(p.parent, p.deadline)
	}
	done := make(chan struct{})
	p.cancel, p.done = cancel, done
	p.mu.Unlock()

	next, again := p.run(ctx)
	cancel()

	p.mu.Lock()
	defer p.mu.Unlock()
	p.cancel, p.done = nil, nil
	close(done)
	if again && !p.stopped {
		p.timer.Reset(max(next, 0))
	}
}

func (p *periodic) stop() {
	p.mu.Lock()
	p.stopped = true
	p.timer.Stop()
	cancel, done := p.cancel, p.done
	p.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
}
