package groupcommit_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/groupcommit"
	"github.com/sbclaim/sbclaim/internal/testkit/testdb"
)

// recording is a real store whose batches are recorded, and whose first
// batch waits for release (so the others pile up behind it).
type recording struct {
	claim.Store
	bw      claim.BatchWriter
	release chan struct{}
	limit   int // its claim.WriteLimit (0: none)

	mu    sync.Mutex
	sizes []int
}

func (r *recording) WriteOutcomes(ctx context.Context, w []claim.OutcomeWrite) ([]error, error) {
	r.mu.Lock()
	r.sizes = append(r.sizes, len(w))
	first := len(r.sizes) == 1
	r.mu.Unlock()
	if first && r.release != nil {
		<-r.release
	}
	return r.bw.WriteOutcomes(ctx, w)
}

func (r *recording) MaxConcurrentWrites() int { return r.limit }

func (r *recording) batches() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int(nil), r.sizes...)
}

func claimN(t *testing.T, st claim.Store, n int) []*claim.Claim {
	t.Helper()
	var out []*claim.Claim
	for i := range n {
		res, err := st.ClaimBatch(t.Context(), &claim.ClaimBatchParams{Host: "h", Claims: []claim.ClaimParams{{
			MessageID: "m-" + uuid.NewString(), Consumer: "billing", Owner: uuid.New(), PayloadHash: claim.HashPayload([]byte{byte(i)}),
		}}})
		if err != nil || res[0].Outcome != claim.OutcomeWon {
			t.Fatalf("claim: %v %v", res, err)
		}
		out = append(out, res[0].Claim)
	}
	return out
}

// Writes that arrive while a batch is written go together in the next
// one; each caller gets its own result, and a write whose guard fails is
// refused alone.
func TestConcurrentWritesShareABatch(t *testing.T) {
	inner := testdb.SQLite(t)
	rec := &recording{Store: inner, bw: inner, release: make(chan struct{})}
	st, err := groupcommit.New(rec, groupcommit.Options{MaxInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	cs := claimN(t, inner, 21)
	ctx := context.Background()

	first := make(chan error)
	go func() { first <- st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: cs[0].ID, Owner: cs[0].Owner}) }()
	eventually(t, "the first batch to be held", func() bool { return len(rec.batches()) == 1 })
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for i := 1; i < len(cs); i++ {
		owner := cs[i].Owner
		if i == 7 {
			owner = uuid.New() // an attempt that lost the claim
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: cs[i].ID, Owner: owner})
		}()
	}
	// Let the 20 writes queue behind the held batch before releasing it.
	waitQueued(t, st, rec, 20)
	close(rec.release)
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if got := rec.batches(); len(got) != 2 || got[0] != 1 || got[1] != 20 {
		t.Fatalf("batches %v, want [1 20]", got)
	}
	for i := 1; i < len(cs); i++ {
		c, err := inner.Get(ctx, cs[i].ID)
		if err != nil {
			t.Fatal(err)
		}
		if i == 7 {
			if !errors.Is(errs[i], claim.ErrStateChanged) || c.State != claim.StateClaimed {
				t.Errorf("the lost attempt's write: %v, claim %s; want ErrStateChanged, still claimed", errs[i], c.State)
			}
			continue
		}
		if errs[i] != nil || c.State != claim.StateProcessed {
			t.Errorf("write %d: %v, claim %s", i, errs[i], c.State)
		}
	}
}

