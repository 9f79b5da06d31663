package sqlite

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// The message path's statements are prepared once, before a later
// transaction (the store has one connection: preparing inside one would
// wait for itself), and then run prepared: after the first batch of a
// shape, batches of that shape add nothing to the cache and run.
func TestMessagePathStatementsArePreparedOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second) // a self-wait would hang
	defer cancel()
	s, err := Open(ctx, "sqlite::memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	batch := func(n int) {
		t.Helper()
		p := &claim.ClaimBatchParams{Host: "h"}
		for range n {
			id := uuid.NewString()
			p.Claims = append(p.Claims, claim.ClaimParams{MessageID: id, Consumer: "c", Owner: uuid.New(), PayloadHash: claim.HashPayload([]byte(id))})
		}
		res, err := s.ClaimBatch(ctx, p)
		if err != nil {
			t.Fatal(err)
		}
		var writes []claim.OutcomeWrite
		for _, r := range res {
			writes = append(writes, claim.OutcomeWrite{MarkProcessed: &claim.MarkProcessedParams{ID: r.Claim.ID, Owner: r.Claim.Owner}})
		}
		errs, err := s.WriteOutcomes(ctx, writes)
		if err != nil {
			t.Fatal(err)
		}
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	ready := func() int {
		s.stmts.mu.Lock()
		defer s.stmts.mu.Unlock()
		return len(s.stmts.ready)
	}
	pending := func() int {
		s.stmts.mu.Lock()
		defer s.stmts.mu.Unlock()
		return len(s.stmts.pending)
	}
	batch(3)
	for range 5 { // each transaction prepares preparePerTx of what the first noted
		if pending() == 0 {
			break
		}
		batch(3)
	}
	if p := pending(); p != 0 {
		t.Fatalf("%d texts still waiting to be prepared after 6 batches", p)
	}
	n := ready()
	if n < 4 { // the insert, the outcome update, two history inserts
		t.Fatalf("%d statements prepared after two batches, want at least 4", n)
	}
	for range 5 {
		batch(3)
	}
	if got := ready(); got != n {
		t.Fatalf("batches of the same shape prepared %d more statements", got-n)
	}
	batch(4)
	batch(4)
	batch(4)
	if got := ready(); got <= n {
		t.Fatalf("a batch of another size prepared nothing (%d statements)", got)
	}
}

// The cache is bounded: a text over maxPreparedText is never kept, and
// once maxPrepared texts are kept no more are.
func TestStatementCacheIsBounded(t *testing.T) {
	s, err := Open(t.Context(), "sqlite::memory:")
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c := &s.stmts
	long := "SELECT 1 /*" + strings.Repeat("x", maxPreparedText) + "*/"
	if c.get(long) != nil {
		t.Fatal("a long text came back prepared")
	}
	for i := range maxPrepared + 10 {
		c.get(fmt.Sprintf("SELECT %d", i))
	}
	c.prepare(t.Context(), s.db)
	if len(c.ready) != preparePerTx || len(c.pending) != maxPrepared-preparePerTx {
		t.Fatalf("one transaction's start prepared %d texts and left %d; want %d and %d", len(c.ready), len(c.pending), preparePerTx, maxPrepared-preparePerTx)
	}
	for len(c.pending) > 0 { // preparePerTx at a time, as transactions begin
		c.prepare(t.Context(), s.db)
	}
	if c.get(long) != nil {
		t.Fatal("a text over maxPreparedText was prepared")
	}
	if len(c.ready) != maxPrepared || len(c.pending) != 0 {
		t.Fatalf("%d prepared, %d pending; want %d and 0", len(c.ready), len(c.pending), maxPrepared)
	}
	if st := c.get("SELECT 7"); st == nil {
		t.Fatal("a kept text did not come back prepared")
	}
	c.close()
	if c.bytes != 0 || len(c.ready) != 0 {
		t.Fatalf("after close: %d bytes, %d statements", c.bytes, len(c.ready))
	}
}
