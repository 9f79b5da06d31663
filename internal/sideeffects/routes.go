package sideeffects

import (
	"bytes"
	"cmp"
	_ "embed"
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

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"go.yaml.in/yaml/v3"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/redact"
	"github.com/sbclaim/sbclaim/internal/tracing"
)

// RoutesSchema is the JSON Schema a routes file is validated against at
// start-up (routes.schema.json, embedded).
//
//go:embed routes.schema.json
var RoutesSchema []byte

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

func (s *statusSpec) UnmarshalYAML(n *yaml.Node) error {
	*s = statusSpec(n.Value)
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

// LoadRoutes reads the routes file at path (SBCLAIM_ROUTES) and builds its
// HTTP effects; see ParseRoutes. It uses a default HTTP client.
func LoadRoutes(path string, getenv func(string) string, logger *slog.Logger) (*HTTPRouter, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("routes file: %w", err)
	}
	r, err := ParseRoutes(data, getenv, nil, logger)
	if err != nil {
		return nil, fmt.Errorf("routes file %s: %w", path, err)
	}
	return r, nil
}

// ParseRoutes validates a routes file (YAML) against RoutesSchema, checks
// what a schema cannot (URLs that could take a value from a message,
// reserved headers, environment variables that are not set) and builds one
// HTTP effect per route. Every problem is reported at once, each as a
// *RoutesError naming the route and field (errors.As finds the first).
//
// getenv (os.Getenv when nil) supplies header values declared with
// fromEnv; they are resolved once, here, and never logged or put in an
// error. client (nil for a default one) sends the requests; ParseRoutes
// uses a copy of it that never follows redirects. logger (nil discards)
// receives one Debug line per attempt and one Info line per failed attempt.
func ParseRoutes(data []byte, getenv func(string) string, client *http.Client, logger *slog.Logger) (*HTTPRouter, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, &RoutesError{Problem: "not valid YAML: " + err.Error()}
	}
	doc = jsonValue(doc)
	if errs := validateSchema(doc); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	var file routesFile
	if err := yaml.Unmarshal(data, &file); err != nil {
		return nil, &RoutesError{Problem: "decode: " + err.Error()}
	}
	return buildRouter(&file, getenv, client, logger)
}

var routesSchema = func() *jsonschema.Schema {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(RoutesSchema))
	if err != nil {
		panic("sideeffects: routes.schema.json: " + err.Error())
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("routes.schema.json", doc); err != nil {
		panic("sideeffects: routes.schema.json: " + err.Error())
	}
	s, err := c.Compile("routes.schema.json")
	if err != nil {
		panic("sideeffects: routes.schema.json: " + err.Error())
	}
	return s
}()

// jsonValue turns a YAML-decoded value into the JSON data model the schema
// validator takes (string-keyed maps; timestamps as text).
func jsonValue(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			v[k] = jsonValue(e)
		}
		return v
	case map[any]any:
		m := make(map[string]any, len(v))
		for k, e := range v {
			m[fmt.Sprint(k)] = jsonValue(e)
		}
		return m
	case []any:
		for i, e := range v {
			v[i] = jsonValue(e)
		}
		return v
	case time.Time:
		return v.Format(time.RFC3339Nano)
	case nil, bool, string, int, int64, uint64, float64:
		return v
	}
	return fmt.Sprint(v)
}

var schemaPrinter = message.NewPrinter(language.English)

