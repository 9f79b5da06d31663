package sideeffects

import "context"

// Call describes the attempt an effect is called for: which claim, which
// message key, and how many attempts of it came before. The claim's
// holder (package held, and the processor's one-phase path) puts it in the
// effect's context; CallOf reads it. An effect that does not need it never
// looks: the idempotency key is its argument.
type Call struct {
	ClaimID  int64
	Consumer string
	// DedupKey is the message's dedup key (the claim's MessageID), as
	// opposed to the idempotency key sent downstream, which is derived
	// from it.
	DedupKey string
	// Attempt is 1 for the first attempt of the claim's effect; it counts
	// the attempts recorded on the claim, so a redelivery, a take-over or
	// a recovery continues the count.
	Attempt int
}

type callKey struct{}

// WithCall returns ctx carrying c.
func WithCall(ctx context.Context, c Call) context.Context {
	return context.WithValue(ctx, callKey{}, c)
}

// CallOf returns the Call ctx carries, if any.
func CallOf(ctx context.Context) (Call, bool) {
	c, ok := ctx.Value(callKey{}).(Call)
	return c, ok
}
