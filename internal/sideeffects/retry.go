package sideeffects

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Default retry settings, used for the zero fields of a RetryPolicy.
const (
	DefaultMaxAttempts     = 5
	DefaultInitialInterval = 200 * time.Millisecond
	DefaultMaxInterval     = 5 * time.Second
	DefaultRetryBudget     = 30 * time.Second
)

// RetryPolicy bounds how an effect is retried inside one delivery: by a
// number of attempts AND by a time budget, whichever runs out first, and by
// the context.
//
// Every attempt passes the same idempotency key, so retrying an effect whose
// outcome is unknown is safe: the downstream deduplicates it. Retryable and
// Unknown outcomes are retried; OK, Permanent, Rejected and Conflict (the
// Final outcomes) stop the loop, and so does an unknown outcome marked
// NeedsOperator (a person must decide).
//
// Budget is the time Do may spend from its start until it begins the last
// attempt; it must leave the last attempt (one route timeout) inside the
// message's lock-renewal window, so the processor still holds the message
// when the loop ends. A wait that would end after the budget is not started:
// Do returns the last error instead, and the message is abandoned (retryable)
// or its claim kept for the reconciler (unknown).
//
// The zero value is usable: zero fields take the Default* constants.
type RetryPolicy struct {
	// MaxAttempts is the number of calls to fn, the first included.
	MaxAttempts int
	// InitialInterval is the first wait; waits grow exponentially (×2) with
	// ±50% jitter up to MaxInterval.
	InitialInterval time.Duration
	MaxInterval     time.Duration
	// Budget bounds the whole loop (see above).
	Budget time.Duration
	// StopOnUnknown ends the loop at the first attempt whose outcome is
	// unknown, for a downstream that does not honour the idempotency key
	// (a RecoveryManual route): only attempts that definitely did nothing
	// are retried.
	StopOnUnknown bool
}

// Validate reports a field with a negative or inconsistent value.
func (p RetryPolicy) Validate() error {
	switch {
	case p.MaxAttempts < 0:
		return fmt.Errorf("RetryPolicy.MaxAttempts cannot be negative (got %d)", p.MaxAttempts)
	case p.InitialInterval < 0:
		return fmt.Errorf("RetryPolicy.InitialInterval cannot be negative (got %s)", p.InitialInterval)
	case p.MaxInterval < 0:
		return fmt.Errorf("RetryPolicy.MaxInterval cannot be negative (got %s)", p.MaxInterval)
	case p.Budget < 0:
		return fmt.Errorf("RetryPolicy.Budget cannot be negative (got %s)", p.Budget)
	}
	p = p.withDefaults()
	if p.MaxInterval < p.InitialInterval {
		return fmt.Errorf("RetryPolicy.MaxInterval (%s) cannot be less than InitialInterval (%s)", p.MaxInterval, p.InitialInterval)
	}
	return nil
}

// EffectiveBudget is the Budget Do keeps to: the field, or its default.
func (p RetryPolicy) EffectiveBudget() time.Duration { return p.withDefaults().Budget }

func (p RetryPolicy) withDefaults() RetryPolicy {
	p.MaxAttempts = cmp.Or(p.MaxAttempts, DefaultMaxAttempts)
	p.InitialInterval = cmp.Or(p.InitialInterval, DefaultInitialInterval)
	p.MaxInterval = cmp.Or(p.MaxInterval, max(DefaultMaxInterval, p.InitialInterval))
	p.Budget = cmp.Or(p.Budget, DefaultRetryBudget)
	return p
}