// validateSchema returns one *RoutesError per leaf schema violation.
func validateSchema(doc any) []error {
	err := routesSchema.Validate(doc)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return []error{&RoutesError{Problem: err.Error()}}
	}
	var errs []error
	var walk func(e, parent *jsonschema.ValidationError)
	walk = func(e, parent *jsonschema.ValidationError) {
		if pn, ok := e.ErrorKind.(*kind.PropertyNames); ok && parent != nil {
			// jsonschema v6.0.3 gives a propertyNames error a location
			// that a later check overwrites (a shared slice); its parent,
			// the object's $ref, has the object's. Its causes are located
			// in the name alone.
			loc := append(slices.Clone(parent.InstanceLocation), pn.Property)
			errs = append(errs, schemaError(doc, loc, nameProblem(loc)))
			return
		}
		if _, ok := e.ErrorKind.(*kind.Not); ok && inRequest(e.InstanceLocation) {
			problem := "set exactly one of pointer (a field of the message) or value (fixed text)"
			if l := e.InstanceLocation; l[len(l)-1] == "request" {
				problem = "set form or json, not both"
			}
			errs = append(errs, schemaError(doc, e.InstanceLocation, problem))
			return
		}
		if len(e.Causes) > 0 {
			for _, c := range e.Causes {
				walk(c, e)
			}
			return
		}
		loc := e.InstanceLocation
		last := ""
		if len(loc) > 0 {
			last = loc[len(loc)-1]
		}
		if last == "status" && len(loc) >= 3 && loc[len(loc)-3] == "answers" {
			switch e.ErrorKind.(type) {
			case *kind.Type, *kind.Minimum, *kind.Maximum, *kind.Pattern:
				errs = append(errs, schemaError(doc, loc, fmt.Sprintf(`%s is not a status: write a code (402), a range ("400-499") or a class ("4xx"), within 100-599`, instanceText(doc, loc))))
				return
			}
		}
		switch k := e.ErrorKind.(type) {
		case *kind.DependentRequired:
			if inRequest(loc) {
				errs = append(errs, schemaError(doc, append(slices.Clone(loc), "pointer"), fmt.Sprintf("missing: %s applies to a field of the message, named by pointer", k.Prop)))
				break
			}
			why := "a rule narrowed by a JSON field names the field and the value it must equal"
			if k.Prop == "header" || k.Prop == "value" {
				why = "a rule narrowed by a response header names the header and the value it must have"
			}
			for _, m := range k.Missing {
				errs = append(errs, schemaError(doc, append(slices.Clone(loc), m), fmt.Sprintf("missing: %s needs %s (%s)", k.Prop, m, why)))
			}
		case *kind.Required:
			for _, m := range k.Missing {
				errs = append(errs, schemaError(doc, append(slices.Clone(loc), m), "missing (required)"))
			}
		case *kind.AdditionalProperties:
			for _, p := range k.Properties {
				errs = append(errs, schemaError(doc, append(slices.Clone(loc), p), "unknown field"))
			}
		case *kind.FalseSchema:
			errs = append(errs, schemaError(doc, loc, "not allowed in a route with steps (set it on each step)"))
		case *kind.MinProperties, *kind.MaxProperties:
			if last == "record" {
				errs = append(errs, schemaError(doc, loc, "list headers, fields or both"))
				break
			}
			if len(loc) >= 2 && loc[len(loc)-2] == "headers" {
				errs = append(errs, schemaError(doc, loc, "set exactly one of fromEnv (a secret, read from the environment) or value (fixed text)"))
				break
			}
			if inRequest(loc) {
				switch {
				case last == "request":
					errs = append(errs, schemaError(doc, loc, "set form, json or path"))
				case last == "form" || last == "json" || last == "path":
					errs = append(errs, schemaError(doc, loc, e.ErrorKind.LocalizedString(schemaPrinter)+" (list the fields)"))
				default:
					errs = append(errs, schemaError(doc, loc, "set exactly one of pointer (a field of the message) or value (fixed text)"))
				}
				break
			}
			errs = append(errs, schemaError(doc, loc, e.ErrorKind.LocalizedString(schemaPrinter)))
		case *kind.Pattern:
			errs = append(errs, schemaError(doc, loc, patternProblem(loc, k)))
		default:
			errs = append(errs, schemaError(doc, loc, e.ErrorKind.LocalizedString(schemaPrinter)))
		}
	}
	walk(ve, nil)
	return errs
}

