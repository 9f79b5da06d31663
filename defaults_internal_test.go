package sbclaim

import (
	"testing"

	"github.com/sbclaim/sbclaim/internal/sideeffects"
)

// TestDefaultsAreTheInternalOnes: the defaults go doc shows by value are
// the ones the processor and the routes apply.
func TestDefaultsAreTheInternalOnes(t *testing.T) {
	if DefaultBackoff.internal() != sideeffects.DefaultBackoff {
		t.Errorf("DefaultBackoff = %+v, the routes apply %+v", DefaultBackoff, sideeffects.DefaultBackoff)
	}
	if DefaultBreaker.internal() != sideeffects.DefaultBreaker {
		t.Errorf("DefaultBreaker = %+v, the routes apply %+v", DefaultBreaker, sideeffects.DefaultBreaker)
	}
	if DefaultRetryBudget != sideeffects.DefaultRetryBudget {
		t.Errorf("DefaultRetryBudget = %v, the processor applies %v", DefaultRetryBudget, sideeffects.DefaultRetryBudget)
	}
	if DefaultEffectMaxAttempts != sideeffects.DefaultMaxAttempts {
		t.Errorf("DefaultEffectMaxAttempts = %d, the processor applies %d", DefaultEffectMaxAttempts, sideeffects.DefaultMaxAttempts)
	}
}
