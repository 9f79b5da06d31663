package claimtest

import (
	"testing"

	"github.com/google/uuid"
)

func (s *suite) tryLock(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	name := "claimtest-" + uuid.NewString()
	unlock, ok, err := st.TryLock(ctx, name)
	if err != nil || !ok {
		t.Fatalf("first TryLock: ok %v, err %v", ok, err)
	}
	if _, ok2, err := st.TryLock(ctx, name); err != nil || ok2 {
		t.Fatalf("second TryLock while held: ok %v, err %v; want not ok", ok2, err)
	}
	other, ok, err := st.TryLock(ctx, name+"-other")
	if err != nil || !ok {
		t.Fatalf("TryLock of another name: ok %v, err %v", ok, err)
	}
	if err := other(ctx); err != nil {
		t.Fatal(err)
	}
	if err := unlock(ctx); err != nil {
		t.Fatalf("unlock: %v", err)
	}
	again, ok, err := st.TryLock(ctx, name)
	if err != nil || !ok {
		t.Fatalf("TryLock after unlock: ok %v, err %v", ok, err)
	}
	if err := again(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}
