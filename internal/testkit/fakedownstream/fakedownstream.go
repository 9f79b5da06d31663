// Package fakedownstream is an idempotent HTTP API for tests, the chaos
// harness and the demo (cmd/demoapi). It behaves like a well-built
// downstream with Idempotency-Key support (Stripe's rules):
//
//   - the first request with a key performs the effect and stores its
//     answer (201 Created);
//   - a repeat with the same key and the same payload replays the stored
//     answer (with Idempotent-Replayed: true) and performs nothing;
//   - the same key with another payload is answered 422;
//   - the same key while the first request is still running is answered
//     409;
//   - a request without Idempotency-Key is answered 400.
//
// Every answer carries Request-Id (req_<n>); a performed effect's body has
// an "id" (fx_<n>).
//
// It can also answer like a payment API that stores failures under the
// key (see Reply, SetKeyReply and ConflictStyle):
//
//   - ReplyDecline: the first request records a declined charge and is
//     answered 402 {"error":{"type":"card_error","code":"card_declined",
//     ...,"charge":"fx_<n>"}}, stored under the key and replayed to every
//     repeat (a final answer: Rejections counts it, once);
//   - ReplyCachedFailure: the first request fails inside: 500, stored
//     under the key and replayed to every repeat, so only a request with
//     a new key (<key>:r1) can succeed;
//   - ReplyConflict: the key is already held by another payload: every
//     request with it is answered as a conflict;
//   - ConflictStripe answers the same key with another payload 400
//     {"error":{"type":"idempotency_error",...}} instead of 422.
//
// Keys are scoped by URL path, so /payments and /emails keep separate
// stores; counters are per key across paths. It counts effects, raw
// requests, replays, declines, conflicts and stored failures per key,
// keeps the stored answer per path and key (StoredAnswer), records the
// headers of every request, and injects faults on demand (see Fault and
// FaultRule). Control endpoints: GET /_counts (JSON), POST /_faults (a
// FaultRule as JSON), DELETE /_faults, POST /_replies ({"key": "k",
// "reply": "decline"}) and DELETE /_replies.
package fakedownstream

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Fault is a failure the fake injects into a request.
type Fault int

const (
	// FaultNone answers normally.
	FaultNone Fault = iota
	// FaultUnavailable answers 503 with Retry-After before doing anything.
	FaultUnavailable
	// FaultErrorBefore answers 500 without performing the effect.
	FaultErrorBefore
	// FaultErrorAfter performs the effect (or replays it), stores the
	// success, then answers 500: the caller cannot tell it happened.
	FaultErrorAfter
	// FaultHang performs the effect (or replays it), stores the success,
	// then sends nothing until the caller gives up (the request's context
	// ends): "performed, then the response was lost".
	FaultHang
)

var faultNames = map[Fault]string{
	FaultNone:        "none",
	FaultUnavailable: "unavailable",
	FaultErrorBefore: "error-before",
	FaultErrorAfter:  "error-after",
	FaultHang:        "hang",
}

func (f Fault) String() string {
	if s, ok := faultNames[f]; ok {
		return s
	}
	return "Fault(" + strconv.Itoa(int(f)) + ")"
}

// ParseFault reads a fault name: none, unavailable, error-before,
// error-after, hang.
func ParseFault(s string) (Fault, error) {
	for f, n := range faultNames {
		if n == s {
			return f, nil
		}
	}
	return FaultNone, fmt.Errorf("unknown fault %q (want none, unavailable, error-before, error-after or hang)", s)
}

