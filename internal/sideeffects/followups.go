package sideeffects

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"unicode/utf8"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// A route's followUps: messages it publishes once its effect succeeded
// (the outbox: see claim.FollowUp), each built from the JSON message (a
// pointer, as in request mapping), fixed text (value) and the
// downstream's recorded answer (answer: one of the last step's record
// fields):
//
//	followUps:
//	  - to: payment-charged
//	    subject: payment.charged
//	    json:
//	      payment: {pointer: /id}
//	      charge: {answer: /id}
//	    properties:
//	      kind: {value: receipt}
//	    sessionId: {pointer: /customer}
//
// The message's fields are checked when the message is routed, before
// any claim (a missing one dead-letters it as MappingFailed, as a request
// mapping does); an answer's field the answer does not have is left out.
// An answer's value is its recorded text.

// followUpSpec is one entry of a route's followUps.
type followUpSpec struct {
	To         string                      `yaml:"to"`
	Subject    string                      `yaml:"subject"`
	SessionID  *followSourceSpec           `yaml:"sessionId"`
	JSON       map[string]followSourceSpec `yaml:"json"`
	Properties map[string]followSourceSpec `yaml:"properties"`
}

// followSourceSpec is a sourceSpec that may also name a recorded field of
// the downstream's answer.
type followSourceSpec struct {
	Pointer  *string `yaml:"pointer"`
	Value    any     `yaml:"value"`
	Type     string  `yaml:"type"`
	Optional bool    `yaml:"optional"`
	Answer   *string `yaml:"answer"`
}

// followSource is a resolved followSourceSpec.
type followSource struct {
	msg    mappedSource // from the message, or fixed
	answer string       // the recorded field's pointer; "" for msg
}

type followField struct {
	name string
	keys []string
	src  followSource
}

// followUpRT is a resolved followUpSpec.
type followUpRT struct {
	to, subject string
	session     *followSource
	fields      []followField // sorted by name
	props       []followField // sorted by name
	usesMessage bool          // a source reads the message
}

// buildFollowUps resolves a route's followUps; recorded are the pointers
// the last step records (what an answer source may name).
func buildFollowUps(specs []followUpSpec, recorded []recordField, fail func(field, problem string)) ([]*followUpRT, string) {
	if len(specs) > claim.MaxFollowUps {
		fail("followUps", fmt.Sprintf("%d follow-ups; a route publishes at most %d", len(specs), claim.MaxFollowUps))
		return nil, ""
	}
	var (
		out   []*followUpRT
		canon []any
	)
	for i, fs := range specs {
		where := fmt.Sprintf("followUps[%d]", i)
		fu := &followUpRT{to: fs.To, subject: fs.Subject}
		probe := claim.FollowUp{To: fs.To, Subject: fs.Subject}
		if err := probe.Validate(); err != nil {
			fail(where, err.Error())
			continue
		}
		source := func(s followSourceSpec, at string) (followSource, bool) {
			if s.Answer != nil {
				if s.Pointer != nil || s.Value != nil || s.Type != "" || s.Optional {
					fail(at, "an answer source names only the answer's recorded field (answer); it is always optional")
					return followSource{}, false
				}
				if _, err := parsePointer(*s.Answer); err != nil {
					fail(at+".answer", err.Error())
					return followSource{}, false
				}
				if !slices.ContainsFunc(recorded, func(r recordField) bool { return r.pointer == *s.Answer }) {
					fail(at+".answer", fmt.Sprintf("the route's (last step's) record.fields has no %s: only a recorded field of the answer can be published", *s.Answer))
					return followSource{}, false
				}
				return followSource{answer: *s.Answer}, true
			}
			src, ok := buildSource(sourceSpec{Pointer: s.Pointer, Value: s.Value, Type: s.Type, Optional: s.Optional}, at, fail)
			if ok && !src.fixed {
				fu.usesMessage = true
			}
			return followSource{msg: src}, ok
		}
		ok := true
		fields := func(m map[string]followSourceSpec, kind string) []followField {
			var fs []followField
			for _, n := range slices.Sorted(maps.Keys(m)) {
				at := where + "." + kind + "." + n
				if kind == "json" && !fieldNameRE.MatchString(n) {
					fail(at, `not a field name: write name or name[key][key], without control characters`)
					ok = false
					continue
				}
				if kind == "properties" && (n == "" || !utf8.ValidString(n)) {
					fail(at, "not a property name")
					ok = false
					continue
				}
				src, good := source(m[n], at)
				ok = ok && good
				keys := []string{n}
				if kind == "json" {
					keys = fieldKeys(n)
				}
				fs = append(fs, followField{name: n, keys: keys, src: src})
			}
			return fs
		}
		fu.fields = fields(fs.JSON, "json")
		fu.props = fields(fs.Properties, "properties")
		for _, f := range fu.fields {
			for _, g := range fu.fields {
				if len(g.name) > len(f.name) && g.name[:len(f.name)+1] == f.name+"[" {
					fail(where+".json."+f.name, fmt.Sprintf("set as a value, and as an object by %s", g.name))
					ok = false
				}
			}
		}
		if fs.SessionID != nil {
			src, good := source(*fs.SessionID, where+".sessionId")
			ok = ok && good
			fu.session = &src
		}
		if !ok {
			continue
		}
		out = append(out, fu)
		canon = append(canon, fu.canon())
	}
	b, _ := json.Marshal(canon)
	return out, string(b)
}

