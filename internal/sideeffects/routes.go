package sideeffects

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/redact"
)

// DefaultRouteTimeout is a route's per-request timeout when the file sets
// none.
const DefaultRouteTimeout = 10 * time.Second

// reservedHeaders are set by sbclaim itself; a routes file cannot configure
// them (canonical form).
var reservedHeaders = []string{
	"Idempotency-Key", "Content-Type", "Content-Length", "Host", "Traceparent",
	"Tracestate", "Diagnostic-Id", "Transfer-Encoding", "Connection",
}

// RoutesError is one problem found in a routes file at start-up. It names
// the route and the field so an operator knows exactly what to fix; it
// never contains a secret value.
type RoutesError struct {
	Route   string // route name, "routes[i]" when it has none, "" for the file itself
	Field   string // path inside the route (or the file), e.g. "url", "steps[1].timeout"
	Problem string
}

func (e *RoutesError) Error() string {
	var b strings.Builder
	if e.Route != "" {
		fmt.Fprintf(&b, "route %q: ", e.Route)
	}
	if e.Field != "" {
		fmt.Fprintf(&b, "field %q: ", e.Field)
	}
	b.WriteString(e.Problem)
	return b.String()
}

// The routes file, as decoded after schema validation.
type routesFile struct {
	Version int         `yaml:"version"`
	Routes  []routeSpec `yaml:"routes"`
}

type routeSpec struct {
	Name        string                `yaml:"name"`
	Match       matchSpec             `yaml:"match"`
	Body        string                `yaml:"body"`
	Recovery    string                `yaml:"recovery"`
	ContentType string                `yaml:"contentType"`
	Timeout     string                `yaml:"timeout"`
	Method      string                `yaml:"method"`
	URL         string                `yaml:"url"`
	Headers     map[string]headerSpec `yaml:"headers"`
	Answers     []answerSpec          `yaml:"answers"`
	Record      *recordSpec           `yaml:"record"`
	Excerpt     *bool                 `yaml:"excerpt"`
	AllowNewKey bool                  `yaml:"allowNewKey"`
	// HoldSessionOnFailure is Handler.HoldSessionOnFailure.
	HoldSessionOnFailure bool         `yaml:"holdSessionOnFailure"`
	KeyLifetime          string       `yaml:"keyLifetime"`
	Request              *requestSpec `yaml:"request"`
	Key                  string       `yaml:"key"`
	Backoff              *backoffSpec `yaml:"backoff"`
	Breaker              *breakerSpec `yaml:"breaker"`
	// ConfigErrors are the statuses that say the route is misconfigured
	// (default DefaultConfigErrors; an empty list: none). An answer rule
	// that matches the answer decides instead.
	ConfigErrors *[]int     `yaml:"configErrors"`
	Steps        []stepSpec `yaml:"steps"`
	// FollowUps are messages the route publishes once its effect
	// succeeded (followups.go).
	FollowUps []followUpSpec `yaml:"followUps"`
}

// backoffSpec is a route's delayed-retry schedule as written (Backoff).
type backoffSpec struct {
	First   string   `yaml:"first"`
	Factor  *float64 `yaml:"factor"`
	Max     string   `yaml:"max"`
	Jitter  *float64 `yaml:"jitter"`
	Horizon string   `yaml:"horizon"`
	Off     bool     `yaml:"off"`
}

// buildBackoff resolves a route's backoff: unset fields take
// DefaultBackoff's values.
func buildBackoff(spec *backoffSpec, fail func(field, problem string)) Backoff {
	if spec == nil {
		return Backoff{}
	}
	b := DefaultBackoff
	b.Off = spec.Off
	for _, d := range []struct {
		field string
		text  string
		dst   *time.Duration
	}{{"backoff.first", spec.First, &b.First}, {"backoff.max", spec.Max, &b.Max}, {"backoff.horizon", spec.Horizon, &b.Horizon}} {
		if d.text == "" {
			continue
		}
		v, err := parseTimeout(d.text)
		if err != nil {
			fail(d.field, err.Error())
			continue
		}
		*d.dst = v
	}
	if spec.Factor != nil {
		b.Factor = *spec.Factor
	}
	if spec.Jitter != nil {
		b.Jitter = *spec.Jitter
	}
	if spec.First != "" && spec.Max == "" {
		b.Max = max(b.Max, b.First)
	}
	if err := b.Validate(); err != nil {
		fail("backoff", err.Error())
	}
	return b
}

