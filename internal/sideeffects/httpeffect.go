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
	"strings"
	"sync/atomic"
	"time"
	"unicode"

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
	url     string
	headers []header
	timeout time.Duration
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
		label := "route " + r.name
		if st.name != "" {
			label += " step " + st.name
		}
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

	var progress struct{ gotConn, wrote atomic.Bool }
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) { progress.gotConn.Store(true) },
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			if info.Err == nil {
				progress.wrote.Store(true)
			}
		},
	})
	req, err := http.NewRequestWithContext(ctx, st.method, st.url, bytes.NewReader(msg.Body))
	if err != nil {
		return Permanent(fmt.Errorf("build request: %w", err))
	}
	for _, h := range st.headers {
		req.Header.Set(h.name, h.value)
	}
	contentType := r.contentType
	if msg.ContentType != nil && *msg.ContentType != "" {
		contentType = *msg.ContentType
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

	start := time.Now()
	resp, err := r.client.Do(req)
	var result error
	status := 0
	if err != nil {
		// net/http quotes the whole URL, query included (an API key in
		// ?code= would end up in logs, the claim and the DLQ).
		var ue *url.Error
		if errors.As(err, &ue) {
			ue.URL = logURL(st.url)
		}
		p := sendProgress{gotConn: progress.gotConn.Load(), wroteRequest: progress.wrote.Load()}
		msg := err.Error()
		if p.wroteRequest && isTimeout(err) {
			msg = fmt.Sprintf("no answer within %s after the request was written (the downstream may have performed it): %s", st.timeout, msg)
		}
		result = classifyTransportError(redacted(r.redact.String(msg), err), p)
	} else {
		status = resp.StatusCode
		detail := ""
		if status < 200 || status > 299 {
			detail = r.redact.String(excerpt(resp.Body))
		}
		// Drain (bounded) so the connection can be reused.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		_ = resp.Body.Close()
		result = classifyResponse(resp, time.Now(), detail)
	}

	attrs := []slog.Attr{
		slog.String("route", r.name),
		slog.String("message_id", msg.MessageID),
		slog.String("idempotency_key", key),
		slog.String("method", st.method),
		slog.String("url", logURL(st.url)),
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

// excerpt reads a short, printable excerpt of a response body for an error
// message.
func excerpt(body io.Reader) string {
	b, _ := io.ReadAll(io.LimitReader(body, 512))
	s := strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return ' '
	}, string(b))
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > 200 {
		s = string(r[:200]) + "…"
	}
	return s
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

// logURL is a route URL fit for logs and errors: query values are
// replaced, since some APIs take their key there (Azure Functions' ?code=).
func logURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "[unparseable URL]"
	}
	if u.RawQuery != "" {
		q := u.Query()
		for k := range q {
			q[k] = []string{"REDACTED"}
		}
		u.RawQuery = q.Encode()
	}
	return u.Redacted()
}
