package protocol

// OperatorAction is an operator's action on a claim (the console, the
// CLI and the library's Store methods).
type OperatorAction int

// The operator actions that run or hand off a claim's effect.
const (
	ActRedrive OperatorAction = iota // re-run a flagged claim's effect here
	ActHandOff                       // hand a flagged claim to the reconciler that runs its route
	ActRetry                         // run a failed claim again
)

var actNames = [...]string{"redrive", "hand off", "retry"}

func (a OperatorAction) String() string { return actNames[a] }

// OperatorRefusal is why an operator action is refused, changing nothing.
type OperatorRefusal int

// The refusals of an operator action.
const (
	OpAllowed          OperatorRefusal = iota
	OpNotFlagged                       // a redrive or hand-off needs a flagged claim
	OpNotFailed                        // a retry needs a failed claim
	OpNoPayload                        // nothing to re-run from
	OpMessageUnsettled                 // the claim names a deferred message whose settlement is not recorded
)

var refNames = [...]string{"allowed", "not flagged", "not failed", "no payload", "message unsettled"}

func (r OperatorRefusal) String() string { return refNames[r] }

// OperatorStep is what an operator action needs of the claim.
type OperatorStep struct {
	Action        OperatorAction
	State         State
	PayloadStored bool
	// HandOffAsked: a retry asked to hand the claim off instead of
	// running it here; NamesMessage: the claim still names a deferred
	// message (DeferredSeq).
	HandOffAsked, NamesMessage bool
}

// OperatorDecision is what an operator action does: refused (changing
// nothing), or allowed — handing the claim off (released, for the
// reconciler that runs its route, or the next delivery of its message)
// or running its effect here (its route checked first: RouteHere).
type OperatorDecision struct {
	Refusal   OperatorRefusal
	HandOff   bool
	RouteHere bool
}

// Operate decides an operator's redrive, hand-off or retry.
//
//	redrive   flagged, payload stored ─► run here
//	hand off  flagged, payload stored ─► release for the route's reconciler
//	retry     failed, payload stored  ─► run here, or hand off when asked
//	retry     failed, no payload      ─► hand off to the next delivery of its
//	                                    message — refused while the claim still
//	                                    names a deferred message whose settlement
//	                                    is not recorded: a re-submitted copy would
//	                                    be taken for a second message of the claim
//	                                    and completed unprocessed
//
// A redrive or hand-off without a payload has nothing to run from: the
// operator resolves the claim by hand.
func Operate(s OperatorStep) OperatorDecision {
	switch s.Action {
	case ActRedrive, ActHandOff:
		switch {
		case s.State != Flagged:
			return OperatorDecision{Refusal: OpNotFlagged}
		case !s.PayloadStored:
			return OperatorDecision{Refusal: OpNoPayload}
		}
		return OperatorDecision{HandOff: s.Action == ActHandOff, RouteHere: s.Action == ActRedrive}
	}
	switch {
	case s.State != Failed:
		return OperatorDecision{Refusal: OpNotFailed}
	case !s.PayloadStored && s.NamesMessage:
		return OperatorDecision{Refusal: OpMessageUnsettled}
	}
	handOff := s.HandOffAsked || !s.PayloadStored
	return OperatorDecision{HandOff: handOff, RouteHere: !handOff}
}
