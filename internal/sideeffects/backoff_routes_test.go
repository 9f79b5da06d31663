package sideeffects

import (
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

func TestRoutesFileBackoff(t *testing.T) {
	r, err := ParseRoutes([]byte(`version: 1
routes:
  - name: charges
    match: {subject: charge}
    url: https://api.example.com/charges
    backoff: {first: 30s, factor: 3, max: 15m, jitter: 0.1, horizon: 48h}
  - name: emails
    match: {subject: email}
    url: https://api.example.com/emails
  - name: pings
    match: {subject: ping}
    url: https://api.example.com/pings
    backoff: {off: true}
`), mapEnv(nil), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for subj, want := range map[string]Backoff{
		"charge": {First: 30 * time.Second, Factor: 3, Max: 15 * time.Minute, Jitter: 0.1, Horizon: 48 * time.Hour},
		"email":  {},
		"ping":   {First: 10 * time.Second, Factor: 2, Max: 10 * time.Minute, Jitter: 0.2, Horizon: 24 * time.Hour, Off: true},
	} {
		h, err := r.Route(&azservicebus.ReceivedMessage{Subject: &subj})
		if err != nil {
			t.Fatal(err)
		}
		if h.Backoff != want {
			t.Errorf("%s: backoff %+v, want %+v", subj, h.Backoff, want)
		}
	}
}

func TestRoutesFileBackoffErrorsNameTheField(t *testing.T) {
	for yml, want := range map[string]string{
		"backoff: {first: 10x}":              `backoff`,
		"backoff: {factor: 0.5}":             `backoff`,
		"backoff: {first: 5m, max: 1m}":      `field "backoff": backoff max 1m0s must be at least first 5m0s`,
		"backoff: {jitter: 1}":               `backoff`,
		"backoff: {horizon: 1h, retries: 3}": `retries`,
	} {
		got := parseErr(t, `version: 1
routes:
  - name: charges
    match: {subject: charge}
    url: https://api.example.com/charges
    `+yml+"\n", nil)
		if !strings.Contains(got, want) {
			t.Errorf("%s: error %q, want it to mention %q", yml, got, want)
		}
	}
}
