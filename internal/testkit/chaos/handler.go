package chaos

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
	"time"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/internal/bridge"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/routesfile"
)

// Handler is the kind of effect the replicas, the reconciler's recovery
// and the operators' redrives run. Either way the processors are built
// with sbclaim.NewProcessor and route through an *sbclaim.Router.
type Handler string

const (
	// HandlerHTTP: the routes file's HTTP route (routesfile.Parse
	// with the replica's HTTP client), the effect for users who do not
	// write Go.
	HandlerHTTP Handler = "http"
	// HandlerGo: a Go sbclaim.HandlerFunc that calls the downstream
	// itself, as a user's handler calls its API's SDK: the delivery's
	// idempotency key as Idempotency-Key, the answers mapped to the
	// outcome wrappers (see goHandler).
	HandlerGo Handler = "go"
)

// goRouteVersion is the Go route's version, in its fingerprint.
const goRouteVersion = "chaos-go-1"

// newRouter is the public router of the run's handler kind, its requests
// sent through client. wrap, when set, wraps the Go handler (the replicas'
// fault injection); the HTTP route is wrapped by the caller, through the
// bridge (faultRouter).
func (h *harness) newRouter(client *http.Client, log *slog.Logger, wrap func(sbclaim.HandlerFunc) sbclaim.HandlerFunc) (*sbclaim.Router, error) {
	if h.cfg.Handler == HandlerGo {
		hf := h.goHandler(client)
		if wrap != nil {
			hf = wrap(hf)
		}
		return sbclaim.NewRouter(sbclaim.Route{
			Name:        "chaos",
			Match:       sbclaim.MatchSubject(EffectSubject),
			Handler:     hf,
			Recovery:    sbclaim.Recovery(h.cfg.Recovery),
			Version:     goRouteVersion,
			AllowNewKey: h.cfg.Answers == AnswersMixed,                                    // as the mixed routes file's allowNewKey
			Backoff:     sbclaim.Backoff{First: 100 * time.Millisecond, Max: time.Second}, // as the routes file's backoff
			// As the routes file's breaker: the faults fail single
			// messages, not the downstream; a breaker opened by them
			// would postpone the whole route for ProbeAfter.
			Breaker: sbclaim.Breaker{Off: true},
		})
	}
	file, err := routesfile.Parse(h.routes, &routesfile.Options{
		Getenv: func(string) string { return "" }, Logger: log, HTTPClient: client,
	})
	if err != nil {
		return nil, err
	}
	var r sbclaim.Router
	if err := r.AddRoutesFile(file); err != nil {
		return nil, err
	}
	return &r, nil
}

// internalRouter is newRouter's router as the reconciler and the
// operators' redrive take it (they are built on the internal packages).
func (h *harness) internalRouter(client *http.Client) (sideeffects.Router, error) {
	r, err := h.newRouter(client, h.log, nil)
	if err != nil {
		return nil, err
	}
	return bridge.RouterOf(r), nil
}

// goHandler is the Go handler: one POST of the message's body to the
// downstream's /effects, with d.IdempotencyKey() as Idempotency-Key, bounded
// by the run's EffectTimeout, sent through client (a replica's killable
// client, or the reconciler's and operators' tagged ones). It maps the
// answers as a careful user's handler would, to the same outcomes as the
// HTTP route's default table and the mixed answers' rules:
//
//   - 2xx: performed (nil);
//   - 503, 429, 408, or no connection obtained (refused, a dead replica's
//     client): NotPerformed;
//   - 402 (a decline): Rejected;
//   - 422, or 400 whose /error/type is idempotency_error: KeyConflict;
//   - anything else — a 500 stored under the key, a 409 (the key in
//     flight), a timeout after the request was written: a plain error, the
//     outcome unknown.
//
// It reports the status, Request-Id and the answer's /id or
// /error/charge on the claim (Delivery.ReportAnswer).
func (h *harness) goHandler(client *http.Client) sbclaim.HandlerFunc {
	url := h.srv.URL + "/effects"
	timeout := h.cfg.EffectTimeout
	return func(ctx context.Context, d *sbclaim.Delivery) error {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		var gotConn, wrote atomic.Bool
		ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
			GotConn: func(httptrace.GotConnInfo) { gotConn.Store(true) },
			WroteRequest: func(i httptrace.WroteRequestInfo) {
				if i.Err == nil {
					wrote.Store(true)
				}
			},
		})
		msg := d.Message()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(msg.Body))
		if err != nil {
			return sbclaim.Permanent(err)
		}
		contentType := "application/json"
		if msg.ContentType != nil {
			contentType = cmp.Or(*msg.ContentType, contentType)
		}
		req.Header.Set("Content-Type", contentType)
		req.Header.Set("Idempotency-Key", d.IdempotencyKey())
		resp, err := client.Do(req)
		if err != nil {
			if !wrote.Load() && (!gotConn.Load() || isDial(err)) {
				return sbclaim.NotPerformed(fmt.Errorf("not sent: %w", err))
			}
			return fmt.Errorf("no answer after the request was written (it may have been performed): %w", err)
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		var doc struct {
			ID    string `json:"id"`
			Error struct {
				Type   string `json:"type"`
				Charge string `json:"charge"`
			} `json:"error"`
		}
		_ = json.Unmarshal(body, &doc) // a body that is not this JSON leaves doc empty
		fields := map[string]string{}
		if v := cmp.Or(doc.ID, doc.Error.Charge); v != "" {
			fields["id"] = v
		}
		recorded := http.Header{}
		if v := resp.Header.Get("Request-Id"); v != "" {
			recorded.Set("Request-Id", v)
		}
		d.ReportAnswer(ctx, resp.StatusCode, recorded, fields)

		answer := fmt.Errorf("downstream answered %d", resp.StatusCode) // its Request-Id is on the claim (ReportAnswer)
		switch s := resp.StatusCode; {
		case s >= 200 && s < 300:
			return nil
		case s == http.StatusServiceUnavailable, s == http.StatusTooManyRequests, s == http.StatusRequestTimeout:
			return sbclaim.NotPerformed(answer)
		case s == http.StatusPaymentRequired:
			return sbclaim.Rejected(answer)
		case s == http.StatusUnprocessableEntity, s == http.StatusBadRequest && doc.Error.Type == "idempotency_error":
			return sbclaim.KeyConflict(answer)
		default:
			return answer // unknown: repeated only with the same key
		}
	}
}

// isDial reports whether err is a failure to connect (nothing was sent).
func isDial(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// faultHandler wraps a replica's Go handler with what faultRouter does for
// the HTTP route: the delivery's tag on its requests, and the lock-expiry
// fault.
func (h *harness) faultHandler(rep *replica) func(sbclaim.HandlerFunc) sbclaim.HandlerFunc {
	return func(next sbclaim.HandlerFunc) sbclaim.HandlerFunc {
		return func(ctx context.Context, d *sbclaim.Delivery) error {
			return next(h.beforeEffect(ctx, rep, d.Message()), d)
		}
	}
}
