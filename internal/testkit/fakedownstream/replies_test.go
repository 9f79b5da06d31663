package fakedownstream

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestDeclineIsStoredAndReplayed(t *testing.T) {
	t.Parallel()
	s, url := setup(t, Options{})
	s.SetKeyReply("d1", ReplyDecline)
	first := mustSend(t, url+"/v1/charges", "d1", `amount=1000`)
	if first.status != http.StatusPaymentRequired || first.replayed {
		t.Fatalf("first: %+v", first)
	}
	var body struct {
		Error struct{ Type, Code, Charge string }
	}
	if err := json.Unmarshal([]byte(first.body), &body); err != nil || body.Error.Type != "card_error" || body.Error.Code != "card_declined" || !strings.HasPrefix(body.Error.Charge, "fx_") {
		t.Errorf("decline body %s (%v)", first.body, err)
	}
	if first.header.Get("Request-Id") == "" {
		t.Error("no Request-Id")
	}
	for range 3 {
		again := mustSend(t, url+"/v1/charges", "d1", `amount=1000`)
		if again.status != http.StatusPaymentRequired || !again.replayed || again.body != first.body {
			t.Errorf("repeat: %+v, want the stored 402 replayed", again)
		}
	}
	if s.Rejections("d1") != 1 || s.Effects("d1") != 0 || s.Requests("d1") != 4 || s.Replays("d1") != 3 {
		t.Errorf("counts: rejections %d effects %d requests %d replays %d, want 1/0/4/3",
			s.Rejections("d1"), s.Effects("d1"), s.Requests("d1"), s.Replays("d1"))
	}
	st, ok := s.StoredAnswer("/v1/charges", "d1")
	if !ok || st.Status != http.StatusPaymentRequired || st.Reply != ReplyDecline || st.Body != first.body {
		t.Errorf("StoredAnswer = %+v, %v", st, ok)
	}
	// Another key is charged normally.
	if a := mustSend(t, url+"/v1/charges", "ok1", `amount=1000`); a.status != http.StatusCreated {
		t.Errorf("other key: %+v", a)
	}
	c := s.Snapshot()
	if c.TotalRejections != 1 || c.Keys["d1"].Stored["/v1/charges"] != 402 || c.Keys["d1"].Rejections != 1 {
		t.Errorf("snapshot: %+v %+v", c, c.Keys["d1"])
	}
}

func TestCachedFailureOnlyANewKeySucceeds(t *testing.T) {
	t.Parallel()
	s, url := setup(t, Options{})
	s.SetKeyReply("c1", ReplyCachedFailure)
	for i := range 3 {
		a := mustSend(t, url+"/p", "c1", `{"a":1}`)
		if a.status != http.StatusInternalServerError || a.replayed != (i > 0) || !strings.Contains(a.body, "api_error") {
			t.Errorf("request %d: %+v, want the stored 500", i, a)
		}
	}
	if s.CachedFailures("c1") != 1 || s.Effects("c1") != 0 || s.Replays("c1") != 2 {
		t.Errorf("c1: cached %d effects %d replays %d", s.CachedFailures("c1"), s.Effects("c1"), s.Replays("c1"))
	}
	// The redrive under a new key.
	a := mustSend(t, url+"/p", "c1:r1", `{"a":1}`)
	if a.status != http.StatusCreated || s.Effects("c1:r1") != 1 {
		t.Errorf("new key: %+v, effects %d", a, s.Effects("c1:r1"))
	}
	if st, _ := s.StoredAnswer("/p", "c1"); st.Status != 500 || st.Reply != ReplyCachedFailure {
		t.Errorf("stored: %+v", st)
	}
}

func TestConflicts(t *testing.T) {
	t.Parallel()
	// The default: 422.
	s, url := setup(t, Options{})
	mustSend(t, url+"/p", "k", `{"a":1}`)
	if a := mustSend(t, url+"/p", "k", `{"a":2}`); a.status != http.StatusUnprocessableEntity {
		t.Errorf("default style: %d, want 422", a.status)
	}
	// Stripe's: 400 idempotency_error.
	s2, url2 := setup(t, Options{ConflictStyle: ConflictStripe})
	mustSend(t, url2+"/p", "k", `{"a":1}`)
	a := mustSend(t, url2+"/p", "k", `{"a":2}`)
	var body struct{ Error struct{ Type string } }
	if a.status != http.StatusBadRequest || json.Unmarshal([]byte(a.body), &body) != nil || body.Error.Type != "idempotency_error" {
		t.Errorf("stripe style: %d %s", a.status, a.body)
	}
	if s2.Conflicts("k") != 1 || s2.Effects("k") != 1 {
		t.Errorf("conflicts %d effects %d", s2.Conflicts("k"), s2.Effects("k"))
	}
	// A key preset as held by another payload conflicts from the first
	// request on, and nothing is performed.
	s2.SetKeyReply("taken", ReplyConflict)
	for range 2 {
		if a := mustSend(t, url2+"/p", "taken", `{"a":1}`); a.status != http.StatusBadRequest {
			t.Errorf("preset conflict: %+v", a)
		}
	}
	if s2.Conflicts("taken") != 2 || s2.Effects("taken") != 0 {
		t.Errorf("taken: conflicts %d effects %d", s2.Conflicts("taken"), s2.Effects("taken"))
	}
	s2.SetConflictStyle(Conflict422)
	if a := mustSend(t, url2+"/p", "taken", `{"a":1}`); a.status != http.StatusUnprocessableEntity {
		t.Errorf("after SetConflictStyle: %d", a.status)
	}
	if s.Snapshot().TotalConflicts != 1 || s2.Snapshot().TotalConflicts != 4 {
		t.Errorf("totals: %d, %d", s.Snapshot().TotalConflicts, s2.Snapshot().TotalConflicts)
	}
}