// A store that writes one transaction at a time (claim.WriteLimit, as
// SQLite) gets one batch in flight whatever MaxInFlight says: the writes
// that arrive while it is written wait for it and go together in the next.
func TestTheStoresWriteLimitBoundsTheBatchesInFlight(t *testing.T) {
	inner := testdb.SQLite(t)
	rec := &recording{Store: inner, bw: inner, release: make(chan struct{}), limit: 1}
	st, err := groupcommit.New(rec, groupcommit.Options{MaxInFlight: 4})
	if err != nil {
		t.Fatal(err)
	}
	cs := claimN(t, inner, 11)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make([]error, len(cs))
	write := func(i int) {
		defer wg.Done()
		errs[i] = st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: cs[i].ID, Owner: cs[i].Owner})
	}
	wg.Add(1)
	go write(0)
	eventually(t, "the first batch to be held", func() bool { return len(rec.batches()) == 1 })
	for i := 1; i < len(cs); i++ {
		wg.Add(1)
		go write(i)
	}
	waitQueued(t, st, rec, 10) // fails if a second batch starts
	close(rec.release)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("write %d: %v", i, err)
		}
	}
	if got := rec.batches(); len(got) != 2 || got[0] != 1 || got[1] != 10 {
		t.Fatalf("batches %v, want [1 10]", got)
	}
}

// A batch outlives a caller whose context ends while it runs; Wait
// returns only once the batch is written (the processor waits so before
// Run returns, and a store closed after Run finds no batch still on it).
func TestWaitWaitsForABatchItsCallerLeft(t *testing.T) {
	inner := testdb.SQLite(t)
	rec := &recording{Store: inner, bw: inner, release: make(chan struct{})}
	st, err := groupcommit.New(rec, groupcommit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := claimN(t, inner, 1)[0]
	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan error)
	go func() { left <- st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: c.ID, Owner: c.Owner}) }()
	eventually(t, "the batch to be held", func() bool { return len(rec.batches()) == 1 })
	cancel()
	if err := <-left; err == nil {
		t.Fatal("the caller whose context ended got nil while its batch was held")
	}
	waited := make(chan struct{})
	go func() { st.Wait(); close(waited) }()
	select {
	case <-waited:
		t.Fatal("Wait returned while the batch was still being written")
	case <-time.After(50 * time.Millisecond):
	}
	close(rec.release)
	<-waited
	if got, err := inner.Get(context.Background(), c.ID); err != nil || got.State != claim.StateProcessed {
		t.Fatalf("after Wait: %v, %v; want the batch written", got, err)
	}
}

// waitQueued waits until n writes wait for a batch (the store's
// WriteOutcomes has not been called for them yet).
func waitQueued(t *testing.T, st *groupcommit.Store, rec *recording, n int) {
	t.Helper()
	eventually(t, "the writes to queue", func() bool {
		if len(rec.batches()) > 1 {
			t.Fatal("a second batch started while the first was held")
		}
		return st.Pending() == n
	})
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10s for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// A lone write is written at once, alone; a store that is not a
// BatchWriter is refused by New and passed through by Wrap.
func TestLoneWriteAndWrap(t *testing.T) {
	inner := testdb.SQLite(t)
	rec := &recording{Store: inner, bw: inner}
	st, err := groupcommit.New(rec, groupcommit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := claimN(t, inner, 1)[0]
	if err := st.Heartbeat(context.Background(), &claim.HeartbeatParams{ID: c.ID, Owner: c.Owner}); err != nil {
		t.Fatal(err)
	}
	if got := rec.batches(); len(got) != 1 || got[0] != 1 {
		t.Fatalf("batches %v, want [1]", got)
	}
	plain := struct{ claim.Store }{inner}
	if _, err := groupcommit.New(plain, groupcommit.Options{}); err == nil {
		t.Error("New accepted a store without WriteOutcomes")
	}
	if got, err := groupcommit.Wrap(plain, groupcommit.Options{}); err != nil || got != claim.Store(plain) {
		t.Errorf("Wrap of a plain store = %T, %v; want it unchanged", got, err)
	}
	if _, err := groupcommit.New(inner, groupcommit.Options{MaxBatch: claim.MaxOutcomeBatch + 1}); err == nil {
		t.Error("New accepted a MaxBatch above claim.MaxOutcomeBatch")
	}
}

// A batch that fails as a whole gives every caller its error.
func TestBatchErrorReachesEveryCaller(t *testing.T) {
	inner := testdb.SQLite(t)
	cs := claimN(t, inner, 3)
	inner.Close() // every statement now fails
	st, err := groupcommit.New(inner, groupcommit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, len(cs))
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = st.MarkProcessed(context.Background(), &claim.MarkProcessedParams{ID: c.ID, Owner: c.Owner})
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, claim.ErrUnavailable) {
			t.Errorf("caller %d: %v, want the batch's ErrUnavailable", i, err)
		}
	}
}

