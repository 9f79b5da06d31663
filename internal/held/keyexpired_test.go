package held_test

import (
	"testing"
	"time"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/held"
)

func TestKeyExpired(t *testing.T) {
	claimed := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	revised := claimed.Add(30 * time.Hour)
	tests := []struct {
		name     string
		c        *claim.Claim
		lifetime time.Duration
		now      time.Time
		want     string // "" for not expired
	}{
		{"no lifetime", &claim.Claim{ClaimedAt: claimed}, 0, claimed.Add(1000 * time.Hour), ""},
		{"young", &claim.Claim{ClaimedAt: claimed}, 24 * time.Hour, claimed.Add(24 * time.Hour), ""},
		{"old", &claim.Claim{ClaimedAt: claimed}, 24 * time.Hour, claimed.Add(25*time.Hour + 300*time.Millisecond),
			"the downstream keeps keys for 24h; this claim is 25h old: a repeat would not be deduplicated"},
		{"old, minutes", &claim.Claim{ClaimedAt: claimed}, 90 * time.Minute, claimed.Add(2*time.Hour + 5*time.Minute),
			"the downstream keeps keys for 1h30m; this claim is 2h5m old: a repeat would not be deduplicated"},
		{"revised key, young", &claim.Claim{MessageID: "m1", ClaimedAt: claimed, KeyRevision: 1, EffectKey: "m1:r1", KeyRevisedAt: &revised},
			24 * time.Hour, revised.Add(time.Hour), ""},
		{"revised key, old", &claim.Claim{MessageID: "m1", ClaimedAt: claimed, KeyRevision: 1, EffectKey: "m1:r1", KeyRevisedAt: &revised},
			24 * time.Hour, revised.Add(26 * time.Hour),
			"the downstream keeps keys for 24h; this claim's key m1:r1 is 26h old: a repeat would not be deduplicated"},
	}
	for _, tt := range tests {
		reason, expired := held.KeyExpired(tt.c, tt.lifetime, tt.now)
		if expired != (tt.want != "") || reason != tt.want {
			t.Errorf("%s: %v %q, want %q", tt.name, expired, reason, tt.want)
		}
	}
}
