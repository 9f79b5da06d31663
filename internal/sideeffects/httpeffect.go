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
	"sync"
	"sync/atomic"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/redact"
)

// Application properties forwarded as request headers when a message
// carries them (W3C trace context and the Service Bus SDKs' diagnostic id).
var forwardedProperties = []string{"traceparent", "tracestate", "Diagnostic-Id"}

// HTTPRouter routes messages to the HTTP effects of a routes file. Build it
// with BuildRoutes (routesfile.Parse and Load); it is safe for concurrent
// use.
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
		if rt.mapped || rt.followMsg {
			if err := rt.checkMapping(msg.Body); err != nil {
				return Handler{}, err
			}
		}
		return Handler{Name: rt.name, Effect: rt, Recovery: rt.recovery, Fingerprint: rt.fingerprint, AllowNewKey: rt.allowNewKey, HoldSessionOnFailure: rt.holdSession,
			KeyLifetime: rt.keyLifetime, KeyForm: rt.keyForm, Backoff: rt.backoff, Breaker: rt.breaker}, nil
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

// checkMapping builds every mapped step's request from body, so a message
// that cannot be mapped is dead-lettered (ReasonMappingFailed) before any
// claim rather than failing after it.
func (r *httpRoute) checkMapping(body []byte) error {
	doc, ok := decodeJSON(body)
	if !ok {
		return &InputError{
			Reason:      ReasonMappingFailed,
			Description: fmt.Sprintf("route %q builds its request from a JSON message; the message body (%d bytes) is not valid JSON", r.name, len(body)),
		}
	}
	for _, st := range r.steps {
		if st.request == nil {
			continue
		}
		if _, _, err := st.request.build(doc); err != nil {
			where := fmt.Sprintf("route %q", r.name)
			if st.name != "" {
				where += fmt.Sprintf(" step %q", st.name)
			}
			return &InputError{Reason: ReasonMappingFailed, Description: where + ": " + err.Error()}
		}
	}
	// The follow-ups' message side, before any claim: once the effect has
	// happened, a message they cannot be built from would be too late.
	for _, fu := range r.followUps {
		if _, err := fu.build(doc, nil); err != nil {
			return &InputError{Reason: ReasonMappingFailed, Description: fmt.Sprintf("route %q follow-up to %q: %v", r.name, fu.to, err)}
		}
	}
	return nil
}

// httpRoute is the Effect of one route: its steps, run in order.
type httpRoute struct {
	name        string
	match       Match
	jsonBody    bool
	contentType string
	recovery    Recovery
	allowNewKey bool
	holdSession bool // Handler.HoldSessionOnFailure
	backoff     Backoff
	breaker     Breaker
	configErrs  map[int]bool  // statuses that say the route is misconfigured (Misconfigured)
	keyLifetime time.Duration // how long the downstream keeps keys; 0: for ever
	keyForm     claim.KeyForm // "" : scoped
	excerpt     bool          // put a response excerpt in error messages
	fingerprint string        // Fingerprint of the steps' names, methods and URLs (and mappings)
	mapped      bool          // a step builds its request from the message (request)
	steps       []*httpStep
	followUps   []*followUpRT // published once the effect succeeded (followups.go)
	followMsg   bool          // a follow-up reads the message
	client      *http.Client
	logger      *slog.Logger
	redact      *redact.Scrubber
}

