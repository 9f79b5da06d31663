package sideeffects

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"mime"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// ReasonMappingFailed is the dead-letter reason for a message a route's
// request mapping cannot build a request from: a body that is not JSON, a
// field that is missing or of the wrong type, a value a path segment
// cannot hold. It is found by HTTPRouter.Route, before any claim.
const ReasonMappingFailed = "MappingFailed"

// MaxPathValueBytes bounds a value taken from a message for a path
// segment.
const MaxPathValueBytes = 256

// Media types of the mapped bodies.
const (
	formContentType = "application/x-www-form-urlencoded"
	jsonContentType = "application/json"
)

// requestSpec is a route's or a step's `request`: how its request is
// built from a JSON message. Without it the body is sent unchanged to a
// fixed URL.
type requestSpec struct {
	Form map[string]sourceSpec `yaml:"form"`
	JSON map[string]sourceSpec `yaml:"json"`
	Path map[string]sourceSpec `yaml:"path"`
}

// sourceSpec is where one value comes from: a field of the message
// (pointer) or fixed text (value).
type sourceSpec struct {
	Pointer  *string `yaml:"pointer"`
	Value    any     `yaml:"value"`
	Type     string  `yaml:"type"`
	Optional bool    `yaml:"optional"`
}

// requestMap is a resolved requestSpec.
type requestMap struct {
	encoding string        // "form", "json", or "" (the body is sent unchanged)
	fields   []mappedField // sorted by name, so every attempt sends the same bytes
	path     map[string]mappedSource
	tmpl     urlTemplate
	// canonical is the mapping as text, for the route's fingerprint.
	canonical string
}

type mappedField struct {
	name string   // as written: "metadata[order]"
	keys []string // for a JSON body: ["metadata", "order"]
	src  mappedSource
}

type mappedSource struct {
	where    string // "request.form.amount", for errors
	pointer  string
	tokens   []string
	value    any // fixed: string, int64, float64 or bool
	fixed    bool
	typ      string // "", string, integer, number, boolean
	optional bool
}

// urlTemplate is a step URL split around its placeholders, which can only
// be whole path segments: head is scheme://authority, tail the query and
// fragment, both fixed text.
type urlTemplate struct {
	head  string
	parts []urlPart // the path's segments, each "/"-prefixed
	tail  string
}

type urlPart struct {
	text  string // literal, with its leading "/"
	param string // placeholder name, when set
}

var (
	placeholderRE = regexp.MustCompile(`^\{([A-Za-z_][A-Za-z0-9_]{0,63})\}$`)
	fieldNameRE   = regexp.MustCompile(`^[^\[\]\x00-\x1f]+(\[[^\[\]\x00-\x1f]+\])*$`)
)

// parseTemplate splits raw at its placeholders. Placeholders may only be
// whole path segments ("/customers/{customer}"); anywhere else — the
// scheme, the host, the port, the query, the fragment, part of a segment
// — they are refused: the host and scheme are what the fixed URL protects.
// The rest of the URL is checked by checkURL with each placeholder
// replaced by a plain segment.
func parseTemplate(raw string) (urlTemplate, []string, error) {
	var t urlTemplate
	i := strings.Index(raw, "://")
	if i < 0 {
		return t, nil, checkURL(raw)
	}
	if strings.ContainsAny(raw[:i], "{}") {
		return t, nil, errors.New("a placeholder can only be a path segment: the scheme is fixed text")
	}
	rest := raw[i+3:]
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	if strings.ContainsAny(rest[:end], "{}") {
		return t, nil, errors.New("a placeholder can only be a path segment: the host and port are fixed text")
	}
	t.head = raw[:i+3+end]
	rest = rest[end:]
	path := rest
	if q := strings.IndexAny(rest, "?#"); q >= 0 {
		path, t.tail = rest[:q], rest[q:]
	}
	if strings.ContainsAny(t.tail, "{}") {
		return t, nil, errors.New("a placeholder can only be a path segment: the query and fragment are fixed text")
	}
	var names []string
	probe := t.head
	if path != "" {
		for _, seg := range strings.Split(path[1:], "/") {
			if !strings.ContainsAny(seg, "{}") {
				t.parts = append(t.parts, urlPart{text: "/" + seg})
				probe += "/" + seg
				continue
			}
			m := placeholderRE.FindStringSubmatch(seg)
			if m == nil {
				return t, nil, errors.New(`a placeholder must be a whole path segment named with letters, digits and "_", like /customers/{customer}`)
			}
			t.parts = append(t.parts, urlPart{param: m[1]})
			names = append(names, m[1])
			probe += "/x"
		}
	}
	if err := checkURL(probe + t.tail); err != nil {
		return t, nil, err
	}
	return t, names, nil
}

