package sideeffects

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestRetryPolicyStopsOnOKAndPermanent(t *testing.T) {
	t.Parallel()
	p := RetryPolicy{MaxAttempts: 10, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond, Budget: time.Minute}

	calls := 0
	err := p.Do(context.Background(), func(context.Context) error {
		calls++
		if calls < 3 {
			return Retryable(errors.New("busy"))
		}
		return nil
	}, nil)
	if err != nil || calls != 3 {
		t.Errorf("retryable twice then ok: err=%v calls=%d, want nil/3", err, calls)
	}

	calls = 0
	var seen []int
	err = p.Do(context.Background(), func(context.Context) error {
		calls++
		if calls == 1 {
			return Retryable(errors.New("busy"))
		}
		return Permanent(errors.New("rejected"))
	}, func(n int, err error) { seen = append(seen, n) })
	if Classify(err) != OutcomePermanent || calls != 2 {
		t.Errorf("retryable then permanent: err=%v calls=%d, want permanent after 2", err, calls)
	}
	if len(seen) != 2 || seen[0] != 1 || seen[1] != 2 {
		t.Errorf("onAttempt saw %v, want [1 2]", seen)
	}
}

func TestRetryPolicyMaxAttempts(t *testing.T) {
	t.Parallel()
	p := RetryPolicy{MaxAttempts: 4, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond, Budget: time.Minute}
	calls := 0
	last := Unknown(errors.New("attempt 4"))
	err := p.Do(context.Background(), func(context.Context) error {
		calls++
		if calls == 4 {
			return last
		}
		return Unknown(errors.New("again"))
	}, nil)
	if calls != 4 {
		t.Errorf("calls = %d, want 4", calls)
	}
	if err != last {
		t.Errorf("Do returned %v, want the last error", err)
	}
}

func TestRetryPolicyBudgetStopsTheLoop(t *testing.T) {
	t.Parallel()
	// Waits of ≥ 100ms (jitter ±50%) against a 1ms budget: the first wait
	// already overruns it, so only one attempt is made.
	p := RetryPolicy{MaxAttempts: 1000, InitialInterval: 200 * time.Millisecond, MaxInterval: time.Second, Budget: time.Millisecond}
	calls := 0
	err := p.Do(context.Background(), func(context.Context) error {
		calls++
		return Retryable(errors.New("busy"))
	}, nil)
	if calls != 1 || Classify(err) != OutcomeRetryable {
		t.Errorf("calls=%d err=%v, want 1 attempt and the retryable error", calls, err)
	}
}

func TestRetryPolicyRetryAfterBeyondBudgetStops(t *testing.T) {
	t.Parallel()
	p := RetryPolicy{MaxAttempts: 10, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond, Budget: time.Minute}
	calls := 0
	err := p.Do(context.Background(), func(context.Context) error {
		calls++
		return &Error{Outcome: OutcomeRetryable, RetryAfter: time.Hour, Err: errors.New("429")}
	}, nil)
	var e *Error
	if calls != 1 || !errors.As(err, &e) || e.RetryAfter != time.Hour {
		t.Errorf("calls=%d err=%v: a Retry-After past the budget must stop the loop and keep RetryAfter", calls, err)
	}
}

func TestRetryPolicyHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	// The backoff interval would be an hour (over budget); Retry-After of
	// 1ms replaces it, so the loop keeps going.
	p := RetryPolicy{MaxAttempts: 3, InitialInterval: time.Hour, MaxInterval: time.Hour, Budget: time.Minute}
	calls := 0
	err := p.Do(context.Background(), func(context.Context) error {
		calls++
		if calls < 3 {
			return &Error{Outcome: OutcomeRetryable, RetryAfter: time.Millisecond, Err: errors.New("503")}
		}
		return nil
	}, nil)
	if err != nil || calls != 3 {
		t.Errorf("calls=%d err=%v, want 3 calls and success", calls, err)
	}
}

