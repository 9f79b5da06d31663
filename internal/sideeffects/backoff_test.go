package sideeffects

import (
	"testing"
	"time"
)

func TestBackoffDefaultsAndGrowth(t *testing.T) {
	b := Backoff{}.WithDefaults()
	if b != DefaultBackoff {
		t.Fatalf("zero Backoff with defaults = %+v, want %+v", b, DefaultBackoff)
	}
	b.Jitter = 0
	for n, want := range []time.Duration{10 * time.Second, 20 * time.Second, 40 * time.Second, 80 * time.Second,
		160 * time.Second, 320 * time.Second, 10 * time.Minute, 10 * time.Minute} {
		if got := b.Delay(n, 0); got != want {
			t.Errorf("Delay(%d) = %s, want %s", n, got, want)
		}
	}
	if got := b.Delay(1000, 0); got != 10*time.Minute {
		t.Errorf("Delay(1000) = %s, want the 10m cap", got)
	}
}

func TestBackoffJitterStaysInBounds(t *testing.T) {
	b := DefaultBackoff
	for range 1000 {
		if got := b.Delay(0, 0); got < 8*time.Second || got > 12*time.Second {
			t.Fatalf("Delay(0) = %s, want 10s ± 20%%", got)
		}
	}
}

func TestBackoffHonoursALongerRetryAfter(t *testing.T) {
	b := Backoff{First: time.Second, Factor: 2, Max: time.Minute, Horizon: time.Hour}
	if got := b.Delay(0, 90*time.Second); got != 90*time.Second {
		t.Errorf("Delay with Retry-After 90s = %s, want 90s (longer than the cap: the downstream asked)", got)
	}
	if got := b.Delay(3, time.Second); got != 8*time.Second {
		t.Errorf("Delay(3) with a shorter Retry-After = %s, want the schedule's 8s", got)
	}
}

func TestBackoffValidateNamesTheField(t *testing.T) {
	for _, b := range []Backoff{{First: -1}, {Factor: 0.5}, {First: time.Minute, Max: time.Second}, {Jitter: 1}, {Horizon: -1}} {
		if err := b.Validate(); err == nil {
			t.Errorf("%+v: no error", b)
		}
	}
	if err := DefaultBackoff.Validate(); err != nil {
		t.Errorf("DefaultBackoff: %v", err)
	}
}