// MarshalText implements encoding.TextMarshaler.
func (f Fault) MarshalText() ([]byte, error) { return []byte(f.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (f *Fault) UnmarshalText(b []byte) error {
	v, err := ParseFault(string(b))
	*f = v
	return err
}

// Reply is how the fake answers the first request with a key (while
// nothing is stored under it); repeats get the stored answer.
type Reply int

const (
	// ReplyNormal performs the effect: 201, stored, replayed.
	ReplyNormal Reply = iota
	// ReplyDecline records a declined charge (the downstream did
	// something: a failed charge exists) and answers 402 with a Stripe-like
	// card_error body, stored under the key and replayed to every repeat.
	// No effect is performed; Rejections counts the decline.
	ReplyDecline
	// ReplyConflict treats the key as already used with another payload:
	// every request with it is answered as a conflict (422, or 400
	// idempotency_error with ConflictStripe). Nothing is performed.
	ReplyConflict
	// ReplyCachedFailure fails inside the endpoint: 500, stored under the
	// key and replayed to every repeat with it (Stripe's rule), so same-key
	// retries can never succeed; a new key can. Nothing is performed.
	ReplyCachedFailure
)

var replyNames = map[Reply]string{
	ReplyNormal:        "normal",
	ReplyDecline:       "decline",
	ReplyConflict:      "conflict",
	ReplyCachedFailure: "cached-failure",
}

func (r Reply) String() string {
	if s, ok := replyNames[r]; ok {
		return s
	}
	return "Reply(" + strconv.Itoa(int(r)) + ")"
}

// ParseReply reads a reply name: normal, decline, conflict,
// cached-failure.
func ParseReply(s string) (Reply, error) {
	for r, n := range replyNames {
		if n == s {
			return r, nil
		}
	}
	return ReplyNormal, fmt.Errorf("unknown reply %q (want normal, decline, conflict or cached-failure)", s)
}

// MarshalText implements encoding.TextMarshaler.
func (r Reply) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (r *Reply) UnmarshalText(b []byte) error {
	v, err := ParseReply(string(b))
	*r = v
	return err
}

// ConflictStyle is how the fake answers a key reused with another payload.
type ConflictStyle int

const (
	// Conflict422 answers 422 {"error": "..."} (the default).
	Conflict422 ConflictStyle = iota
	// ConflictStripe answers 400 {"error":{"type":"idempotency_error",
	// "message":...}}, as Stripe does.
	ConflictStripe
)

var conflictStyleNames = map[ConflictStyle]string{Conflict422: "422", ConflictStripe: "stripe"}

func (c ConflictStyle) String() string {
	if s, ok := conflictStyleNames[c]; ok {
		return s
	}
	return "ConflictStyle(" + strconv.Itoa(int(c)) + ")"
}

// ParseConflictStyle reads a conflict style name: 422 or stripe.
func ParseConflictStyle(s string) (ConflictStyle, error) {
	for c, n := range conflictStyleNames {
		if n == s {
			return c, nil
		}
	}
	return Conflict422, fmt.Errorf("unknown conflict style %q (want 422 or stripe)", s)
}

// MarshalText implements encoding.TextMarshaler.
func (c ConflictStyle) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (c *ConflictStyle) UnmarshalText(b []byte) error {
	v, err := ParseConflictStyle(string(b))
	*c = v
	return err
}

// FaultRule says when to inject a fault. Rules are checked in the order
// they were added; the first that applies to a request fires.
type FaultRule struct {
	Fault Fault `json:"fault"`
	// Key limits the rule to one idempotency key; empty means any key.
	Key string `json:"key,omitempty"`
	// Times is how many requests the rule fires for; 0 means unlimited.
	Times int `json:"times,omitempty"`
	// Probability (0 < p < 1) fires the rule for that share of the
	// requests it applies to, drawn from the fake's seeded source; 0 or
	// >= 1 means always.
	Probability float64 `json:"probability,omitempty"`
	// RetryAfterSeconds is sent as Retry-After with FaultUnavailable
	// (default 1).
	RetryAfterSeconds int `json:"retryAfterSeconds,omitempty"`
}

// Options configures a Server.
type Options struct {
	// Seed seeds the source that Probability rules draw from (runs are
	// reproducible for a given seed and request order).
	Seed uint64
	// Latency is how long performing an effect takes (during which a
	// concurrent request with the same key gets 409).
	Latency time.Duration
	// Logger receives one Info line per effect; nil discards.
	Logger *slog.Logger
	// ConflictStyle is how a key reused with another payload is answered.
	ConflictStyle ConflictStyle
	// StripeRequests checks every effect request the way Stripe's API
	// does before its idempotency layer (nothing is stored for a refused
	// request): Authorization must be "Bearer <key>" (401 otherwise) and
	// the body form-encoded, Content-Type
	// application/x-www-form-urlencoded (400 invalid_request_error
	// otherwise: Stripe does not take JSON).
	StripeRequests bool
}

// Server is the fake downstream, an http.Handler. It is safe for
// concurrent use.
type Server struct {
	logger *slog.Logger

	mu        sync.Mutex
	latency   time.Duration
	conflicts ConflictStyle
	rand      *rand.Rand
	rules     []*FaultRule
	replies   map[string]Reply
	replyFunc func(key string) Reply
	entries   map[entryKey]*entry
	counts    map[string]*KeyCounts
	headers   map[string][]http.Header
	bodies    map[string][]string
	stripe    bool
	effects   int
	requests  int
	seq       int // ids of what was recorded (effects and declines)
	totals    struct{ rejections, conflicts, cachedFailures int }
}

type entryKey struct{ path, key string }

type entry struct {
	hash    [32]byte
	running bool
	status  int
	body    []byte
	reply   Reply
}

// StoredAnswer is what the fake stored under a key at a path: the answer
// every repeat with the key (and the same payload) gets.
type StoredAnswer struct {
	Status int    `json:"status"`
	Body   string `json:"body"`
	Reply  Reply  `json:"reply"` // how the first request was answered
}

// KeyCounts are the counters of one idempotency key.
type KeyCounts struct {
	Effects  int `json:"effects"`
	Requests int `json:"requests"`
	// Paths counts effects per URL path (each path is its own idempotency
	// store, so two consumers posting the same key to /invoices and
	// /emails perform one effect each).
	Paths map[string]int `json:"paths,omitempty"`
	// Rejections counts declines recorded (ReplyDecline): at most one per
	// path — a repeat gets the stored 402, a replay.
	Rejections int `json:"rejections,omitempty"`
	// CachedFailures counts failures stored (ReplyCachedFailure), at most
	// one per path.
	CachedFailures int `json:"cachedFailures,omitempty"`
	// Conflicts counts requests answered as a conflict (another payload
	// under the key).
	Conflicts int `json:"conflicts,omitempty"`
	// Replays counts requests answered from the store (Idempotent-Replayed).
	Replays int `json:"replays,omitempty"`
	// Stored maps each path to the status stored under the key there.
	Stored map[string]int `json:"stored,omitempty"`
}

// New returns a Server.
func New(opts Options) *Server {
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Server{
		logger:    logger,
		latency:   opts.Latency,
		conflicts: opts.ConflictStyle,
		rand:      rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15)),
		replies:   map[string]Reply{},
		entries:   map[entryKey]*entry{},
		counts:    map[string]*KeyCounts{},
		headers:   map[string][]http.Header{},
		bodies:    map[string][]string{},
		stripe:    opts.StripeRequests,
	}
}

