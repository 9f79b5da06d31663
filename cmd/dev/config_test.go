package main

import (
	"io"
	"log/slog"
	"strings"
	"testing"
)

func TestParseConfig(t *testing.T) {
	c, err := parseConfig(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Dir != "sbclaim-dev" || c.ConsoleAddr != "127.0.0.1:0" || c.Payments != 20 || c.Outage != 12 || c.LogLevel != slog.LevelInfo {
		t.Errorf("defaults: %+v", c)
	}
	for _, tc := range []struct {
		args []string
		want string // in the error
	}{
		{[]string{"-console-addr", "0.0.0.0:8082"}, "loopback"},
		{[]string{"-console-addr", ":8082"}, "loopback"},
		{[]string{"-console-addr", "127.0.0.1"}, "host:port"},
		{[]string{"-console-addr", "127.0.0.1:99999"}, "port"},
		{[]string{"-payments", "-1"}, "-payments"},
		{[]string{"-dup-share", "1.5"}, "-dup-share"},
		{[]string{"-outage", "-3"}, "-outage"},
		{[]string{"-log-level", "loud"}, "-log-level"},
		{[]string{"-dir", ""}, "-dir"},
		{[]string{"extra"}, "unexpected arguments"},
	} {
		_, err := parseConfig(tc.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error naming %q", tc.args, err, tc.want)
		}
	}
	for _, ok := range []string{"127.0.0.1:18082", "[::1]:0", "localhost:18082"} {
		if _, err := parseConfig([]string{"-console-addr", ok}, io.Discard); err != nil {
			t.Errorf("-console-addr %s: %v", ok, err)
		}
	}
}

// The mix holds what its description says, copies after their original.
func TestNewMix(t *testing.T) {
	m := newMix("r1", 10, 0.3, 7)
	if len(m.Payments) != 10 || m.Extra < 3 || m.Conflict != "r1-pay-0010" {
		t.Fatalf("mix: %d payments, %d extra copies, conflict %q", len(m.Payments), m.Extra, m.Conflict)
	}
	if want := 10 + 2 + m.Extra + 1 + 1; len(m.Sends) != want { // payments, declined and stored failure, copies, conflict, poison
		t.Errorf("%d sends, want %d", len(m.Sends), want)
	}
	seen := map[string]bool{}
	for _, s := range m.Sends {
		id := *s.MessageID
		if s.Subject != nil && *s.Subject == paymentSubject && !seen[id] && strings.Contains(string(s.Body), `"amountCents":1001,`) {
			t.Errorf("the conflicting copy of %s comes before its original", id)
		}
		seen[id] = true
	}
	if replyFor("payments/r1-pay"+declinedSuffix) == replyFor("payments/r1-pay-0001") ||
		replyFor("payments/r1-pay"+storedFailureSuffix+":r1") != replyFor("payments/r1-pay-0001") {
		t.Error("replyFor: the declined key, or a redrive's new key of the stored failure, is answered like any other")
	}
}