func TestReplyFuncAndControlEndpoint(t *testing.T) {
	t.Parallel()
	s, url := setup(t, Options{})
	s.SetReplyFunc(func(key string) Reply {
		if strings.HasPrefix(key, "decline-") && !strings.Contains(key, ":r") {
			return ReplyDecline
		}
		return ReplyNormal
	})
	if a := mustSend(t, url+"/p", "decline-1", `x`); a.status != http.StatusPaymentRequired {
		t.Errorf("reply func: %d", a.status)
	}
	if a := mustSend(t, url+"/p", "decline-1:r1", `x`); a.status != http.StatusCreated {
		t.Errorf("reply func, new key: %d", a.status)
	}
	// An exact setting wins over the function.
	resp, err := http.Post(url+"/_replies", "application/json", strings.NewReader(`{"key":"decline-2","reply":"cached-failure"}`))
	if err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("POST /_replies: %v %v", resp, err)
	}
	if a := mustSend(t, url+"/p", "decline-2", `x`); a.status != http.StatusInternalServerError {
		t.Errorf("set over HTTP: %d", a.status)
	}
	for _, bad := range []string{`{"key":"k","reply":"explode"}`, `{"reply":"decline"}`, `{"key":"k","other":1}`} {
		resp, err := http.Post(url+"/_replies", "application/json", strings.NewReader(bad))
		if err != nil || resp.StatusCode != http.StatusBadRequest {
			t.Errorf("POST /_replies %s: %v %v", bad, resp, err)
		}
	}
	req, _ := http.NewRequest(http.MethodDelete, url+"/_replies", nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusNoContent {
		t.Fatalf("DELETE /_replies: %v %v", resp, err)
	}
	if a := mustSend(t, url+"/p", "decline-3", `x`); a.status != http.StatusCreated {
		t.Errorf("after clearing: %d", a.status)
	}
	// What was stored stays stored.
	if a := mustSend(t, url+"/p", "decline-1", `x`); a.status != http.StatusPaymentRequired || !a.replayed {
		t.Errorf("stored decline after clearing: %+v", a)
	}
}

func TestReplyAndConflictStyleNames(t *testing.T) {
	t.Parallel()
	for r := range replyNames {
		got, err := ParseReply(r.String())
		b, _ := r.MarshalText()
		if err != nil || got != r || string(b) != r.String() {
			t.Errorf("Reply %v: %v %v %s", r, got, err, b)
		}
	}
	for c := range conflictStyleNames {
		var got ConflictStyle
		if err := got.UnmarshalText([]byte(c.String())); err != nil || got != c {
			t.Errorf("ConflictStyle %v: %v %v", c, got, err)
		}
	}
	if _, err := ParseReply("nope"); err == nil {
		t.Error("ParseReply accepted nope")
	}
	if _, err := ParseConflictStyle("409"); err == nil {
		t.Error("ParseConflictStyle accepted 409")
	}
	b, _ := json.Marshal(StoredAnswer{Status: 402, Reply: ReplyDecline})
	if !strings.Contains(string(b), `"reply":"decline"`) {
		t.Errorf("StoredAnswer JSON: %s", b)
	}
}

func TestStripeRequestsRefuseJSONAndMissingBearer(t *testing.T) {
	t.Parallel()
	s, base := setup(t, Options{StripeRequests: true, ConflictStyle: ConflictStripe})
	post := func(key, auth, contentType, body string) answer {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, base+"/v1/payment_intents", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Idempotency-Key", key)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		req.Header.Set("Content-Type", contentType)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return answer{status: resp.StatusCode, body: string(b)}
	}
	const form = "application/x-www-form-urlencoded"
	for _, c := range []struct {
		name, auth, contentType, body string
		want                          int
	}{
		{"no Authorization", "", form, "amount=1999", http.StatusUnauthorized},
		{"key without Bearer", "sk_test_123", form, "amount=1999", http.StatusUnauthorized},
		{"JSON body", "Bearer sk_test_123", "application/json", `{"amount":1999}`, http.StatusBadRequest},
		{"bad form", "Bearer sk_test_123", form, "amount=%zz", http.StatusBadRequest},
	} {
		a := post("k-"+c.name, c.auth, c.contentType, c.body)
		if a.status != c.want || !strings.Contains(a.body, "invalid_request_error") {
			t.Errorf("%s: %d %s, want %d invalid_request_error", c.name, a.status, a.body, c.want)
		}
		if _, stored := s.StoredAnswer("/v1/payment_intents", "k-"+c.name); stored || s.Effects("k-"+c.name) != 0 {
			t.Errorf("%s: a refused request was stored or performed", c.name)
		}
	}
	ok := post("k1", "Bearer sk_test_123", form+"; charset=utf-8", "amount=1999&currency=usd&metadata%5Border%5D=42")
	if ok.status != http.StatusCreated || s.Effects("k1") != 1 {
		t.Errorf("form request: %d %s, want 201 performed", ok.status, ok.body)
	}
	if got := s.Bodies("k1"); len(got) != 1 || got[0] != "amount=1999&currency=usd&metadata%5Border%5D=42" {
		t.Errorf("Bodies(k1) = %q", got)
	}
}
