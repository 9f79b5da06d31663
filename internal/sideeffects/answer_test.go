package sideeffects

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestAnswerJSONFieldNames(t *testing.T) {
	t.Parallel()
	a := Answer{Status: 402, Headers: map[string]string{"Request-Id": "req_1"}, Fields: map[string]string{"/error/charge": "ch_1"}}
	b, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"status":402,"headers":{"Request-Id":"req_1"},"fields":{"/error/charge":"ch_1"}}`
	if string(b) != want {
		t.Errorf("json = %s\nwant   %s", b, want)
	}
	var back Answer
	if err := json.Unmarshal(b, &back); err != nil || back.Status != 402 || back.Fields["/error/charge"] != "ch_1" {
		t.Errorf("round trip: %+v %v", back, err)
	}
	if b, _ := json.Marshal(Answer{Status: 201}); string(b) != `{"status":201}` {
		t.Errorf("empty answer: %s", b)
	}
}

func TestAnswerBounds(t *testing.T) {
	t.Parallel()
	// A value over the limit is cut on a rune boundary.
	long := strings.Repeat("é", 200) // 400 bytes
	a := Answer{Status: 200, Fields: map[string]string{"/name": long}}.bounded()
	v := a.Fields["/name"]
	if len(v) > MaxAnswerValueBytes || !utf8.ValidString(v) || !a.Truncated {
		t.Errorf("value: %d bytes, valid %v, truncated %v", len(v), utf8.ValidString(v), a.Truncated)
	}
	// Control characters and invalid UTF-8 never reach a claim.
	a = Answer{Headers: map[string]string{"X-Evil": "a\r\nb\x1b[31mc\xff"}}.bounded()
	if got := a.Headers["X-Evil"]; got != "a  b [31mc\uFFFD" {
		t.Errorf("cleaned = %q", got)
	}
	if a.Truncated {
		t.Error("cleaning alone marked the answer truncated")
	}
	// Too many entries: MaxAnswerEntries kept, headers first, sorted.
	many := Answer{Headers: map[string]string{}, Fields: map[string]string{}}
	for i := range 10 {
		many.Headers[fmt.Sprintf("H-%02d", i)] = "h"
		many.Fields[fmt.Sprintf("/f%02d", i)] = "f"
	}
	a = many.bounded()
	if len(a.Headers)+len(a.Fields) != MaxAnswerEntries || len(a.Headers) != 10 || !a.Truncated {
		t.Errorf("entries: %d headers %d fields truncated %v", len(a.Headers), len(a.Fields), a.Truncated)
	}
	if _, ok := a.Fields["/f05"]; !ok {
		t.Errorf("fields kept are not the first in order: %v", a.Fields)
	}
	// The whole JSON stays within MaxAnswerBytes, even with values that
	// grow when escaped.
	big := Answer{Status: 500, Fields: map[string]string{}}
	for i := range MaxAnswerEntries {
		big.Fields[fmt.Sprintf("/%s%d", strings.Repeat("k", 100), i)] = strings.Repeat(`<"&>`, 64)
	}
	a = big.bounded()
	b, _ := json.Marshal(a)
	if len(b) > MaxAnswerBytes || !a.Truncated || len(a.Fields) == 0 {
		t.Errorf("JSON %d bytes (max %d), truncated %v, %d fields", len(b), MaxAnswerBytes, a.Truncated, len(a.Fields))
	}
	// Within bounds: unchanged.
	small := Answer{Status: 201, Fields: map[string]string{"/id": "ch_1"}}
	if got := small.bounded(); got.Truncated || got.Fields["/id"] != "ch_1" {
		t.Errorf("small answer changed: %+v", got)
	}
}

func TestRecordAnswers(t *testing.T) {
	t.Parallel()
	ReportAnswer(context.Background(), Answer{Status: 200}) // no recorder: nothing happens

	ctx, outer := RecordAnswers(context.Background())
	if outer.Last() != nil || outer.Count() != 0 {
		t.Fatal("a new recorder is not empty")
	}
	ReportAnswer(ctx, Answer{Status: 500})
	inner, rec := RecordAnswers(ctx)
	ReportAnswer(inner, Answer{Status: 201, Fields: map[string]string{"/id": "x"}})
	if got := rec.Last(); got == nil || got.Status != 201 || rec.Count() != 1 {
		t.Errorf("inner: %+v (%d)", got, rec.Count())
	}
	got := outer.Last()
	if got == nil || got.Status != 201 || outer.Count() != 2 {
		t.Errorf("outer: %+v (%d), want the inner answer too", got, outer.Count())
	}
	got.Fields["/id"] = "changed"
	if outer.Last().Fields["/id"] != "x" {
		t.Error("Last returned the recorder's own map")
	}
	// Reported answers are bounded.
	ReportAnswer(ctx, Answer{Status: 200, Fields: map[string]string{"/a": strings.Repeat("x", 1000)}})
	if a := outer.Last(); len(a.Fields["/a"]) != MaxAnswerValueBytes || !a.Truncated {
		t.Errorf("reported answer not bounded: %d bytes", len(a.Fields["/a"]))
	}
}

func TestAnswerOf(t *testing.T) {
	t.Parallel()
	a := &Answer{Status: 402}
	err := fmt.Errorf("route payments: %w", &Error{Outcome: OutcomeRejected, Answer: a, Err: errors.New("declined")})
	if got := AnswerOf(err); got == nil || got.Status != 402 || got == a {
		t.Errorf("AnswerOf = %+v", got)
	}
	// An outer *Error without an answer (RetryPolicy's unknown wrap) does
	// not hide the inner one.
	wrapped := Unknown(fmt.Errorf("earlier attempt: %w", err))
	if got := AnswerOf(wrapped); got == nil || got.Status != 402 {
		t.Errorf("AnswerOf(wrapped) = %+v", got)
	}
	if AnswerOf(errors.New("plain")) != nil || AnswerOf(nil) != nil || AnswerOf(Retryable(errors.New("dial"))) != nil {
		t.Error("AnswerOf found an answer where there is none")
	}
	// RetryPolicy keeps the answer when it turns a later answer unknown.
	calls := 0
	out := RetryPolicy{MaxAttempts: 2, InitialInterval: time.Millisecond, Budget: time.Second}.Do(context.Background(),
		func(context.Context) error {
			calls++
			if calls == 1 {
				return Unknown(errors.New("timeout"))
			}
			return &Error{Outcome: OutcomePermanent, Answer: &Answer{Status: 400}, Err: errors.New("400")}
		}, nil)
	var e *Error
	if Classify(out) != OutcomeUnknown || !errors.As(out, &e) || e.Answer == nil || e.Answer.Status != 400 {
		t.Errorf("Do: %v, answer %+v", out, e)
	}
}