// buildRequestMap checks and resolves spec for a step whose URL is raw
// (urlField names it in errors); field names the spec ("request" or
// "steps[1].request"). contentType is the route's contentType ("" when
// unset).
func buildRequestMap(spec *requestSpec, raw, urlField, contentType, field string, fail func(field, problem string)) *requestMap {
	m := &requestMap{path: map[string]mappedSource{}}
	var canon []any
	switch {
	case spec.Form != nil && spec.JSON != nil:
		fail(field, "set form or json, not both")
		return nil
	case spec.Form != nil:
		m.encoding = "form"
	case spec.JSON != nil:
		m.encoding = "json"
	}
	fields := spec.Form
	if m.encoding == "json" {
		fields = spec.JSON
	}
	ok := true
	for _, n := range slices.Sorted(maps.Keys(fields)) {
		where := field + "." + m.encoding + "." + n
		if !fieldNameRE.MatchString(n) {
			fail(where, `not a field name: write name or name[key][key] (Stripe's nested keys), without control characters`)
			ok = false
			continue
		}
		src, good := buildSource(fields[n], where, fail)
		ok = ok && good
		m.fields = append(m.fields, mappedField{name: n, keys: fieldKeys(n), src: src})
		canon = append(canon, []any{m.encoding, n, src.canon()})
	}
	if m.encoding == "json" {
		// "metadata" and "metadata[order]": one key cannot hold a value
		// and an object.
		for _, f := range m.fields {
			for _, g := range m.fields {
				if strings.HasPrefix(g.name, f.name+"[") {
					fail(field+".json."+f.name, fmt.Sprintf("set as a value, and as an object by %s", g.name))
					ok = false
				}
			}
		}
	}

	tmpl, params, err := parseTemplate(raw)
	if err != nil {
		fail(urlField, err.Error())
		ok = false
	}
	m.tmpl = tmpl
	for _, p := range params {
		if _, found := spec.Path[p]; !found {
			fail(urlField, fmt.Sprintf("placeholder {%s} has no entry in %s.path", p, field))
			ok = false
		}
	}
	for _, n := range slices.Sorted(maps.Keys(spec.Path)) {
		where := field + ".path." + n
		if !slices.Contains(params, n) {
			fail(where, fmt.Sprintf("the url has no placeholder {%s}", n))
			ok = false
			continue
		}
		src, good := buildSource(spec.Path[n], where, fail)
		if src.fixed {
			fail(where+".value", "a path segment takes its value from the message (pointer); write a fixed segment into the url")
			good = false
		}
		if src.optional {
			fail(where+".optional", "a path segment cannot be optional")
			good = false
		}
		if src.typ != "" && src.typ != "string" && src.typ != "integer" {
			fail(where+".type", "a path segment takes a string or an integer")
			good = false
		}
		ok = ok && good
		m.path[n] = src
		canon = append(canon, []any{"path", n, src.canon()})
	}

	if contentType != "" && m.encoding != "" {
		mt, _, _ := mime.ParseMediaType(contentType)
		want := formContentType
		if m.encoding == "json" {
			want = jsonContentType
		}
		if mt != want && !(m.encoding == "json" && strings.HasSuffix(mt, "+json")) {
			fail("contentType", fmt.Sprintf("%q does not match %s.%s, which sends %s", mt, field, m.encoding, want))
			ok = false
		}
	}
	if !ok {
		return nil
	}
	b, _ := json.Marshal(canon)
	m.canonical = string(b)
	return m
}

