// Package rawhttp charges each payment event once through a payment API
// called with net/http, no SDK: the request carries the claim's
// idempotency key, and sbclaim.HTTPOutcome maps the answer to the outcome
// by the routes file's default rules — a 429 or 503 is not performed
// (retried after its Retry-After), a 401 opens the route's breaker, a 409
// or a 5xx may have been performed (repeated with the same key), another
// 4xx is refused for good.
package rawhttp

import (
	"bytes"
	"context"
	"errors"
	"net/http"

	"github.com/sbclaim/sbclaim"
)

// Payment is a payment.requested message's body.
type Payment struct {
	Order       int64 `json:"order"`
	AmountCents int64 `json:"amount_cents"`
}

// Charger posts payments to the payment API at URL.
type Charger struct {
	URL    string
	Client *http.Client
}

// Charge is the route's handler: the whole handler and outcome mapping.
func (c *Charger) Charge(ctx context.Context, d *sbclaim.Delivery, p Payment) error {
	if p.Order <= 0 || p.AmountCents <= 0 {
		return sbclaim.Permanent(errors.New("order and amount_cents must be positive"))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL, bytes.NewReader(d.Message().Body))
	if err != nil {
		return sbclaim.Permanent(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", d.IdempotencyKey())
	resp, err := c.Client.Do(req)
	if err == nil {
		defer resp.Body.Close()
	}
	return sbclaim.HTTPOutcome(resp, err)
}

// Route is the payments route, for a Router.
func (c *Charger) Route() sbclaim.Route {
	return sbclaim.Route{Name: "charge", Match: sbclaim.MatchSubject("payment.requested"), Handler: sbclaim.JSON(c.Charge)}
}
