package chaos

import (
	"context"
	"slices"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// checkHistory checks every routed claim's history against what the
// harness traced and against the claim itself:
//
//   - the owners the history says were granted the claim (claimed, taken
//     over, redriven) are exactly the grants the ledger traced, one row
//     each, in order;
//   - the rows chain: each change starts in the state the previous one
//     ended in (a change written without its row, or a row without its
//     change, breaks the chain), and the last one ends in the claim's
//     state and owner;
//   - its take-over rows are as many as the claim's take-over count.
func (h *harness) checkHistory(ctx context.Context, rep *Report, claims map[string]*claim.Claim) {
	ids := make([]string, 0, len(claims))
	for id := range claims {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	h.led.mu.Lock()
	grants := make(map[string][]uuid.UUID, len(h.led.grants))
	for key, gs := range h.led.grants {
		for _, g := range gs {
			grants[key] = append(grants[key], g.owner)
		}
	}
	unsure := make(map[string]map[uuid.UUID]string, len(h.led.unsure))
	for key, os := range h.led.unsure {
		unsure[key] = os
	}
	h.led.mu.Unlock()
	for _, id := range ids {
		c := claims[id]
		hist, err := h.db.Store.History(ctx, c.ID)
		if err != nil {
			rep.violate("history of claim %d (%s): %v", c.ID, id, err)
			continue
		}
		rep.HistoryRows += len(hist)
		var granted []uuid.UUID
		takeOvers := 0
		for i, e := range hist {
			switch e.What {
			case claim.ChangeClaimed:
				granted = grantOf(granted, e.Owner, grants[id], unsure[id], &rep.UnansweredGrants)
			case claim.ChangeTakenOver, claim.ChangeRedriven:
				granted = grantOf(granted, e.Owner, grants[id], unsure[id], &rep.UnansweredGrants)
				takeOvers++
				if i > 0 && e.PreviousOwner != hist[i-1].Owner {
					rep.violate("claim %d (%s): history row %d takes the claim from owner %s, the previous row left it with %s", c.ID, id, e.ID, e.PreviousOwner, hist[i-1].Owner)
				}
			}
			if i == 0 && e.What != claim.ChangeClaimed {
				rep.violate("claim %d (%s): its history starts with %q, not claimed", c.ID, id, e.What)
			}
			if i > 0 && e.From != hist[i-1].To {
				rep.violate("claim %d (%s): history row %d (%s) starts %s, the previous row (%s) ended %s: a change has no row",
					c.ID, id, e.ID, e.What, e.From, hist[i-1].What, hist[i-1].To)
			}
		}
		if n := len(hist); n == 0 || hist[n-1].To != c.State || hist[n-1].Owner != c.Owner {
			rep.violate("claim %d (%s) is %s (owner %s); its history ends elsewhere: %d rows", c.ID, id, c.State, c.Owner, n)
		}
		if takeOvers != c.TakeOvers {
			rep.violate("claim %d (%s): %d take-overs counted, %d in its history", c.ID, id, c.TakeOvers, takeOvers)
		}
		if !slices.Equal(granted, grants[id]) {
			rep.violate("claim %d (%s): the history grants owners %v, the harness traced %v", c.ID, id, granted, grants[id])
			rep.history(id, h.hist.of(id))
		}
	}
}

// grantOf appends a grant the history shows, unless its call failed
// without a refusal (a timeout, a replica killed mid-call): it committed,
// but its caller never learned it, so the harness traced no grant, and
// nobody acted as that owner (a later take-over from it is traced). Those
// are counted apart. (A caller may retry with the same owner token and
// learn it then: that grant is traced.)
func grantOf(granted []uuid.UUID, o uuid.UUID, traced []uuid.UUID, unsure map[uuid.UUID]string, unanswered *int) []uuid.UUID {
	if _, ok := unsure[o]; ok && !slices.Contains(traced, o) {
		*unanswered++
		return granted
	}
	return append(granted, o)
}