func TestRetryPolicyContextCancellation(t *testing.T) {
	t.Parallel()
	// Cancelled during a wait: the loop stops, the error keeps the last
	// outcome and says why it stopped.
	p := RetryPolicy{MaxAttempts: 1000, InitialInterval: time.Hour, MaxInterval: time.Hour, Budget: 10 * time.Hour}
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	err := p.Do(ctx, func(context.Context) error {
		calls++
		return Unknown(errors.New("timeout"))
	}, func(int, error) { cancel() })
	if calls != 1 {
		t.Errorf("calls = %d, want 1", calls)
	}
	if !errors.Is(err, context.Canceled) || Classify(err) != OutcomeUnknown {
		t.Errorf("err = %v (outcome %v): want context.Canceled and outcome unknown", err, Classify(err))
	}

	// Cancelled inside an attempt: no further attempt.
	ctx, cancel = context.WithCancel(context.Background())
	calls = 0
	err = p.Do(ctx, func(ctx context.Context) error {
		calls++
		cancel()
		return Retryable(ctx.Err())
	}, nil)
	if calls != 1 || !errors.Is(err, context.Canceled) {
		t.Errorf("calls=%d err=%v, want one call", calls, err)
	}

	// Cancelled before the first attempt: nothing is attempted.
	calls = 0
	err = p.Do(ctx, func(context.Context) error { calls++; return nil }, nil)
	if calls != 0 || Classify(err) != OutcomeRetryable || !errors.Is(err, context.Canceled) {
		t.Errorf("calls=%d err=%v, want no call and a retryable error", calls, err)
	}
}

func TestRetryPolicyValidate(t *testing.T) {
	t.Parallel()
	if err := (RetryPolicy{}).Validate(); err != nil {
		t.Errorf("zero policy: %v", err)
	}
	for _, p := range []RetryPolicy{
		{MaxAttempts: -1},
		{Budget: -time.Second},
		{InitialInterval: time.Second, MaxInterval: time.Millisecond},
	} {
		err := p.Validate()
		if err == nil || !strings.Contains(err.Error(), "RetryPolicy.") {
			t.Errorf("%+v: Validate() = %v, want an error naming the field", p, err)
		}
	}
}

// TestRetryUnknownThenNotPerformedStaysUnknown: once an attempt may have
// performed the effect, a later "not performed" answer cannot make the
// whole effect "not performed".
func TestRetryUnknownThenNotPerformedStaysUnknown(t *testing.T) {
	for _, last := range []func(error) error{Retryable, Permanent} {
		calls := 0
		err := RetryPolicy{MaxAttempts: 2, InitialInterval: time.Millisecond, Budget: time.Second}.Do(context.Background(),
			func(context.Context) error {
				calls++
				if calls == 1 {
					return Unknown(errors.New("timeout after the request was written"))
				}
				return last(errors.New("503 / 400"))
			}, nil)
		if calls != 2 {
			t.Fatalf("calls = %d, want 2", calls)
		}
		if got := Classify(err); got != OutcomeUnknown {
			t.Errorf("unknown then %v: outcome %v, want unknown", Classify(last(nil)), got)
		}
	}
	// An OK after an unknown is OK: the key made the retry safe.
	calls := 0
	err := RetryPolicy{MaxAttempts: 3, InitialInterval: time.Millisecond, Budget: time.Second}.Do(context.Background(),
		func(context.Context) error {
			calls++
			if calls == 1 {
				return Unknown(errors.New("500"))
			}
			return nil
		}, nil)
	if err != nil {
		t.Errorf("unknown then ok: %v, want nil", err)
	}
}

func TestRetryPolicyStopOnUnknown(t *testing.T) {
	t.Parallel()
	p := RetryPolicy{MaxAttempts: 10, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond, Budget: time.Minute, StopOnUnknown: true}
	calls := 0
	err := p.Do(context.Background(), func(context.Context) error {
		calls++
		if calls < 3 {
			return Retryable(errors.New("not performed"))
		}
		return Unknown(errors.New("no answer"))
	}, nil)
	if calls != 3 || Classify(err) != OutcomeUnknown {
		t.Errorf("retryable twice then unknown: calls=%d err=%v, want 3 calls and unknown", calls, err)
	}
	p.StopOnUnknown = false
	calls = 0
	_ = p.Do(context.Background(), func(context.Context) error {
		calls++
		if calls < 3 {
			return Unknown(errors.New("no answer"))
		}
		return nil
	}, nil)
	if calls != 3 {
		t.Errorf("without StopOnUnknown: calls=%d, want unknown retried until ok (3)", calls)
	}
}
