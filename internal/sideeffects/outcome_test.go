package sideeffects

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestOutcomeNamesAndText(t *testing.T) {
	t.Parallel()
	want := map[Outcome]string{
		OutcomeOK: "ok", OutcomeRetryable: "retryable", OutcomePermanent: "permanent",
		OutcomeUnknown: "unknown", OutcomeRejected: "rejected", OutcomeConflict: "conflict",
	}
	// The existing constants keep their values (they are stored and
	// compared by the processor and reconciler).
	if OutcomeOK != 0 || OutcomeRetryable != 1 || OutcomePermanent != 2 || OutcomeUnknown != 3 || OutcomeRejected != 4 || OutcomeConflict != 5 {
		t.Fatal("Outcome constant values changed")
	}
	for o, name := range want {
		if o.String() != name {
			t.Errorf("%d.String() = %q, want %q", int(o), o.String(), name)
		}
		b, err := o.MarshalText()
		if err != nil || string(b) != name {
			t.Errorf("%v.MarshalText() = %q, %v", o, b, err)
		}
		var back Outcome
		if err := back.UnmarshalText([]byte(name)); err != nil || back != o {
			t.Errorf("UnmarshalText(%q) = %v, %v", name, back, err)
		}
		if !o.Valid() {
			t.Errorf("%v not Valid", o)
		}
	}
	if _, err := ParseOutcome("maybe"); err == nil {
		t.Error("ParseOutcome accepted maybe")
	}
	if b, err := Outcome(42).MarshalText(); err != nil || string(b) != "Outcome(42)" || Outcome(42).Valid() {
		t.Errorf("Outcome(42): %q, %v, valid %v", b, err, Outcome(42).Valid())
	}
	var o Outcome
	if err := o.UnmarshalText([]byte("Outcome(42)")); err == nil {
		t.Error("UnmarshalText accepted Outcome(42)")
	}
	for o, final := range map[Outcome]bool{OutcomeOK: true, OutcomePermanent: true, OutcomeRejected: true, OutcomeConflict: true, OutcomeRetryable: false, OutcomeUnknown: false} {
		if o.Final() != final {
			t.Errorf("%v.Final() = %v", o, !final)
		}
	}
}

// TestOutcomeLogsByName: `"outcome": 2` in a JSON log line was the finding.
func TestOutcomeLogsByName(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("redrive", "outcome", OutcomePermanent, "other", OutcomeRejected)
	if !strings.Contains(buf.String(), `"outcome":"permanent"`) || !strings.Contains(buf.String(), `"other":"rejected"`) {
		t.Errorf("JSON log line: %s", buf.String())
	}
	b, err := json.Marshal(struct {
		Outcome Outcome `json:"outcome"`
	}{OutcomeConflict})
	if err != nil || string(b) != `{"outcome":"conflict"}` {
		t.Errorf("json.Marshal = %s, %v", b, err)
	}
	var v struct {
		Outcome Outcome `json:"outcome"`
	}
	if err := json.Unmarshal([]byte(`{"outcome":"unknown"}`), &v); err != nil || v.Outcome != OutcomeUnknown {
		t.Errorf("json.Unmarshal: %v %v", v.Outcome, err)
	}
}

func TestRejectedAndConflictWrappers(t *testing.T) {
	t.Parallel()
	base := errors.New("card_declined")
	for _, tt := range []struct {
		err  error
		want Outcome
	}{{Rejected(base), OutcomeRejected}, {Conflict(base), OutcomeConflict}} {
		if Classify(tt.err) != tt.want || !errors.Is(tt.err, base) {
			t.Errorf("%v: Classify %v, want %v", tt.err, Classify(tt.err), tt.want)
		}
		if !strings.HasPrefix(tt.err.Error(), tt.want.String()+": ") {
			t.Errorf("message %q does not start with the outcome", tt.err)
		}
	}
}

func TestRetryPolicyStopsOnRejectedAndConflict(t *testing.T) {
	t.Parallel()
	p := RetryPolicy{MaxAttempts: 10, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond, Budget: time.Minute}
	for _, final := range []func(error) error{Rejected, Conflict} {
		calls := 0
		err := p.Do(context.Background(), func(context.Context) error {
			calls++
			if calls == 1 {
				return Retryable(errors.New("503"))
			}
			return final(errors.New("final"))
		}, nil)
		if calls != 2 || Classify(err) != Classify(final(nil)) {
			t.Errorf("retryable then %v: calls=%d outcome=%v, want 2 calls and %v", Classify(final(nil)), calls, Classify(err), Classify(final(nil)))
		}
	}
}

// TestRetryUnknownThenFinalAnswerEndsUnknown: a rejected or conflict
// answer after an unknown attempt is the downstream's final word about
// the key (a replayed decline), so it is returned as is; retryable and
// permanent still stay unknown (TestRetryUnknownThenNotPerformedStaysUnknown).
func TestRetryUnknownThenFinalAnswerEndsUnknown(t *testing.T) {
	t.Parallel()
	for _, final := range []func(error) error{Rejected, Conflict} {
		want := final(errors.New("HTTP 402 replayed"))
		calls := 0
		err := RetryPolicy{MaxAttempts: 5, InitialInterval: time.Millisecond, Budget: time.Second}.Do(context.Background(),
			func(context.Context) error {
				calls++
				if calls == 1 {
					return Unknown(errors.New("timeout after the request was written"))
				}
				return want
			}, nil)
		if calls != 2 || err != want {
			t.Errorf("unknown then %v: calls=%d err=%v, want 2 calls and the final error unchanged", Classify(want), calls, err)
		}
	}
}
