package sideeffects

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"
)

// ClassifyHTTP is the routes file's default answer rules for a Go
// handler's own HTTP call: the response (or the transport error) of one
// request sent with the idempotency key, turned into nil (performed) or a
// classified *Error, exactly as an HTTP route without answer rules
// classifies it. The status table decides (see the package
// documentation), a Retry-After is honoured where the table says so, and
// a status in configErrors (nil: DefaultConfigErrors) is Misconfigured.
// The error carries the answer's status (and its Retry-After header) for
// the claim's history.
//
// A transport error is retryable when the request cannot have left (a
// dial or DNS failure); any other is unknown: without a trace of the
// request, the downstream may have received it. ClassifyHTTP neither reads
// nor closes resp.Body.
func ClassifyHTTP(resp *http.Response, err error, configErrors []int, now time.Time) error {
	if err != nil {
		if isDialError(err) {
			return Retryable(err)
		}
		return Unknown(err)
	}
	if resp == nil {
		return Unknown(errors.New("no HTTP response and no error"))
	}
	result := classifyStatus(resp.StatusCode, resp.Header, now, "")
	if result == nil {
		return nil
	}
	var e *Error
	if errors.As(result, &e) {
		a := Answer{Status: resp.StatusCode}
		if v := resp.Header.Get("Retry-After"); v != "" {
			a.Headers = map[string]string{"Retry-After": v}
		}
		a = a.bounded()
		e.Answer = &a
	}
	if configErrors == nil {
		configErrors = DefaultConfigErrors
	}
	if slices.Contains(configErrors, resp.StatusCode) {
		return Misconfigured(result)
	}
	return result
}

// RetryableAfter marks err as "not performed, may succeed later; try again
// no sooner than d": the retry loop and the delayed retries wait at least
// d (a longer backoff still wins). d <= 0 is Retryable(err).
func RetryableAfter(err error, d time.Duration) error {
	if err == nil {
		err = fmt.Errorf("not performed; retry after %s", d)
	}
	return &Error{Outcome: OutcomeRetryable, RetryAfter: max(d, 0), Err: err}
}
