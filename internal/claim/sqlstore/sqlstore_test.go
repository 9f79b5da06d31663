package sqlstore

import (
	"testing"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
)

func TestPlanResults(t *testing.T) {
	h1, h2 := claim.HashPayload([]byte("1")), claim.HashPayload([]byte("2"))
	p := func(id string, h []byte) claim.ClaimParams {
		return claim.ClaimParams{Owner: uuid.New(), MessageID: id, Consumer: "c", PayloadHash: h}
	}
	plan, err := NewPlan([]claim.ClaimParams{p("a", h1), p("b", h1), p("a", h1), p("a", h2), p("b", h2), p("c", h1)})
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.First) != 3 || plan.First[0] != 0 || plan.First[1] != 1 || plan.First[2] != 5 {
		t.Fatalf("First = %v, want [0 1 5]", plan.First)
	}
	won := map[Key]*claim.Claim{{"a", "c"}: {ID: 1, MessageID: "a", Consumer: "c", PayloadHash: h1}}
	existing := map[Key]*claim.Claim{
		{"b", "c"}: {ID: 2, MessageID: "b", Consumer: "c", PayloadHash: h2},
		{"c", "c"}: {ID: 3, MessageID: "c", Consumer: "c", PayloadHash: h1},
	}
	res, err := plan.Results(won, existing)
	if err != nil {
		t.Fatal(err)
	}
	want := []claim.Outcome{claim.OutcomeWon, claim.OutcomeConflict, claim.OutcomeDuplicate, claim.OutcomeConflict, claim.OutcomeDuplicate, claim.OutcomeDuplicate}
	for i := range want {
		if res[i].Outcome != want[i] {
			t.Errorf("message %d: %s, want %s", i, res[i].Outcome, want[i])
		}
	}
	if res[0].Claim == res[2].Claim {
		t.Error("results share a *Claim")
	}
	delete(existing, Key{"c", "c"})
	if _, err := plan.Results(won, existing); err == nil {
		t.Error("Results with a key neither won nor found succeeded")
	}
}

func TestProperties(t *testing.T) {
	s, err := EncodeProperties(map[string]string{"a": "1"})
	if err != nil {
		t.Fatal(err)
	}
	m, err := DecodeProperties(s)
	if err != nil || m["a"] != "1" || len(m) != 1 {
		t.Fatalf("round trip: %v %v", m, err)
	}
	if s, _ := EncodeProperties(nil); s != "{}" {
		t.Fatalf("empty properties encode as %q", s)
	}
	if m, err := DecodeProperties("{}"); m != nil || err != nil {
		t.Fatalf("{} decodes as %v %v", m, err)
	}
}