// breakerSpec is a route's breaker as written (Breaker).
type breakerSpec struct {
	Failures   int    `yaml:"failures"`
	ProbeAfter string `yaml:"probeAfter"`
	Off        bool   `yaml:"off"`
}

// buildBreaker resolves a route's breaker: unset fields take
// DefaultBreaker's values.
func buildBreaker(spec *breakerSpec, fail func(field, problem string)) Breaker {
	if spec == nil {
		return Breaker{}
	}
	b := Breaker{Failures: spec.Failures, Off: spec.Off}
	if spec.ProbeAfter != "" {
		v, err := parseTimeout(spec.ProbeAfter)
		if err != nil {
			fail("breaker.probeAfter", err.Error())
		}
		b.ProbeAfter = v
	}
	if err := b.Validate(); err != nil {
		fail("breaker", err.Error())
	}
	return b.WithDefaults()
}

// buildConfigErrors resolves a route's configuration statuses.
func buildConfigErrors(list *[]int, fail func(field, problem string)) map[int]bool {
	statuses := DefaultConfigErrors
	if list != nil {
		statuses = *list
	}
	m := make(map[int]bool, len(statuses))
	for _, s := range statuses {
		if s < 400 || s > 499 {
			fail("configErrors", fmt.Sprintf("%d is not a 4xx status", s))
		}
		m[s] = true
	}
	return m
}

type answerSpec struct {
	Status  statusSpec `yaml:"status"`
	Field   string     `yaml:"field"`
	Equals  any        `yaml:"equals"`
	Header  string     `yaml:"header"`
	Value   any        `yaml:"value"`
	Outcome string     `yaml:"outcome"`
}

// statusSpec is a rule's status as written: 402, "400-499" or "4xx".
type statusSpec string

// UnmarshalText takes the status as written, a number or text alike (the
// YAML decoder hands a scalar's text to a TextUnmarshaler).
func (s *statusSpec) UnmarshalText(text []byte) error {
	*s = statusSpec(text)
	return nil
}

type recordSpec struct {
	Headers []string `yaml:"headers"`
	Fields  []string `yaml:"fields"`
}

type matchSpec struct {
	Subject  string         `yaml:"subject"`
	Property *PropertyMatch `yaml:"property"`
}

type stepSpec struct {
	Name    string                `yaml:"name"`
	Method  string                `yaml:"method"`
	URL     string                `yaml:"url"`
	Headers map[string]headerSpec `yaml:"headers"`
	Timeout string                `yaml:"timeout"`
	Answers []answerSpec          `yaml:"answers"`
	Record  *recordSpec           `yaml:"record"`
	Request *requestSpec          `yaml:"request"`
}

type headerSpec struct {
	FromEnv *string `yaml:"fromEnv"`
	Value   *string `yaml:"value"`
}

// BuildRoutes builds one HTTP effect per route of a routes file, after
// checking what its schema cannot (URLs that could take a value from a
// message, reserved headers, environment variables that are not set).
// decode fills the file's form it is given (a pointer) from the file, once
// the file passed its schema: routesfile.Parse does both, with YAML; this
// package links no YAML or JSON Schema library. Every problem is reported
// at once, each as a *RoutesError naming the route and field (errors.As
// finds the first); a decode error that is not one becomes one.
//
// getenv (os.Getenv when nil) supplies header values declared with
// fromEnv; they are resolved once, here, and never logged or put in an
// error. client (nil for a default one) sends the requests; BuildRoutes
// uses a copy of it that never follows redirects, with its transport as it
// is: routesfile.Parse wraps it with tracinghttp.Transport, which gives a
// request in a traced attempt its client span and traceparent (traced:
// the effect then forwards no producer's traceparent). logger (nil discards)
// receives one Debug line per attempt and one Info line per failed attempt.
func BuildRoutes(decode func(into any) error, getenv func(string) string, client *http.Client, logger *slog.Logger) (*HTTPRouter, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	var file routesFile
	if err := decode(&file); err != nil {
		var re *RoutesError
		if !errors.As(err, &re) {
			err = &RoutesError{Problem: err.Error()}
		}
		return nil, err
	}
	return buildRouter(&file, getenv, client, logger)
}

