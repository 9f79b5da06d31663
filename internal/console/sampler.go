package console

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// Sampler keeps, in this process only, a bounded history of the age of
// the oldest unfinished claim: the claims table holds the current value
// alone (a claim that finished leaves no trace of how long it waited), so
// the history starts when the console starts, is lost when it stops, and
// differs between replicas. The overview says so.
type Sampler struct {
	store    claim.Store
	interval time.Duration

	mu      sync.Mutex
	ring    []Sample
	next    int
	full    bool
	started time.Time // first sample, database clock
}

// Sample is one reading, by the database clock.
type Sample struct {
	At time.Time
	// Oldest is the age of the oldest unfinished claim; zero when there
	// was none.
	Oldest time.Duration
	// Unfinished counts the claimed and released claims.
	Unfinished int64
}

// NewSampler returns a sampler of store keeping capacity samples.
func NewSampler(store claim.Store, interval time.Duration, capacity int) *Sampler {
	return &Sampler{store: store, interval: interval, ring: make([]Sample, max(capacity, 2))}
}

// Interval is the time between two samples.
func (s *Sampler) Interval() time.Duration { return s.interval }

// Sample reads the table once (Store.Stats: two partial-index reads) and
// keeps the reading.
func (s *Sampler) Sample(ctx context.Context) error {
	st, err := s.store.Stats(ctx)
	if err != nil {
		return err
	}
	r := Sample{At: st.Now, Unfinished: st.Claimed + st.Released}
	if st.OldestUnfinished != nil {
		r.Oldest = max(st.Now.Sub(*st.OldestUnfinished), 0)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started.IsZero() {
		s.started = r.At
	}
	s.ring[s.next] = r
	s.next = (s.next + 1) % len(s.ring)
	if s.next == 0 {
		s.full = true
	}
	return nil
}

// Samples returns the kept samples, oldest first.
func (s *Sampler) Samples() []Sample {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.full {
		return append([]Sample(nil), s.ring[:s.next]...)
	}
	return append(append([]Sample(nil), s.ring[s.next:]...), s.ring[:s.next]...)
}

// Started is the time of the first sample (zero before it).
func (s *Sampler) Started() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.started
}

// Run samples at once and then every interval until ctx ends. A failed
// sample is logged and skipped: the chart shows the gap.
func (s *Sampler) Run(ctx context.Context, log *slog.Logger) {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	for {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		if err := s.Sample(sctx); err != nil && ctx.Err() == nil {
			log.Warn("console: sampling the oldest unfinished claim failed", "err", err)
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
