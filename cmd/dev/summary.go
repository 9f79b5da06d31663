package main

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
	"github.com/sbclaim/sbclaim/sbclaimtest"
)

// states counts claims by state.
type states struct {
	total int
	by    map[sbclaim.ClaimState]int
}

func (s states) unfinished() int { return s.by[sbclaim.StateClaimed] + s.by[sbclaim.StateReleased] }

// String lists the non-zero counts in lifecycle order.
func (s states) String() string {
	var parts []string
	for _, st := range sbclaim.ClaimStates() {
		if n := s.by[st]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, st))
		}
	}
	return strings.Join(parts, ", ")
}

// runClaims returns the claims whose dedup key starts with prefix (every
// claim when prefix is empty), oldest first.
func runClaims(ctx context.Context, store *sbclaim.Store, prefix string) ([]*sbclaim.Claim, error) {
	var out []*sbclaim.Claim
	var after int64
	for {
		page, err := store.Claims(ctx, sbclaim.ClaimFilter{AfterID: after, Limit: 500})
		if err != nil {
			return nil, err
		}
		for _, c := range page {
			if strings.HasPrefix(c.DedupKey, prefix) {
				out = append(out, c)
			}
		}
		if len(page) < 500 {
			return out, nil
		}
		after = page[len(page)-1].ID
	}
}

func countStates(ctx context.Context, store *sbclaim.Store, prefix string) (states, error) {
	cs, err := runClaims(ctx, store, prefix)
	if err != nil {
		return states{}, err
	}
	return countOf(cs), nil
}

func countOf(cs []*sbclaim.Claim) states {
	s := states{total: len(cs), by: map[sbclaim.ClaimState]int{}}
	for _, c := range cs {
		s.by[c.State]++
	}
	return s
}

// resume waits (at most settleWait) until the claims an earlier run left
// unfinished are finished — the reconciler recovers them from their
// stored payloads, with their own keys — and says what became of them.
func resume(ctx context.Context, store *sbclaim.Store, fake *fakedownstream.Server, ids []int64, out *printer) {
	ctx, cancel := context.WithTimeout(ctx, settleWait)
	defer cancel()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		var cs []*sbclaim.Claim
		for _, id := range ids {
			c, err := store.Claim(ctx, id)
			if err != nil {
				if ctx.Err() == nil {
					out.Printf("resume: claim %d: %v\n", id, err)
				}
				return
			}
			cs = append(cs, c)
		}
		s := countOf(cs)
		if s.unfinished() == 0 {
			once := 0
			for _, c := range cs {
				if c.State == sbclaim.StateProcessed && fake.Effects(c.IdempotencyKey) == 1 {
					once++
				}
			}
			out.Printf("resumed: the %d claim(s) an earlier run left unfinished are now %s; %d effected once by this run's downstream\n", len(ids), s, once)
			return
		}
		select {
		case <-ctx.Done():
			if ctx.Err() == context.DeadlineExceeded {
				out.Printf("resume: after %s the claims an earlier run left unfinished are %s\n", settleWait, s)
			}
			return
		case <-t.C:
		}
	}
}

// settle waits until every message of the mix is settled (completed or
// dead-lettered, none deferred) and none of the run's claims is
// unfinished, printing progress once a second while it waits, for at most
// settleWait.
func settle(ctx context.Context, store *sbclaim.Store, queue *sbclaimtest.Queue, run string, out *printer) error {
	ctx, cancel := context.WithTimeout(ctx, settleWait)
	defer cancel()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	last := ""
	for {
		s, err := countStates(ctx, store, run+"-")
		if err != nil {
			return err
		}
		pending := queue.Pending()
		if pending == 0 && s.unfinished() == 0 {
			return nil
		}
		line := fmt.Sprintf("  ... %d message(s) not yet settled; claims: %s\n", pending, cmp.Or(s.String(), "none yet"))
		if line != last {
			out.Printf("%s", line)
			last = line
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("after %s: %d message(s) not settled, %d claim(s) unfinished", settleWait, pending, s.unfinished())
		case <-t.C:
		}
	}
}

// summary is what a run did, read from the claims store, the queue and
// the demo downstream.
type summary struct {
	run string
	// effectedOnce counts processed claims whose key the downstream
	// performed exactly once; notOnce lists the processed claims it did
	// not (0 or 2+ times: a bug).
	effectedOnce int
	notOnce      []string
	failed       []*sbclaim.Claim
	flagged      []*sbclaim.Claim
	unfinished   int
	postponed    int // postponements recorded on the run's claims
	deadLetters  map[string]int
	absorbed     int // duplicate copies completed without an effect of their own
	effects      int // at the downstream, every key
	requests     int
	replays      int
	// refused counts the requests the downstream answered without
	// performing or replaying anything: the outage's 503s.
	refused int
}

