package redact_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/sbclaim/sbclaim/internal/redact"
)

const secret = "hunter2-s3cret"

// The one table: every kind of text sbclaim shows that may hold a secret.
func TestValue(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"postgres://app:" + secret + "@db:5432/claims?sslmode=require", "postgres://app:xxxxx@db:5432/claims?sslmode=require"},
		{"postgresql://app@db/claims", "postgresql://app@db/claims"},
		{"postgres://h/db?password=" + secret, "postgres://h/db?password=xxxxx"},
		{"sqlserver://sa:" + secret + "@sql:1433?database=x&password=p2", "sqlserver://sa:xxxxx@sql:1433?database=x&password=xxxxx"},
		{"sqlserver://h:1433?database=x&pwd=" + secret, "sqlserver://h:1433?database=x&pwd=xxxxx"},
		{"sqlserver://h?database=x&fedauth=ActiveDirectoryServicePrincipalAccessToken&clientassertion=" + secret, "sqlserver://h?clientassertion=xxxxx&database=x&fedauth=ActiveDirectoryServicePrincipalAccessToken"},
		{"sqlserver://h?database=x&systemtoken=" + secret, "sqlserver://h?database=x&systemtoken=xxxxx"},
		{"sqlserver://h?database=x&fedauth=ActiveDirectoryDefault", "sqlserver://h?database=x&fedauth=ActiveDirectoryDefault"},
		{"sqlite:/var/lib/claims.db", "sqlite:/var/lib/claims.db"},
		{"sqlite::memory:", "sqlite::memory:"},
		{"Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=" + secret, "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=xxxxx"},
		{"Endpoint=sb://h;SharedAccessSignature=SharedAccessSignature sr=x&sig=" + secret, "Endpoint=sb://h;SharedAccessSignature=xxxxx"},
		{"Server=h;User Id=sa;Password=" + secret + ";Database=x", "Server=h;User Id=sa;Password=xxxxx;Database=x"},
		{"https://hooks.example.com/x?api_key=" + secret + "&v=2", "https://hooks.example.com/x?api_key=xxxxx&v=2"},
		{"sqlserver://sa:" + secret + "@host:port:bad/%zz", "sqlserver:(unparseable URL redacted)"},
		{secret, "xxxxx"},
		// A bare token with a colon is no URL: masked whole, not shown.
		{"tok:" + secret, "xxxxx"},
		{"mailto:" + secret, "xxxxx"},
		{"", ""},
	} {
		got := redact.Value(tc.in)
		if got != tc.want {
			t.Errorf("Value(%q)\n got %q\nwant %q", tc.in, got, tc.want)
		}
		if strings.Contains(got, secret) {
			t.Errorf("Value(%q) leaks the secret: %q", tc.in, got)
		}
	}
}

// A URL without //host (scheme:opaque) shows its scheme only.
func TestOpaqueURL(t *testing.T) {
	if got := redact.URL("tok:" + secret); got != "tok:xxxxx" {
		t.Errorf("URL of an opaque URL = %q", got)
	}
}

func TestIsSecretKey(t *testing.T) {
	for k, want := range map[string]bool{
		"password": true, "PWD": true, "Password": true, "SharedAccessKey": true, "AccountKey": true,
		"client_secret": true, "clientassertion": true, "systemtoken": true, "x-api-key": true, "sig": true,
		"SharedAccessSignature": true, "User Password": true,
		"SharedAccessKeyName": false, "database": false, "fedauth": false, "user id": false, "sslmode": false,
		"Endpoint": false, "keystoreprincipalid": false, "sv": false,
	} {
		if got := redact.IsSecretKey(k); got != want {
			t.Errorf("IsSecretKey(%q) = %v, want %v", k, got, want)
		}
	}
}

func TestSecretsCoverEverySpelling(t *testing.T) {
	pass := `p@ss/w"rd`
	u := url.URL{Scheme: "postgres", User: url.UserPassword("u", pass), Host: "h", Path: "/db", RawQuery: "password=" + secret + "&pwd=ab"}
	got := redact.Secrets(u.String())
	for _, want := range []string{pass, url.QueryEscape(pass), url.PathEscape(pass), `p@ss/w\"rd`, secret} {
		if !slices.Contains(got, want) {
			t.Errorf("Secrets misses %q (got %q)", want, got)
		}
	}
	for _, g := range got {
		if g == "ab" {
			t.Error("Secrets returns a two-character value, which would garble unrelated text")
		}
	}
	for i := 1; i < len(got); i++ {
		if len(got[i]) > len(got[i-1]) {
			t.Fatalf("Secrets not longest first: %q", got)
		}
	}
	cs := redact.Secrets("Endpoint=sb://h;SharedAccessKeyName=n;SharedAccessKey=" + secret)
	if len(cs) == 0 || cs[0] != secret {
		t.Errorf("Secrets of a connection string = %q, want %q first", cs, secret)
	}
}

func TestScrubber(t *testing.T) {
	s := redact.NewScrubber(redact.Secrets("sqlserver://sa:" + secret + "@h")...)
	if got := s.String("login failed: '" + secret + "'"); strings.Contains(got, secret) || !strings.Contains(got, redact.Mask) {
		t.Errorf("String = %q", got)
	}

	// An error without a secret comes back as it is; one with a secret
	// keeps its chain, so classification (errors.Is) still works.
	plain := errors.New("plain")
	if s.Error(plain) != plain {
		t.Error("Error replaced an error without secrets")
	}
	leaky := fmt.Errorf("open %s: %w", secret, fs.ErrNotExist)
	got := s.Error(leaky)
	if strings.Contains(got.Error(), secret) {
		t.Errorf("Error leaks: %v", got)
	}
	if !errors.Is(got, fs.ErrNotExist) {
		t.Error("a scrubbed error lost its chain")
	}
	if s.Error(nil) != nil {
		t.Error("Error(nil) != nil")
	}

	var buf bytes.Buffer
	w := s.Writer(&buf)
	line := "level=ERROR msg=\"" + secret + "\"\n"
	n, err := w.Write([]byte(line))
	if err != nil || n != len(line) {
		t.Fatalf("Write = %d, %v; want %d, nil", n, err, len(line))
	}
	if strings.Contains(buf.String(), secret) {
		t.Errorf("Writer leaks: %q", buf.String())
	}

	var none *redact.Scrubber
	if none.String(secret) != secret || none.Writer(&buf) != &buf {
		t.Error("a nil Scrubber changes text")
	}
	// A secret that contains another is replaced whole.
	if got := redact.NewScrubber("abcd", "abcdefgh").String("abcdefgh"); got != redact.Mask {
		t.Errorf("nested secrets: %q", got)
	}
}
