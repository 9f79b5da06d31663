package sideeffects

import (
	"context"

	"github.com/sbclaim/sbclaim/internal/claim"
)

type keyFormKey struct{}

// WithKeyForm returns a context that tells an effect run with it how its
// claim's keys are derived (the form recorded on the claim): a route with
// steps derives each step's key from it (StepKey). The processor, the
// reconciler's recovery and an operator's redrive set it from the claim.
func WithKeyForm(ctx context.Context, f claim.KeyForm) context.Context {
	return context.WithValue(ctx, keyFormKey{}, f)
}

// KeyFormOf returns the key form WithKeyForm put in ctx; the raw form
// (the behaviour before key forms) when there is none.
func KeyFormOf(ctx context.Context) claim.KeyForm {
	if f, ok := ctx.Value(keyFormKey{}).(claim.KeyForm); ok && f != "" {
		return f
	}
	return claim.KeyFormRaw
}

// StepKey is the idempotency key step sends for an effect whose key is
// key, in the form of ctx (KeyFormOf): "<key>:<step>" for a raw claim,
// "<key>/<escaped step>" for a scoped one (see claim.StepKey).
func StepKey(ctx context.Context, key, step string) string {
	if step == "" {
		return key // a single-step effect: the key itself
	}
	return claim.StepKey(KeyFormOf(ctx), key, step)
}
