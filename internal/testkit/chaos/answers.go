package chaos

import (
	"fmt"
	"slices"
	"strings"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/testkit/fakedownstream"
	"github.com/sbclaim/sbclaim/internal/testkit/membus"
)

// Answers is how a run's downstream answers.
type Answers string

const (
	// AnswersNormal: every key is performed (201) and replayed.
	AnswersNormal Answers = "normal"
	// AnswersMixed: a share of keys is answered like a payment API does
	// besides success — a final decline, a key conflict, a failure stored
	// under the key.
	AnswersMixed Answers = "mixed"
)

// Shares of the routed keys that get each of AnswersMixed's answers (at
// least 3 each).
const (
	declineShare  = 0.04
	conflictShare = 0.02
	cachedShare   = 0.02
)

// mixedAnswerRules extend the chaos route for AnswersMixed with the rules
// a Stripe-like API needs (the same as docs/answers.md's worked example): a
// 402 is the final decline, a 400 whose error type is idempotency_error
// is a key conflict, a 409 (the key in flight) is retried; the request id
// and the charge are recorded; an operator may redrive under a new key
// (the cached failure).
var mixedAnswerRules = []byte(`    allowNewKey: true
    answers:
      - {status: 402, outcome: rejected}
      - {status: 400, field: /error/type, equals: idempotency_error, outcome: conflict}
      - {status: 409, outcome: retryable}
    record:
      headers: [Request-Id, Idempotent-Replayed]
      fields: [/id, /error/charge, /error/type]
`)

// planAnswers picks the keys the downstream answers otherwise, never a
// conflict key (whose payloads are checked apart).
func (h *harness) planAnswers() {
	n := len(h.ids)
	if n < 10 {
		return
	}
	candidates := slices.DeleteFunc(h.rng.Perm(n), func(i int) bool { return slices.Contains(h.conflicts, h.ids[i]) })
	next := 0
	for _, a := range []struct {
		reply fakedownstream.Reply
		share float64
	}{
		{fakedownstream.ReplyDecline, declineShare},
		{fakedownstream.ReplyConflict, conflictShare},
		{fakedownstream.ReplyCachedFailure, cachedShare},
	} {
		for range max(3, int(float64(n)*a.share+0.5)) {
			if next == len(candidates) {
				return
			}
			id := h.ids[candidates[next]]
			next++
			h.answers[id] = a.reply
			h.down.SetKeyReply(keyOf(id), a.reply)
		}
	}
}

// answerOf is the downstream's reply to a routed key.
func (h *harness) answerOf(id string) fakedownstream.Reply { return h.answers[id] }

// cachedFailureKey is the key an operator redrives a cached failure
// under: the claim's first key revision.
func cachedFailureKey(id string) string { return claim.KeyFor(claim.KeyFormScoped, Consumer, id, 1) }

// keyOf is the idempotency key the harness's claims send for message id:
// the routes keep the default form, scoped to the consumer.
func keyOf(id string) string { return claim.KeyFor(claim.KeyFormScoped, Consumer, id, 0) }

// idOfKey is the message a downstream request is for: its key is
// "<Consumer>/<id>", ":r<N>" after a redrive under a new key (the
// harness's message IDs and consumer need no escaping).
func idOfKey(key string) string {
	_, rest, ok := strings.Cut(key, "/")
	if !ok {
		return ""
	}
	id, _, _ := strings.Cut(rest, ":")
	return id
}

