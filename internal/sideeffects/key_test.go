package sideeffects

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// TestStepKeysFollowTheClaimsKeyForm: a step's key extends the claim's
// key in the claim's form. Scoped: "/" and the escaped step name, so step
// "r1" of claim X is never message "X:r1"'s key nor X's first new key
// (issue 20, finding 5, for steps); raw (a claim taken before key forms,
// or a route with key: raw): ":" and the name, as before.
func TestStepKeysFollowTheClaimsKeyForm(t *testing.T) {
	var (
		mu   sync.Mutex
		keys []string
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(srv.Close)
	router, err := ParseRoutes([]byte(fmt.Sprintf(`
routes:
  - name: pay
    match: {subject: pay}
    steps:
      - {name: r1, url: %q}
      - {name: capture, url: %q}
`, srv.URL+"/a", srv.URL+"/b")), func(string) string { return "" }, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	subject := "pay"
	msg := &azservicebus.ReceivedMessage{MessageID: "X", Subject: &subject, Body: []byte("{}")}
	h, err := router.Route(msg)
	if err != nil {
		t.Fatal(err)
	}
	if h.KeyForm != "" {
		t.Fatalf("a route without key: has form %q, want the default (scoped)", h.KeyForm)
	}
	for _, tc := range []struct {
		ctx  context.Context
		key  string
		want []string
	}{
		{WithKeyForm(t.Context(), claim.KeyFormScoped), claim.KeyFor(claim.KeyFormScoped, "billing", "X", 0),
			[]string{"billing/X/r1", "billing/X/capture"}},
		{WithKeyForm(t.Context(), claim.KeyFormRaw), "X", []string{"X:r1", "X:capture"}},
		{t.Context(), "X", []string{"X:r1", "X:capture"}},
	} {
		mu.Lock()
		keys = nil
		mu.Unlock()
		if err := h.Effect.Perform(tc.ctx, msg, tc.key); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		got := strings.Join(keys, " ")
		mu.Unlock()
		if got != strings.Join(tc.want, " ") {
			t.Errorf("key %q (form %s): steps sent %q, want %q", tc.key, KeyFormOf(tc.ctx), got, tc.want)
		}
	}
	// Step r1 of claim X, claim X's first new key and message "X:r1"
	// under the same consumer: three keys.
	step := StepKey(WithKeyForm(t.Context(), claim.KeyFormScoped), claim.KeyFor(claim.KeyFormScoped, "billing", "X", 0), "r1")
	revised := claim.KeyFor(claim.KeyFormScoped, "billing", "X", 1)
	other := claim.KeyFor(claim.KeyFormScoped, "billing", "X:r1", 0)
	if step == revised || step == other || revised == other {
		t.Fatalf("keys collide: step %q, revision %q, message X:r1 %q", step, revised, other)
	}
}

func TestRouteKeyForm(t *testing.T) {
	router, err := ParseRoutes([]byte(`
routes:
  - {name: raw, key: raw, match: {subject: a}, url: "http://example.test/a"}
  - {name: scoped, key: scoped, match: {subject: b}, url: "http://example.test/b"}
`), func(string) string { return "" }, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for subject, want := range map[string]claim.KeyForm{"a": claim.KeyFormRaw, "b": claim.KeyFormScoped} {
		h, err := router.Route(&azservicebus.ReceivedMessage{MessageID: "m", Subject: &subject})
		if err != nil || h.KeyForm != want {
			t.Errorf("subject %s: form %q (%v), want %q", subject, h.KeyForm, err, want)
		}
	}
	if msg := parseErr(t, `
routes:
  - {name: x, key: hashed, match: {subject: a}, url: "http://example.test/a"}
`, nil); !strings.Contains(msg, "key") {
		t.Errorf("key: hashed: %q", msg)
	}
	if _, err := NewRouter(Route{Name: "x", Match: Match{Subject: AnySubject}, Effect: EffectFunc(nil), KeyForm: "hashed"}); err == nil {
		t.Error("NewRouter accepted KeyForm \"hashed\"")
	}
}
