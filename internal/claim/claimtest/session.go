package claimtest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// listSession: a claim records its message's session (the processor's
// session mode), the list filters by it exactly, and a session id longer
// than a SessionId may be is refused before the database.
func (s *suite) listSession(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	inSession := func(session string) claim.ClaimParams {
		p := msg("", "billing", "b")
		p.SessionID = session
		return p
	}
	a := mustWin(t, st, inSession("account-7"))
	b := mustWin(t, st, inSession("account-7"))
	other := mustWin(t, st, inSession("Account-7")) // another session: ids compare exactly
	none := mustWin(t, st, msg("", "billing", "b"))
	if a.SessionID != "account-7" || none.SessionID != "" {
		t.Fatalf("won claims' SessionID %q and %q, want account-7 and none", a.SessionID, none.SessionID)
	}
	got, err := st.Get(ctx, b.ID)
	if err != nil || got.SessionID != "account-7" {
		t.Fatalf("Get: SessionID %q (%v), want account-7", got.SessionID, err)
	}
	list, err := st.List(ctx, &claim.ListParams{SessionID: "account-7"})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(ids(list)) != fmt.Sprint(ids([]*claim.Claim{a, b})) {
		t.Fatalf("session filter: got %v, want %v (not %d, another session, nor %d, none)", ids(list), ids([]*claim.Claim{a, b}), other.ID, none.ID)
	}
	list, err = st.List(ctx, &claim.ListParams{InSession: true, AfterID: a.ID - 1})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(ids(list)) != fmt.Sprint(ids([]*claim.Claim{a, b, other})) {
		t.Fatalf("any session: got %v, want %v (not %d, none)", ids(list), ids([]*claim.Claim{a, b, other}), none.ID)
	}
	list, err = st.List(ctx, &claim.ListParams{SessionID: "account-7", States: []claim.State{claim.StateClaimed}, Consumer: "shipping"})
	if err != nil || len(list) != 0 {
		t.Fatalf("session, state and another consumer: %v (%v), want none", ids(list), err)
	}
	if _, err := st.List(ctx, &claim.ListParams{SessionID: strings.Repeat("s", claim.MaxMessageIDLength+1)}); err == nil {
		t.Error("List accepted a SessionID longer than a session id may be")
	}
	long := inSession(strings.Repeat("s", claim.MaxMessageIDLength+1))
	if _, err := st.ClaimBatch(ctx, &claim.ClaimBatchParams{Host: "h", Claims: []claim.ClaimParams{long}}); err == nil {
		t.Error("ClaimBatch accepted a SessionID longer than a session id may be")
	}
}
