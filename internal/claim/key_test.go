package claim_test

import (
	"strings"
	"testing"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// TestScopedKeysAreInjective: distinct (consumer, dedup key, revision,
// step) give distinct keys, whatever ':', '/' and '%' the parts contain
// (issue 20, findings 5 and 8); the raw form collides, which is why it is
// only kept for claims taken before key forms and for routes that opt out.
func TestScopedKeysAreInjective(t *testing.T) {
	parts := []string{"", "X", "X:r1", "X/r1", "r1", "X%3Ar1", "X%2Fr1", "a/b", "a", "b", "a:b", "%", "x y", "é"}
	seen := map[string]string{}
	add := func(key, what string) {
		t.Helper()
		if prev, ok := seen[key]; ok {
			t.Fatalf("%s and %s share the key %q", prev, what, key)
		}
		seen[key] = what
	}
	for _, consumer := range parts[1:] {
		for _, id := range parts[1:] {
			for n := range 3 {
				base := claim.KeyFor(claim.KeyFormScoped, consumer, id, n)
				add(base, "consumer "+consumer+" id "+id+" revision "+string(rune('0'+n)))
				for _, step := range parts[1:] {
					add(claim.StepKey(claim.KeyFormScoped, base, step), "consumer "+consumer+" id "+id+" revision "+string(rune('0'+n))+" step "+step)
				}
			}
		}
	}
	// The raw form's collisions (the review's findings).
	if claim.KeyFor(claim.KeyFormRaw, "billing", "X:r1", 0) != claim.KeyFor(claim.KeyFormRaw, "billing", "X", 1) {
		t.Error("the raw form no longer collides: update the docs")
	}
	if claim.KeyFor(claim.KeyFormRaw, "billing", "X", 0) != claim.KeyFor(claim.KeyFormRaw, "shipping", "X", 0) {
		t.Error("the raw form is scoped now: update the docs")
	}
}

func TestScopedKeyShapeAndBound(t *testing.T) {
	if got := claim.KeyFor(claim.KeyFormScoped, "billing", "order-7", 0); got != "billing/order-7" {
		t.Errorf("key %q", got)
	}
	if got := claim.KeyFor(claim.KeyFormScoped, "bill/ing", "o:7%", 2); got != "bill%2Fing/o%3A7%25:r2" {
		t.Errorf("escaped key %q", got)
	}
	if got := claim.StepKey(claim.KeyFormScoped, "billing/order-7", "charge"); got != "billing/order-7/charge" {
		t.Errorf("step key %q", got)
	}
	long := claim.KeyFor(claim.KeyFormScoped, strings.Repeat("c", 200), strings.Repeat("m", 128), 0)
	if len(long) > claim.MaxKeyLength || !strings.HasPrefix(long, "sha256:") || len(long) != len("sha256:")+64 {
		t.Errorf("long key %q (%d bytes)", long, len(long))
	}
	if long == claim.KeyFor(claim.KeyFormScoped, strings.Repeat("c", 200), strings.Repeat("m", 128), 1) {
		t.Error("a hashed key and its revision are one key")
	}
	if step := claim.StepKey(claim.KeyFormScoped, long, strings.Repeat("s", 250)); len(step) > claim.MaxKeyLength {
		t.Errorf("step key of a hashed key: %d bytes", len(step))
	}
	// Exactly at the bound: kept as is.
	c := strings.Repeat("c", claim.MaxKeyLength-1-10)
	if got := claim.KeyFor(claim.KeyFormScoped, c, "0123456789", 0); got != c+"/0123456789" {
		t.Errorf("a key of %d bytes was hashed", len(c)+11)
	}
}