// Do calls fn until it succeeds, fails permanently, or attempts/budget/ctx
// run out; onAttempt (may be nil) is called after every failed attempt with
// the 1-based attempt number and its error. It returns nil or the last error
// (classified: Classify works on it).
//
// When the downstream gave a Retry-After (Error.RetryAfter), that is the
// next wait instead of the backoff interval; if it would end after the
// budget, Do stops and returns the error (the broker's redelivery comes
// later instead). When ctx ends during a wait, the returned error wraps both
// the last error and the context's cause (errors.Is(err, context.Canceled)
// holds, and Classify still sees the last attempt's outcome).
//
// Once an attempt's outcome was unknown, the effect may have happened: a
// later attempt that fails as retryable or permanent cannot undo that, so Do
// then returns an OutcomeUnknown error wrapping the last one. (Releasing the
// claim would tell the next delivery the effect never ran.)
//
// A later rejected or conflict answer does end the unknown-ness: it is the
// downstream's own final word about the key. Every attempt sends the same
// key and payload, so an idempotent downstream answers a repeat from what
// it stored for the key: a rejected answer is the stored decline, whether
// the first attempt reached it or not, and a conflict says the key is held
// by another payload, so this payload was never performed under it. Either
// way nothing further can happen with this key, and keeping the claim
// "unknown" would only leave it flagged forever. Do returns that error
// unchanged. (This is why an answer rule should map to rejected only the
// downstream's decision about the request — a decline — and never an
// answer given before its idempotency layer, such as 401 after a key
// rotation: see docs/answers.md.)
func (p RetryPolicy) Do(ctx context.Context, fn func(ctx context.Context) error, onAttempt func(attempt int, err error)) error {
	mayHaveHappened := false
	err := p.do(ctx, func(ctx context.Context) error {
		err := fn(ctx)
		if Classify(err) == OutcomeUnknown {
			mayHaveHappened = true
		}
		return err
	}, onAttempt)
	if err == nil || !mayHaveHappened {
		return err
	}
	switch Classify(err) {
	case OutcomeRetryable, OutcomePermanent:
		return &Error{Outcome: OutcomeUnknown, Answer: AnswerOf(err),
			Err: fmt.Errorf("an earlier attempt may have performed the effect; last attempt: %w", err)}
	}
	return err
}

func (p RetryPolicy) do(ctx context.Context, fn func(ctx context.Context) error, onAttempt func(attempt int, err error)) error {
	p = p.withDefaults()
	b := &backoff.ExponentialBackOff{
		InitialInterval:     p.InitialInterval,
		RandomizationFactor: 0.5,
		Multiplier:          2,
		MaxInterval:         p.MaxInterval,
	}
	b.Reset()
	start := time.Now()
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()

	for attempt := 1; ; attempt++ {
		if attempt == 1 {
			if err := context.Cause(ctx); err != nil {
				// Nothing was attempted, so nothing was performed.
				return Retryable(fmt.Errorf("effect not attempted: %w", err))
			}
		}
		err := fn(ctx)
		if err == nil {
			return nil
		}
		if onAttempt != nil {
			onAttempt(attempt, err)
		}
		switch Classify(err) {
		case OutcomePermanent, OutcomeRejected, OutcomeConflict:
			return err
		case OutcomeRetryable:
			if IsMisconfigured(err) {
				// A repeat gets the same answer until someone fixes
				// the configuration: the route's breaker waits for it.
				return err
			}
		case OutcomeUnknown:
			if p.StopOnUnknown || ForOperator(err) {
				// A person must decide (NeedsOperator): a repeat would
				// get the same answer.
				return err
			}
		}
		if attempt >= p.MaxAttempts {
			return err
		}
		if cause := context.Cause(ctx); cause != nil {
			return stopped(err, cause)
		}
		next := b.NextBackOff()
		var e *Error
		if errors.As(err, &e) && e.RetryAfter > 0 {
			next = e.RetryAfter
		}
		if time.Since(start)+next > p.Budget {
			return err
		}
		if timer == nil {
			timer = time.NewTimer(next)
		} else {
			timer.Reset(next)
		}
		select {
		case <-timer.C:
		case <-ctx.Done():
			return stopped(err, context.Cause(ctx))
		}
	}
}

func stopped(last, cause error) error {
	return fmt.Errorf("%w (retries stopped: %w)", last, cause)
}
