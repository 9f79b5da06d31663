package chaos

import (
	"context"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claim/claimtest"
)

// testLogger routes warnings to t.Log (the replicas log every fault).
func testLogger(t *testing.T) *slog.Logger {
	if path := os.Getenv("CHAOS_TEST_LOG"); path != "" {
		f, err := os.Create(path + "." + strings.ReplaceAll(t.Name(), "/", "_"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelError}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func runChaos(t *testing.T, dbURL string, seed uint64) {
	t.Helper()
	rep, err := Run(context.Background(), Config{
		Messages:    300,
		Replicas:    3,
		Faults:      AllFaults,
		Seed:        seed,
		DatabaseURL: dbURL,
		Logger:      testLogger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	rep.Write(&b)
	t.Log("\n" + b.String())
	if !rep.Pass() {
		t.Fatalf("exactly-once violated:\n%s", strings.Join(rep.Violations, "\n"))
	}
	for _, f := range AllFaults {
		if rep.Happened[f] == 0 {
			t.Errorf("fault %s never happened (planned %d)", f, rep.Planned[f])
		}
	}
	if got := rep.EffectsPerKey[1]; got != rep.Distinct {
		t.Errorf("%d of %d keys had exactly one effect", got, rep.Distinct)
	}
	if rep.Kills == 0 || rep.ReplicasStarted != rep.Replicas+rep.Kills {
		t.Errorf("replicas: %d killed, %d started (want every killed replica replaced)", rep.Kills, rep.ReplicasStarted)
	}
	if rep.Redriven == 0 {
		t.Error("no claim was redriven: the die-after-claim and die-after-effect faults must leave stale claims")
	}
}

func TestChaosSQLite(t *testing.T) {
	t.Parallel()
	runChaos(t, "", 7)
}

func TestChaosPostgres(t *testing.T) {
	t.Parallel()
	runChaos(t, claimtest.PostgresURL(t), 8)
}

// sqlServerURLEnv is the SQL Server URL of the tests (see internal/testdb).
const sqlServerURLEnv = "SBCLAIM_TEST_SQLSERVER_URL"

func TestChaosSQLServer(t *testing.T) {
	t.Parallel()
	runChaos(t, claimtest.RequireOrSkip(t, "sqlserver", sqlServerURLEnv), 9)
}

// noDedupStore claims nothing: every delivery "wins", as in a consumer
// without deduplication. The harness must report it.
type noDedupStore struct{ claim.Store }

func (s noDedupStore) ClaimBatch(_ context.Context, p *claim.ClaimBatchParams) ([]claim.ClaimResult, error) {
	out := make([]claim.ClaimResult, len(p.Claims))
	for i := range p.Claims {
		out[i] = claim.ClaimResult{Outcome: claim.OutcomeWon, Claim: &claim.Claim{ID: int64(-i - 1), Owner: uuid.New(), State: claim.StateClaimed}}
	}
	return out, nil
}

func (noDedupStore) Heartbeat(context.Context, *claim.HeartbeatParams) error { return nil }

func (noDedupStore) MarkProcessed(context.Context, *claim.MarkProcessedParams) error { return nil }

// TestChaosDetectsMissingDeduplication proves the checks bite: without
// claims, duplicate deliveries each run the effect, which the downstream's
// own idempotency would hide from an effects count alone.
func TestChaosDetectsMissingDeduplication(t *testing.T) {
	t.Parallel()
	rep, err := Run(context.Background(), Config{
		Messages:  100,
		Replicas:  2,
		DupShare:  0.5,
		Seed:      3,
		Logger:    testLogger(t),
		wrapStore: func(s claim.Store) claim.Store { return noDedupStore{s} },
	})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	rep.Write(&b)
	t.Log("\n" + b.String())
	if rep.Pass() {
		t.Fatal("the harness passed a processor without deduplication")
	}
	if rep.MultiSender == 0 {
		t.Error("no key was reported as sent by several deliveries")
	}
	if !strings.HasPrefix(rep.Verdict(), "VERDICT: FAIL: ") {
		t.Errorf("verdict = %q", rep.Verdict())
	}
}

// wonAsDuplicateStore turns every won claim into a duplicate of itself: the
// processor completes every message without performing its effect, and
// the claims are left for the reconciler, whose redrive performs them all.
type wonAsDuplicateStore struct{ claim.Store }

func (s wonAsDuplicateStore) ClaimBatch(ctx context.Context, p *claim.ClaimBatchParams) ([]claim.ClaimResult, error) {
	res, err := s.Store.ClaimBatch(ctx, p)
	for i := range res {
		if res[i].Outcome == claim.OutcomeWon {
			res[i].Outcome = claim.OutcomeDuplicate
		}
	}
	return res, err
}

// forgetfulStore's MarkProcessed reports success and writes nothing: every
// claim stays claimed, and the reconciler flags and redrives it.
type forgetfulStore struct{ claim.Store }

func (forgetfulStore) MarkProcessed(context.Context, *claim.MarkProcessedParams) error { return nil }

// TestChaosDetectsWorkLeftToRedrive proves that a redrive does not hide a
// processor that leaves its work to the reconciler: every flagged claim
// must be explained by a kill, a fault or an outage, and an effect that
// only a redrive performed must be too. (Before this check, both broken
// processors below passed with every claim flagged and redriven.)
func TestChaosDetectsWorkLeftToRedrive(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		wrap   func(claim.Store) claim.Store
		faults []Fault
	}{
		{"no-effect/no-faults", func(s claim.Store) claim.Store { return wonAsDuplicateStore{s} }, nil},
		{"no-effect/all-faults", func(s claim.Store) claim.Store { return wonAsDuplicateStore{s} }, AllFaults},
		{"no-mark-processed/no-faults", func(s claim.Store) claim.Store { return forgetfulStore{s} }, nil},
		{"no-mark-processed/all-faults", func(s claim.Store) claim.Store { return forgetfulStore{s} }, AllFaults},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rep, err := Run(context.Background(), Config{
				Messages:  100,
				Replicas:  2,
				Faults:    tc.faults,
				Seed:      4,
				Logger:    testLogger(t),
				wrapStore: tc.wrap,
			})
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			rep.Write(&b)
			t.Log("\n" + b.String())
			if rep.Pass() || !strings.HasPrefix(rep.Verdict(), "VERDICT: FAIL: ") {
				t.Fatalf("the harness passed a processor that leaves its work to the reconciler: %s", rep.Verdict())
			}
			if rep.Unexplained == 0 {
				t.Errorf("no flagged claim was reported unexplained (flagged %d: %v)", rep.Flagged, rep.FlagExplained)
			}
			if len(rep.Histories) == 0 {
				t.Error("no history was reported for an unexplained claim")
			}
			if tc.faults == nil && !slices.ContainsFunc(rep.Violations, func(v string) bool {
				return strings.Contains(v, "no fault was injected, yet the reconciler flagged claims")
			}) {
				t.Errorf("with no faults, flagged claims were not a violation of their own: %q", rep.Violations)
			}
		})
	}
}

func TestScenarios(t *testing.T) {
	t.Parallel()
	backends := map[string]func(t *testing.T) string{
		"sqlite":   func(*testing.T) string { return "" },
		"postgres": func(t *testing.T) string { return claimtest.PostgresURL(t) },
		"sqlserver": func(t *testing.T) string {
			return claimtest.RequireOrSkip(t, "sqlserver", sqlServerURLEnv)
		},
	}
	want := map[Scenario]int{ScenarioNaive: 2, ScenarioUniqueIndex: 1, ScenarioTwoPhase: 1}
	for _, backend := range []string{"sqlite", "postgres", "sqlserver"} {
		for _, s := range Scenarios {
			t.Run(backend+"/"+string(s), func(t *testing.T) {
				t.Parallel()
				url := backends[backend](t)
				res, err := RunScenario(context.Background(), s, ScenarioConfig{DatabaseURL: url, Logger: testLogger(t)})
				if err != nil {
					t.Fatal(err)
				}
				var b strings.Builder
				res.Write(&b)
				t.Log("\n" + b.String())
				if res.Effects != want[s] || !res.Pass() {
					t.Errorf("%s: %d effects, want %d (%s)", s, res.Effects, want[s], res.Verdict())
				}
			})
		}
	}
}

// TestTwoPhaseScenarioDetectsNoClaim proves the two-phase scenario can
// fail: with a store that grants every claim, both instances call the
// downstream. (Its effect count stays 1, the downstream deduplicating by
// key itself; the request count and the outcomes show it.)
func TestTwoPhaseScenarioDetectsNoClaim(t *testing.T) {
	t.Parallel()
	res, err := RunScenario(context.Background(), ScenarioTwoPhase, ScenarioConfig{
		Logger:    testLogger(t),
		wrapStore: func(s claim.Store) claim.Store { return noDedupStore{s} },
	})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	res.Write(&b)
	t.Log("\n" + b.String())
	if res.Pass() || !strings.HasPrefix(res.Verdict(), "VERDICT: FAIL: ") {
		t.Fatalf("the scenario passed a store that grants every claim: %s", res.Verdict())
	}
	if res.Requests < 2 {
		t.Errorf("downstream requests = %d, want 2 (both instances called)", res.Requests)
	}
}

func TestParseFaults(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []Fault
		wantErr string
	}{
		{in: "all", want: AllFaults},
		{in: "none", want: nil},
		{in: "lock-expiry, die-after-claim,lock-expiry", want: []Fault{FaultLockExpiry, FaultDieAfterClaim}},
		{in: "die-after-lunch", wantErr: `unknown fault "die-after-lunch"`},
	} {
		got, err := ParseFaults(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseFaults(%q) error = %v, want %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ParseFaults(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestRedact(t *testing.T) {
	got := Redact("postgres://u:secret@h:5432/db?sslmode=disable")
	if strings.Contains(got, "secret") {
		t.Errorf("Redact kept the password: %s", got)
	}
}
