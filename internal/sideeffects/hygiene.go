package sideeffects

import (
	"fmt"
	"mime"
	"net/url"
	"strings"
	"unicode"
)

// MaxContentTypeBytes bounds a Content-Type (a message's or a route's).
const MaxContentTypeBytes = 256

// ReasonInvalidContentType is the dead-letter reason for a message whose
// ContentType cannot be sent as a Content-Type header (see
// CheckContentType).
const ReasonInvalidContentType = "InvalidContentType"

// CheckContentType checks a message's ContentType before it becomes a
// Content-Type header: at most MaxContentTypeBytes of printable ASCII (no
// control characters: a CR/LF would split the header), a type/subtype
// media type that mime.ParseMediaType accepts, parameters included. The
// empty string is valid (the route's content type is used). It returns nil
// or an *InputError with ReasonInvalidContentType, fit for a dead-letter
// description (the value is quoted with escapes and cut).
//
// The processor calls it before any claim; HTTPRouter.Route calls it too,
// and the HTTP effect never sends an invalid value (it answers permanent).
func CheckContentType(s string) error {
	if s == "" {
		return nil
	}
	problem := ""
	switch {
	case len(s) > MaxContentTypeBytes:
		problem = fmt.Sprintf("longer than %d bytes", MaxContentTypeBytes)
	case strings.IndexFunc(s, func(r rune) bool { return r < ' ' || r > '~' }) >= 0:
		problem = "contains control or non-ASCII characters"
	default:
		mt, _, err := mime.ParseMediaType(s)
		switch {
		case err != nil:
			problem = "not a media type (" + strings.TrimPrefix(err.Error(), "mime: ") + ")"
		case !strings.Contains(mt, "/"):
			problem = "not a type/subtype media type"
		}
	}
	if problem == "" {
		return nil
	}
	return &InputError{
		Reason:      ReasonInvalidContentType,
		Description: fmt.Sprintf("ContentType %s is %s; it cannot be sent as a Content-Type header", quoteCut(s, 64), problem),
	}
}

// quoteCut quotes s with Go escapes (control characters visible, never
// raw), showing at most max bytes of it.
func quoteCut(s string, max int) string {
	if len(s) > max {
		return fmt.Sprintf("%q… (%d bytes)", cutUTF8(s, max), len(s))
	}
	return fmt.Sprintf("%q", s)
}

// urlHost is what logs and errors say of a route URL: its host (with the
// port, if any). The path and query are never written anywhere: webhook
// URLs carry their secret in the path (Slack, Teams) and some APIs take
// their key in the query (Azure Functions' ?code=).
func urlHost(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "(unparseable URL)"
	}
	return u.Host
}

// urlOrigin is scheme://host of a route URL, for the URL that net/http's
// *url.Error quotes.
func urlOrigin(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "(unparseable URL)"
	}
	return u.Scheme + "://" + u.Host
}

// MaxExcerptBytes bounds the response excerpt in an error message (and so
// in a claim's last error and a dead-letter description).
const MaxExcerptBytes = 200

// excerpt is a short, printable excerpt of a response body for an error
// message: the body's text with secrets already redacted (redact runs on
// the whole body before this cut, so a secret is never half shown), every
// run of control characters and white space made one space, cut to at most
// MaxExcerptBytes on a UTF-8 boundary.
func excerpt(body string) string {
	const window = 4 * MaxExcerptBytes
	if len(body) > window {
		body = cutUTF8(body, window)
	}
	body = strings.ToValidUTF8(body, "\uFFFD")
	s := strings.Map(func(r rune) rune {
		if unicode.IsPrint(r) {
			return r
		}
		return ' '
	}, body)
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > MaxExcerptBytes {
		s = cutUTF8(s, MaxExcerptBytes-len("…")) + "…"
	}
	return s
}