func (s followSource) canon() any {
	if s.answer != "" {
		return []any{"answer", s.answer}
	}
	return s.msg.canon()
}

// canon is the follow-up as data, for the route's fingerprint.
func (fu *followUpRT) canon() any {
	c := []any{fu.to, fu.subject}
	for _, f := range fu.fields {
		c = append(c, "json", f.name, f.src.canon())
	}
	for _, f := range fu.props {
		c = append(c, "property", f.name, f.src.canon())
	}
	if fu.session != nil {
		c = append(c, "session", fu.session.canon())
	}
	return c
}

// value is the source's value from the message doc or the answer; found
// is false for a missing optional field or an answer without it.
func (s followSource) value(doc any, answer *Answer) (v any, found bool, err error) {
	if s.answer != "" {
		if answer == nil {
			return nil, false, nil
		}
		t, ok := answer.Fields[s.answer]
		return t, ok, nil
	}
	return s.msg.resolve(doc)
}

// text is the source's value as text (a property, a session id).
func (s followSource) text(doc any, answer *Answer) (string, bool, error) {
	v, found, err := s.value(doc, answer)
	if err != nil || !found {
		return "", found, err
	}
	if t, ok := v.(string); ok {
		return t, true, nil
	}
	t, err := s.msg.formText(v)
	return t, true, err
}

// build is the follow-up of the message doc and the downstream's answer
// (nil: check the message's side only).
func (fu *followUpRT) build(doc any, answer *Answer) (claim.FollowUp, error) {
	f := claim.FollowUp{To: fu.to, Subject: fu.subject, ContentType: jsonContentType}
	obj := map[string]any{}
	for _, fl := range fu.fields {
		v, found, err := fl.src.value(doc, answer)
		if err != nil {
			return f, err
		}
		if !found {
			continue
		}
		o := obj
		for _, k := range fl.keys[:len(fl.keys)-1] {
			next, _ := o[k].(map[string]any)
			if next == nil {
				next = map[string]any{}
				o[k] = next
			}
			o = next
		}
		o[fl.keys[len(fl.keys)-1]] = v
	}
	body, err := json.Marshal(obj)
	if err != nil {
		return f, &mappingError{where: "followUps", problem: "cannot encode: " + err.Error()}
	}
	f.Body = body
	for _, p := range fu.props {
		t, found, err := p.src.text(doc, answer)
		if err != nil {
			return f, err
		}
		if found {
			if f.Properties == nil {
				f.Properties = map[string]string{}
			}
			f.Properties[p.name] = t
		}
	}
	if fu.session != nil {
		t, _, err := fu.session.text(doc, answer)
		if err != nil {
			return f, err
		}
		f.SessionID = t
	}
	if err := f.Validate(); err != nil {
		return f, &mappingError{where: "followUps", problem: err.Error()}
	}
	return f, nil
}

// errNoOutbox is a route's answer to a processor without an outbox.
func (r *httpRoute) errNoOutbox() error {
	return Misconfigured(fmt.Errorf("route %q publishes follow-ups (followUps), but the processor has no outbox: %w", r.name, claim.ErrNoOutbox))
}

// publish publishes the route's follow-ups once its effect succeeded.
// The message was checked when it was routed; a failure here is after
// the effect, so its outcome is unknown (a repeat under the same key
// publishes again).
func (r *httpRoute) publish(ctx context.Context, body []byte, answer *Answer) error {
	var doc any
	if len(body) > 0 {
		doc, _ = decodeJSON(body)
	}
	sink := claim.FollowUpSinkOf(ctx)
	for _, fu := range r.followUps {
		f, err := fu.build(doc, answer)
		if err == nil {
			err = sink.Publish(f)
		}
		if err != nil {
			return Unknown(fmt.Errorf("route %q: the effect succeeded, but its follow-up to %q could not be published: %w", r.name, fu.to, err))
		}
	}
	return nil
}

// FollowUpTargets returns the queues and topics the routes publish
// follow-ups to, sorted (none: the routes need no outbox).
func (r *HTTPRouter) FollowUpTargets() []string {
	seen := map[string]bool{}
	for _, rt := range r.routes {
		for _, fu := range rt.followUps {
			seen[fu.to] = true
		}
	}
	return slices.Sorted(maps.Keys(seen))
}
