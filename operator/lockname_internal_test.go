package operator

import (
	"testing"

	"github.com/sbclaim/sbclaim/internal/reconciler"
)

// TestReconcilerLockNameIsTheTicks: the name shown to users is the lock
// the reconciler's tick takes.
func TestReconcilerLockNameIsTheTicks(t *testing.T) {
	if ReconcilerLockName != reconciler.LockName {
		t.Fatalf("ReconcilerLockName = %q, the tick locks %q", ReconcilerLockName, reconciler.LockName)
	}
}
