package sideeffects

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// parsePointer splits a JSON Pointer (RFC 6901) into its reference
// tokens: "" is the whole document; otherwise it starts with "/" and "~"
// only appears as "~0" (a "~") or "~1" (a "/").
func parsePointer(p string) ([]string, error) {
	if p == "" {
		return []string{}, nil
	}
	if p[0] != '/' {
		return nil, errors.New("a JSON Pointer starts with /")
	}
	tokens := strings.Split(p[1:], "/")
	for i, t := range tokens {
		for j := 0; j < len(t); j++ {
			if t[j] == '~' && (j+1 == len(t) || t[j+1] != '0' && t[j+1] != '1') {
				return nil, errors.New(`"~" must be written ~0, and "/" inside a name ~1`)
			}
		}
		// ~1 first, then ~0: "~01" is the name "~1".
		tokens[i] = strings.ReplaceAll(strings.ReplaceAll(t, "~1", "/"), "~0", "~")
	}
	return tokens, nil
}

// lookupPointer evaluates pointer tokens against a decoded JSON document
// (objects as map[string]any, arrays as []any). An array index is "0" or
// digits without a leading zero; "-" (past the end) never exists.
func lookupPointer(doc any, tokens []string) (any, bool) {
	for _, t := range tokens {
		switch v := doc.(type) {
		case map[string]any:
			e, ok := v[t]
			if !ok {
				return nil, false
			}
			doc = e
		case []any:
			if t == "" || len(t) > 1 && t[0] == '0' || strings.Trim(t, "0123456789") != "" {
				return nil, false
			}
			i, err := strconv.Atoi(t)
			if err != nil || i >= len(v) {
				return nil, false
			}
			doc = v[i]
		default:
			return nil, false
		}
	}
	return doc, true
}

// decodeJSON decodes a whole JSON document, numbers as json.Number. ok is
// false when body is not exactly one JSON value.
func decodeJSON(body []byte) (doc any, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false
	}
	return doc, true
}

// jsonText is how a JSON value is recorded in an Answer: a string as
// itself, anything else as its compact JSON text.
func jsonText(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case json.Number:
		return v.String()
	}
	b, err := json.Marshal(v)
	if err != nil {
		return ""
	}
	return string(b)
}

// answerRule is one rule of a route's answers list.
type answerRule struct {
	where    string // "answers[1]" or "steps[0].answers[1]": for errors and logs
	from, to int    // inclusive status range
	field    string // JSON Pointer as written; "" for no field condition
	tokens   []string
	equals   any    // string, bool, int64 or float64
	header   string // canonical response header name; "" for no header condition
	value    string // the header's value, compared without case
	outcome  Outcome
	flag     bool // outcome "flag": unknown, and a person must decide (NeedsOperator)
}

// matches reports whether the rule applies to an answer; doc is the
// decoded JSON body (hasDoc false when it is not JSON, or too large).
func (r *answerRule) matches(status int, header http.Header, doc any, hasDoc bool) bool {
	if status < r.from || status > r.to {
		return false
	}
	if r.header != "" && !headerHas(header, r.header, r.value) {
		return false
	}
	if r.field == "" {
		return true
	}
	if !hasDoc {
		return false
	}
	v, ok := lookupPointer(doc, r.tokens)
	return ok && jsonEquals(v, r.equals)
}

// headerHas reports whether one of the header's values (one per field
// line; a comma-separated list is not split) equals value, ignoring case
// and surrounding white space. The name is matched without case.
func headerHas(h http.Header, name, value string) bool {
	for _, v := range h.Values(name) {
		if strings.EqualFold(strings.TrimSpace(v), value) {
			return true
		}
	}
	return false
}