// maxBody bounds the request bodies the fake reads.
const maxBody = 1 << 20

// maxRecordedBody bounds what Bodies keeps of each request body.
const maxRecordedBody = 4 << 10

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/_counts":
		if r.Method == http.MethodGet {
			s.serveCounts(w)
			return
		}
	case "/_faults":
		switch r.Method {
		case http.MethodPost:
			s.serveAddFault(w, r)
			return
		case http.MethodDelete:
			s.ClearFaults()
			w.WriteHeader(http.StatusNoContent)
			return
		}
	case "/_replies":
		switch r.Method {
		case http.MethodPost:
			s.serveSetReply(w, r)
			return
		case http.MethodDelete:
			s.ClearReplies()
			w.WriteHeader(http.StatusNoContent)
			return
		}
	}
	s.serveEffect(w, r)
}

func (s *Server) serveEffect(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Idempotency-Key")
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		// The caller gave up while sending: nothing performed.
		http.Error(w, "read body: "+err.Error(), http.StatusBadRequest)
		return
	}
	if len(body) > maxBody {
		http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
		return
	}

	s.mu.Lock()
	s.requests++
	w.Header().Set("Request-Id", "req_"+strconv.Itoa(s.requests))
	if key == "" {
		s.mu.Unlock()
		http.Error(w, "Idempotency-Key header is required", http.StatusBadRequest)
		return
	}
	c := s.countsFor(key)
	c.Requests++
	s.headers[key] = append(s.headers[key], r.Header.Clone())
	s.bodies[key] = append(s.bodies[key], string(body[:min(len(body), maxRecordedBody)]))
	stripe := s.stripe
	fault, rule := s.pickFault(key)
	s.mu.Unlock()

	if stripe {
		if status, problem := stripeRequestProblem(r, body); status != 0 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, _ = w.Write(jsonLine(map[string]any{"error": map[string]any{"type": "invalid_request_error", "message": problem}}))
			return
		}
	}

	switch fault {
	case FaultUnavailable:
		w.Header().Set("Retry-After", strconv.Itoa(max(rule.RetryAfterSeconds, 1)))
		http.Error(w, "injected fault: unavailable", http.StatusServiceUnavailable)
		return
	case FaultErrorBefore:
		http.Error(w, "injected fault: error before the effect", http.StatusInternalServerError)
		return
	}

	status, respBody, replayed := s.perform(r, key, body)
	if status == 0 {
		return // the caller went away during the effect; nothing stored
	}

	switch fault {
	case FaultErrorAfter:
		http.Error(w, "injected fault: error after the effect", http.StatusInternalServerError)
		return
	case FaultHang:
		<-r.Context().Done()
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if replayed {
		w.Header().Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(status)
	_, _ = w.Write(respBody)
}

// perform applies the idempotency rules. It returns the answer to send,
// whether it was replayed, or status 0 when the request's context ended
// before the effect completed (nothing performed or stored).
func (s *Server) perform(r *http.Request, key string, body []byte) (status int, respBody []byte, replayed bool) {
	hash := sha256.Sum256(body)
	ek := entryKey{path: r.URL.Path, key: key}

	s.mu.Lock()
	c := s.countsFor(key)
	e, ok := s.entries[ek]
	if !ok && s.replyForLocked(key) == ReplyConflict {
		// The key's first request (another payload) was performed
		// earlier: store it so that this one and every repeat conflict.
		e = &entry{hash: sha256.Sum256([]byte("another payload for " + key)), status: http.StatusCreated,
			body: jsonLine(map[string]any{"note": "performed earlier for another payload", "idempotencyKey": key}), reply: ReplyConflict}
		s.entries[ek] = e
		s.storedLocked(c, r.URL.Path, e.status)
		ok = true
	}
	if ok {
		// Copy under the lock: the first request fills the entry in.
		seen := *e
		switch {
		case seen.hash != hash:
			c.Conflicts++
			s.totals.conflicts++
			style := s.conflicts
			s.mu.Unlock()
			if style == ConflictStripe {
				return http.StatusBadRequest, jsonLine(map[string]any{"error": map[string]any{
					"type":    "idempotency_error",
					"message": "Keys for idempotent requests can only be used with the same parameters they were first used with.",
				}}), false
			}
			return http.StatusUnprocessableEntity, jsonError("Idempotency-Key was already used with another payload"), false
		case seen.running:
			s.mu.Unlock()
			return http.StatusConflict, jsonError("a request with this Idempotency-Key is in progress"), false
		}
		c.Replays++
		s.mu.Unlock()
		return seen.status, seen.body, true
	}
	e = &entry{hash: hash, running: true, reply: s.replyForLocked(key)}
	s.entries[ek] = e
	latency := s.latency
	s.mu.Unlock()

	if latency > 0 {
		t := time.NewTimer(latency)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			s.mu.Lock()
			delete(s.entries, ek)
			s.mu.Unlock()
			return 0, nil, false
		}
	}

	s.mu.Lock()
	c = s.countsFor(key)
	s.seq++
	id := "fx_" + strconv.Itoa(s.seq)
	msg := "effect performed"
	e.running = false
	switch e.reply {
	case ReplyDecline:
		c.Rejections++
		s.totals.rejections++
		msg = "decline recorded"
		e.status = http.StatusPaymentRequired
		e.body = jsonLine(map[string]any{"error": map[string]any{
			"type":         "card_error",
			"code":         "card_declined",
			"decline_code": "generic_decline",
			"message":      "Your card was declined.",
			"charge":       id,
		}})
	case ReplyCachedFailure:
		c.CachedFailures++
		s.totals.cachedFailures++
		msg = "failure stored under the key"
		e.status = http.StatusInternalServerError
		e.body = jsonLine(map[string]any{"error": map[string]any{
			"type":    "api_error",
			"message": "An error occurred while processing the request; this answer is stored under the Idempotency-Key.",
		}})
	default:
		s.effects++
		c.Effects++
		if c.Paths == nil {
			c.Paths = map[string]int{}
		}
		c.Paths[r.URL.Path]++
		e.status = http.StatusCreated
		e.body = jsonLine(map[string]any{
			"id":             id,
			"effect":         s.effects,
			"idempotencyKey": key,
			"path":           r.URL.Path,
			"bytes":          len(body),
		})
	}
	s.storedLocked(c, r.URL.Path, e.status)
	status, respBody = e.status, e.body
	n := s.effects
	s.mu.Unlock()

	s.logger.LogAttrs(r.Context(), slog.LevelInfo, msg,
		slog.Int("effect", n),
		slog.String("id", id),
		slog.String("idempotency_key", key),
		slog.String("method", r.Method),
		slog.String("path", r.URL.Path),
		slog.Int("status", status),
		slog.Int("bytes", len(body)))
	return status, respBody, false
}

