package sbclaim

// Outcome is what became of one run of an effect, as the handler's error
// (or the HTTP effect's answer) classified it.
type Outcome string

// The outcomes.
const (
	OutcomeOK        Outcome = "ok"        // performed
	OutcomeRetryable Outcome = "retryable" // definitely not performed (NotPerformed)
	OutcomePermanent Outcome = "permanent" // refused for good, not performed (Permanent)
	OutcomeUnknown   Outcome = "unknown"   // may or may not have happened
	OutcomeRejected  Outcome = "rejected"  // the downstream's final business answer (Rejected)
	OutcomeConflict  Outcome = "conflict"  // the key was used with another payload (KeyConflict)
)

// Final reports whether o settles the idempotency key for good: ok,
// permanent, rejected and conflict. Retryable and unknown do not.
func (o Outcome) Final() bool {
	return o == OutcomeOK || o == OutcomePermanent || o == OutcomeRejected || o == OutcomeConflict
}
