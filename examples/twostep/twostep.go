// Package twostep is a handler that makes two calls for one message:
// create the order's customer, then charge it. Each call is sent with its
// own step key (Delivery.StepKey), the same on every attempt: when the
// handler is run again after a failure between or during the steps, the
// downstream replays the steps it already performed (the same customer)
// and performs the rest once.
package twostep

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/sbclaim/sbclaim"
)

// Event is a payment event's body.
type Event struct {
	Order       int64  `json:"order"`
	AmountCents int64  `json:"amount_cents"`
	Email       string `json:"email"`
}

// Client calls the payments API: POST /customers, then POST /charges,
// JSON both ways, deduplicated on the Idempotency-Key header.
type Client struct {
	BaseURL string
	HTTP    *http.Client // default http.DefaultClient
}

// Handler returns the handler that creates the customer and charges it.
func Handler(c *Client) sbclaim.HandlerFunc {
	return func(ctx context.Context, d *sbclaim.Delivery) error {
		var ev Event
		if err := json.Unmarshal(d.Message().Body, &ev); err != nil {
			return sbclaim.Permanent(err)
		}
		var customer struct{ ID string }
		if err := c.post(ctx, "/customers", d.StepKey("customer"), map[string]any{"email": ev.Email}, &customer); err != nil {
			return fmt.Errorf("create customer: %w", err)
		}
		var charge struct{ ID string }
		if err := c.post(ctx, "/charges", d.StepKey("charge"), map[string]any{
			"customer": customer.ID, "amount_cents": ev.AmountCents, "order": ev.Order,
		}, &charge); err != nil {
			return fmt.Errorf("charge customer %s: %w", customer.ID, err)
		}
		d.ReportAnswer(ctx, http.StatusOK, nil, map[string]string{"customer": customer.ID, "charge": charge.ID})
		return nil
	}
}

// post sends one step and classifies its answer: a 2xx is done; a 402 is
// the API's final answer (Rejected); another 4xx will never succeed
// (Permanent); a 429 or 503 did nothing (NotPerformed); anything else, a
// broken connection included, is unknown and repeated with the same key.
// NotPerformed at step 2 releases the claim although step 1 was done: the
// next run sends step 1 again with its key, so the API replays it.
func (c *Client) post(ctx context.Context, path, key string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return sbclaim.Permanent(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.BaseURL+path, bytes.NewReader(body))
	if err != nil {
		return sbclaim.Permanent(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch status := resp.StatusCode; {
	case status >= 200 && status < 300:
		return json.NewDecoder(resp.Body).Decode(out)
	case status == http.StatusPaymentRequired:
		return sbclaim.Rejected(fmt.Errorf("%s: %s", path, resp.Status))
	case status == http.StatusTooManyRequests, status == http.StatusServiceUnavailable:
		return sbclaim.NotPerformed(fmt.Errorf("%s: %s", path, resp.Status))
	case status >= 400 && status < 500:
		return sbclaim.Permanent(fmt.Errorf("%s: %s", path, resp.Status))
	default:
		return fmt.Errorf("%s: %s", path, resp.Status)
	}
}