// stripeRequestProblem checks a request as Stripe's API does before its
// idempotency layer; status 0 means it passes.
func stripeRequestProblem(r *http.Request, body []byte) (status int, problem string) {
	auth := r.Header.Get("Authorization")
	if k, ok := strings.CutPrefix(auth, "Bearer "); !ok || strings.TrimSpace(k) == "" {
		return http.StatusUnauthorized, "You did not provide an API key. You need to provide your API key in the Authorization header, using Bearer auth (e.g. 'Authorization: Bearer YOUR_SECRET_KEY')."
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/x-www-form-urlencoded" {
		return http.StatusBadRequest, "Invalid request: the body must be form-encoded (Content-Type: application/x-www-form-urlencoded)."
	}
	if _, err := url.ParseQuery(string(body)); err != nil {
		return http.StatusBadRequest, "Invalid request: the body is not valid form encoding."
	}
	return 0, ""
}

// replyForLocked is the reply for the first request with key. Called with
// s.mu held.
func (s *Server) replyForLocked(key string) Reply {
	if r, ok := s.replies[key]; ok {
		return r
	}
	if s.replyFunc != nil {
		return s.replyFunc(key)
	}
	return ReplyNormal
}

func (s *Server) storedLocked(c *KeyCounts, path string, status int) {
	if c.Stored == nil {
		c.Stored = map[string]int{}
	}
	c.Stored[path] = status
}

