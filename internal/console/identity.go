package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/coreos/go-oidc/v3/oidc"
)

// The headers the platform's built-in authentication sets (Container
// Apps and App Service "Easy Auth"). The principal headers are plain text
// anybody who reaches the port can send: the console reads them only when
// Options.TrustIdentityHeaders says a trusted front strips and sets them.
// The ID token header (forwarded when the platform's token store is on)
// and Authorization: Bearer carry a signed token, which the console
// verifies itself.
const (
	HeaderPrincipalName = "X-Ms-Client-Principal-Name"
	HeaderPrincipalID   = "X-Ms-Client-Principal-Id"
	HeaderIDToken       = "X-Ms-Token-Aad-Id-Token"
)

// OIDC is the identity provider whose tokens the console accepts: the
// issuer (discovery document at Issuer/.well-known/openid-configuration,
// for Microsoft Entra ID https://login.microsoftonline.com/<tenant>/v2.0)
// and the audience (the app registration's client id).
//
// AllowedGroups and AllowedPrincipals, when either is set, narrow the
// operators to the tokens whose oid is an allowed principal or whose
// groups claim names an allowed group (others get 403): the same rule as
// the platform's sign-in, checked again here so that a valid token of
// another user of the tenant does not act when it reaches the console
// some other way.
type OIDC struct {
	Issuer            string
	Audience          string
	AllowedGroups     []string
	AllowedPrincipals []string
	// Client fetches the discovery document and the keys (default
	// http.DefaultClient).
	Client *http.Client
}

// How an operator's identity was established.
const (
	sourceToken   = "token"   // a token signed by the configured issuer, verified here
	sourceHeaders = "headers" // the platform's headers, trusted by configuration (TrustIdentityHeaders)
	sourceLocal   = "local"   // Options.LocalOperator
)

// Operator is who acts on the console.
type Operator struct {
	Name   string // preferred_username (an e-mail address or UPN), or the local operator
	ID     string // the principal's object id (oid, else sub); empty when Local
	Local  bool   // named by Options.LocalOperator: local development, not signed in
	source string
	groups []string // the verified token's groups claim
}

// Unverified reports an identity taken from headers the console cannot
// verify (Options.TrustIdentityHeaders).
func (o *Operator) Unverified() bool { return o.source == sourceHeaders }

// By is the operator as recorded on the claim (ResolvedBy, the holder of a
// redrive): the name and the principal id; an identity read from headers
// is marked unverified, the local operator as not signed in.
func (o *Operator) By() string {
	switch {
	case o.Local:
		return o.Name + " (local, not signed in)"
	case o.Unverified():
		return o.Name + " (id " + o.ID + ", unverified header)"
	}
	return o.Name + " (id " + o.ID + ")"
}

type operatorKey struct{}

// operator returns who makes r, as authenticate established it (nil on
// the pages authenticate did not let through, which only error pages see).
func (s *Server) operator(r *http.Request) *Operator {
	op, _ := r.Context().Value(operatorKey{}).(*Operator)
	return op
}

// authenticate is the gate of every route: the request carries an
// identity the console can stand behind, or it is refused 401 before any
// handler runs (reads included); a verified identity outside the
// allow-lists is refused 403. In local development mode the request
// must be addressed to a loopback host (DNS rebinding: a page on a name
// that resolves to 127.0.0.1 sends its own Host).
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var op *Operator
		var why string
		switch {
		case s.opts.LocalOperator != "":
			if !loopbackHost(r.Host) {
				s.renderError(w, r, http.StatusForbidden, "Refused: local development mode answers only on localhost",
					"This console runs in local development mode (SBCLAIM_CONSOLE_LOCAL_OPERATOR), where nobody signs in, so it answers "+
						"only requests addressed to localhost, 127.0.0.1 or [::1]; this one was addressed to "+fmt.Sprintf("%q", r.Host)+".")
				return
			}
			op = &Operator{Name: s.opts.LocalOperator, Local: true, source: sourceLocal}
		case s.verifier != nil:
			op, why = s.verifier.operator(r)
			if op != nil && !s.verifier.allowed(op) {
				s.renderError(w, r, http.StatusForbidden, "Refused: not an operator",
					"You are signed in, but neither you nor a group your token names is allowed to use this console "+
						"(SBCLAIM_CONSOLE_ALLOWED_GROUPS, SBCLAIM_CONSOLE_ALLOWED_PRINCIPALS). Nothing was read or changed.")
				return
			}
		case s.opts.TrustIdentityHeaders:
			op, why = headerOperator(r)
		}
		if op == nil {
			s.unauthorized(w, r, why)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), operatorKey{}, op)))
	})
}

// unauthorized writes the 401 page: what was missing or wrong, and (behind
// the platform's sign-in) where to sign in again.
func (s *Server) unauthorized(w http.ResponseWriter, r *http.Request, why string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="sbclaim console"`)
	lines := []string{"The console shows and changes nothing without a verified identity: " + why + ". Nothing was read or changed."}
	if s.verifier != nil {
		lines = append(lines, "Behind the platform's sign-in, sign in again at /.auth/login/aad?post_login_redirect_uri="+
			url.QueryEscape(r.URL.RequestURI())+" (an ID token lasts about an hour).")
	}
	s.renderError(w, r, http.StatusUnauthorized, "Not signed in", lines...)
}

// loopbackHost reports a Host header naming this machine's loopback:
// localhost, 127.0.0.1 or [::1], with any port.
func loopbackHost(host string) bool {
	h := host
	if hp, _, err := net.SplitHostPort(host); err == nil {
		h = hp
	} else {
		h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	}
	switch strings.ToLower(h) {
	case "localhost", "127.0.0.1", "::1":
		return true
	}
	return false
}

// headerOperator reads the platform's principal headers: both present,
// non-empty, free of control characters. Only for TrustIdentityHeaders.
func headerOperator(r *http.Request) (*Operator, string) {
	name := strings.TrimSpace(r.Header.Get(HeaderPrincipalName))
	id := strings.TrimSpace(r.Header.Get(HeaderPrincipalID))
	if name == "" || id == "" {
		return nil, "the request carries no " + HeaderPrincipalName + " and " + HeaderPrincipalID + " headers"
	}
	op := cleanOperator(name, id, sourceHeaders)
	if op == nil {
		return nil, "the identity headers hold characters an identity may not"
	}
	return op, ""
}

// cleanOperator checks a name and id from the request: valid UTF-8, no
// control or bidirectional-override characters, an id of at most 64
// bytes; the name is cut to maxNameLength characters.
func cleanOperator(name, id, source string) *Operator {
	if !utf8.ValidString(name+id) || strings.ContainsFunc(name+id, isInvisible) || len(id) > 64 || id == "" {
		return nil
	}
	if r := []rune(name); len(r) > maxNameLength {
		name = string(r[:maxNameLength])
	}
	if name == "" {
		name = id
	}
	return &Operator{Name: name, ID: id, source: source}
}

// tokenVerifier verifies the console's tokens with go-oidc: the signature
// against the issuer's published keys (discovery, then JWKS, fetched again
// when a token names a key it has not seen: key rotation), the issuer, the
// audience, the expiry (and not-before). The provider is discovered on
// first use and kept; a failed discovery is retried by the next request,
// at most every discoveryRetry.
type tokenVerifier struct {
	cfg OIDC

	mu       sync.Mutex
	verifier *oidc.IDTokenVerifier
	lastErr  error
	lastTry  time.Time
}

const (
	discoveryTimeout = 10 * time.Second
	discoveryRetry   = 5 * time.Second
)

// errIssuerUnreachable: the discovery document could not be read.
var errIssuerUnreachable = errors.New("the identity provider's discovery document could not be read")

func (v *tokenVerifier) get(ctx context.Context) (*oidc.IDTokenVerifier, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.verifier != nil {
		return v.verifier, nil
	}
	if v.lastErr != nil && time.Since(v.lastTry) < discoveryRetry {
		return nil, v.lastErr
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), discoveryTimeout)
	defer cancel()
	if v.cfg.Client != nil {
		ctx = oidc.ClientContext(ctx, v.cfg.Client)
	}
	v.lastTry = time.Now()
	p, err := oidc.NewProvider(ctx, v.cfg.Issuer)
	if err != nil {
		v.lastErr = fmt.Errorf("%w (%s): %v", errIssuerUnreachable, v.cfg.Issuer, err)
		return nil, v.lastErr
	}
	// The provider's keys are fetched with a context of their own (go-oidc
	// keeps the client, not ctx); the accepted algorithms are those the
	// discovery document lists, never "none".
	v.verifier = p.Verifier(&oidc.Config{ClientID: v.cfg.Audience})
	v.lastErr = nil
	return v.verifier, nil
}

// operator verifies the request's token: the platform's ID token header,
// else Authorization: Bearer. Identity = the verified claims: the name
// from preferred_username (else upn, email, name), the id from oid (else
// sub).
func (v *tokenVerifier) operator(r *http.Request) (*Operator, string) {
	raw := strings.TrimSpace(r.Header.Get(HeaderIDToken))
	if raw == "" {
		if a := r.Header.Get("Authorization"); len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
			raw = strings.TrimSpace(a[7:])
		}
	}
	if raw == "" {
		return nil, "the request carries no token (" + HeaderIDToken + " from the platform's sign-in, or Authorization: Bearer)"
	}
	iv, err := v.get(r.Context())
	if err != nil {
		return nil, "the token could not be checked: " + err.Error()
	}
	ctx, cancel := context.WithTimeout(r.Context(), discoveryTimeout)
	defer cancel()
	tok, err := iv.Verify(ctx, raw)
	if err != nil {
		var exp *oidc.TokenExpiredError
		if errors.As(err, &exp) {
			return nil, "the token expired at " + exp.Expiry.UTC().Format(time.RFC3339)
		}
		return nil, "the token was refused: " + tokenError(err)
	}
	var c struct {
		PreferredUsername string   `json:"preferred_username"`
		UPN               string   `json:"upn"`
		Email             string   `json:"email"`
		Name              string   `json:"name"`
		OID               string   `json:"oid"`
		Groups            []string `json:"groups"`
	}
	if err := tok.Claims(&c); err != nil {
		return nil, "the token's claims could not be read"
	}
	name := firstNonEmpty(c.PreferredUsername, c.UPN, c.Email, c.Name)
	op := cleanOperator(strings.TrimSpace(name), strings.TrimSpace(firstNonEmpty(c.OID, tok.Subject)), sourceToken)
	if op == nil {
		return nil, "the token names no usable principal (oid or sub)"
	}
	op.groups = c.Groups
	return op, ""
}

// allowed reports whether a verified operator may use the console: no
// allow-list, or its oid or one of its groups on it. A token with too many
// groups to list (Entra's overage: no groups claim) passes only by oid.
func (v *tokenVerifier) allowed(op *Operator) bool {
	if len(v.cfg.AllowedGroups) == 0 && len(v.cfg.AllowedPrincipals) == 0 {
		return true
	}
	if slices.ContainsFunc(v.cfg.AllowedPrincipals, func(p string) bool { return strings.EqualFold(p, op.ID) }) {
		return true
	}
	return slices.ContainsFunc(op.groups, func(g string) bool {
		return slices.ContainsFunc(v.cfg.AllowedGroups, func(a string) bool { return strings.EqualFold(a, g) })
	})
}

// tokenError is go-oidc's reason without its prefix, cut short: it names
// the expected and the found issuer or audience, never the token.
func tokenError(err error) string {
	return visible(cut(200, strings.TrimPrefix(err.Error(), "oidc: ")))
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if strings.TrimSpace(v) != "" {
			return v
		}
	}
	return ""
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

// The CSRF token of a form is an HMAC of the verified identity under a
// random key of this process: no cookie, nothing the caller chooses. A
// page from another site can neither read it nor compute it; a token
// taken under one identity does not work under another; a restart of the
// console makes open forms stale (the operator reloads the page).
const csrfField = "csrf"

func newCSRFKey() []byte {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return b
}

func (s *Server) csrfToken(op *Operator) string {
	m := hmac.New(sha256.New, s.csrfKey)
	m.Write([]byte("sbclaim console csrf\x00"))
	m.Write([]byte(op.source + "\x00" + op.By()))
	return hex.EncodeToString(m.Sum(nil))
}

// checkCSRF reports whether the form of r carries op's token.
func (s *Server) checkCSRF(r *http.Request, op *Operator) bool {
	got := r.PostFormValue(csrfField)
	return got != "" && hmac.Equal([]byte(got), []byte(s.csrfToken(op)))
}
