package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/url"
	"regexp"
	"strings"
)

const redacted = "xxxxx"

var (
	// password=... / pwd=... in query strings and ADO-style connection strings.
	passwordParam = regexp.MustCompile(`(?i)\b(password|pwd)(\s*=\s*)([^;&\s]*)`)
	// user:password@ in a URL-ish string that url.Parse rejected.
	userinfo = regexp.MustCompile(`//([^/@:\s]*):([^@/\s]*)@`)
)

// redactURL hides the password of a database URL: the user:pass@ userinfo
// and any password= or pwd= parameter.
func redactURL(s string) string {
	if u, err := url.Parse(s); err == nil && u.Scheme != "" && u.Opaque == "" {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), redacted)
		}
		q := u.Query()
		changed := false
		for k := range q {
			if lk := strings.ToLower(k); lk == "password" || lk == "pwd" {
				q.Set(k, redacted)
				changed = true
			}
		}
		if changed {
			u.RawQuery = q.Encode()
		}
		return u.String()
	}
	s = userinfo.ReplaceAllString(s, "//${1}:"+redacted+"@")
	return passwordParam.ReplaceAllString(s, "${1}${2}"+redacted)
}

// secretsOf returns the password(s) in a database URL, in every spelling
// they could take in output (raw, URL-escaped, JSON-escaped).
func secretsOf(dbURL string) []string {
	var raw []string
	if u, err := url.Parse(dbURL); err == nil {
		if p, ok := u.User.Password(); ok {
			raw = append(raw, p)
		}
		for k, vs := range u.Query() {
			if lk := strings.ToLower(k); lk == "password" || lk == "pwd" {
				raw = append(raw, vs...)
			}
		}
	}
	for _, m := range userinfo.FindAllStringSubmatch(dbURL, -1) {
		raw = append(raw, m[2])
	}
	for _, m := range passwordParam.FindAllStringSubmatch(dbURL, -1) {
		raw = append(raw, m[3])
	}
	var out []string
	for _, p := range raw {
		// A very short secret would blank unrelated text; such a password
		// is not worth protecting this way, the URL itself is never logged.
		if len(p) < 4 {
			continue
		}
		j, _ := json.Marshal(p)
		out = append(out, p, url.QueryEscape(p), url.PathEscape(p), string(j[1:len(j)-1]))
	}
	return out
}

// scrubWriter replaces every secret in what it writes: defence in depth
// for log lines and errors, in case a driver error quotes the connection
// string. slog handlers write one record per Write call.
type scrubWriter struct {
	w       io.Writer
	secrets [][]byte
}

func newScrubWriter(w io.Writer, secrets []string) io.Writer {
	if len(secrets) == 0 {
		return w
	}
	sw := &scrubWriter{w: w}
	for _, s := range secrets {
		sw.secrets = append(sw.secrets, []byte(s))
	}
	return sw
}

func (s *scrubWriter) Write(p []byte) (int, error) {
	out := p
	for _, sec := range s.secrets {
		if bytes.Contains(out, sec) {
			out = bytes.ReplaceAll(out, sec, []byte(redacted))
		}
	}
	if _, err := s.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}