// jsonEquals compares a decoded JSON value with a rule's expected value:
// same type, same value (numbers numerically).
func jsonEquals(v, want any) bool {
	switch want := want.(type) {
	case string:
		s, ok := v.(string)
		return ok && s == want
	case bool:
		b, ok := v.(bool)
		return ok && b == want
	case int64:
		n, ok := v.(json.Number)
		if !ok {
			return false
		}
		if i, err := n.Int64(); err == nil {
			return i == want
		}
		f, err := n.Float64()
		return err == nil && f == float64(want)
	case float64:
		n, ok := v.(json.Number)
		if !ok {
			return false
		}
		f, err := n.Float64()
		return err == nil && f == want
	}
	return false
}

// ruleMeaning says what an answer rule's outcome means, for the error.
var ruleMeaning = map[Outcome]string{
	OutcomeRejected:  "a final answer: the effect is finished and is not repeated",
	OutcomeConflict:  "the key was already used with another payload",
	OutcomePermanent: "the downstream rejected the request; not performed",
	OutcomeRetryable: "not performed; may succeed later",
	OutcomeUnknown:   "the downstream may have performed the effect",
}

// flagMeaning is what an answer rule's outcome "flag" means, for the error
// (and so for the flag reason).
const flagMeaning = "a person must decide: a repeat with this key would get the same answer (a failure the downstream stored under the key), so the claim is flagged instead of retried"

// parseStatus reads a rule's status: "402", "400-499" or "4xx" (the schema
// has checked the syntax).
func parseStatus(s string) (from, to int, err error) {
	switch {
	case len(s) == 3 && strings.HasSuffix(s, "xx"):
		c := int(s[0]-'0') * 100
		return c, c + 99, nil
	case strings.Contains(s, "-"):
		a, b, _ := strings.Cut(s, "-")
		from, err1 := strconv.Atoi(a)
		to, err2 := strconv.Atoi(b)
		if err1 != nil || err2 != nil {
			return 0, 0, fmt.Errorf("%q is not a status range", s)
		}
		if from > to {
			return 0, 0, fmt.Errorf("the range %q starts after it ends", s)
		}
		return from, to, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 100 || n > 599 {
		return 0, 0, fmt.Errorf("%q is not a status code", s)
	}
	return n, n, nil
}

// recordSpec is what of an answer a step keeps.
type recordRT struct {
	headers []string // canonical names
	fields  []recordField
}

type recordField struct {
	pointer string
	tokens  []string
}

// alwaysSecretHeaders can never be recorded: they carry credentials.
var alwaysSecretHeaders = []string{"Authorization", "Proxy-Authorization", "Cookie", "Set-Cookie"}

// classifyAnswer classifies an answer with the step's rules, then the
// default table. It returns the rule that decided ("" for the table) and
// nil (ok) or a classified *Error carrying answer; detail (called only for
// an error) gives the excerpt for its message.
func classifyAnswer(rules []answerRule, status int, header http.Header, doc any, hasDoc bool, now time.Time, detail func() string, answer *Answer) (string, error) {
	for i := range rules {
		r := &rules[i]
		if !r.matches(status, header, doc, hasDoc) {
			continue
		}
		if r.outcome == OutcomeOK {
			return r.where, nil
		}
		meaning := ruleMeaning[r.outcome]
		if r.flag {
			meaning = flagMeaning
		}
		msg := "HTTP " + strconv.Itoa(status) + " (" + r.where + "): " + meaning
		if d := detail(); d != "" {
			msg += ": " + d
		}
		e := &Error{Outcome: r.outcome, Operator: r.flag, Answer: answer, Err: errors.New(msg)}
		// A retried outcome waits as long as the downstream asked.
		if !r.flag && (r.outcome == OutcomeRetryable || r.outcome == OutcomeUnknown) {
			e.RetryAfter = ParseRetryAfter(header.Get("Retry-After"), now)
		}
		return r.where, e
	}
	if r, ok := statusRuleFor(status); ok && r.outcome == OutcomeOK {
		return "", nil
	}
	err := classifyStatus(status, header, now, detail())
	var e *Error
	if errors.As(err, &e) {
		e.Answer = answer
	}
	return "", err
}