// fieldKeys splits "metadata[order]" into ["metadata", "order"].
func fieldKeys(name string) []string {
	i := strings.IndexByte(name, '[')
	if i < 0 {
		return []string{name}
	}
	return append([]string{name[:i]}, strings.Split(strings.TrimSuffix(name[i+1:], "]"), "][")...)
}

func buildSource(s sourceSpec, where string, fail func(field, problem string)) (mappedSource, bool) {
	src := mappedSource{where: where, typ: s.Type, optional: s.Optional}
	switch {
	case s.Pointer != nil && s.Value != nil:
		fail(where, "set exactly one of pointer (a field of the message) or value (fixed text)")
		return src, false
	case s.Pointer != nil:
		tokens, err := parsePointer(*s.Pointer)
		if err != nil {
			fail(where+".pointer", err.Error())
			return src, false
		}
		src.pointer, src.tokens = *s.Pointer, tokens
	case s.Value != nil:
		src.fixed = true
		switch v := s.Value.(type) {
		case string, bool, float64:
			src.value = v
		case int:
			src.value = int64(v)
		case int64:
			src.value = v
		case uint64:
			src.value = float64(v)
		default:
			fail(where+".value", "want a string, a number or true/false")
			return src, false
		}
		if s.Type != "" || s.Optional {
			fail(where, "type and optional apply to a pointer, not to a fixed value")
			return src, false
		}
	default:
		fail(where, "set exactly one of pointer (a field of the message) or value (fixed text)")
		return src, false
	}
	return src, true
}

// canon is the source as text for the fingerprint.
func (s mappedSource) canon() any {
	if s.fixed {
		return map[string]any{"value": s.value}
	}
	return map[string]any{"pointer": s.pointer, "type": s.typ, "optional": s.optional}
}

// contentType is the Content-Type of the mapped body.
func (m *requestMap) contentType() string {
	if m.encoding == "json" {
		return jsonContentType
	}
	return formContentType
}

// mappingError is why a message cannot be mapped; it becomes an
// *InputError with ReasonMappingFailed. It never quotes a whole value from
// the message.
type mappingError struct {
	where   string
	problem string
}

func (e *mappingError) Error() string { return e.where + ": " + e.problem }

// build makes the step's URL and body from doc, the message's JSON. body
// is nil when the mapping has no form or json (the message body is sent
// unchanged).
func (m *requestMap) build(doc any) (rawURL string, body []byte, err error) {
	var u strings.Builder
	u.WriteString(m.tmpl.head)
	for _, p := range m.tmpl.parts {
		if p.param == "" {
			u.WriteString(p.text)
			continue
		}
		seg, err := m.path[p.param].segment(doc)
		if err != nil {
			return "", nil, err
		}
		u.WriteString("/" + url.PathEscape(seg))
	}
	u.WriteString(m.tmpl.tail)

	switch m.encoding {
	case "form":
		vals := url.Values{}
		for _, f := range m.fields {
			v, found, err := f.src.resolve(doc)
			if err != nil {
				return "", nil, err
			}
			if !found {
				continue
			}
			s, err := f.src.formText(v)
			if err != nil {
				return "", nil, err
			}
			vals.Set(f.name, s)
		}
		body = []byte(vals.Encode()) // sorted by key: the same bytes on every attempt
	case "json":
		obj := map[string]any{}
		for _, f := range m.fields {
			v, found, err := f.src.resolve(doc)
			if err != nil {
				return "", nil, err
			}
			if !found {
				continue
			}
			o := obj
			for _, k := range f.keys[:len(f.keys)-1] {
				next, _ := o[k].(map[string]any)
				if next == nil {
					next = map[string]any{}
					o[k] = next
				}
				o = next
			}
			o[f.keys[len(f.keys)-1]] = v
		}
		body, err = json.Marshal(obj) // maps marshal sorted: the same bytes every time
		if err != nil {
			return "", nil, &mappingError{where: "request.json", problem: "cannot encode: " + err.Error()}
		}
	}
	return u.String(), body, nil
}

