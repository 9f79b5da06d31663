package sideeffects

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// statusRule is one row of the response classification table.
type statusRule struct {
	from, to   int // inclusive status range
	outcome    Outcome
	retryAfter bool   // honour the Retry-After header
	meaning    string // why, for error messages and the docs
}

// statusTable is THE classification of downstream answers; the first row
// whose range holds the status wins. doc.go shows the same table in
// markdown; TestStatusTableMatchesDoc keeps the two in agreement.
var statusTable = []statusRule{
	{200, 299, OutcomeOK, false, "performed (or replayed by the downstream's idempotency layer)"},
	{300, 399, OutcomePermanent, false, "redirects are not followed; the route URL is wrong"},
	{408, 408, OutcomeRetryable, true, "the downstream gave up reading the request; not performed"},
	{409, 409, OutcomeUnknown, true, "the same key is still in flight downstream; retry later with the same key"},
	{422, 422, OutcomeConflict, false, "the key was already used with another payload"},
	{429, 429, OutcomeRetryable, true, "rate limited; not performed"},
	{400, 499, OutcomePermanent, false, "the downstream rejected the request; not performed"},
	{500, 500, OutcomeUnknown, false, "the downstream failed; it may have performed the effect"},
	{502, 502, OutcomeUnknown, false, "a gateway failed; the downstream may have performed the effect"},
	{503, 503, OutcomeRetryable, true, "the downstream is unavailable; not performed"},
	{504, 504, OutcomeUnknown, false, "a gateway timed out; the downstream may have performed the effect"},
	{500, 599, OutcomeUnknown, false, "the downstream failed; it may have performed the effect"},
}

// StatusOutcome classifies an HTTP status from a downstream, following the
// table in the package documentation. A status outside 200–599 is
// OutcomeUnknown.
func StatusOutcome(status int) Outcome {
	if r, ok := statusRuleFor(status); ok {
		return r.outcome
	}
	return OutcomeUnknown
}

func statusRuleFor(status int) (statusRule, bool) {
	for _, r := range statusTable {
		if status >= r.from && status <= r.to {
			return r, true
		}
	}
	return statusRule{}, false
}

// classifyResponse turns a downstream answer into nil or a classified
// *Error by the default table (see classifyStatus).
func classifyResponse(resp *http.Response, now time.Time, detail string) error {
	return classifyStatus(resp.StatusCode, resp.Header, now, detail)
}

// classifyStatus classifies an answer by statusTable: nil or a classified
// *Error. detail is appended to the message (a short, redacted excerpt of
// the response body).
func classifyStatus(status int, header http.Header, now time.Time, detail string) error {
	r, ok := statusRuleFor(status)
	if !ok {
		r = statusRule{outcome: OutcomeUnknown, meaning: "unexpected status"}
	}
	if r.outcome == OutcomeOK {
		return nil
	}
	msg := "HTTP " + strconv.Itoa(status) + ": " + r.meaning
	if detail != "" {
		msg += ": " + detail
	}
	e := &Error{Outcome: r.outcome, Err: errors.New(msg)}
	if r.retryAfter {
		e.RetryAfter = ParseRetryAfter(header.Get("Retry-After"), now)
	}
	return e
}

// ParseRetryAfter reads a Retry-After header value: delay-seconds or an
// HTTP-date (relative to now). It returns 0 for an empty, invalid or past
// value.
func ParseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		const maxSecs = int64(1<<63-1) / int64(time.Second)
		return time.Duration(min(secs, maxSecs)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}

// sendProgress is what httptrace saw of one request before it failed.
type sendProgress struct {
	gotConn      bool // a connection was obtained (dial, DNS and TLS done)
	wroteRequest bool // the whole request was written without error
}

// classifyTransportError sorts a failure to get an answer. The effect was
// definitely not performed only when nothing could have reached the
// downstream: no connection was obtained (DNS, dial, TLS, or the context
// ended while connecting), or the error is a dial error. Once any part of
// the request may have been written, the outcome is unknown — including a
// timeout while waiting for the answer.
func classifyTransportError(err error, p sendProgress) error {
	if !p.wroteRequest && (!p.gotConn || isDialError(err)) {
		return Retryable(err)
	}
	return Unknown(err)
}

func isDialError(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var dns *net.DNSError
	return errors.As(err, &dns)
}

// isTimeout reports whether err is a deadline or network timeout.
func isTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
