package sideeffects

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// Bounds of an Answer (applied by ReportAnswer and by the HTTP effect, so
// whatever reaches a claim fits in it).
const (
	// MaxAnswerEntries bounds headers + fields together.
	MaxAnswerEntries = 16
	// MaxAnswerValueBytes bounds each value (cut on a UTF-8 boundary).
	MaxAnswerValueBytes = 256
	// MaxAnswerBytes bounds the whole Answer as JSON (json.Marshal).
	MaxAnswerBytes = 2048
)

// Answer is what a downstream answered one request: its status and the
// values a route chose to keep (record: response headers and JSON fields of
// the body), so that a claim can say "charged, id ch_123" or "declined,
// charge ch_456" without anyone searching the downstream. It is
// JSON-marshalable with stable names; the claim stores it as JSON.
//
// Values are text: a JSON string field is its string, any other JSON value
// its compact JSON text (a number 1000 is "1000", an object {"a":1} is
// `{"a":1}`). A header with several values is joined with ", ". Control
// characters are replaced by spaces, invalid UTF-8 by U+FFFD, secret
// header values (fromEnv) by redact.Mask. An Answer holds at most
// MaxAnswerEntries entries, each value at most MaxAnswerValueBytes, and at
// most MaxAnswerBytes as JSON; Truncated says something was cut or left
// out. A field or header the answer did not have is absent.
type Answer struct {
	// Status is the HTTP status (0 for an effect without one).
	Status int `json:"status"`
	// Step is the route step that got the answer ("" for a route without
	// steps).
	Step string `json:"step,omitempty"`
	// Headers maps canonical response header names to their values.
	Headers map[string]string `json:"headers,omitempty"`
	// Fields maps JSON Pointers (RFC 6901, e.g. "/id") to the values found
	// at them in the JSON body.
	Fields map[string]string `json:"fields,omitempty"`
	// Truncated is set when a value was cut or an entry left out to keep
	// the Answer within its bounds.
	Truncated bool `json:"truncated,omitempty"`
}

// Clone returns a deep copy of a (nil for nil).
func (a *Answer) Clone() *Answer {
	if a == nil {
		return nil
	}
	c := *a
	c.Headers = maps.Clone(a.Headers)
	c.Fields = maps.Clone(a.Fields)
	return &c
}

// bounded returns a copy of a that fits the bounds (see Answer).
func (a Answer) bounded() Answer {
	out := Answer{Status: a.Status, Step: cleanText(a.Step, 64), Truncated: a.Truncated}
	type entry struct {
		field   bool
		key, v  string
		dropped bool
	}
	var entries []*entry
	add := func(field bool, k, v string) {
		key := cleanText(k, 128)
		if key != cleanText(k, math.MaxInt) {
			out.Truncated = true
		}
		full := cleanText(v, math.MaxInt)
		e := &entry{field: field, key: key, v: cutUTF8(full, MaxAnswerValueBytes)}
		if len(e.v) < len(full) {
			out.Truncated = true
		}
		entries = append(entries, e)
	}
	for _, k := range slices.Sorted(maps.Keys(a.Headers)) {
		add(false, k, a.Headers[k])
	}
	for _, k := range slices.Sorted(maps.Keys(a.Fields)) {
		add(true, k, a.Fields[k])
	}
	if len(entries) > MaxAnswerEntries {
		entries = entries[:MaxAnswerEntries]
		out.Truncated = true
	}
	build := func() Answer {
		b := out
		b.Headers, b.Fields = nil, nil
		for _, e := range entries {
			if e.dropped {
				continue
			}
			m := &b.Headers
			if e.field {
				m = &b.Fields
			}
			if *m == nil {
				*m = map[string]string{}
			}
			(*m)[e.key] = e.v
		}
		return b
	}
	for {
		b := build()
		j, _ := json.Marshal(b)
		if len(j) <= MaxAnswerBytes {
			return b
		}
		out.Truncated = true
		// Halve the longest value; when every value is empty, leave out
		// the last entry.
		var longest *entry
		for _, e := range entries {
			if !e.dropped && (longest == nil || len(e.v) > len(longest.v)) {
				longest = e
			}
		}
		if longest != nil && longest.v != "" {
			longest.v = cutUTF8(longest.v, len(longest.v)/2)
			continue
		}
		for i := len(entries) - 1; i >= 0; i-- {
			if !entries[i].dropped {
				entries[i].dropped = true
				break
			}
		}
	}
}

// cleanText makes s safe to store and print: invalid UTF-8 becomes U+FFFD,
// control characters become spaces, and the result is cut to at most max
// bytes on a rune boundary.
func cleanText(s string, max int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, s)
	return cutUTF8(s, max)
}

// cutUTF8 returns the longest prefix of s of at most max bytes that ends
// on a rune boundary.
func cutUTF8(s string, max int) string {
	if len(s) <= max {
		return s
	}
	for max > 0 && !utf8.RuneStart(s[max]) {
		max--
	}
	return s[:max]
}

// AnswerRecorder collects the answers reported while an effect runs (see
// RecordAnswers). It is safe for concurrent use.
type AnswerRecorder struct {
	parent *AnswerRecorder
	mu     sync.Mutex
	last   *Answer
	count  int
}

type recorderKey struct{}

// RecordAnswers returns a context that records every Answer reported into
// it (by the HTTP effect, or by a Go effect calling ReportAnswer), and the
// recorder to read them from. Wrap the context passed to
// RetryPolicy.Do/Effect.Perform:
//
//	ctx, rec := sideeffects.RecordAnswers(ctx)
//	err := policy.Do(ctx, func(ctx context.Context) error { return h.Effect.Perform(ctx, msg, key) }, nil)
//	answer := rec.Last() // nil when no answer was received
//
// Recorders nest: an answer reported under an inner recorder is recorded by
// every recorder around it too (one per attempt inside one per delivery).
func RecordAnswers(ctx context.Context) (context.Context, *AnswerRecorder) {
	parent, _ := ctx.Value(recorderKey{}).(*AnswerRecorder)
	r := &AnswerRecorder{parent: parent}
	return context.WithValue(ctx, recorderKey{}, r), r
}

// ReportAnswer records a (bounded, see Answer) in the recorders of ctx;
// without one it does nothing. The HTTP effect reports every answer it
// receives, whatever its status; a Go effect may report its own.
func ReportAnswer(ctx context.Context, a Answer) {
	r, _ := ctx.Value(recorderKey{}).(*AnswerRecorder)
	if r == nil {
		return
	}
	b := a.bounded()
	for ; r != nil; r = r.parent {
		r.mu.Lock()
		r.last = b.Clone()
		r.count++
		r.mu.Unlock()
	}
}

// Last returns a copy of the last answer recorded, nil if none. For a
// route with steps that is the answer of the last step that got one; over
// several attempts, the last attempt's (an attempt that got no answer —
// a timeout — leaves the previous one in place).
func (r *AnswerRecorder) Last() *Answer {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last.Clone()
}

// Count returns how many answers were recorded.
func (r *AnswerRecorder) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.count
}

// AnswerOf returns a copy of the answer attached to the first *Error in
// err's chain that has one (nil if none): the downstream's answer to a
// failed attempt.
func AnswerOf(err error) *Answer {
	for err != nil {
		var e *Error
		if !errors.As(err, &e) {
			return nil
		}
		if e.Answer != nil {
			return e.Answer.Clone()
		}
		err = e.Err
	}
	return nil
}
