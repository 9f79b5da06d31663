package main

import (
	"errors"
	"io"
	"strings"
	"testing"
)

// FuzzConfig: arbitrary values for every setting never panic, and every
// rejection is a ConfigError naming an SBCLAIM_ variable.
func FuzzConfig(f *testing.F) {
	f.Add("postgres://u:p@h/db", "Endpoint=sb://x;SharedAccessKeyName=a;SharedAccessKey=b", "q", "c", "16", "5m", "message-id", "true")
	f.Add("sqlite:", "", "", "", "0", "-1s", "property:", "maybe")
	f.Add("sqlserver://%zz", "Endpoint=http://x", "q", strings.Repeat("c", 300), "x", "1h", "cloudevents", "1")
	f.Fuzz(func(t *testing.T, db, cs, queue, consumer, calls, renewal, key, payload string) {
		env := map[string]string{
			"SBCLAIM_DATABASE_URL":                 db,
			"SBCLAIM_SERVICEBUS_CONNECTION_STRING": cs,
			"SBCLAIM_QUEUE":                        queue,
			"SBCLAIM_CONSUMER":                     consumer,
			"SBCLAIM_MAX_CONCURRENT_CALLS":         calls,
			"SBCLAIM_MAX_LOCK_RENEWAL":             renewal,
			"SBCLAIM_DEDUP_KEY":                    key,
			"SBCLAIM_STORE_PAYLOAD":                payload,
			"SBCLAIM_ROUTES":                       "routes.yaml",
		}
		c, err := LoadConfig(nil, func(k string) string { return env[k] }, io.Discard)
		if err != nil {
			var ce *ConfigError
			if !errors.As(err, &ce) || !strings.HasPrefix(ce.Field, "SBCLAIM_") {
				t.Fatalf("rejection %v is not a ConfigError naming a variable", err)
			}
			return
		}
		if c.Consumer == "" || c.DatabaseURL == "" || c.Key == nil {
			t.Fatalf("accepted an incomplete config: %+v", c)
		}
	})
}