func summarize(ctx context.Context, store *sbclaim.Store, queue *sbclaimtest.Queue, fake *fakedownstream.Server, m mix) (summary, error) {
	cs, err := runClaims(ctx, store, m.RunID+"-")
	if err != nil {
		return summary{}, err
	}
	s := summary{run: m.RunID, deadLetters: map[string]int{}}
	for _, c := range cs {
		s.postponed += c.Postponements
		switch c.State {
		case sbclaim.StateProcessed:
			if n := fake.Effects(c.IdempotencyKey); n == 1 {
				s.effectedOnce++
			} else {
				s.notOnce = append(s.notOnce, fmt.Sprintf("%s (%d effects)", c.DedupKey, n))
			}
		case sbclaim.StateFailed:
			s.failed = append(s.failed, c)
		case sbclaim.StateFlagged:
			s.flagged = append(s.flagged, c)
		case sbclaim.StateClaimed, sbclaim.StateReleased:
			s.unfinished++
		}
	}
	for _, dl := range queue.DeadLetters() {
		if dl.MessageID != "" && strings.HasPrefix(dl.MessageID, m.RunID+"-") {
			reason := "(none)"
			if dl.DeadLetterReason != nil {
				reason = *dl.DeadLetterReason
			}
			s.deadLetters[reason]++
		}
	}
	completed := map[string]int{}
	for _, id := range queue.Completed() {
		completed[id]++
	}
	for _, n := range completed {
		s.absorbed += n - 1
	}
	snap := fake.Snapshot()
	s.effects, s.requests = snap.TotalEffects, snap.TotalRequests
	s.refused = snap.TotalRequests - snap.TotalEffects - snap.TotalRejections - snap.TotalCachedFailures - snap.TotalConflicts
	for _, k := range snap.Keys {
		s.replays += k.Replays
		s.refused -= k.Replays
	}
	return s, nil
}

// Format prints the summary; its first word on each line is what the
// line counts ("effected once:", "failed:", ...).
func (s summary) Format(consoleURL string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "summary of run %s (read from the claims store, the queue and the demo downstream):\n", s.run)
	fmt.Fprintf(&b, "  effected once:  %d  payments processed, each performed exactly once downstream, duplicates included\n", s.effectedOnce)
	fmt.Fprintf(&b, "  not once:       %d", len(s.notOnce))
	if len(s.notOnce) > 0 {
		fmt.Fprintf(&b, "  processed, but the downstream did not perform them exactly once (a bug worth a report): %s", strings.Join(s.notOnce, ", "))
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "  failed:         %d", len(s.failed))
	for _, c := range s.failed {
		fmt.Fprintf(&b, "  %s: %s (a final answer: never repeated)", c.DedupKey, shorten(c.FailReason, 100))
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "  flagged:        %d", len(s.flagged))
	for _, c := range s.flagged {
		fmt.Fprintf(&b, "  %s: %s -> %s/claims/%d", c.DedupKey, shorten(c.FlagReason, 100), consoleURL, c.ID)
	}
	b.WriteString("\n")
	reasons := slices.Sorted(maps.Keys(s.deadLetters))
	total := 0
	var parts []string
	for _, r := range reasons {
		total += s.deadLetters[r]
		parts = append(parts, fmt.Sprintf("%s %d", r, s.deadLetters[r]))
	}
	fmt.Fprintf(&b, "  dead-lettered:  %d  %s\n", total, strings.Join(parts, ", "))
	fmt.Fprintf(&b, "  duplicates:     %d  copies completed without an effect of their own\n", s.absorbed)
	fmt.Fprintf(&b, "  postponed:      %d  times an effect was deferred and retried later with the same key\n", s.postponed)
	if s.unfinished > 0 {
		fmt.Fprintf(&b, "  unfinished:     %d  claims still held or released\n", s.unfinished)
	}
	fmt.Fprintf(&b, "  downstream:     %d effects, %d requests: %d refused (503, the outage), %d answered from its idempotency store (replays)\n",
		s.effects, s.requests, s.refused, s.replays)
	return b.String()
}

// shorten cuts s to n runes, marking the cut.
func shorten(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}
