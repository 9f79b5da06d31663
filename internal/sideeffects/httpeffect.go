package sideeffects

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// Application properties forwarded as request headers when a message
// carries them (W3C trace context and the Service Bus SDKs' diagnostic id).
var forwardedProperties = []string{"traceparent", "tracestate", "Diagnostic-Id"}

// HTTPRouter routes messages to the HTTP effects of a routes file. Build it
// with LoadRoutes or ParseRoutes; it is safe for concurrent use.
type HTTPRouter struct {
	routes []*httpRoute
	logger *slog.Logger
}

var _ Router = (*HTTPRouter)(nil)

// Route implements Router: the first route whose match selects the message
// wins. It checks the body of a `body: json` route here, before any claim.
func (r *HTTPRouter) Route(msg *azservicebus.ReceivedMessage) (Handler, error) {
	for _, rt := range r.routes {
		if !rt.match.Matches(msg) {
			continue
		}
		if msg.ContentType != nil {
			if err := CheckContentType(*msg.ContentType); err != nil {
				return Handler{}, err
			}
		}
		if rt.jsonBody {
			if err := checkJSONBody(rt.name, msg.Body); err != nil {
				return Handler{}, err
			}
		}
		return Handler{Name: rt.name, Effect: rt, Recovery: rt.recovery, Fingerprint: rt.fingerprint}, nil
	}
	return Handler{}, noRoute(msg)
}

// Names returns the route names in file order.
func (r *HTTPRouter) Names() []string {
	names := make([]string, len(r.routes))
	for i, rt := range r.routes {
		names[i] = rt.name
	}
	return names
}

func checkJSONBody(route string, body []byte) error {
	if json.Valid(body) {
		return nil
	}
	return &InputError{
		Reason:      ReasonMalformedBody,
		Description: fmt.Sprintf("route %q takes a JSON body; the message body (%d bytes) is not valid JSON", route, len(body)),
	}
}

// httpRoute is the Effect of one route: its steps, run in order.
type httpRoute struct {
	name        string
	match       Match
	jsonBody    bool
	contentType string
	recovery    Recovery
	fingerprint string // Fingerprint of the steps' names, methods and URLs
	steps       []*httpStep
	client      *http.Client
	logger      *slog.Logger
	redact      *redactor
}

type httpStep struct {
	name    string // "" for a route without steps
	method  string
	url     string // never logged or put in an error: see host
	host    string // what logs and errors say of the URL
	origin  string // scheme://host, for net/http's *url.Error
	headers []header
	timeout time.Duration
}

// label names a step in errors: route, step and host, never the URL's
// path or query.
func (r *httpRoute) label(st *httpStep) string {
	l := "route " + r.name
	if st.name != "" {
		l += " step " + st.name
	}
	return l + " at " + st.host
}

type header struct {
	name   string
	value  string
	secret bool // from the environment: never logged, redacted from errors
}

// Perform sends the message to each step in order, one attempt per step
// (the processor's RetryPolicy retries the whole effect). The idempotency
// key is key for a single-step route and key + ":" + step name per step, so
// a retry that re-runs an already performed step 1 sends the same key and
// the downstream replays its answer instead of acting twice.
//
// When a step fails after an earlier step was performed, the effect is
// partial: that is reported as OutcomeUnknown (the claim is kept, retried
// with the same keys, and flagged for an operator) rather than retryable or
// permanent (which would release it).
func (r *httpRoute) Perform(ctx context.Context, msg *azservicebus.ReceivedMessage, key string) error {
	for i, st := range r.steps {
		stepKey := key
		if st.name != "" {
			stepKey = key + ":" + st.name
		}
		err := r.send(ctx, msg, st, stepKey)
		if err == nil {
			continue
		}
		label := r.label(st)
		if i > 0 && Classify(err) != OutcomeUnknown {
			// Whatever this step's answer, an earlier step happened:
			// releasing the claim would say the effect never did.
			return Unknown(fmt.Errorf("%s: partial effect, earlier steps were performed: %w", label, err))
		}
		return fmt.Errorf("%s: %w", label, err)
	}
	return nil
}