// buildRouter checks what the schema cannot and resolves the routes.
func buildRouter(file *routesFile, getenv func(string) string, client *http.Client, logger *slog.Logger) (*HTTPRouter, error) {
	if client == nil {
		client = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	c := *client // never follow redirects: a 3xx is classified, not chased
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

	router := &HTTPRouter{logger: logger}
	var errs []error
	seen := map[RoutesError]bool{} // a route's request is checked once per step: say it once
	fail := func(route, field, format string, args ...any) {
		e := RoutesError{Route: route, Field: field, Problem: fmt.Sprintf(format, args...)}
		if !seen[e] {
			seen[e] = true
			errs = append(errs, &e)
		}
	}
	var secrets []string
	names := map[string]bool{}
	for _, rs := range file.Routes {
		if names[rs.Name] {
			fail(rs.Name, "name", "used by two routes")
		}
		names[rs.Name] = true

		r := &httpRoute{
			name:        rs.Name,
			match:       Match{Subject: rs.Match.Subject, Property: rs.Match.Property},
			jsonBody:    rs.Body == "json",
			contentType: rs.ContentType,
			recovery:    cmp.Or(Recovery(rs.Recovery), RecoveryAuto),
			allowNewKey: rs.AllowNewKey,
			holdSession: rs.HoldSessionOnFailure,
			keyForm:     claim.KeyForm(rs.Key),
			backoff:     buildBackoff(rs.Backoff, func(field, problem string) { fail(rs.Name, field, "%s", problem) }),
			breaker:     buildBreaker(rs.Breaker, func(field, problem string) { fail(rs.Name, field, "%s", problem) }),
			configErrs:  buildConfigErrors(rs.ConfigErrors, func(field, problem string) { fail(rs.Name, field, "%s", problem) }),
			excerpt:     rs.Excerpt == nil || *rs.Excerpt,
			client:      &c,
			logger:      logger,
		}
		// Headers configured from the environment (anywhere in the route)
		// are secrets: a downstream echoing one must not have it recorded.
		secretHeaders := slices.Clone(alwaysSecretHeaders)
		for _, hs := range append([]map[string]headerSpec{rs.Headers}, stepHeaders(rs.Steps)...) {
			for n, h := range hs {
				if h.FromEnv != nil {
					secretHeaders = append(secretHeaders, http.CanonicalHeaderKey(n))
				}
			}
		}
		routeRules := buildRules(rs.Answers, "", func(field, problem string) { fail(rs.Name, field, "%s", problem) })
		routeRecord := buildRecord(rs.Record, "", secretHeaders, func(field, problem string) { fail(rs.Name, field, "%s", problem) })
		if err := CheckContentType(r.contentType); err != nil {
			var ie *InputError
			errors.As(err, &ie)
			fail(rs.Name, "contentType", "%s", strings.TrimPrefix(ie.Description, "ContentType "))
		}
		if r.contentType == "" {
			r.contentType = "application/octet-stream"
			if r.jsonBody {
				r.contentType = "application/json"
			}
		}
		if rs.KeyLifetime != "" {
			d, err := parseTimeout(rs.KeyLifetime)
			if err != nil {
				fail(rs.Name, "keyLifetime", "%v", err)
			}
			r.keyLifetime = d
		}
		routeTimeout := DefaultRouteTimeout
		if rs.Timeout != "" {
			d, err := parseTimeout(rs.Timeout)
			if err != nil {
				fail(rs.Name, "timeout", "%v", err)
			}
			routeTimeout = d
		}

		steps := rs.Steps
		if len(steps) == 0 {
			steps = []stepSpec{{Method: rs.Method, URL: rs.URL}}
		}
		stepNames := map[string]bool{}
		for i, ss := range steps {
			prefix := ""
			if len(rs.Steps) > 0 {
				prefix = fmt.Sprintf("steps[%d].", i)
				if stepNames[ss.Name] {
					fail(rs.Name, prefix+"name", "step name %q is used twice", ss.Name)
				}
				stepNames[ss.Name] = true
			}
			st := &httpStep{name: ss.Name, method: cmp.Or(ss.Method, http.MethodPost), timeout: routeTimeout}
			// A step's rules are tried before the route's; its record
			// replaces the route's.
			st.rules = append(buildRules(ss.Answers, prefix, func(field, problem string) { fail(rs.Name, field, "%s", problem) }), routeRules...)
			st.record = routeRecord
			if ss.Record != nil {
				st.record = buildRecord(ss.Record, prefix, secretHeaders, func(field, problem string) { fail(rs.Name, field, "%s", problem) })
			}
			st.needJSON = len(st.record.fields) > 0
			for _, ar := range st.rules {
				st.needJSON = st.needJSON || ar.field != ""
			}
			if ss.Timeout != "" {
				d, err := parseTimeout(ss.Timeout)
				if err != nil {
					fail(rs.Name, prefix+"timeout", "%v", err)
				}
				st.timeout = d
			}
			// A step's request mapping replaces the route's.
			req, reqField := rs.Request, "request"
			if ss.Request != nil {
				req, reqField = ss.Request, prefix+"request"
			}
			if req != nil {
				st.request = buildRequestMap(req, ss.URL, prefix+"url", rs.ContentType, reqField,
					func(field, problem string) { fail(rs.Name, field, "%s", problem) })
				if st.request != nil && st.request.encoding != "" {
					st.contentType = cmp.Or(rs.ContentType, st.request.contentType())
				}
			} else if err := checkURL(ss.URL); err != nil {
				fail(rs.Name, prefix+"url", "%v", err)
			}
			st.url, st.host, st.origin = ss.URL, urlHost(ss.URL), urlOrigin(ss.URL)
			secrets = append(secrets, urlSecrets(ss.URL)...)

			// Route headers apply to every step; a step's own header of the
			// same name replaces it.
			merged := map[string]headerSpec{}
			fields := map[string]string{}
			for n, h := range rs.Headers {
				merged[http.CanonicalHeaderKey(n)] = h
				fields[http.CanonicalHeaderKey(n)] = "headers." + n
			}
			for n, h := range ss.Headers {
				merged[http.CanonicalHeaderKey(n)] = h
				fields[http.CanonicalHeaderKey(n)] = prefix + "headers." + n
			}
			for _, n := range slices.Sorted(maps.Keys(merged)) {
				h, field := merged[n], fields[n]
				if slices.Contains(reservedHeaders, n) {
					fail(rs.Name, field, "header %s is set by sbclaim and cannot be configured", n)
					continue
				}
				hv := header{name: n}
				switch {
				case h.FromEnv != nil:
					hv.value = getenv(*h.FromEnv)
					hv.secret = true
					if hv.value == "" {
						fail(rs.Name, field+".fromEnv", "environment variable %s (header %s) is not set or empty", *h.FromEnv, n)
						continue
					}
					if !validHeaderValue(hv.value) {
						fail(rs.Name, field+".fromEnv", "environment variable %s (header %s) holds a value that is not a valid header value (control characters)", *h.FromEnv, n)
						continue
					}
					secrets = append(secrets, hv.value)
				case h.Value != nil:
					hv.value = *h.Value
					if !validHeaderValue(hv.value) {
						fail(rs.Name, field+".value", "not a valid header value (control characters)")
						continue
					}
				}
				st.headers = append(st.headers, hv)
			}
			r.steps = append(r.steps, st)
		}
		var parts []string
		for _, st := range r.steps {
			parts = append(parts, st.name, st.method, st.url)
			if st.request != nil {
				// A step without a mapping keeps the fingerprint it had
				// before mappings existed.
				parts = append(parts, "request", st.contentType, st.request.canonical)
			}
			r.mapped = r.mapped || st.request != nil
		}
		if len(rs.FollowUps) > 0 {
			// What an answer source may name: the last step's record.
			var recorded []recordField
			if n := len(r.steps); n > 0 {
				recorded = r.steps[n-1].record.fields
			}
			var canon string
			r.followUps, canon = buildFollowUps(rs.FollowUps, recorded, func(field, problem string) { fail(rs.Name, field, "%s", problem) })
			for _, fu := range r.followUps {
				r.followMsg = r.followMsg || fu.usesMessage
			}
			// A route without follow-ups keeps the fingerprint it had
			// before they existed.
			parts = append(parts, "followUps", canon)
		}
		r.fingerprint = Fingerprint(parts...)
		router.routes = append(router.routes, r)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	red := redact.NewScrubber(secrets...)
	for _, r := range router.routes {
		r.redact = red
	}
	return router, nil
}

func stepHeaders(steps []stepSpec) []map[string]headerSpec {
	var out []map[string]headerSpec
	for _, s := range steps {
		out = append(out, s.Headers)
	}
	return out
}

// buildRules checks and resolves answer rules; prefix is "" or
// "steps[i].".
func buildRules(specs []answerSpec, prefix string, fail func(field, problem string)) []answerRule {
	var rules []answerRule
	for i, as := range specs {
		where := fmt.Sprintf("%sanswers[%d]", prefix, i)
		r := answerRule{where: where, field: as.Field}
		var err error
		if r.from, r.to, err = parseStatus(string(as.Status)); err != nil {
			fail(where+".status", err.Error())
			continue
		}
		if as.Outcome == "flag" {
			r.outcome, r.flag = OutcomeUnknown, true
		} else if r.outcome, err = ParseOutcome(as.Outcome); err != nil {
			fail(where+".outcome", err.Error())
			continue
		}
		if as.Header != "" {
			r.header = http.CanonicalHeaderKey(as.Header)
			switch v := as.Value.(type) {
			case string:
				r.value = strings.TrimSpace(v)
			case bool:
				r.value = strconv.FormatBool(v)
			case int:
				r.value = strconv.Itoa(v)
			default:
				fail(where+".value", "want the header's value as text, a whole number or true/false")
				continue
			}
		}
		if as.Field != "" {
			if r.tokens, err = parsePointer(as.Field); err != nil {
				fail(where+".field", err.Error())
				continue
			}
			switch v := as.Equals.(type) {
			case string, bool, float64:
				r.equals = v
			case int:
				r.equals = int64(v)
			case int64:
				r.equals = v
			case uint64:
				r.equals = float64(v)
			default:
				fail(where+".equals", "want a string, a number or true/false")
				continue
			}
		}
		rules = append(rules, r)
	}
	return rules
}

// buildRecord checks and resolves what a step records of its answers.
func buildRecord(spec *recordSpec, prefix string, secretHeaders []string, fail func(field, problem string)) recordRT {
	var rec recordRT
	if spec == nil {
		return rec
	}
	if n := len(spec.Headers) + len(spec.Fields); n > MaxAnswerEntries {
		fail(prefix+"record", fmt.Sprintf("at most %d headers and fields together can be recorded (got %d)", MaxAnswerEntries, n))
	}
	seen := map[string]bool{}
	for i, h := range spec.Headers {
		field := fmt.Sprintf("%srecord.headers[%d]", prefix, i)
		c := http.CanonicalHeaderKey(h)
		switch {
		case slices.Contains(secretHeaders, c):
			fail(field, fmt.Sprintf("header %s carries a secret (a credential, or a header this route sets from the environment) and is never recorded", c))
		case seen[c]:
			fail(field, fmt.Sprintf("header %s is listed twice", c))
		default:
			seen[c] = true
			rec.headers = append(rec.headers, c)
		}
	}
	for i, p := range spec.Fields {
		tokens, err := parsePointer(p)
		if err != nil {
			fail(fmt.Sprintf("%srecord.fields[%d]", prefix, i), err.Error())
			continue
		}
		rec.fields = append(rec.fields, recordField{pointer: p, tokens: tokens})
	}
	return rec
}

func parseTimeout(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration (write it like 5s, 1500ms or 1m30s)", s)
	}
	if d <= 0 {
		return 0, fmt.Errorf("%q must be greater than zero", s)
	}
	return d, nil
}

// checkURL refuses any URL that could take a value from the message: the
// URL is fixed text in the routes file, absolute http(s), with no template
// syntax (raw or percent-encoded) and no credentials. Its errors name the
// host at most: a webhook URL carries its secret in the path.
func checkURL(raw string) error {
	lower := strings.ToLower(raw)
	for _, bad := range []string{"{", "}", "$", "%7b", "%7d", "%24", "<", ">", "%3c", "%3e"} {
		if strings.Contains(lower, bad) {
			return fmt.Errorf("the URL contains template syntax %q: a route URL is fixed text; only a whole path segment may come from the message, as a {name} placeholder mapped in request.path", bad)
		}
	}
	u, err := url.Parse(raw)
	if err != nil {
		return errors.New("the URL does not parse")
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return errors.New("the URL must be an absolute http:// or https:// URL")
	}
	if u.User != nil {
		return fmt.Errorf("the URL (host %s) must not carry credentials: put them in a header with fromEnv", u.Hostname())
	}
	return nil
}

func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// urlSecrets are the parts of a route URL that a downstream echoing its
// request must not put in an excerpt or a recorded answer: the path (a
// webhook's secret) and the query values (an API key), when long enough
// to be secrets (short ones would only garble the text).
func urlSecrets(raw string) []string {
	u, err := url.Parse(raw)
	if err != nil {
		return nil
	}
	var out []string
	for _, p := range []string{u.EscapedPath(), u.Path} {
		if len(p) >= 4 {
			out = append(out, p)
		}
	}
	for _, vs := range u.Query() {
		for _, v := range vs {
			if len(v) >= 6 {
				out = append(out, v, url.QueryEscape(v))
			}
		}
	}
	return out
}
