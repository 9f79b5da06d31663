package sideeffects

import (
	"errors"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"
)

func TestStatusOutcomeTable(t *testing.T) {
	t.Parallel()
	want := map[int]Outcome{
		200: OutcomeOK, 201: OutcomeOK, 202: OutcomeOK, 204: OutcomeOK, 299: OutcomeOK,
		300: OutcomePermanent, 301: OutcomePermanent, 304: OutcomePermanent, 308: OutcomePermanent,
		400: OutcomePermanent, 401: OutcomePermanent, 403: OutcomePermanent, 404: OutcomePermanent,
		405: OutcomePermanent, 410: OutcomePermanent, 413: OutcomePermanent, 499: OutcomePermanent,
		408: OutcomeRetryable, 429: OutcomeRetryable, 503: OutcomeRetryable,
		409: OutcomeUnknown, 422: OutcomeConflict,
		500: OutcomeUnknown, 501: OutcomeUnknown, 502: OutcomeUnknown, 504: OutcomeUnknown,
		505: OutcomeUnknown, 599: OutcomeUnknown,
		100: OutcomeUnknown, 199: OutcomeUnknown, 600: OutcomeUnknown, 0: OutcomeUnknown,
	}
	for status, w := range want {
		if got := StatusOutcome(status); got != w {
			t.Errorf("StatusOutcome(%d) = %v, want %v", status, got, w)
		}
	}
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		in   string
		want time.Duration
	}{
		{"", 0},
		{"0", 0},
		{"-5", 0},
		{"5", 5 * time.Second},
		{" 120 ", 2 * time.Minute},
		{"1.5", 0},
		{"soon", 0},
		{now.Add(30 * time.Second).Format(http.TimeFormat), 30 * time.Second},
		{"Mon, 30 Nov 2026 12:01:00 GMT", time.Minute},
		{"Monday, 30-Nov-26 12:00:10 GMT", 10 * time.Second}, // RFC 850
		{"Mon Nov 30 12:00:20 2026", 20 * time.Second},       // asctime
		{now.Add(-time.Minute).Format(http.TimeFormat), 0},   // past
		{"99999999999999999999", 0},                          // overflows int64: not a number
		{"9223372036854775807", time.Duration(1<<63-1) / time.Second * time.Second},
	}
	for _, tt := range tests {
		if got := ParseRetryAfter(tt.in, now); got != tt.want {
			t.Errorf("ParseRetryAfter(%q) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

func TestClassifyResponseRetryAfterOnlyWhereTheTableSaysSo(t *testing.T) {
	t.Parallel()
	now := time.Now()
	for _, status := range []int{400, 422, 500, 502} {
		resp := &http.Response{StatusCode: status, Header: http.Header{"Retry-After": {"9"}}}
		var e *Error
		if err := classifyResponse(resp, now, ""); !errors.As(err, &e) || e.RetryAfter != 0 {
			t.Errorf("status %d: RetryAfter %v, want 0 (not retried on Retry-After)", status, e)
		}
	}
	for _, status := range []int{408, 409, 429, 503} {
		resp := &http.Response{StatusCode: status, Header: http.Header{"Retry-After": {"9"}}}
		var e *Error
		if err := classifyResponse(resp, now, ""); !errors.As(err, &e) || e.RetryAfter != 9*time.Second {
			t.Errorf("status %d: %v, want RetryAfter 9s", status, err)
		}
	}
}

func TestClassifyTransportError(t *testing.T) {
	t.Parallel()
	dial := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	read := &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset")}
	tests := []struct {
		err  error
		p    sendProgress
		want Outcome
	}{
		{dial, sendProgress{}, OutcomeRetryable},
		{&net.DNSError{Err: "no such host", Name: "x"}, sendProgress{}, OutcomeRetryable},
		{errors.New("tls: handshake failure"), sendProgress{}, OutcomeRetryable},
		{dial, sendProgress{gotConn: true}, OutcomeRetryable},
		{read, sendProgress{gotConn: true}, OutcomeUnknown}, // may have been partly written
		{read, sendProgress{gotConn: true, wroteRequest: true}, OutcomeUnknown},
		{errors.New("timeout"), sendProgress{gotConn: true, wroteRequest: true}, OutcomeUnknown},
	}
	for _, tt := range tests {
		if got := Classify(classifyTransportError(tt.err, tt.p)); got != tt.want {
			t.Errorf("%v with %+v: %v, want %v", tt.err, tt.p, got, tt.want)
		}
	}
}

// TestStatusTableMatchesDoc keeps the markdown table in doc.go (which the
// README copies) in agreement with statusTable.
func TestStatusTableMatchesDoc(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile(`(?m)^//\t\| ([^|]+?)\s*\| (ok|retryable|permanent|unknown|rejected|conflict)\s*\|`)
	code := regexp.MustCompile(`^(other )?([1-5])xx$|^([1-5][0-9][0-9])\b`)
	rows := row.FindAllStringSubmatch(string(src), -1)
	if len(rows) < 12 {
		t.Fatalf("found %d rows in doc.go's table", len(rows))
	}
	documented := map[int]bool{}
	for _, r := range rows {
		answer, outcome := r[1], r[2]
		m := code.FindStringSubmatch(answer)
		if m == nil {
			continue // transport rows, covered by TestClassifyTransportError
		}
		var samples []int
		if m[3] != "" {
			n, _ := strconv.Atoi(m[3])
			samples = []int{n}
			documented[n] = true
		} else {
			class, _ := strconv.Atoi(m[2])
			for s := class * 100; s < class*100+100; s++ {
				if m[1] == "" || !documented[s] {
					samples = append(samples, s)
				}
			}
		}
		for _, s := range samples {
			if got := StatusOutcome(s).String(); got != outcome {
				t.Errorf("doc.go says %q is %s; StatusOutcome(%d) = %s", answer, outcome, s, got)
			}
		}
	}
	for _, r := range statusTable {
		if r.from == r.to && !documented[r.from] {
			t.Errorf("status %d has its own row in statusTable but not in doc.go", r.from)
		}
	}
}
