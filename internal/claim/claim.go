package claim

import (
	"crypto/sha256"
	"time"

	"github.com/google/uuid"
)

// State is where a claim is in its life. See DESIGN.md §5:
//
//	claimed ──► processed
//	   ├──► released ──► claimed again (taken over by the next delivery)
//	   └──► flagged ──► resolved (redriven | done | discarded)
type State string

const (
	// StateClaimed: a replica committed the marker and owns the effect.
	StateClaimed State = "claimed"
	// StateProcessed: the effect happened and its outcome is committed.
	StateProcessed State = "processed"
	// StateReleased: the effect was definitely not performed; the next
	// delivery may take the claim over.
	StateReleased State = "released"
	// StateFlagged: the reconciler found the claim stale (no heartbeat, or
	// released and not taken over) and handed it to operators.
	StateFlagged State = "flagged"
	// StateResolved: an operator (or a redrive) closed a flagged claim.
	StateResolved State = "resolved"
)

// States lists every state in lifecycle order.
var States = []State{StateClaimed, StateProcessed, StateReleased, StateFlagged, StateResolved}

// Valid reports whether s is one of the known states.
func (s State) Valid() bool {
	for _, v := range States {
		if s == v {
			return true
		}
	}
	return false
}

// Unfinished reports whether the claim still needs an outcome (claimed or
// released). Unfinished claims are what the reconciler scans.
func (s State) Unfinished() bool { return s == StateClaimed || s == StateReleased }

// Resolution is how an operator closed a flagged claim.
type Resolution string

const (
	// ResolutionRedriven: the effect was re-run with the same idempotency
	// key and succeeded; the claim is processed.
	ResolutionRedriven Resolution = "redriven"
	// ResolutionDone: an operator checked that the effect happened.
	ResolutionDone Resolution = "done"
	// ResolutionDiscarded: an operator decided the effect must not happen.
	ResolutionDiscarded Resolution = "discarded"
)

// Valid reports whether r is one of the known resolutions.
func (r Resolution) Valid() bool {
	return r == ResolutionRedriven || r == ResolutionDone || r == ResolutionDiscarded
}

// MaxMessageIDLength is the longest dedup key a claim accepts; it is the
// width of the MessageId column and Service Bus's own MessageId limit.
const MaxMessageIDLength = 128

// Claim is one row of the claims table: the marker that says which attempt
// owns the effect of (MessageID, Consumer), and what became of it.
//
// Every time in a Claim was written by the database clock, never by a
// replica's clock, so times from different replicas compare.
type Claim struct {
	ID        int64
	MessageID string // the dedup key (MessageId by default)
	Consumer  string
	// Owner is the token of the attempt that holds the claim. Every guarded
	// update names it, so a replica that lost the claim cannot change it.
	Owner uuid.UUID
	State State

	Entity        string            // queue, or topic/subscription
	Subject       string            // the message's Subject (routes match on it)
	ContentType   string            // the message's ContentType
	Properties    map[string]string // application properties, stringified (for redrive)
	PayloadHash   []byte            // SHA-256 of the body
	Payload       []byte            // the body, when stored; nil once processed
	DeliveryCount int               // the delivery that won (or last took over) the claim
	ClaimedBy     string            // host of the owning replica

	ClaimedAt   time.Time
	HeartbeatAt time.Time // last heartbeat; set on claim, take-over and release
	ProcessedAt *time.Time
	ReleasedAt  *time.Time
	Attempts    int    // effect attempts recorded so far
	LastError   string // the last attempt's error, if any

	FlaggedAt  *time.Time
	FlagReason string

	ResolvedAt     *time.Time
	ResolvedBy     string
	Resolution     Resolution
	ResolutionNote string
}

// HashPayload returns the SHA-256 of a message body: the payload hash that
// tells a duplicate (same key, same body) from a conflict (same key, other
// body).
func HashPayload(body []byte) []byte {
	sum := sha256.Sum256(body)
	return sum[:]
}
