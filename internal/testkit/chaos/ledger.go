package chaos

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// ledger records, from the outside, who held each key's claim when: every
// grant (a ClaimBatch that won, a TakeOver that succeeded), every sign of
// life of an owner (the claim or take-over itself, a heartbeat written, a
// release), and every downstream request that may have performed an
// effect. It checks the take-over protocol against that record:
//
//   - at most one ClaimBatch ever wins a key (the unique index);
//   - a take-over of a claimed claim happens only after its holder showed
//     no life for the path's window (TakeoverAfter for a redelivery,
//     StaleAfter for the reconciler): a live holder is never taken over;
//   - every request that may have performed a key's effect was sent by a
//     holder of the key's claim (a replica, the reconciler or an operator
//     that had been granted it before it sent).
//
// Times are the harness's own clock, taken around the store calls, and
// each check reads a call on its own safe side, so neither clock skew
// inside one process nor a slow database can cause a false violation: a
// grant counts from the moment its call returned (nothing could be sent
// before); a sign of life counts, for the take-over check, from the moment
// its call started (the database wrote it no earlier), and for a holder's
// silence (holder) from the moment it returned (no later).
type ledger struct {
	takeoverAfter, staleAfter time.Duration

	mu     sync.Mutex
	owners map[uuid.UUID]*owner
	grants map[string][]grant // key → grants in order
	// unsure: owners a grant's call offered, whose call failed without
	// a refusal (a timeout, a replica killed mid-call): it may have
	// committed. The history may show them; nobody acted as them.
	unsure   map[string]map[uuid.UUID]string // key → owner → host
	requests map[string][]request
	wins     map[string]int
	problems []string
}

type owner struct {
	host      string
	key       string
	lastAlive time.Time // start of the latest write that proved it alive
	provenAt  time.Time // end of the latest write that proved it alive
	released  bool
	// silentFor is how long it had shown no life when a take-over the
	// ledger checked took its claim (0: never taken over while silent).
	silentFor time.Duration
}

type grant struct {
	host, path string // path: "won" or a claim.TakeOverPath
	owner      uuid.UUID
	at         time.Time // when the grant's call returned
}

type request struct {
	sender string
	at     time.Time
}

func newLedger(takeoverAfter, staleAfter time.Duration) *ledger {
	return &ledger{
		takeoverAfter: takeoverAfter, staleAfter: staleAfter,
		owners: map[uuid.UUID]*owner{}, grants: map[string][]grant{}, requests: map[string][]request{}, wins: map[string]int{},
		unsure: map[string]map[uuid.UUID]string{},
	}
}

// maybeGranted records a grant's call that failed with err: unless the
// store refused it (the guard, the route), it may have committed with
// nobody told.
func (l *ledger) maybeGranted(key, host string, o uuid.UUID, err error) {
	if err == nil || errors.Is(err, claim.ErrStateChanged) || errors.Is(err, claim.ErrRouteChanged) || key == "" {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.unsure[key] == nil {
		l.unsure[key] = map[uuid.UUID]string{}
	}
	l.unsure[key][o] = host
}

// grantUnanswered reports whether owner o of key was offered by a
// grant's call that failed without a refusal: the claim was granted to an
// owner nobody knew of, which nobody heartbeats, and which only a
// take-over after its silence moves on.
func (l *ledger) grantUnanswered(key string, o uuid.UUID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.unsure[key][o]
	return ok
}

func (l *ledger) problem(format string, args ...any) {
	if len(l.problems) < 200 {
		l.problems = append(l.problems, fmt.Sprintf(format, args...))
	}
}

// won records a ClaimBatch that won key for host.
func (l *ledger) won(key, host string, o uuid.UUID, start, end time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.wins[key]++
	if l.wins[key] == 2 {
		l.problem("%s: a second ClaimBatch won the key (the claims index did not stop it)", key)
	}
	l.owners[o] = &owner{host: host, key: key, lastAlive: start, provenAt: end}
	l.grants[key] = append(l.grants[key], grant{host: host, path: "won", owner: o, at: end})
}

// tookOver records a successful take-over, and checks it was allowed.
func (l *ledger) tookOver(key, host string, p *claim.TakeOverParams, start, end time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if prev, ok := l.owners[p.PreviousOwner]; ok && !prev.released && p.Path != claim.PathOperator {
		window := l.takeoverAfter
		if p.Path == claim.PathReconciler {
			window = l.staleAfter
		}
		silent := end.Sub(prev.lastAlive)
		if silent >= window {
			prev.silentFor = silent
		}
		if silent < window {
			l.problem("%s: %s took the claim over (path %s) from %s, which had shown life %s earlier, within its window of %s: a live holder was taken over",
				key, host, p.Path, prev.host, silent.Round(time.Millisecond), window)
		}
	}
	l.owners[p.Owner] = &owner{host: host, key: key, lastAlive: start, provenAt: end}
	l.grants[key] = append(l.grants[key], grant{host: host, path: string(p.Path), owner: p.Owner, at: end})
}

// alive records a write that proved o alive (a heartbeat written), made
// by a call that ran from start to end.
func (l *ledger) alive(o uuid.UUID, start, end time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w, ok := l.owners[o]
	if !ok {
		return
	}
	if start.After(w.lastAlive) {
		w.lastAlive = start
	}
	if end.After(w.provenAt) {
		w.provenAt = end
	}
}

// takenWhileSilent reports how long owner o had shown no life when a
// take-over took its claim, when one did (checked against the window).
func (l *ledger) takenWhileSilent(o uuid.UUID) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w, ok := l.owners[o]; ok && w.silentFor > 0 {
		return w.silentFor, true
	}
	return 0, false
}

// released records that o released its claim (its effect not performed).
func (l *ledger) released(o uuid.UUID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w, ok := l.owners[o]; ok {
		w.released = true
	}
}

// requested records a downstream request that may have performed key's
// effect.
func (l *ledger) requested(key, sender string, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.requests[key] = append(l.requests[key], request{sender: sender, at: at})
}

// holder returns the host currently holding key's claim by the ledger
// and how long ago it last showed life ("" when nobody was granted it),
// counted from the end of the call that proved it: the shortest silence
// the record allows, for checks that report a silent holder.
func (l *ledger) holder(key string, now time.Time) (host string, silent time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	gs := l.grants[key]
	if len(gs) == 0 {
		return "", 0
	}
	g := gs[len(gs)-1]
	if o := l.owners[g.owner]; o != nil {
		return o.host, now.Sub(o.provenAt)
	}
	return g.host, 0
}

// check returns every protocol violation the ledger saw, and how many
// keys had their effect sent by more than one holder (legitimately, after
// a take-over).
func (l *ledger) check() (problems []string, repeated int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	problems = slices.Clone(l.problems)
	keys := make([]string, 0, len(l.requests))
	for k := range l.requests {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		senders := map[string]bool{}
		for _, r := range l.requests[key] {
			senders[r.sender] = true
			held := false
			for _, g := range l.grants[key] {
				if g.host == r.sender && !g.at.After(r.at) {
					held = true
					break
				}
			}
			if !held {
				problems = append(problems, fmt.Sprintf("%s: %s sent a request that may have performed the effect without ever having been granted the claim", key, r.sender))
			}
		}
		if len(senders) > 1 {
			repeated++
		}
	}
	return problems, repeated
}
