package held_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/held"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
)

// attemptStore records the attempts Run writes; every other method is the
// embedded nil Store (Run calls none but Heartbeat, which the long
// interval keeps from running).
type attemptStore struct {
	claim.Store
	mu       sync.Mutex
	attempts []claim.RecordAttemptParams
}

func (s *attemptStore) RecordAttempt(_ context.Context, p *claim.RecordAttemptParams) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.attempts = append(s.attempts, *p)
	return nil
}

func (s *attemptStore) Heartbeat(context.Context, *claim.HeartbeatParams) error { return nil }

// TestRunRecordsEachAttemptsAnswer: every failed attempt is recorded with
// its own answer (none for an attempt that got none: a timeout), and the
// run's last answer comes back for the outcome write, converted to the
// claim's Answer; the key is the one given.
func TestRunRecordsEachAttemptsAnswer(t *testing.T) {
	st := &attemptStore{}
	var keys []string
	eff := sideeffects.EffectFunc(func(ctx context.Context, _ *azservicebus.ReceivedMessage, key string) error {
		keys = append(keys, key)
		switch len(keys) {
		case 1:
			sideeffects.ReportAnswer(ctx, sideeffects.Answer{Status: 500, Headers: map[string]string{"Request-Id": "req_1"}})
			return sideeffects.Unknown(errors.New("HTTP 500"))
		case 2:
			return sideeffects.Unknown(context.DeadlineExceeded) // no answer
		}
		sideeffects.ReportAnswer(ctx, sideeffects.Answer{Status: 402, Fields: map[string]string{"/error/charge": "ch_1"}})
		return sideeffects.Rejected(errors.New("HTTP 402: declined"))
	})
	res := held.Run(context.Background(), held.Params{
		Store: st, Claim: &claim.Claim{ID: 1, MessageID: "m"}, Effect: eff, Message: &azservicebus.ReceivedMessage{}, Key: "m:r1",
		Retry:             sideeffects.RetryPolicy{MaxAttempts: 5, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond},
		HeartbeatInterval: time.Hour, StoreTimeout: time.Second,
	})
	if res.Outcome != sideeffects.OutcomeRejected || res.Attempts != 3 {
		t.Fatalf("outcome %s after %d attempts, want rejected after 3", res.Outcome, res.Attempts)
	}
	for _, k := range keys {
		if k != "m:r1" {
			t.Fatalf("keys %q, want the given key every time", keys)
		}
	}
	if res.Answer == nil || res.Answer.Status != 402 || res.Answer.Fields["/error/charge"] != "ch_1" {
		t.Fatalf("the run's answer %+v, want the 402", res.Answer)
	}
	if len(st.attempts) != 3 {
		t.Fatalf("%d attempts recorded, want 3", len(st.attempts))
	}
	if a := st.attempts[0].Answer; a == nil || a.Status != 500 || a.Headers["Request-Id"] != "req_1" {
		t.Errorf("attempt 1 recorded answer %+v, want its 500", a)
	}
	if a := st.attempts[1].Answer; a != nil {
		t.Errorf("attempt 2 (no answer) recorded %+v, want none (the claim keeps the last)", a)
	}
	if a := st.attempts[2].Answer; a == nil || a.Status != 402 {
		t.Errorf("attempt 3 recorded answer %+v, want its 402", a)
	}
}

// TestRunFallsBackToTheErrorsAnswer: an effect that attaches its answer to
// the error without reporting it still has it recorded.
func TestRunFallsBackToTheErrorsAnswer(t *testing.T) {
	st := &attemptStore{}
	eff := sideeffects.EffectFunc(func(context.Context, *azservicebus.ReceivedMessage, string) error {
		return &sideeffects.Error{Outcome: sideeffects.OutcomeConflict, Answer: &sideeffects.Answer{Status: 400}, Err: errors.New("idempotency_error")}
	})
	res := held.Run(context.Background(), held.Params{
		Store: st, Claim: &claim.Claim{ID: 1}, Effect: eff, Message: &azservicebus.ReceivedMessage{}, Key: "k",
		HeartbeatInterval: time.Hour, StoreTimeout: time.Second,
	})
	if res.Outcome != sideeffects.OutcomeConflict || res.Answer == nil || res.Answer.Status != 400 {
		t.Fatalf("outcome %s answer %+v", res.Outcome, res.Answer)
	}
	if len(st.attempts) != 1 || st.attempts[0].Answer == nil || st.attempts[0].Answer.Status != 400 {
		t.Fatalf("recorded attempts %+v", st.attempts)
	}
}

func TestFailReason(t *testing.T) {
	for o, want := range map[sideeffects.Outcome]string{
		sideeffects.OutcomeRejected: claim.FailRejected, sideeffects.OutcomePermanent: claim.FailPermanent,
		sideeffects.OutcomeConflict: claim.FailConflict, sideeffects.OutcomeOK: "", sideeffects.OutcomeRetryable: "",
		sideeffects.OutcomeUnknown: "",
	} {
		if got := held.FailReason(o); got != want {
			t.Errorf("FailReason(%s) = %q, want %q", o, got, want)
		}
	}
	if held.ClaimAnswer(nil) != nil {
		t.Error("ClaimAnswer(nil) is not nil")
	}
}

func TestFailDescription(t *testing.T) {
	a := &claim.Answer{Status: 402}
	if got := held.FailDescription(errors.New("rejected: card_declined"), a); got != "HTTP 402: rejected: card_declined" {
		t.Errorf("without the status in the error: %q", got)
	}
	if got := held.FailDescription(errors.New("rejected: route p at h: HTTP 402 (answers[0]): declined"), a); got != "rejected: route p at h: HTTP 402 (answers[0]): declined" {
		t.Errorf("with the status in the error: %q", got)
	}
	if got := held.FailDescription(errors.New("permanent: bad"), nil); got != "permanent: bad" {
		t.Errorf("without an answer: %q", got)
	}
	long := held.FailDescription(errors.New(strings.Repeat("日", 3000)), a)
	if len(long) > claim.MaxErrorText+len("…") || !utf8.ValidString(long) {
		t.Errorf("a long error: %d bytes, valid UTF-8 %v", len(long), utf8.ValidString(long))
	}
}
