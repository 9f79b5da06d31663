package processor

import (
	"errors"
	"strings"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

func TestParseKeySpec(t *testing.T) {
	msg := &azservicebus.ReceivedMessage{
		MessageID: "mid-1",
		ApplicationProperties: map[string]any{
			"order_id": "o-7", "n": int64(42), "ce_source": "/shop", "ce_id": "e-1", "blank": " ", "bin": []byte("x"),
		},
	}
	for spec, want := range map[string]string{
		"":                  "mid-1",
		"message-id":        "mid-1",
		"property:order_id": "o-7",
		"property:n":        "42",
		"cloudevents":       "%2Fshop/e-1",
	} {
		f, err := ParseKeySpec(spec)
		if err != nil {
			t.Fatalf("%q: %v", spec, err)
		}
		if got, err := f(msg); err != nil || got != want {
			t.Errorf("%q: got %q, %v; want %q", spec, got, err, want)
		}
	}
	for _, spec := range []string{"property:missing", "property:blank", "property:bin"} {
		f, _ := ParseKeySpec(spec)
		if _, err := f(msg); !errors.Is(err, ErrNoKey) {
			t.Errorf("%q: err %v, want ErrNoKey", spec, err)
		}
	}
	ce, _ := ParseKeySpec("cloudevents")
	k1, _ := ce(&azservicebus.ReceivedMessage{ApplicationProperties: map[string]any{"ce_source": "a/b", "ce_id": "c"}})
	k2, _ := ce(&azservicebus.ReceivedMessage{ApplicationProperties: map[string]any{"ce_source": "a", "ce_id": "b/c"}})
	if k1 == k2 {
		t.Errorf("cloudevents keys collide: %q", k1)
	}
	if _, err := messageIDKey(&azservicebus.ReceivedMessage{}); !errors.Is(err, ErrNoKey) {
		t.Errorf("empty MessageId accepted")
	}
	for _, spec := range []string{"correlation-id", "property:", "property: x", "sequence"} {
		if _, err := ParseKeySpec(spec); err == nil {
			t.Errorf("%q accepted", spec)
		}
	}
}

// FuzzDedupKey: any message and any spec: no panic; a key is never empty;
// every failure wraps ErrNoKey.
func FuzzDedupKey(f *testing.F) {
	f.Add("message-id", "m1", "order_id", "o-1")
	f.Add("property:order_id", "", "order_id", "")
	f.Add("cloudevents", "x", "ce_id", "1")
	f.Add("property:ünïcode", "\x00", "ünïcode", strings.Repeat("k", 200))
	f.Fuzz(func(t *testing.T, spec, id, prop, val string) {
		fn, err := ParseKeySpec(spec)
		if err != nil {
			return
		}
		msg := &azservicebus.ReceivedMessage{MessageID: id, ApplicationProperties: map[string]any{prop: val}}
		key, err := fn(msg)
		if err != nil {
			if !errors.Is(err, ErrNoKey) {
				t.Fatalf("error %v does not wrap ErrNoKey", err)
			}
			return
		}
		if strings.TrimSpace(key) == "" {
			t.Fatalf("empty key accepted for spec %q", spec)
		}
	})
}
