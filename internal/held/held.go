// Package held runs an effect while its claim is held. The processor, the
// reconciler's recovery pass and an operator's redrive all run effects
// through Run, so they keep a claim alive, notice they lost it and classify
// the result the same way:
//
//   - the claim's heartbeat is written on its own goroutine every
//     HeartbeatInterval (independently of anything else the caller does,
//     such as renewing a message lock);
//   - a heartbeat or attempt write answered claim.ErrStateChanged means the
//     claim was taken over, flagged or resolved by someone else: the
//     effect's context is cancelled at once and nothing more is written
//     (no attempt, no release); Result.Lost says so;
//   - failed attempts are retried by the RetryPolicy with the same
//     idempotency key, each recorded on the claim (RecordAttempt) with
//     the downstream's answer to it;
//   - the downstream's answers are recorded (sideeffects.RecordAnswers:
//     one recorder for the run, one per attempt), and the last one is in
//     Result.Answer for the caller's outcome write;
//   - a panic in the effect is recovered and becomes an unknown outcome
//     (the effect may have done something before it panicked).
//
// Run does not record the outcome: callers do (mark processed, release,
// fail, resolve, flag), each with its own guarded write, usually through
// Write, passing Result.Answer.
package held

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/cenkalti/backoff/v5"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
)

// Params is the input of Run.
type Params struct {
	Store claim.Store
	// Claim is the held claim: its ID and Owner guard every write.
	Claim   *claim.Claim
	Effect  sideeffects.Effect
	Message *azservicebus.ReceivedMessage
	// Key is the idempotency key: the claim's Key() (its MessageID, or the
	// key an operator's redrive chose).
	Key   string
	Retry sideeffects.RetryPolicy

	HeartbeatInterval time.Duration // required
	StoreTimeout      time.Duration // bounds each heartbeat and attempt write; required
	// Deadline cuts the effect off (its context ends); zero: none.
	// Heartbeats stop one HeartbeatInterval after it, even if the effect
	// ignores its context, so a hung effect cannot keep its claim fresh
	// forever and block its take-over.
	Deadline time.Time

	// NextAttemptIn, when positive, is recorded with every failed attempt
	// (the reconciler's recovery backoff: claim.RecordAttemptParams).
	NextAttemptIn time.Duration

	// Outbox lets the effect publish follow-up messages (claim.FollowUp):
	// each attempt collects its own (claim.CollectFollowUps), and those of
	// the attempt that succeeded are Result.FollowUps, for the caller's
	// outcome write. Without it an effect's Publish fails
	// (claim.ErrNoOutbox).
	Outbox bool

	Logger *slog.Logger // nil discards
	// OnHeartbeat, when set, is called after every heartbeat write with
	// its error (nil when written), for metrics.
	OnHeartbeat func(err error)
}

// Result is what Run saw.
type Result struct {
	// Err is the effect's final error, nil when it succeeded.
	Err error
	// Outcome is sideeffects.Classify(Err).
	Outcome sideeffects.Outcome
	// Attempts is how many times the effect was called.
	Attempts int
	// Lost is set (wrapping claim.ErrStateChanged) when the claim stopped
	// being this holder's while the effect ran; the effect's context was
	// cancelled, and the caller must not write the claim again.
	Lost error
	// Duration is the time spent in Run.
	Duration time.Duration
	// Answer is the downstream's last answer in this run (nil when no
	// attempt got one), as a claim keeps it.
	Answer *claim.Answer
	// FollowUps are the follow-up messages the successful attempt
	// published (Params.Outbox), unnumbered: the caller writes them with
	// the outcome (claim.NumberFollowUps, MarkProcessedParams.FollowUps).
	// A failed attempt's are dropped with it.
	FollowUps []claim.FollowUp
}

// ClaimAnswer converts a downstream's answer to the claim's copy of it
// (nil for nil).
func ClaimAnswer(a *sideeffects.Answer) *claim.Answer {
	if a == nil {
		return nil
	}
	c := a.Clone()
	return &claim.Answer{Status: c.Status, Step: c.Step, Headers: c.Headers, Fields: c.Fields, Truncated: c.Truncated}
}

// FailReason is the claim's fail reason (and the message's dead-letter
// reason) for a final answer that is not a success: rejected, permanent
// or conflict; "" for any other outcome (ok, retryable and unknown do not
// fail a claim).
func FailReason(o sideeffects.Outcome) string {
	switch o {
	case sideeffects.OutcomeRejected:
		return claim.FailRejected
	case sideeffects.OutcomePermanent:
		return claim.FailPermanent
	case sideeffects.OutcomeConflict:
		return claim.FailConflict
	}
	return ""
}

