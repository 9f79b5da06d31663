package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The headers the platform's built-in authentication sets (Container
// Apps and App Service "Easy Auth"); it removes them from clients'
// requests, so only the platform can set them.
const (
	HeaderPrincipalName = "X-Ms-Client-Principal-Name"
	HeaderPrincipalID   = "X-Ms-Client-Principal-Id"
)

// Operator is who acts on the console.
type Operator struct {
	Name  string // the principal's name (an e-mail address or UPN), or the local operator
	ID    string // the principal's id from the identity provider; empty when Local
	Local bool   // named by Options.LocalOperator: local development, not signed in
}

// By is the operator as recorded on the claim (ResolvedBy, the holder of a
// redrive): the name and the principal id, or the local operator marked as
// such.
func (o *Operator) By() string {
	if o.Local {
		return o.Name + " (local, not signed in)"
	}
	return o.Name + " (id " + o.ID + ")"
}

// operator returns who makes r, or nil when nobody does: without a local
// operator, a request must carry both identity headers, each non-empty and
// free of control characters.
func (s *Server) operator(r *http.Request) *Operator {
	if s.opts.LocalOperator != "" {
		return &Operator{Name: s.opts.LocalOperator, Local: true}
	}
	name := strings.TrimSpace(r.Header.Get(HeaderPrincipalName))
	id := strings.TrimSpace(r.Header.Get(HeaderPrincipalID))
	if name == "" || id == "" || !utf8.ValidString(name+id) || strings.ContainsFunc(name+id, isInvisible) ||
		len(id) > 64 {
		return nil
	}
	if r := []rune(name); len(r) > maxNameLength {
		name = string(r[:maxNameLength])
	}
	return &Operator{Name: name, ID: id}
}

// isInvisible reports characters that must not reach a page or an audit
// record as they are: controls, and the bidirectional overrides and
// isolates that make text read differently from what it is.
func isInvisible(r rune) bool {
	switch {
	case unicode.IsControl(r):
		return true
	case r >= '\u202a' && r <= '\u202e', r >= '\u2066' && r <= '\u2069', r == '\u200e', r == '\u200f', r == '\u061c':
		return true
	}
	return false
}

// The CSRF token of a form is an HMAC of the operator's identity keyed by
// a random secret in a cookie of this browser. A page from another site
// can neither read the cookie nor compute the token; a token taken under
// one identity does not work under another.
const (
	csrfField        = "csrf"
	csrfCookie       = "sbclaim-csrf"
	csrfCookieSecure = "__Host-sbclaim-csrf" // over HTTPS: no Domain, Path=/, Secure, so no sibling host can set it
)

// secure reports whether the browser reached the console over HTTPS (the
// platform's ingress terminates TLS and says so in X-Forwarded-Proto).
func secure(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

// csrfSecret returns this browser's secret, setting a new one when the
// request has none.
func csrfSecret(w http.ResponseWriter, r *http.Request) string {
	name := csrfCookie
	if secure(r) {
		name = csrfCookieSecure
	}
	if c, err := r.Cookie(name); err == nil && len(c.Value) >= 32 {
		return c.Value
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	v := base64.RawURLEncoding.EncodeToString(b)
	http.SetCookie(w, &http.Cookie{Name: name, Value: v, Path: "/", HttpOnly: true, Secure: secure(r), SameSite: http.SameSiteStrictMode})
	return v
}

func csrfToken(secret string, op *Operator) string {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte("sbclaim console csrf\x00"))
	m.Write([]byte(op.By()))
	return hex.EncodeToString(m.Sum(nil))
}

// checkCSRF reports whether the form of r carries the token of op under
// the browser's secret. Over HTTPS only the __Host- cookie counts: a
// sibling host could set the plain one.
func checkCSRF(r *http.Request, op *Operator) bool {
	got := r.PostFormValue(csrfField)
	name := csrfCookie
	if secure(r) {
		name = csrfCookieSecure
	}
	c, err := r.Cookie(name)
	if got == "" || err != nil || len(c.Value) < 32 {
		return false
	}
	return hmac.Equal([]byte(got), []byte(csrfToken(c.Value, op)))
}
