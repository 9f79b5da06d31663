package protocol_test

import (
	"testing"
	"time"

	"github.com/sbclaim/sbclaim/internal/protocol"
)

// TestSessionNeverDefersOrAbandons checks the rule the session mode
// rests on: in a session no outcome defers or abandons the message
// (either would let the session's next message overtake it), whatever
// the delivery's position; a retry holds the message.
func TestSessionNeverDefersOrAbandons(t *testing.T) {
	for _, o := range []protocol.Outcome{protocol.OK, protocol.Retryable, protocol.Rejected, protocol.Permanent, protocol.Conflict, protocol.Unknown} {
		for _, manual := range []bool{false, true} {
			for count := 1; count <= 5; count++ {
				d := protocol.AfterEffect(protocol.EffectStep{
					Claim:    protocol.Claim{Postponements: 1, Postponed: true, SincePostponed: time.Minute},
					Delivery: protocol.Delivery{Count: count, Max: 5, Session: true, CanDefer: true},
					Route:    protocol.Route{Name: "r", Manual: manual, Horizon: time.Hour},
					Effect:   protocol.Effect{Outcome: o, Delay: 3 * time.Second}})
				if d.Settle == protocol.DeferMessage || d.Settle == protocol.Abandon || d.Write == protocol.Defer || d.Write == protocol.Release {
					t.Errorf("%s, manual %v, delivery %d: %s / %s: a session's message must not be deferred, released or abandoned", o, manual, count, d.Write, d.Settle)
				}
				if (o == protocol.Retryable || (o == protocol.Unknown && !manual)) && (d.Write != protocol.Hold || d.Settle != protocol.Retry || d.Wait != 3*time.Second) {
					t.Errorf("%s, manual %v: %s / %s after %s, want hold / retry after the delay (3s)", o, manual, d.Write, d.Settle, d.Wait)
				}
			}
		}
	}
}

func TestSessionHoldOnFailure(t *testing.T) {
	step := func(o protocol.Outcome, hold bool) protocol.Decision {
		return protocol.AfterEffect(protocol.EffectStep{Delivery: protocol.Delivery{Count: 1, Max: 5, Session: true},
			Route: protocol.Route{Name: "r", HoldOnFailure: hold}, Effect: protocol.Effect{Outcome: o}})
	}
	for _, o := range []protocol.Outcome{protocol.Rejected, protocol.Permanent, protocol.Conflict} {
		if d := step(o, false); d.Write != protocol.Fail || d.Settle != protocol.DeadLetter || d.HoldSession {
			t.Errorf("%s without HoldOnFailure: %s / %s hold %v, want fail / dead-letter, the session goes on", o, d.Write, d.Settle, d.HoldSession)
		}
		if d := step(o, true); d.Write != protocol.Fail || d.Settle != protocol.DeadLetter || !d.HoldSession {
			t.Errorf("%s with HoldOnFailure: %s / %s hold %v, want fail / dead-letter, then hold the session", o, d.Write, d.Settle, d.HoldSession)
		}
	}
	if d := step(protocol.OK, true); d.HoldSession {
		t.Error("a success holds the session")
	}
	if d := step(protocol.Retryable, true); d.HoldSession {
		t.Error("a retry holds the session for an operator; it only waits its backoff")
	}
}

// TestSessionUnknownRetriesAreBounded: an unknown outcome is held and
// repeated at most Delivery.Max times, then flagged (a downstream that
// replays a stored failure would otherwise hold its session until the
// route's horizon); a retryable one (not performed) holds on.
func TestSessionUnknownRetriesAreBounded(t *testing.T) {
	step := func(o protocol.Outcome, holds int) protocol.Decision {
		return protocol.AfterEffect(protocol.EffectStep{
			Claim:    protocol.Claim{Postponements: holds, Postponed: holds > 0, SincePostponed: time.Minute},
			Delivery: protocol.Delivery{Count: 1, Max: 5, Session: true},
			Route:    protocol.Route{Name: "r", Horizon: time.Hour}, Effect: protocol.Effect{Outcome: o, Delay: time.Second}})
	}
	if d := step(protocol.Unknown, 4); d.Write != protocol.Hold {
		t.Errorf("unknown after 4 holds of 5: %s, want hold", d.Write)
	}
	if d := step(protocol.Unknown, 5); d.Write != protocol.Flag || d.Settle == protocol.Retry {
		t.Errorf("unknown after 5 holds of 5: %s / %s, want flag", d.Write, d.Settle)
	}
	if d := step(protocol.Retryable, 50); d.Write != protocol.Hold {
		t.Errorf("retryable after 50 holds, inside the horizon: %s, want hold", d.Write)
	}
}