func jsonLine(v any) []byte {
	b, _ := json.Marshal(v)
	return append(b, '\n')
}

func jsonError(msg string) []byte {
	b, _ := json.Marshal(map[string]string{"error": msg})
	return append(b, '\n')
}

// pickFault returns the fault for this request, consuming one use of the
// rule that fired. Called with s.mu held.
func (s *Server) pickFault(key string) (Fault, FaultRule) {
	for i, r := range s.rules {
		if r.Key != "" && r.Key != key {
			continue
		}
		if r.Probability > 0 && r.Probability < 1 && s.rand.Float64() >= r.Probability {
			continue
		}
		fired := *r
		if r.Times > 0 {
			r.Times--
			if r.Times == 0 {
				s.rules = slices.Delete(s.rules, i, i+1)
			}
		}
		return fired.Fault, fired
	}
	return FaultNone, FaultRule{}
}

func (s *Server) countsFor(key string) *KeyCounts {
	c, ok := s.counts[key]
	if !ok {
		c = &KeyCounts{}
		s.counts[key] = c
	}
	return c
}

// AddFault adds a fault rule (after the existing ones).
func (s *Server) AddFault(rule FaultRule) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rules = append(s.rules, &rule)
}

// FailNext injects f into the next n requests (any key).
func (s *Server) FailNext(n int, f Fault) { s.AddFault(FaultRule{Fault: f, Times: n}) }