func patternProblem(loc []string, k *kind.Pattern) string {
	last := ""
	if len(loc) > 0 {
		last = loc[len(loc)-1]
	}
	switch {
	case last == "timeout" || last == "keyLifetime":
		return fmt.Sprintf("%q is not a duration (write it like 5s, 1500ms or 1m30s)", k.Got)
	case last == "header":
		return fmt.Sprintf("%q is not a valid HTTP header name", k.Got)
	case last == "name":
		return fmt.Sprintf("%q is not a valid name (letters, digits, '.', '_', '-'; at most 64)", k.Got)
	case last == "fromEnv":
		return fmt.Sprintf("%q is not an environment variable name", k.Got)
	case last == "field" || last == "pointer" || len(loc) >= 2 && loc[len(loc)-2] == "fields":
		return fmt.Sprintf(`%q is not a JSON Pointer (RFC 6901): write it like /error/type, starting with "/", with "~" as ~0 and a "/" inside a name as ~1`, k.Got)
	case len(loc) >= 2 && loc[len(loc)-2] == "headers":
		return "not a valid HTTP header name"
	}
	return k.LocalizedString(schemaPrinter)
}

// nameProblem says why the name that ends loc (a key of an object) is
// refused.
func nameProblem(loc []string) string {
	parent := ""
	if len(loc) >= 2 {
		parent = loc[len(loc)-2]
	}
	switch {
	case parent == "headers":
		return "not a valid HTTP header name"
	case inRequest(loc) && (parent == "form" || parent == "json"):
		return `not a field name: write name or name[key][key] (Stripe's nested keys), at most 128 bytes, without control characters`
	case inRequest(loc) && parent == "path":
		return `not a placeholder name: letters, digits and "_", not starting with a digit, at most 64`
	}
	return "not a valid name"
}

// inRequest reports whether loc is inside a route's or step's request
// mapping.
func inRequest(loc []string) bool {
	// routes/<i>/request/... or routes/<i>/steps/<j>/request/...
	return len(loc) >= 3 && loc[0] == "routes" && loc[2] == "request" ||
		len(loc) >= 5 && loc[0] == "routes" && loc[2] == "steps" && loc[4] == "request"
}

// instanceText renders the value at loc in doc for an error message.
func instanceText(doc any, loc []string) string {
	v := doc
	for _, t := range loc {
		switch c := v.(type) {
		case map[string]any:
			v = c[t]
		case []any:
			i, err := strconv.Atoi(t)
			if err != nil || i < 0 || i >= len(c) {
				return "the value"
			}
			v = c[i]
		default:
			return "the value"
		}
	}
	switch v := v.(type) {
	case string:
		return strconv.Quote(v)
	case nil:
		return "null"
	}
	return fmt.Sprint(v)
}

// schemaError names the route (by its name when it has one) and the field
// at loc, a JSON pointer split into tokens.
func schemaError(doc any, loc []string, problem string) error {
	if len(loc) >= 2 && loc[0] == "routes" {
		i, _ := strconv.Atoi(loc[1])
		return &RoutesError{Route: routeLabel(doc, i), Field: fieldPath(loc[2:]), Problem: problem}
	}
	return &RoutesError{Field: fieldPath(loc), Problem: problem}
}

func routeLabel(doc any, i int) string {
	if m, ok := doc.(map[string]any); ok {
		if rs, ok := m["routes"].([]any); ok && i < len(rs) {
			if r, ok := rs[i].(map[string]any); ok {
				if n, ok := r["name"].(string); ok && n != "" {
					return n
				}
			}
		}
	}
	return fmt.Sprintf("routes[%d]", i)
}

func fieldPath(tokens []string) string {
	var b strings.Builder
	for i, t := range tokens {
		if _, err := strconv.Atoi(t); err == nil && i > 0 {
			b.WriteString("[" + t + "]")
			continue
		}
		if b.Len() > 0 {
			b.WriteByte('.')
		}
		b.WriteString(t)
	}
	return b.String()
}

// buildRouter checks what the schema cannot and resolves the routes.
func buildRouter(file *routesFile, getenv func(string) string, client *http.Client, logger *slog.Logger) (*HTTPRouter, error) {
	if client == nil {
		client = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	c := *client // never follow redirects: a 3xx is classified, not chased
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	c.Transport = tracing.HTTPTransport(c.Transport) // a span per request; the downstream gets its traceparent

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