// resolve returns the source's value from doc; found is false for a
// missing optional field.
func (s mappedSource) resolve(doc any) (v any, found bool, err error) {
	if s.fixed {
		return s.value, true, nil
	}
	v, ok := lookupPointer(doc, s.tokens)
	if !ok {
		if s.optional {
			return nil, false, nil
		}
		return nil, false, &mappingError{where: s.where, problem: fmt.Sprintf("the message has no field %s", s.pointer)}
	}
	if s.typ != "" && jsonType(v) != s.typ && !(s.typ == "number" && jsonType(v) == "integer") {
		return nil, false, s.wrongType(v, article(s.typ))
	}
	return v, true, nil
}

func (s mappedSource) wrongType(v any, want string) error {
	return &mappingError{where: s.where, problem: fmt.Sprintf("the field %s is %s; want %s", s.pointer, article(jsonType(v)), want)}
}

func article(t string) string {
	switch t {
	case "null":
		return "null"
	case "integer", "object", "array":
		return "an " + t
	}
	return "a " + t
}

// jsonType names a decoded JSON value's type (numbers decoded as
// json.Number).
func jsonType(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case string:
		return "string"
	case bool:
		return "boolean"
	case json.Number:
		if isInteger(v.String()) {
			return "integer"
		}
		return "number"
	case int64:
		return "integer"
	case float64:
		return "number"
	case map[string]any:
		return "object"
	case []any:
		return "array"
	}
	return fmt.Sprintf("%T", v)
}

func isInteger(s string) bool {
	s = strings.TrimPrefix(s, "-")
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// formText renders a scalar as a form value.
func (s mappedSource) formText(v any) (string, error) {
	switch v := v.(type) {
	case string:
		return v, nil
	case json.Number:
		return v.String(), nil
	case bool:
		return strconv.FormatBool(v), nil
	case int64:
		return strconv.FormatInt(v, 10), nil
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64), nil
	}
	return "", s.wrongType(v, "a string, a number or true/false (a form value)")
}

// segment returns the value for one path segment, or refuses it: a path
// value is one segment of letters, digits, "-", ".", "_" and "~" (RFC
// 3986's unreserved characters, which need no percent-encoding), never
// empty, "." or "..", at most MaxPathValueBytes. Anything else — a "/", a
// "%", a ":" (a scheme), "@", "?", "#", white space — is refused rather
// than encoded: an API that decodes %2F before routing would see two
// segments.
func (s mappedSource) segment(doc any) (string, error) {
	v, _, err := s.resolve(doc)
	if err != nil {
		return "", err
	}
	var seg string
	switch v := v.(type) {
	case string:
		seg = v
	case json.Number:
		if !isInteger(v.String()) {
			return "", s.wrongType(v, "a string or an integer (a path segment)")
		}
		seg = v.String()
	default:
		return "", s.wrongType(v, "a string or an integer (a path segment)")
	}
	refuse := func(problem string) error {
		return &mappingError{where: s.where, problem: fmt.Sprintf("the field %s %s; a path segment takes 1 to %d letters, digits, \"-\", \".\", \"_\" or \"~\"", s.pointer, problem, MaxPathValueBytes)}
	}
	switch {
	case seg == "":
		return "", refuse("is empty")
	case seg == "." || seg == "..":
		return "", refuse(fmt.Sprintf("is %q (a dot segment)", seg))
	case len(seg) > MaxPathValueBytes:
		return "", refuse(fmt.Sprintf("is %d bytes long", len(seg)))
	}
	for i := 0; i < len(seg); i++ {
		c := seg[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~' {
			continue
		}
		if c < ' ' || c >= 0x7f {
			return "", refuse(fmt.Sprintf("holds byte 0x%02x", c))
		}
		return "", refuse(fmt.Sprintf("holds %q", string(c)))
	}
	return seg, nil
}
