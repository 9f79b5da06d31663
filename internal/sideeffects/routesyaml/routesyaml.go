// Package routesyaml reads a routes file: YAML, validated against its JSON
// Schema (routes.schema.json), each problem named by route and field, then
// decoded into the form package sideeffects builds its routes from
// (sideeffects.BuildRoutes). It imports nothing of sbclaim's, so that
// sideeffects, and the root package with it, links no YAML or JSON Schema
// library: only programs that read a routes file (package routesfile) do.
package routesyaml

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"go.yaml.in/yaml/v3"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// Schema is the JSON Schema a routes file is validated against at start-up
// (routes.schema.json, embedded).
//
//go:embed routes.schema.json
var Schema []byte

// Decode validates data, a routes file, against Schema and decodes it into
// into (a pointer to the decoded form, with yaml field tags). Every schema
// problem is reported at once, each as the error newProblem makes of the
// route (its name, "routes[i]" when it has none, "" for the file itself),
// the field inside it (e.g. "steps[1].timeout") and the problem; the
// problems are joined (errors.Join). YAML that does not parse is one
// problem of the file.
func Decode(data []byte, into any, newProblem func(route, field, problem string) error) error {
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return newProblem("", "", "not valid YAML: "+err.Error())
	}
	doc = jsonValue(doc)
	if errs := validateSchema(doc); len(errs) > 0 {
		for i, e := range errs {
			if p, ok := e.(*routeProblem); ok {
				errs[i] = newProblem(p.Route, p.Field, p.Problem)
			}
		}
		return errors.Join(errs...)
	}
	if err := yaml.Unmarshal(data, into); err != nil {
		return newProblem("", "", "decode: "+err.Error())
	}
	return nil
}

// routeProblem is one schema problem, before Decode hands it to its
// caller's newProblem.
type routeProblem struct {
	Route, Field, Problem string
}

func (p *routeProblem) Error() string {
	return fmt.Sprintf("route %q: field %q: %s", p.Route, p.Field, p.Problem)
}

var routesSchema = func() *jsonschema.Schema {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(Schema))
	if err != nil {
		panic("routesyaml: routes.schema.json: " + err.Error())
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("routes.schema.json", doc); err != nil {
		panic("routesyaml: routes.schema.json: " + err.Error())
	}
	s, err := c.Compile("routes.schema.json")
	if err != nil {
		panic("routesyaml: routes.schema.json: " + err.Error())
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
		return []error{&routeProblem{Problem: err.Error()}}
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
		return &routeProblem{Route: routeLabel(doc, i), Field: fieldPath(loc[2:]), Problem: problem}
	}
	return &routeProblem{Field: fieldPath(loc), Problem: problem}
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