// send makes one request and classifies its result.
func (r *httpRoute) send(ctx context.Context, msg *azservicebus.ReceivedMessage, st *httpStep, key string) error {
	ctx, cancel := context.WithTimeout(ctx, st.timeout)
	defer cancel()

	var progress sendProgressTrace
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) { progress.gotConn.Store(true) },
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			if info.Err == nil {
				progress.wrote.Store(true)
			}
		},
	})
	start := time.Now()
	result, status := r.attempt(ctx, msg, st, key, &progress)

	attrs := []slog.Attr{
		slog.String("route", r.name),
		slog.String("message_id", msg.MessageID),
		slog.String("idempotency_key", key),
		slog.String("method", st.method),
		slog.String("host", st.host),
		slog.Int("status", status),
		slog.String("outcome", Classify(result).String()),
		slog.Duration("duration", time.Since(start)),
	}
	if st.name != "" {
		attrs = append(attrs, slog.String("step", st.name))
	}
	if result != nil {
		attrs = append(attrs, slog.String("error", result.Error()))
		r.logger.LogAttrs(ctx, slog.LevelInfo, "http effect attempt failed", attrs...)
	} else {
		r.logger.LogAttrs(ctx, slog.LevelDebug, "http effect attempt", attrs...)
	}
	return result
}

// maxAnswerBody bounds what is read of a response body (for the excerpt,
// and drained so the connection can be reused).
const maxAnswerBody = 64 << 10

// attempt builds and sends the request and classifies the answer; status
// is 0 when there was none.
func (r *httpRoute) attempt(ctx context.Context, msg *azservicebus.ReceivedMessage, st *httpStep, key string, progress *sendProgressTrace) (result error, status int) {
	contentType := r.contentType
	if msg.ContentType != nil && *msg.ContentType != "" {
		contentType = *msg.ContentType
	}
	// A second line of defence behind Route and the processor: net/http
	// would refuse a CR/LF before connecting, which looks retryable and
	// would loop until the broker dead-letters the message.
	if err := CheckContentType(contentType); err != nil {
		var ie *InputError
		errors.As(err, &ie)
		return Permanent(fmt.Errorf("not sent: %s", ie.Description)), 0
	}
	req, err := http.NewRequestWithContext(ctx, st.method, st.url, bytes.NewReader(msg.Body))
	if err != nil {
		return Permanent(fmt.Errorf("build request: %w", scrubURLError(err, st.origin))), 0
	}
	for _, h := range st.headers {
		req.Header.Set(h.name, h.value)
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Idempotency-Key", key)
	for _, p := range forwardedProperties {
		if v, ok := msg.ApplicationProperties[p]; ok {
			if s := propertyText(v); s != "" && validHeaderValue(s) {
				req.Header.Set(p, s)
			}
		}
	}
	if req.Header.Get("User-Agent") == "" {
		req.Header.Set("User-Agent", "sbclaim")
	}

	resp, err := r.client.Do(req)
	if err != nil {
		// net/http quotes the whole URL: its path (a webhook's secret) and
		// query (an API key in ?code=) would end up in logs, the claim
		// and the DLQ.
		err = scrubURLError(err, st.origin)
		p := sendProgress{gotConn: progress.gotConn.Load(), wroteRequest: progress.wrote.Load()}
		msg := err.Error()
		if p.wroteRequest && isTimeout(err) {
			msg = fmt.Sprintf("no answer within %s after the request was written (the downstream may have performed it): %s", st.timeout, msg)
		}
		return classifyTransportError(redacted(r.redact.String(msg), err), p), 0
	}
	// Read (bounded) what the answer needs; the rest is not drained, so a
	// huge body costs a connection, not memory.
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBody))
	_ = resp.Body.Close()
	detail := ""
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		detail = excerpt(r.redact.String(string(body)))
	}
	return classifyResponse(resp, time.Now(), detail), resp.StatusCode
}

// sendProgressTrace is filled in by httptrace while a request is sent.
type sendProgressTrace struct{ gotConn, wrote atomic.Bool }

// scrubURLError replaces the URL that a *url.Error in err's chain quotes
// with origin (scheme://host).
func scrubURLError(err error, origin string) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		ue.URL = origin
	}
	return err
}

// redactedError carries a redacted message and keeps the original error
// for errors.Is/As (timeouts, net errors).
type redactedError struct {
	msg string
	err error
}

func redacted(msg string, err error) error { return &redactedError{msg: msg, err: err} }

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }
