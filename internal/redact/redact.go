// Package redact hides secrets in everything sbclaim shows: database URLs,
// Service Bus connection strings, setting values, downstream header values
// and error messages. It holds the one list of what names a secret
// (IsSecretKey), so every binary and library hides the same things.
package redact

import (
	"cmp"
	"encoding/json"
	"io"
	"net/url"
	"slices"
	"strings"
)

// Mask replaces every secret.
const Mask = "xxxxx"

// minSecretLen is the shortest secret that Secrets returns for scrubbing:
// replacing a two-letter password everywhere would garble unrelated text,
// and such a value is shown nowhere else (URLs are always redacted whole).
const minSecretLen = 4

// IsSecretKey reports whether a URL query parameter or connection-string
// key names a secret value: password, pwd, passwd, sig, or a name ending in
// password, secret, token, key, signature or assertion (case, spaces,
// dashes and underscores ignored): SharedAccessKey, AccountKey,
// client_secret, clientassertion, systemtoken, x-api-key. SharedAccessKeyName
// is a name, not a secret.
func IsSecretKey(name string) bool {
	k := strings.Map(func(r rune) rune {
		switch r {
		case ' ', '-', '_', '\t':
			return -1
		}
		return r
	}, strings.ToLower(name))
	switch k {
	case "pwd", "passwd", "sig":
		return true
	}
	for _, suffix := range []string{"password", "secret", "token", "key", "signature", "assertion"} {
		if strings.HasSuffix(k, suffix) {
			return true
		}
	}
	return false
}

// URL returns raw with its secrets masked: the user info's password and
// the value of every secret query parameter. A sqlite: URL (a file path)
// is returned as it is. A string that does not parse as a URL is replaced
// whole, keeping only its scheme.
func URL(raw string) string {
	scheme, _, _ := strings.Cut(raw, ":")
	if hasScheme(raw, "sqlite") {
		return raw
	}
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		if validScheme(scheme) {
			return scheme + ":(unparseable URL redacted)"
		}
		return "(unparseable URL redacted)"
	}
	if u.Opaque != "" {
		// scheme:opaque (no //host): nothing in it says which is safe to
		// show.
		return u.Scheme + ":" + Mask
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), Mask)
	}
	q := u.Query()
	changed := false
	for k := range q {
		if IsSecretKey(k) {
			q.Set(k, Mask)
			changed = true
		}
	}
	if changed {
		u.RawQuery = q.Encode()
	}
	return u.String()
}

// hasScheme reports whether s starts with scheme: (any case).
func hasScheme(s, scheme string) bool {
	first, _, ok := strings.Cut(s, ":")
	return ok && strings.EqualFold(first, scheme)
}

// validScheme reports whether s is a URL scheme (RFC 3986: a letter, then
// letters, digits, '+', '-' or '.'), so an unparseable string's "scheme" is
// shown only when it cannot be part of a secret.
func validScheme(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for i, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z':
		case i > 0 && (r >= '0' && r <= '9' || r == '+' || r == '-' || r == '.'):
		default:
			return false
		}
	}
	return true
}

// ConnectionString returns an ADO-style Key=Value;Key=Value string (a
// Service Bus or SQL Server connection string) with every secret key's
// value masked.
func ConnectionString(s string) string {
	parts := strings.Split(s, ";")
	for i, part := range parts {
		k, _, ok := strings.Cut(part, "=")
		if ok && IsSecretKey(k) {
			parts[i] = k + "=" + Mask
		}
	}
	return strings.Join(parts, ";")
}

// Value returns a secret setting's value fit to show: a URL or a
// connection string keeps what says which server was meant; anything
// else (a bare token) is masked whole.
func Value(s string) string {
	switch {
	case s == "":
		return ""
	case isConnectionString(s):
		return ConnectionString(s)
	case strings.Contains(s, "://"), hasScheme(s, "sqlite"):
		return URL(s)
	}
	return Mask
}

// isConnectionString reports whether s is Key=Value pairs separated by
// semicolons rather than a URL (which may hold '=' in its query).
func isConnectionString(s string) bool {
	if !strings.Contains(s, ";") {
		return false
	}
	k, _, ok := strings.Cut(s, "=")
	return ok && !strings.ContainsAny(k, ":/?")
}

// Secrets returns the secret values in a URL or a connection string, in
// every spelling they could take in output (as they are, query- and
// path-escaped, JSON-escaped), longest first, for a Scrubber. Values
// shorter than four characters are left out.
func Secrets(s string) []string {
	var raw []string
	if isConnectionString(s) {
		for _, part := range strings.Split(s, ";") {
			if k, v, ok := strings.Cut(part, "="); ok && IsSecretKey(k) {
				raw = append(raw, v)
			}
		}
	} else if u, err := url.Parse(s); err == nil {
		if p, ok := u.User.Password(); ok {
			raw = append(raw, p)
		}
		for k, vs := range u.Query() {
			if IsSecretKey(k) {
				raw = append(raw, vs...)
			}
		}
	}
	var out []string
	for _, v := range raw {
		if len(v) < minSecretLen {
			continue
		}
		j, _ := json.Marshal(v)
		out = append(out, v, url.QueryEscape(v), url.PathEscape(v), string(j[1:len(j)-1]))
	}
	return longestFirst(out)
}

func longestFirst(secrets []string) []string {
	out := slices.DeleteFunc(slices.Clone(secrets), func(s string) bool { return s == "" })
	slices.SortStableFunc(out, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	return slices.Compact(out)
}

// A Scrubber replaces known secret values wherever they appear: defence in
// depth for a driver's error that quotes its connection string, or a
// downstream that echoes a request header. The zero value and a nil
// *Scrubber replace nothing.
type Scrubber struct {
	secrets []string
	r       *strings.Replacer
}

// NewScrubber returns a Scrubber for the given secret values (empty ones
// ignored). A secret that contains another is replaced whole.
func NewScrubber(secrets ...string) *Scrubber {
	s := &Scrubber{secrets: longestFirst(secrets)}
	pairs := make([]string, 0, 2*len(s.secrets))
	for _, v := range s.secrets {
		pairs = append(pairs, v, Mask)
	}
	s.r = strings.NewReplacer(pairs...)
	return s
}

// String returns text with every secret masked.
func (s *Scrubber) String(text string) string {
	if s == nil || len(s.secrets) == 0 {
		return text
	}
	return s.r.Replace(text)
}

// Error returns err unchanged when its text holds no secret, and otherwise
// an error with the masked text that still unwraps to err (so errors.Is and
// errors.As keep working, and only the text shown changes).
func (s *Scrubber) Error(err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	if clean := s.String(msg); clean != msg {
		return &scrubbed{msg: clean, err: err}
	}
	return err
}

type scrubbed struct {
	msg string
	err error
}

func (e *scrubbed) Error() string { return e.msg }
func (e *scrubbed) Unwrap() error { return e.err }

// Writer returns a writer that masks every secret in what it writes
// (slog handlers write one record per call, so a record is never split).
func (s *Scrubber) Writer(w io.Writer) io.Writer {
	if s == nil || len(s.secrets) == 0 {
		return w
	}
	return &scrubWriter{w: w, s: s}
}

type scrubWriter struct {
	w io.Writer
	s *Scrubber
}

func (sw *scrubWriter) Write(p []byte) (int, error) {
	if _, err := io.WriteString(sw.w, sw.s.String(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}
