package processor

import (
	"testing"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/protocol"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
)

// TestProtocolMirrorsTheDomain: the protocol's own names for states,
// outcomes and fail reasons are the domain's, and the driver converts
// each outcome to its namesake.
func TestProtocolMirrorsTheDomain(t *testing.T) {
	for _, s := range claim.States {
		if got := protocol.State(s); string(got) != string(s) {
			t.Errorf("state %s", s)
		}
	}
	for _, st := range []protocol.State{protocol.Claimed, protocol.Processed, protocol.Released, protocol.Failed, protocol.Flagged, protocol.Resolved} {
		if !claim.State(st).Valid() {
			t.Errorf("protocol state %q is not a claim state", st)
		}
	}
	for o := sideeffects.OutcomeOK; o.Valid(); o++ {
		if got := outcomeOf(o); got.String() != o.String() {
			t.Errorf("outcome %s converts to %s", o, got)
		}
	}
	if protocol.FailRejected != claim.FailRejected || protocol.FailPermanent != claim.FailPermanent || protocol.FailConflict != claim.FailConflict {
		t.Error("the protocol's fail reasons are not the claim's")
	}
	if string(claim.PathRedelivery) != "redelivery" {
		t.Error("protocol.Elsewhere compares TakeOverPath with \"redelivery\"")
	}
}