// FailKey injects f into the next n requests with key (n = 0: all of them).
func (s *Server) FailKey(key string, n int, f Fault) {
	s.AddFault(FaultRule{Fault: f, Key: key, Times: n})
}

// SetFault injects f into every request (FaultNone clears all rules).
func (s *Server) SetFault(f Fault) {
	s.ClearFaults()
	if f != FaultNone {
		s.AddFault(FaultRule{Fault: f})
	}
}

// SetFaultRate injects f into a share p of all requests.
func (s *Server) SetFaultRate(p float64, f Fault) {
	s.AddFault(FaultRule{Fault: f, Probability: p})
}

// ClearFaults removes every fault rule.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rules = nil
}

// SetKeyReply sets how the first request with key is answered (see
// Reply); ReplyNormal is the default. It takes effect for keys with
// nothing stored yet.
func (s *Server) SetKeyReply(key string, r Reply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.replies[key] = r
}

// SetReplyFunc sets a function deciding the reply for keys without one set
// by SetKeyReply (nil: ReplyNormal). It is called, with the server's lock
// held, on a key's first request at a path; it must be quick and must not
// call the server.
func (s *Server) SetReplyFunc(f func(key string) Reply) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.replyFunc = f
}

// ClearReplies removes every SetKeyReply setting and the reply function
// (what is already stored stays stored).
func (s *Server) ClearReplies() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.replies = map[string]Reply{}
	s.replyFunc = nil
}

// SetStripeRequests turns Options.StripeRequests on or off.
func (s *Server) SetStripeRequests(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stripe = on
}

// Bodies returns the body of every request that carried key (its first
// 4 KiB), in arrival order.
func (s *Server) Bodies(key string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.bodies[key])
}

// SetConflictStyle changes how a key reused with another payload is
// answered.
func (s *Server) SetConflictStyle(c ConflictStyle) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conflicts = c
}

// StoredAnswer returns what is stored under key at path (ok false when
// nothing is, or the first request is still running).
func (s *Server) StoredAnswer(path, key string) (StoredAnswer, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.entries[entryKey{path: path, key: key}]
	if !ok || e.running {
		return StoredAnswer{}, false
	}
	return StoredAnswer{Status: e.status, Body: string(e.body), Reply: e.reply}, true
}

// Rejections returns how many declines were recorded for key (ReplyDecline;
// one per path at most, whatever the number of requests).
func (s *Server) Rejections(key string) int {
	return s.keyCount(key, func(c *KeyCounts) int { return c.Rejections })
}

// CachedFailures returns how many failures were stored for key
// (ReplyCachedFailure; one per path at most).
func (s *Server) CachedFailures(key string) int {
	return s.keyCount(key, func(c *KeyCounts) int { return c.CachedFailures })
}

// Conflicts returns how many requests with key were answered as a
// conflict.
func (s *Server) Conflicts(key string) int {
	return s.keyCount(key, func(c *KeyCounts) int { return c.Conflicts })
}

// Replays returns how many requests with key were answered from the store.
func (s *Server) Replays(key string) int {
	return s.keyCount(key, func(c *KeyCounts) int { return c.Replays })
}