// FailDescription is a failed claim's last error and its message's
// dead-letter description: the effect's error (sideeffects bounds and
// redacts the response excerpt in it), led by the status when the error
// does not say it, bounded and cut on a UTF-8 boundary (claim.ErrorText).
func FailDescription(err error, answer *claim.Answer) string {
	text := claim.ErrorText(err)
	if answer != nil && answer.Status != 0 {
		if status := fmt.Sprintf("HTTP %d", answer.Status); !strings.Contains(text, status) {
			text = claim.ErrorText(fmt.Errorf("%s: %w", status, err))
		}
	}
	return text
}

// answerOf is the answer an attempt (or a run) got: the last one its
// recorder saw, else the one attached to its error.
func answerOf(rec *sideeffects.AnswerRecorder, err error) *claim.Answer {
	if rec != nil {
		if a := rec.Last(); a != nil {
			return ClaimAnswer(a)
		}
	}
	return ClaimAnswer(sideeffects.AnswerOf(err))
}

// Run runs the effect of a held claim; see the package documentation.
func Run(ctx context.Context, p Params) Result {
	log := p.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	start := time.Now()
	effectCtx, cancelEffect := context.WithCancelCause(ctx)
	defer cancelEffect(nil)
	if !p.Deadline.IsZero() {
		var cancel context.CancelFunc
		effectCtx, cancel = context.WithDeadline(effectCtx, p.Deadline)
		defer cancel()
	}

	var (
		mu   sync.Mutex
		lost error
	)
	loseClaim := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if lost == nil {
			lost = err
			cancelEffect(fmt.Errorf("claim %d lost: %w", p.Claim.ID, err))
		}
	}
	isLost := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return lost != nil
	}

	effectCtx, runAnswers := sideeffects.RecordAnswers(effectCtx)
	stopHeartbeats := heartbeat(ctx, p, log, loseClaim)
	attempts := 0
	// The attempt's own recorder: onAttempt runs right after the attempt,
	// on the same goroutine.
	var (
		attemptAnswers *sideeffects.AnswerRecorder
		attemptOutbox  *claim.FollowUpSink
	)
	err := p.Retry.Do(effectCtx, func(ctx context.Context) error {
		attempts++
		ctx, attemptAnswers = sideeffects.RecordAnswers(ctx)
		attemptOutbox = nil
		if p.Outbox {
			ctx, attemptOutbox = claim.CollectFollowUps(ctx)
		}
		ctx = sideeffects.WithCall(ctx, sideeffects.Call{ClaimID: p.Claim.ID, Consumer: p.Claim.Consumer,
			DedupKey: p.Claim.MessageID, Attempt: p.Claim.Attempts + attempts})
		ctx, endSpan := startAttempt(ctx, p, p.Claim.Attempts+attempts)
		err := perform(ctx, p, log)
		endSpan(err)
		return err
	}, func(attempt int, err error) {
		if isLost() {
			return // the claim is someone else's now: write nothing
		}
		log.Warn("effect attempt failed", "attempt", attempt, "effect_outcome", sideeffects.Classify(err).String(), "error", err)
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.StoreTimeout)
		defer cancel()
		werr := p.Store.RecordAttempt(wctx, &claim.RecordAttemptParams{ID: p.Claim.ID, Owner: p.Claim.Owner,
			Error: claim.ErrorText(err), NextAttemptIn: p.NextAttemptIn, Answer: answerOf(attemptAnswers, err)})
		switch {
		case errors.Is(werr, claim.ErrStateChanged):
			loseClaim(werr)
		case werr != nil:
			log.Warn("record attempt failed", "error", werr)
		}
	})
	stopHeartbeats()

	res := Result{Err: err, Outcome: sideeffects.Classify(err), Attempts: attempts, Duration: time.Since(start),
		Answer: answerOf(runAnswers, err)}
	if err == nil {
		res.FollowUps = attemptOutbox.List()
	}
	mu.Lock()
	res.Lost = lost
	mu.Unlock()
	return res
}

// perform calls the effect once, turning a panic into an unknown outcome.
func perform(ctx context.Context, p Params, log *slog.Logger) (err error) {
	defer func() {
		if r := recover(); r != nil {
			log.Error("effect panicked; its outcome is unknown", "panic", fmt.Sprint(r), "stack", string(debug.Stack()))
			err = sideeffects.Unknown(fmt.Errorf("effect panicked: %v", r))
		}
	}()
	// A route with steps derives each step's key in the claim's form.
	return p.Effect.Perform(sideeffects.WithKeyForm(ctx, p.Claim.KeyForm), p.Message, p.Key)
}