type httpStep struct {
	name    string // "" for a route without steps
	method  string
	url     string // never logged or put in an error: see host
	host    string // what logs and errors say of the URL
	origin  string // scheme://host, for net/http's *url.Error
	headers []header
	timeout time.Duration
	rules   []answerRule // the step's, then the route's
	record  recordRT
	// needJSON: a rule or the record reads the JSON body.
	needJSON bool
	// request, when set, builds the URL (path placeholders) and, for a
	// form or json mapping, the body from the message's JSON; contentType
	// is then the mapped body's, whatever the message's.
	request     *requestMap
	contentType string
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
// key is key for a single-step route and, per step, key extended with the
// step's name in the claim's key form (StepKey: key + ":" + step for a raw
// claim, key + "/" + step for a scoped one), so
// a retry that re-runs an already performed step 1 sends the same key and
// the downstream replays its answer instead of acting twice. Every answer
// is reported to the context's AnswerRecorder (see RecordAnswers), so the
// last one reported is the last step's that got one.
//
// When a step fails after an earlier step was performed, the effect is
// partial. A retryable or permanent failure is then reported as
// OutcomeUnknown (the claim is kept, retried with the same keys, and
// flagged for an operator) rather than released. A rejected or conflict
// answer stays what it is: the downstream's final word about that step's
// key, which no retry can change (each would replay it), so the effect is
// finished — partially — and the error names the steps that were
// performed for the operator reading the dead letter.
func (r *httpRoute) Perform(ctx context.Context, msg *azservicebus.ReceivedMessage, key string) error {
	var answers *AnswerRecorder
	if len(r.followUps) > 0 {
		if claim.FollowUpSinkOf(ctx) == nil {
			return r.errNoOutbox() // before any request: nothing performed
		}
		ctx, answers = RecordAnswers(ctx)
	}
	for i, st := range r.steps {
		stepKey := StepKey(ctx, key, st.name)
		err := r.send(ctx, msg, st, stepKey)
		if err == nil {
			continue
		}
		label := r.label(st)
		if i == 0 {
			return fmt.Errorf("%s: %w", label, err)
		}
		done := make([]string, i)
		for j := range i {
			done[j] = r.steps[j].name
		}
		switch o := Classify(err); o {
		case OutcomeUnknown:
			return fmt.Errorf("%s: %w", label, err)
		case OutcomeRejected, OutcomeConflict:
			return &Error{Outcome: o, Answer: AnswerOf(err),
				Err: fmt.Errorf("%s: final answer after earlier steps were performed (%s): %w", label, strings.Join(done, ", "), err)}
		default:
			// Whatever this step's answer, an earlier step happened:
			// releasing the claim would say the effect never did.
			return &Error{Outcome: OutcomeUnknown, Answer: AnswerOf(err),
				Err: fmt.Errorf("%s: partial effect, earlier steps were performed (%s): %w", label, strings.Join(done, ", "), err)}
		}
	}
	if answers != nil {
		return r.publish(ctx, msg.Body, answers.Last())
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
	status, rule, result := r.attempt(ctx, msg, st, key, &progress)

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
	if rule != "" {
		attrs = append(attrs, slog.String("answer_rule", rule))
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

// answerBodies are the buffers answers are read into (at most
// maxAnswerBody+1 bytes each, plus bytes.Buffer's read margin).
var answerBodies = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// attempt builds and sends the request, reports the answer (ReportAnswer)
// and classifies it; status is 0 when there was none, rule the answer rule
// that decided ("" for the default table).
func (r *httpRoute) attempt(ctx context.Context, msg *azservicebus.ReceivedMessage, st *httpStep, key string, progress *sendProgressTrace) (status int, rule string, result error) {
	contentType := r.contentType
	if msg.ContentType != nil && *msg.ContentType != "" {
		contentType = *msg.ContentType
	}
	target, reqBody := st.url, msg.Body
	if st.request != nil {
		// Route checked the mapping before the claim; the message has not
		// changed since, so this builds the same request on every attempt.
		doc, ok := decodeJSON(msg.Body)
		if !ok {
			return 0, "", Permanent(errors.New("not sent: the message body is not valid JSON (request mapping)"))
		}
		u, b, err := st.request.build(doc)
		if err != nil {
			return 0, "", Permanent(fmt.Errorf("not sent: request mapping: %w", err))
		}
		target = u
		if b != nil {
			reqBody, contentType = b, st.contentType
		}
	}
	// A second line of defence behind Route and the processor: net/http
	// would refuse a CR/LF before connecting, which looks retryable and
	// would loop until the broker dead-letters the message.
	if err := CheckContentType(contentType); err != nil {
		var ie *InputError
		errors.As(err, &ie)
		return 0, "", Permanent(fmt.Errorf("not sent: %s", ie.Description))
	}
	req, err := http.NewRequestWithContext(ctx, st.method, target, bytes.NewReader(reqBody))
	if err != nil {
		return 0, "", Permanent(fmt.Errorf("build request: %w", scrubURLError(err, st.origin)))
	}
	for _, h := range st.headers {
		req.Header.Set(h.name, h.value)
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Idempotency-Key", key)
	for _, p := range forwardedProperties {
		if traced(ctx) {
			break // the transport sends the attempt's own traceparent
		}
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
		if p.wroteRequest && isTimeout(err) {
			err = fmt.Errorf("no answer within %s after the request was written (the downstream may have performed it): %w", st.timeout, err)
		}
		return 0, "", classifyTransportError(r.redact.Error(err), p)
	}
	// Read (bounded) what the answer needs; the rest is not drained, so a
	// huge body costs a connection, not memory.
	// The buffer is pooled: nothing below keeps body past this call (the
	// answer, the JSON document and the excerpt copy what they keep).
	buf := answerBodies.Get().(*bytes.Buffer)
	buf.Reset()
	defer answerBodies.Put(buf)
	_, _ = buf.ReadFrom(io.LimitReader(resp.Body, maxAnswerBody+1))
	body := buf.Bytes()
	_ = resp.Body.Close()
	complete := len(body) <= maxAnswerBody
	if !complete {
		body = body[:maxAnswerBody]
	}
	var doc any
	hasDoc := false
	if st.needJSON && complete {
		doc, hasDoc = decodeJSON(body)
	}
	answer := r.answer(resp, st, doc, hasDoc)
	ReportAnswer(ctx, answer)
	detail := func() string {
		if !r.excerpt {
			return ""
		}
		return excerpt(r.redact.String(string(body)))
	}
	rule, result = classifyAnswer(st.rules, resp.StatusCode, resp.Header, doc, hasDoc, time.Now(), detail, &answer)
	if result != nil && rule == "" && r.configErrs[resp.StatusCode] {
		// Answered before the downstream's idempotency layer: nothing
		// was performed, and nothing will be until the route is fixed.
		// (An answer rule that matched the answer decides instead.)
		result = Misconfigured(result)
	}
	return resp.StatusCode, rule, result
}

// answer is what the step keeps of a response: its status and the
// recorded headers and fields, redacted and bounded.
func (r *httpRoute) answer(resp *http.Response, st *httpStep, doc any, hasDoc bool) Answer {
	a := Answer{Status: resp.StatusCode, Step: st.name}
	for _, h := range st.record.headers {
		if vs := resp.Header.Values(h); len(vs) > 0 {
			if a.Headers == nil {
				a.Headers = map[string]string{}
			}
			a.Headers[h] = r.redact.String(strings.Join(vs, ", "))
		}
	}
	if hasDoc {
		for _, f := range st.record.fields {
			if v, ok := lookupPointer(doc, f.tokens); ok {
				if a.Fields == nil {
					a.Fields = map[string]string{}
				}
				a.Fields[f.pointer] = r.redact.String(jsonText(v))
			}
		}
	}
	return a.bounded()
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
