package chaos

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/testkit"
)

func runSessionChaos(t *testing.T, dbURL string, seed uint64, recovery sideeffects.Recovery) {
	t.Helper()
	rep, err := Run(context.Background(), Config{
		Messages:    200,
		Replicas:    3,
		Faults:      AllFaults,
		Seed:        seed,
		DatabaseURL: dbURL,
		Sessions:    true,
		Recovery:    recovery,
		Logger:      testLogger(t),
	})
	if err != nil {
		t.Fatalf("%s: %v", dbSource(dbURL), err)
	}
	var b strings.Builder
	rep.Write(&b)
	t.Log("\n" + b.String())
	if !rep.Pass() {
		t.Fatalf("a session run failed:\n%s", strings.Join(rep.Violations, "\n"))
	}
	if rep.Sessions != 200/SessionSize || rep.OutOfOrder != 0 || rep.EffectsPerKey[1] != rep.Distinct {
		t.Errorf("sessions %d, out of order %d, keys with one effect %d of %d", rep.Sessions, rep.OutOfOrder, rep.EffectsPerKey[1], rep.Distinct)
	}
	if rep.Queue.Deferrals != 0 {
		t.Errorf("%d deferrals in a session run: a session's message is never deferred", rep.Queue.Deferrals)
	}
	for _, want := range []string{"\nsessions: 25 sessions; out of order 0", "\nsessions: exactly once: doubled 0, lost 0, dead-lettered by the broker 0"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the report has no %q line", strings.TrimPrefix(want, "\n"))
		}
	}
}

func TestChaosSessionsSQLite(t *testing.T) {
	t.Parallel()
	runSessionChaos(t, "", 21, sideeffects.RecoveryAuto)
}

// TestChaosSessionsManualRoutes: crash-left claims of manual routes are
// flagged by the session's next holder (their outcome is open), so the
// session goes on only past a final outcome.
func TestChaosSessionsManualRoutes(t *testing.T) {
	t.Parallel()
	runSessionChaos(t, "", 23, sideeffects.RecoveryManual)
}

func TestChaosSessionsPostgres(t *testing.T) {
	t.Parallel()
	runSessionChaos(t, testkit.PostgresURL(t), 22, sideeffects.RecoveryAuto)
}

// TestSessionOrderCheckFindsAnOvertake: the order check itself — a
// message whose first request arrived before its predecessor's claim was
// final, or while it never was, is reported; one that waited is not.
func TestSessionOrderCheckFindsAnOvertake(t *testing.T) {
	b := newSessionBook()
	for _, id := range []string{"a", "b", "c", "d"} {
		b.sent(id, "s")
	}
	b.sent("x", "other")
	t0 := time.Now()
	b.attempt["a"], b.final["a"] = t0, t0.Add(10*time.Millisecond)
	b.attempt["b"], b.final["b"] = t0.Add(20*time.Millisecond), t0.Add(30*time.Millisecond) // waited for a
	b.attempt["c"] = t0.Add(25 * time.Millisecond)                                          // overtook b
	b.attempt["d"] = t0.Add(40 * time.Millisecond)                                          // c never final
	b.attempt["x"] = t0
	bad, n := b.outOfOrder()
	if n != 2 || len(bad) != 2 || !strings.Contains(bad[0]+bad[1], "c's first effect request arrived while b") ||
		!strings.Contains(bad[0]+bad[1], "never reached a final outcome") {
		t.Fatalf("%d sessions, out of order %q: want c (overtook b) and d (c never final)", n, bad)
	}
}