// heartbeat writes the claim's heartbeat every HeartbeatInterval until the
// returned stop is called (it waits for a heartbeat in progress, so none
// is written after it returns) or the claim is lost.
func heartbeat(ctx context.Context, p Params, log *slog.Logger, lose func(error)) (stop func()) {
	var deadline time.Time
	if !p.Deadline.IsZero() {
		deadline = p.Deadline.Add(p.HeartbeatInterval)
	}
	return Periodic(ctx, deadline, p.HeartbeatInterval, func(hctx context.Context) (time.Duration, bool) {
		start := time.Now()
		wctx, wcancel := context.WithTimeout(hctx, p.StoreTimeout)
		err := p.Store.Heartbeat(wctx, &claim.HeartbeatParams{ID: p.Claim.ID, Owner: p.Claim.Owner})
		wcancel()
		if p.OnHeartbeat != nil && hctx.Err() == nil {
			p.OnHeartbeat(err)
		}
		switch {
		case err == nil:
		case errors.Is(err, claim.ErrStateChanged):
			log.Warn("claim lost while its effect ran (taken over, flagged or resolved): cancelling the effect")
			lose(err)
			return 0, false
		case hctx.Err() == nil:
			log.Warn("heartbeat failed", "error", err)
		}
		// Every HeartbeatInterval from the last one's start, as a ticker.
		return p.HeartbeatInterval - time.Since(start), true
	})
}

// Write runs a store write that records an outcome already known (mark
// processed, release, fail, resolve). Each try runs on its own StoreTimeout
// context, detached from ctx, so a shutdown does not cut a write off; a
// transient failure (claim.Transient: the store unavailable, or this call
// aborted as a deadlock victim) is retried with backoff for up to window,
// but no new try starts once ctx has ended. Any other error ends it at
// once. It returns what the store last said.
func Write(ctx context.Context, storeTimeout, window time.Duration, write func(ctx context.Context) error) error {
	b := backoff.NewExponentialBackOff()
	b.InitialInterval = 100 * time.Millisecond
	b.MaxInterval = 2 * time.Second
	detached := context.WithoutCancel(ctx)
	var last error
	_, err := backoff.Retry(ctx, func() (struct{}, error) {
		wctx, cancel := context.WithTimeout(detached, storeTimeout)
		defer cancel()
		last = write(wctx)
		if last != nil && !claim.Transient(last) {
			return struct{}{}, backoff.Permanent(last)
		}
		return struct{}{}, last
	}, backoff.WithBackOff(b), backoff.WithMaxElapsedTime(window))
	if err != nil && last != nil {
		return last // not the context's error: what the store said
	}
	return err
}

// KeyExpired reports whether the idempotency key of claim c is older than
// lifetime, how long its route's downstream keeps keys (zero: for ever),
// at now (the database clock: claim.Store.Now). The key was first sent
// when the claim was taken (ClaimedAt, which a take-over keeps) or, after
// an operator's redrive under a new key, when that key was chosen
// (KeyRevisedAt). Such a claim must not be repeated with its key by a
// redelivery, the reconciler or a redrive: the downstream has forgotten
// the key and would perform the repeat again. reason is the flag reason
// that says so.
func KeyExpired(c *claim.Claim, lifetime time.Duration, now time.Time) (reason string, expired bool) {
	if lifetime <= 0 {
		return "", false
	}
	since, what := c.ClaimedAt, "this claim"
	if c.KeyRevision > 0 && c.KeyRevisedAt != nil {
		since, what = *c.KeyRevisedAt, fmt.Sprintf("this claim's key %s", c.Key())
	}
	age := now.Sub(since)
	if age <= lifetime {
		return "", false
	}
	return fmt.Sprintf("the downstream keeps keys for %s; %s is %s old: a repeat would not be deduplicated",
		ShortDuration(lifetime), what, ShortDuration(age)), true
}

// ShortDuration writes d the way a person reads it: 24h, 25h3m, 90s —
// whole seconds, with zero minutes and seconds left out.
func ShortDuration(d time.Duration) string {
	if d < time.Second {
		return d.String()
	}
	s := d.Truncate(time.Second).String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// OperatorReason is the flag reason of a claim whose effect's answer
// needs a person (sideeffects.NeedsOperator, an answer rule's outcome
// flag): the effect's error, bounded.
func OperatorReason(err error) string {
	return claim.ErrorText(fmt.Errorf("needs an operator: %w", err))
}
