package claim

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestStates(t *testing.T) {
	for _, s := range States {
		if !s.Valid() {
			t.Errorf("%s is not valid", s)
		}
	}
	finished := map[State]bool{StateProcessed: true, StateFailed: true, StateResolved: true}
	for _, s := range States {
		if s.Finished() != finished[s] {
			t.Errorf("%s.Finished() = %v", s, s.Finished())
		}
		if s.Finished() && s.Unfinished() {
			t.Errorf("%s is finished and unfinished", s)
		}
	}
	if State("bogus").Valid() {
		t.Error("bogus is valid")
	}
}

// TestOutcomeLogsByName: claim outcomes marshal as their names (slog's
// JSON handler and encoding/json use MarshalText).
func TestOutcomeLogsByName(t *testing.T) {
	b, err := json.Marshal(map[string]Outcome{"won": OutcomeWon, "dup": OutcomeDuplicate, "conflict": OutcomeConflict, "zero": 0})
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != `{"conflict":"conflict","dup":"duplicate","won":"won","zero":"unknown"}` {
		t.Fatalf("outcomes marshal as %s", b)
	}
}

func TestKey(t *testing.T) {
	c := &Claim{MessageID: "m-1"}
	if c.Key() != "m-1" {
		t.Fatalf("Key() = %q", c.Key())
	}
	c.EffectKey, c.KeyRevision = RevisedKey("m-1", 2), 2
	if c.Key() != "m-1:r2" {
		t.Fatalf("Key() after two revisions = %q", c.Key())
	}
}

// TestErrorTextIsBoundedOnARuneBoundary: a last error (and so a
// dead-letter description) is at most MaxErrorText bytes plus the
// ellipsis, valid UTF-8, never a cut rune.
func TestErrorTextIsBoundedOnARuneBoundary(t *testing.T) {
	for _, prefix := range []string{"", "a", "ab", "abc"} {
		s := ErrorText(errString(prefix + strings.Repeat("日", MaxErrorText)))
		if !utf8.ValidString(s) || len(s) > MaxErrorText+len("…") || !strings.HasSuffix(s, "…") || strings.ContainsRune(s, utf8.RuneError) {
			t.Errorf("prefix %q: %d bytes, valid %v, tail %q", prefix, len(s), utf8.ValidString(s), s[len(s)-8:])
		}
	}
	if s := ErrorText(errString("bad \xff\x00 bytes")); s != "bad \uFFFD\uFFFD bytes" {
		t.Errorf("ErrorText of invalid UTF-8 and NUL: %q", s)
	}
}

type errString string

func (e errString) Error() string { return string(e) }