// slowQueue is a real store whose first batch waits for release (so the
// others queue behind it) and whose second waits until after gate is
// closed, then writes with the batch's own context.
type slowQueue struct {
	claim.Store
	bw      claim.BatchWriter
	release chan struct{}
	gate    <-chan struct{}

	mu      sync.Mutex
	batches int
}

func (s *slowQueue) WriteOutcomes(ctx context.Context, w []claim.OutcomeWrite) ([]error, error) {
	s.mu.Lock()
	s.batches++
	n := s.batches
	s.mu.Unlock()
	switch n {
	case 1:
		<-s.release
	case 2:
		<-s.gate
	}
	return s.bw.WriteOutcomes(ctx, w)
}

// TestASpentWriterDoesNotFailItsBatch: a writer that waited in a slow
// queue until its deadline is nearly spent is failed alone, unwritten, with
// its own context's error, which is not store-wide; the fresh writers
// queued with it are written, although their batch runs past its
// deadline: nothing store-wide, nothing for a breaker to trip on.
func TestASpentWriterDoesNotFailItsBatch(t *testing.T) {
	inner := testdb.SQLite(t)
	gate := make(chan struct{}) // the second batch waits for the spent writer's deadline
	slow := &slowQueue{Store: inner, bw: inner, release: make(chan struct{}), gate: gate}
	st, err := groupcommit.New(slow, groupcommit.Options{MaxInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	cs := claimN(t, inner, 6)
	first := make(chan error)
	go func() {
		first <- st.MarkProcessed(context.Background(), &claim.MarkProcessedParams{ID: cs[0].ID, Owner: cs[0].Owner})
	}()
	eventually(t, "the first batch to be held", func() bool { slow.mu.Lock(); defer slow.mu.Unlock(); return slow.batches == 1 })

	// The spent writer's deadline starts now, after the set-up, so a
	// loaded machine cannot spend it before the writes have queued.
	spentCtx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	go func() { <-spentCtx.Done(); close(gate) }()
	queued := time.Now()
	spent := make(chan error)
	go func() {
		spent <- st.MarkProcessed(spentCtx, &claim.MarkProcessedParams{ID: cs[1].ID, Owner: cs[1].Owner})
	}()
	errs := make([]error, len(cs))
	var wg sync.WaitGroup
	for i := 2; i < len(cs); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			errs[i] = st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: cs[i].ID, Owner: cs[i].Owner})
		}()
	}
	eventually(t, "the writes to queue", func() bool { return st.Pending() == len(cs)-1 })
	// The spent writer has now waited longer than it has left.
	deadline, _ := spentCtx.Deadline()
	// A margin for the batcher's own queue time, a little later than
	// queued: when the batch is taken, it has waited longer than it has
	// left.
	eventually(t, "the spent writer to wait most of its time", func() bool {
		return time.Since(queued) > time.Until(deadline)+500*time.Millisecond
	})
	close(slow.release)

	err = <-spent
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if !errors.Is(err, context.DeadlineExceeded) || claim.StoreWide(err) || !claim.Transient(err) {
		t.Errorf("spent writer: %v; want its own context's error, transient, not store-wide", err)
	}
	if c, gerr := inner.Get(context.Background(), cs[1].ID); gerr != nil || c.State != claim.StateClaimed {
		t.Errorf("spent writer's claim: %v %v, want still claimed (not written)", c, gerr)
	}
	for i := 2; i < len(cs); i++ {
		if errs[i] != nil || claim.StoreWide(errs[i]) {
			t.Errorf("fresh writer %d: %v (store-wide %v), want written", i, errs[i], claim.StoreWide(errs[i]))
			continue
		}
		if c, err := inner.Get(context.Background(), cs[i].ID); err != nil || c.State != claim.StateProcessed {
			t.Errorf("fresh writer %d's claim: %v %v, want processed", i, c, err)
		}
	}
}
