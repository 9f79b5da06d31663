package sbclaim

import (
	"net/http"
	"time"

	"github.com/sbclaim/sbclaim/internal/sideeffects"
)

// HTTPOutcome turns the answer to a handler's own HTTP request (sent with
// d.IdempotencyKey() as its idempotency key) into what the handler
// returns, by the same default answer rules as an HTTP route of the
// routes file — so a raw-HTTP handler ends in one call:
//
//	resp, err := client.Do(req)
//	if err == nil {
//		defer resp.Body.Close()
//	}
//	return sbclaim.HTTPOutcome(resp, err)
//
// The rules (the first that matches wins):
//
//   - 2xx: nil (performed).
//   - 401, 403, 407: Misconfigured (the route's breaker opens).
//   - 408, 429, 503: NotPerformed, waiting at least the answer's
//     Retry-After.
//   - 409: unknown (the same key is still in flight downstream), waiting
//     at least the answer's Retry-After.
//   - 422: KeyConflict. Other 3xx and 4xx: Permanent.
//   - 500, 502, 504 and any other 5xx, or a status outside 200–599:
//     unknown (the downstream may have performed it).
//   - a transport error: NotPerformed when the request cannot have left
//     (a dial or DNS failure), unknown otherwise.
//
// The returned error carries the status (and Retry-After) for the
// claim's history, and names the status and its meaning. HTTPOutcome
// neither reads nor closes resp.Body. For a downstream whose answers
// differ (a decline as a 402 that is final: Rejected), check those first
// and fall through to HTTPOutcome.
func HTTPOutcome(resp *http.Response, err error) error {
	return sideeffects.ClassifyHTTP(resp, err, nil, time.Now())
}

// NotPerformedAfter is NotPerformed with the delay the downstream asked
// for ("not performed, try again in 2 minutes"): within the delivery the
// next attempt waits at least d, and the route's delayed retry (Backoff)
// waits at least d when it is longer than the schedule's. d <= 0 is
// NotPerformed. A nil err gets a message naming the delay.
func NotPerformedAfter(err error, d time.Duration) error {
	return sideeffects.RetryableAfter(err, d)
}