// checkAnswers checks the keys the downstream answered otherwise, from
// the claims (by message id) and the dead letters (by message id and
// reason):
//
//   - a declined or conflicting key: no effect, the claim failed with the
//     matching reason and never flagged, the message dead-lettered exactly
//     once with that reason (every other copy completed);
//   - a cached failure: no effect under its key; the claim flagged (a
//     person must decide: same-key repeats can never succeed), then
//     redriven by the operators under a new key, which performed it once.
func (h *harness) checkAnswers(rep *Report, claims map[string]*claim.Claim, dead map[string]map[string]int) {
	ids := make([]string, 0, len(h.answers))
	for id := range h.answers {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		c := claims[id]
		if c == nil {
			rep.violate("%s (answered %s): no claim", id, h.answers[id])
			continue
		}
		if n := h.down.Effects(keyOf(id)); n != 0 {
			rep.violate("%s (answered %s): %d effects under its key (want 0)", id, h.answers[id], n)
		}
		switch h.answers[id] {
		case fakedownstream.ReplyDecline, fakedownstream.ReplyConflict:
			reason := claim.FailRejected
			if h.answers[id] == fakedownstream.ReplyConflict {
				reason = claim.FailConflict
				rep.AnswerConflicts++
			} else {
				rep.Rejected++
				if h.down.Rejections(keyOf(id)) != 1 {
					rep.violate("%s (declined): the downstream recorded %d declines (want 1: repeats are replayed)", id, h.down.Rejections(keyOf(id)))
				}
			}
			if c.State != claim.StateFailed || c.FailReason != reason {
				rep.violate("%s (answered %s): claim %d is %s %s (want failed %s)", id, h.answers[id], c.ID, c.State, c.FailReason, reason)
			}
			// Flagged only on a manual route, after a crash left its first
			// attempt's outcome unknown (explained like any flag): the
			// operator's redrive got the final answer and failed the claim;
			// the message was completed while the claim was flagged, so it
			// may never be dead-lettered. Otherwise exactly once.
			wantDL := "once"
			switch {
			case c.FlaggedAt != nil && h.cfg.Recovery == sideeffects.RecoveryManual:
				wantDL = "at most once"
				rep.FinalFlaggedFirst++
				if dead[id][reason] > 1 {
					rep.violate("%s (answered %s): dead-lettered %d times as %s (want %s)", id, h.answers[id], dead[id][reason], reason, wantDL)
				}
			case c.FlaggedAt != nil:
				rep.violate("%s (answered %s): claim %d was flagged (%s): a final answer is never an operator's", id, h.answers[id], c.ID, c.FlagReason)
			case dead[id][reason] <= 1 && c.DeadLetterSeq == nil && h.handedOff(c.ID):
				// Its deliveries were spent on postponements: a processor
				// handed the claim to the reconciler with its payload and
				// completed the message; the recovery got the final answer
				// and failed the claim with no message at hand. The failed
				// claim (payload kept) is the record; only a later copy of
				// the key would be dead-lettered (TakeDeadLetter).
				rep.FinalAfterHandOff++
			case dead[id][reason] != 1:
				rep.violate("%s (answered %s): dead-lettered %d times as %s (want %s)", id, h.answers[id], dead[id][reason], reason, wantDL)
				rep.history(id, h.hist.of(id))
			}
			for r, k := range dead[id] {
				if r != reason {
					rep.violate("%s (answered %s): %d dead letters as %s", id, h.answers[id], k, r)
				}
			}
		case fakedownstream.ReplyCachedFailure:
			rep.CachedFailures++
			if c.FlaggedAt == nil {
				rep.violate("%s (a cached failure): claim %d never flagged (%s): same-key repeats can never succeed, a person must choose a new key", id, c.ID, c.State)
			}
			if c.State != claim.StateResolved || c.Resolution != claim.ResolutionRedriven || c.Key() != cachedFailureKey(id) {
				rep.violate("%s (a cached failure): claim %d is %s %s under key %q (want redriven under %s)", id, c.ID, c.State, c.Resolution, c.Key(), cachedFailureKey(id))
			}
			if n := h.down.Effects(cachedFailureKey(id)); n != 1 {
				rep.violate("%s (a cached failure): %d effects under the new key %s (want 1)", id, n, cachedFailureKey(id))
			}
			// Its deliveries bounce (every same-key attempt answers 500)
			// until the claim is flagged, or the broker gives up.
			for r, k := range dead[id] {
				if r != membus.ReasonMaxDeliveryCountExceeded {
					rep.violate("%s (a cached failure): %d dead letters as %s", id, k, r)
				}
			}
		}
	}
}

// answersLine is the verdict's addition for AnswersMixed.
func (r *Report) answersLine() string {
	if r.Config.Answers != AnswersMixed {
		return ""
	}
	line := fmt.Sprintf("; rejected %d (dead-lettered once each, claims failed), conflicts %d (dead-lettered once each, claims failed), cached failures %d (flagged, redriven under a new key)",
		r.Rejected, r.AnswerConflicts, r.CachedFailures)
	if r.FinalAfterHandOff > 0 {
		line += fmt.Sprintf("; %d failed by the reconciler's recovery after a hand-off had completed the message (the failed claim is the record: nothing left to dead-letter)", r.FinalAfterHandOff)
	}
	if r.FinalFlaggedFirst > 0 {
		line += fmt.Sprintf("; of the rejected and conflicts, %d were flagged first (a crash left the manual route's outcome unknown) and failed by the operator's redrive, dead-lettered at most once", r.FinalFlaggedFirst)
	}
	return line
}
