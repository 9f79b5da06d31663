package sideeffects

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// AnySubject in Match.Subject matches every message, with or without a
// Subject.
const AnySubject = "*"

// Match selects messages for a route: Subject must equal the message's
// Subject (or be AnySubject), and when Property is set, the message must
// carry that application property with that value (compared as text).
type Match struct {
	Subject  string
	Property *PropertyMatch
}

// PropertyMatch is one application property name=value.
type PropertyMatch struct {
	Name  string
	Value string
}

// Matches reports whether msg is selected.
func (m Match) Matches(msg *azservicebus.ReceivedMessage) bool {
	if m.Subject != AnySubject {
		if msg.Subject == nil || *msg.Subject != m.Subject {
			return false
		}
	}
	if m.Property != nil {
		v, ok := msg.ApplicationProperties[m.Property.Name]
		if !ok || propertyText(v) != m.Property.Value {
			return false
		}
	}
	return true
}

func (m Match) String() string {
	s := "subject=" + m.Subject
	if m.Property != nil {
		s += " " + m.Property.Name + "=" + m.Property.Value
	}
	return s
}

// propertyText renders an application property value the way a routes file
// writes it.
func propertyText(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	case nil:
		return ""
	}
	return fmt.Sprint(v)
}

// Route maps messages to one Go effect: exactly one of Effect or TxEffect
// is set. It is the in-code counterpart of a routes file entry, for programs
// (tests, the chaos harness) whose effects are Go functions.
type Route struct {
	Name     string
	Match    Match
	Effect   Effect
	TxEffect TxEffect
	// JSONBody, when set, dead-letters messages whose body is not valid JSON
	// (ReasonMalformedBody) before any claim is taken.
	JSONBody bool
	// Recovery is RecoveryAuto ("" too) or RecoveryManual.
	Recovery Recovery
	// Version is part of the route's fingerprint (with its name): change it
	// when the effect changes in a way that must not meet claims taken
	// under the old one.
	Version string
	// AllowNewKey is Handler.AllowNewKey.
	AllowNewKey bool
	// HoldSessionOnFailure is Handler.HoldSessionOnFailure.
	HoldSessionOnFailure bool
	// KeyLifetime is Handler.KeyLifetime (zero: the downstream keeps keys
	// for ever).
	KeyLifetime time.Duration
	// KeyForm is Handler.KeyForm ("" : scoped).
	KeyForm claim.KeyForm
	// Backoff is Handler.Backoff.
	Backoff Backoff
	// Breaker is Handler.Breaker.
	Breaker Breaker
}

// Routes is an in-code Router: the first route whose Match selects the
// message wins; no match is an *InputError with ReasonNoRoute. Build it with
// NewRouter, which checks it.
type Routes []Route

var _ Router = Routes(nil)

// NewRouter checks routes (a name, a subject, exactly one effect, unique
// names) and returns them as a Router.
func NewRouter(routes ...Route) (Routes, error) {
	seen := make(map[string]bool, len(routes))
	var errs []error
	for i, r := range routes {
		switch {
		case r.Name == "":
			errs = append(errs, fmt.Errorf("route %d: Name is required", i))
		case seen[r.Name]:
			errs = append(errs, fmt.Errorf("route %q: Name is used twice", r.Name))
		}
		seen[r.Name] = true
		if r.Match.Subject == "" {
			errs = append(errs, fmt.Errorf("route %q: Match.Subject is required (use %q for any)", r.Name, AnySubject))
		}
		if (r.Effect == nil) == (r.TxEffect == nil) {
			errs = append(errs, fmt.Errorf("route %q: exactly one of Effect and TxEffect must be set", r.Name))
		}
		if r.KeyLifetime < 0 {
			errs = append(errs, fmt.Errorf("route %q: KeyLifetime cannot be negative (got %s)", r.Name, r.KeyLifetime))
		}
		if r.KeyForm != "" && !r.KeyForm.Valid() {
			errs = append(errs, fmt.Errorf("route %q: KeyForm must be %q or %q, got %q", r.Name, claim.KeyFormRaw, claim.KeyFormScoped, r.KeyForm))
		}
		if !r.Recovery.Valid() {
			errs = append(errs, fmt.Errorf("route %q: Recovery must be %q or %q, got %q", r.Name, RecoveryAuto, RecoveryManual, r.Recovery))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return Routes(routes), nil
}

// Route implements Router.
func (rs Routes) Route(msg *azservicebus.ReceivedMessage) (Handler, error) {
	for _, r := range rs {
		if !r.Match.Matches(msg) {
			continue
		}
		if r.JSONBody {
			if err := checkJSONBody(r.Name, msg.Body); err != nil {
				return Handler{}, err
			}
		}
		return Handler{Name: r.Name, Effect: r.Effect, TxEffect: r.TxEffect,
			Recovery: cmp.Or(r.Recovery, RecoveryAuto), Fingerprint: Fingerprint("go", r.Name, r.Version), AllowNewKey: r.AllowNewKey,
			HoldSessionOnFailure: r.HoldSessionOnFailure, KeyLifetime: r.KeyLifetime, KeyForm: r.KeyForm, Backoff: r.Backoff, Breaker: r.Breaker}, nil
	}
	return Handler{}, noRoute(msg)
}

// Chain returns a Router that asks each router in turn and returns the
// first handler found. A router's NoRoute error passes to the next; any
// other error (a malformed body) stops the search.
func Chain(routers ...Router) Router { return chain(routers) }

type chain []Router

// Names returns the names of the chained routers' routes, for those that
// list them (Routes, *HTTPRouter).
func (c chain) Names() []string {
	var names []string
	for _, r := range c {
		if n, ok := r.(interface{ Names() []string }); ok {
			names = append(names, n.Names()...)
		}
	}
	return names
}

// Names returns the routes' names, in order.
func (rs Routes) Names() []string {
	names := make([]string, len(rs))
	for i, r := range rs {
		names[i] = r.Name
	}
	return names
}

func (c chain) Route(msg *azservicebus.ReceivedMessage) (Handler, error) {
	for _, r := range c {
		h, err := r.Route(msg)
		var ie *InputError
		if errors.As(err, &ie) && ie.Reason == ReasonNoRoute {
			continue
		}
		return h, err
	}
	return Handler{}, noRoute(msg)
}

func noRoute(msg *azservicebus.ReceivedMessage) error {
	subject := "(none)"
	if msg.Subject != nil {
		subject = fmt.Sprintf("%q", *msg.Subject)
	}
	return &InputError{Reason: ReasonNoRoute, Description: "no route matches subject " + subject}
}

// MessageFromClaim rebuilds the message a claim was taken for, as the SDK's
// own type, from what the claim stored: MessageID, Body (the stored
// payload), Subject, ContentType and ApplicationProperties (as strings).
// Broker-assigned fields (lock token, sequence number, delivery count) are
// left zero: a redrive has no delivery. A claim that stored no payload has
// no body and no application properties: a route that decides on them
// cannot route it.
func MessageFromClaim(c *claim.Claim) *azservicebus.ReceivedMessage {
	msg := &azservicebus.ReceivedMessage{
		MessageID: c.MessageID,
		Body:      c.Payload,
	}
	if c.Subject != "" {
		subject := c.Subject
		msg.Subject = &subject
	}
	if c.ContentType != "" {
		contentType := c.ContentType
		msg.ContentType = &contentType
	}
	if len(c.Properties) > 0 {
		msg.ApplicationProperties = make(map[string]any, len(c.Properties))
		for k, v := range maps.All(c.Properties) {
			msg.ApplicationProperties[k] = v
		}
	}
	return msg
}