func (s *Server) keyCount(key string, f func(*KeyCounts) int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.counts[key]; ok {
		return f(c)
	}
	return 0
}

// SetLatency changes how long an effect takes.
func (s *Server) SetLatency(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.latency = d
}

// Effects returns how many times the effect was performed for key.
func (s *Server) Effects(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.counts[key]; ok {
		return c.Effects
	}
	return 0
}

// EffectsAt returns how many times the effect was performed for key at
// path.
func (s *Server) EffectsAt(path, key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.counts[key]; ok {
		return c.Paths[path]
	}
	return 0
}

// Requests returns how many requests carried key.
func (s *Server) Requests(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c, ok := s.counts[key]; ok {
		return c.Requests
	}
	return 0
}

// TotalEffects returns how many effects were performed, all keys.
func (s *Server) TotalEffects() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.effects
}

// TotalRequests returns how many effect requests arrived (control endpoints
// excluded), with or without a key.
func (s *Server) TotalRequests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests
}

// Keys returns every idempotency key seen, sorted.
func (s *Server) Keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.counts))
	for k := range s.counts {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Headers returns a copy of the headers of every request that carried key,
// in arrival order.
func (s *Server) Headers(key string) []http.Header {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]http.Header, len(s.headers[key]))
	for i, h := range s.headers[key] {
		out[i] = h.Clone()
	}
	return out
}

// Duplicates returns "path key" for every key performed more than once at
// the same path (always empty unless the fake itself is broken; a check
// for the chaos harness).
func (s *Server) Duplicates() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var dups []string
	for k, c := range s.counts {
		for p, n := range c.Paths {
			if n > 1 {
				dups = append(dups, p+" "+k)
			}
		}
	}
	slices.Sort(dups)
	return dups
}

// Counts is the JSON served at GET /_counts.
type Counts struct {
	TotalEffects        int                   `json:"totalEffects"`
	TotalRequests       int                   `json:"totalRequests"`
	TotalRejections     int                   `json:"totalRejections,omitempty"`
	TotalConflicts      int                   `json:"totalConflicts,omitempty"`
	TotalCachedFailures int                   `json:"totalCachedFailures,omitempty"`
	Keys                map[string]*KeyCounts `json:"keys"`
}

// Snapshot returns the current counters.
func (s *Server) Snapshot() Counts {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := Counts{TotalEffects: s.effects, TotalRequests: s.requests,
		TotalRejections: s.totals.rejections, TotalConflicts: s.totals.conflicts, TotalCachedFailures: s.totals.cachedFailures,
		Keys: make(map[string]*KeyCounts, len(s.counts))}
	for k, v := range s.counts {
		cp := *v
		cp.Paths = maps.Clone(v.Paths)
		cp.Stored = maps.Clone(v.Stored)
		c.Keys[k] = &cp
	}
	return c
}

func (s *Server) serveCounts(w http.ResponseWriter) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	_ = enc.Encode(s.Snapshot())
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(buf.Bytes())
}

func (s *Server) serveAddFault(w http.ResponseWriter, r *http.Request) {
	var rule FaultRule
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rule); err != nil {
		http.Error(w, "fault rule: "+err.Error(), http.StatusBadRequest)
		return
	}
	s.AddFault(rule)
	w.WriteHeader(http.StatusNoContent)
}

// ReplyRule is the JSON of POST /_replies.
type ReplyRule struct {
	Key   string `json:"key"`
	Reply Reply  `json:"reply"`
}

func (s *Server) serveSetReply(w http.ResponseWriter, r *http.Request) {
	var rule ReplyRule
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rule); err != nil || rule.Key == "" {
		msg := "reply rule: a key is required"
		if err != nil {
			msg = "reply rule: " + err.Error()
		}
		http.Error(w, msg, http.StatusBadRequest)
		return
	}
	s.SetKeyReply(rule.Key, rule.Reply)
	w.WriteHeader(http.StatusNoContent)
}
