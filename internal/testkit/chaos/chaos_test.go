package chaos

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/processor"
	"github.com/sbclaim/sbclaim/internal/reconciler"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/testkit"
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
	runChaosWith(t, dbURL, seed, sideeffects.RecoveryAuto)
}

func runChaosWith(t *testing.T, dbURL string, seed uint64, recovery sideeffects.Recovery) {
	t.Helper()
	rep, err := Run(context.Background(), Config{
		Messages:    300,
		Replicas:    3,
		Faults:      AllFaults,
		Seed:        seed,
		DatabaseURL: dbURL,
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
	if !strings.Contains(b.String(), "\nrecovery: recovered by redelivery ") {
		t.Error("the report has no recovery: line")
	}
	switch recovery {
	case sideeffects.RecoveryAuto:
		// Crashes heal without operators: redeliveries take silent
		// holders' claims over.
		if rep.RecoveredByRedelivery == 0 || rep.FlaggedForOperators != 0 || rep.Redriven != 0 {
			t.Errorf("auto routes: recovered by redelivery %d, flagged %d, redriven %d; want some, 0, 0",
				rep.RecoveredByRedelivery, rep.FlaggedForOperators, rep.Redriven)
		}
	case sideeffects.RecoveryManual:
		// Crash-left claims go to operators, each explained, and the
		// stand-in operators redrive them all.
		if rep.FlaggedForOperators == 0 || rep.Redriven != rep.FlaggedForOperators || rep.Unexplained != 0 {
			t.Errorf("manual routes: flagged %d, redriven %d, unexplained %d; want some, all, 0",
				rep.FlaggedForOperators, rep.Redriven, rep.Unexplained)
		}
	}
}

func TestChaosSQLiteManualRoutes(t *testing.T) {
	t.Parallel()
	runChaosWith(t, "", 10, sideeffects.RecoveryManual)
}

func TestChaosSQLite(t *testing.T) {
	t.Parallel()
	runChaos(t, "", 7)
}

func TestChaosPostgres(t *testing.T) {
	t.Parallel()
	runChaos(t, testkit.PostgresURL(t), 8)
}

// sqlServerURLEnv is the SQL Server URL of the tests (see internal/testkit/testdb).
const sqlServerURLEnv = testkit.SQLServerEnv

// dbSource says where a run's database URL came from, for its errors:
// the variable that holds it, or a scratch SQLite file.
func dbSource(url string) string {
	for _, env := range []string{sqlServerURLEnv, testkit.PostgresURLEnv} {
		if url != "" && url == os.Getenv(env) {
			return env
		}
	}
	return "a scratch SQLite database"
}

func TestChaosSQLServer(t *testing.T) {
	t.Parallel()
	runChaos(t, testkit.RequireOrSkip(t, "sqlserver", sqlServerURLEnv), 9)
}

// noDedupStore claims nothing: every delivery "wins", as in a consumer
// without deduplication. The harness must report it.
type noDedupStore struct{ claim.Store }

func (s noDedupStore) ClaimBatch(_ context.Context, p *claim.ClaimBatchParams) ([]claim.ClaimResult, error) {
	out := make([]claim.ClaimResult, len(p.Claims))
	for i := range p.Claims {
		out[i] = claim.ClaimResult{Outcome: claim.OutcomeWon, Claim: &claim.Claim{ID: int64(-i - 1), MessageID: p.Claims[i].MessageID, Consumer: p.Claims[i].Consumer, Owner: uuid.New(), State: claim.StateClaimed,
			KeyForm: claim.KeyFormScoped}}
	}
	return out, nil
}

func (noDedupStore) Heartbeat(context.Context, *claim.HeartbeatParams) error { return nil }

func (noDedupStore) MarkProcessed(context.Context, *claim.MarkProcessedParams) error { return nil }

func (noDedupStore) RecordAttempt(context.Context, *claim.RecordAttemptParams) error { return nil }

func (noDedupStore) Release(context.Context, *claim.ReleaseParams) error { return nil }

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
	if !slices.ContainsFunc(rep.Violations, func(v string) bool { return strings.Contains(v, "without ever having been granted the claim") }) {
		t.Errorf("no request was reported as sent by a delivery that never held the claim: %q", rep.Violations)
	}
	if !strings.HasPrefix(rep.Verdict(), "VERDICT: FAIL: ") {
		t.Errorf("verdict = %q", rep.Verdict())
	}
}

// forgetfulStore's MarkProcessed reports success and writes nothing: every
// claim stays claimed after its message was completed, and the reconciler
// recovers it.
type forgetfulStore struct{ claim.Store }

func (forgetfulStore) MarkProcessed(context.Context, *claim.MarkProcessedParams) error { return nil }

// eagerTakeOver ignores the holder's heartbeat: its take-overs take any
// claimed claim at once, a live holder's included.
type eagerTakeOver struct{ claim.Store }

func (s eagerTakeOver) TakeOver(ctx context.Context, p *claim.TakeOverParams) (*claim.Claim, error) {
	q := *p
	q.SilentFor = time.Microsecond
	return s.Store.TakeOver(ctx, &q)
}

// neverTakesOver makes every take-over look as if the claim had been
// processed by someone else: the processor completes its copy without
// running the effect, while the holder may be silent (dead).
type neverTakesOver struct{ claim.Store }

func (s neverTakesOver) TakeOver(ctx context.Context, p *claim.TakeOverParams) (*claim.Claim, error) {
	c, err := s.Store.Get(ctx, p.ID)
	if err != nil {
		return nil, err
	}
	c.State = claim.StateProcessed
	return c, claim.ErrStateChanged
}

// redriveWithoutHold is an operator's redrive that calls the downstream
// without taking the claim first, then resolves it.
func redriveWithoutHold(ctx context.Context, st claim.Store, p *reconciler.RedriveParams) (*claim.Claim, error) {
	c, err := st.Get(ctx, p.ID)
	if err != nil {
		return nil, err
	}
	msg := reconciler.MessageFromClaim(c)
	h, err := p.Routes.For(c.Consumer).Route(msg)
	if err != nil {
		return nil, err
	}
	if err := h.Effect.Perform(ctx, msg, c.Key()); err != nil {
		return nil, err
	}
	return st.Resolve(ctx, &claim.ResolveParams{ID: c.ID, Resolution: claim.ResolutionRedriven, By: p.By, Note: "no hold"})
}

// TestChaosDetectsBrokenRecovery proves the checks bite on each way the
// take-over protocol can break: a processor that leaves its work to the
// reconciler (whose recovery would hide it), a take-over that ignores the
// holder's heartbeat, a redelivery that completes while the holder is
// silent, an operator's redrive that does not hold the claim.
func TestChaosDetectsBrokenRecovery(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		wrap     func(claim.Store) claim.Store
		redrive  func(context.Context, claim.Store, *reconciler.RedriveParams) (*claim.Claim, error)
		recovery sideeffects.Recovery
		faults   []Fault
		want     string // a violation's text
	}{
		{"no-mark-processed/no-faults", func(s claim.Store) claim.Store { return forgetfulStore{s} }, nil, "", nil,
			"recovered by the reconciler and nothing explains"},
		{"no-mark-processed/all-faults", func(s claim.Store) claim.Store { return forgetfulStore{s} }, nil, "", AllFaults,
			"recovered by the reconciler and nothing explains"},
		{"takeover-ignores-heartbeat", func(s claim.Store) claim.Store { return eagerTakeOver{s} }, nil, "", []Fault{FaultLockExpiry},
			"a live holder was taken over"},
		{"completes-while-holder-silent", func(s claim.Store) claim.Store { return neverTakesOver{s} }, nil, "", []Fault{FaultDieAfterClaim},
			"while the claim was still claimed"},
		{"redrive-without-hold", nil, redriveWithoutHold, sideeffects.RecoveryManual, []Fault{FaultDieAfterClaim, FaultResponseLost},
			"without ever having been granted the claim"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rep, err := Run(context.Background(), Config{
				Messages:  100,
				Replicas:  2,
				Faults:    tc.faults,
				Seed:      4,
				Recovery:  tc.recovery,
				Logger:    testLogger(t),
				wrapStore: tc.wrap,
				redrive:   tc.redrive,
			})
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			rep.Write(&b)
			t.Log("\n" + b.String())
			if rep.Pass() || !strings.HasPrefix(rep.Verdict(), "VERDICT: FAIL: ") {
				t.Fatalf("the harness passed a broken recovery: %s", rep.Verdict())
			}
			if !slices.ContainsFunc(rep.Violations, func(v string) bool { return strings.Contains(v, tc.want) }) {
				t.Errorf("no violation says %q: %q", tc.want, rep.Violations)
			}
		})
	}
}

func TestScenarios(t *testing.T) {
	t.Parallel()
	backends := map[string]func(t *testing.T) string{
		"sqlite":   func(*testing.T) string { return "" },
		"postgres": func(t *testing.T) string { return testkit.PostgresURL(t) },
		"sqlserver": func(t *testing.T) string {
			return testkit.RequireOrSkip(t, "sqlserver", sqlServerURLEnv)
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
					t.Fatalf("%s: %v", dbSource(url), err)
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
		{in: "all,downstream-outage", want: append(slices.Clone(AllFaults), FaultDownstreamOutage)},
		{in: "misconfigured", want: []Fault{FaultMisconfigured}},
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

// With a payment API's answers and every fault on, declines and key
// conflicts fail their claims and are dead-lettered once each, never
// flagged; stored failures are flagged and settled under a new key.
func TestChaosMixedAnswers(t *testing.T) {
	t.Parallel()
	for _, db := range []string{"sqlite", "postgres"} {
		t.Run(db, func(t *testing.T) {
			t.Parallel()
			url := ""
			if db == "postgres" {
				url = testkit.PostgresURL(t)
			}
			rep, err := Run(context.Background(), Config{Messages: 300, Faults: AllFaults, Seed: 12, DatabaseURL: url,
				Answers: AnswersMixed, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			rep.Write(&b)
			t.Log("\n" + b.String())
			if !rep.Pass() {
				t.Fatalf("violations:\n%s", strings.Join(rep.Violations, "\n"))
			}
			if rep.Rejected < 3 || rep.AnswerConflicts < 3 || rep.CachedFailures < 3 {
				t.Errorf("rejected %d, conflicts %d, cached failures %d: want at least 3 each", rep.Rejected, rep.AnswerConflicts, rep.CachedFailures)
			}
			if rep.ClaimStates[claim.StateFailed] != rep.Rejected+rep.AnswerConflicts || rep.FlaggedForOperators != rep.CachedFailures {
				t.Errorf("failed claims %d (want %d), flagged %d (want %d, the cached failures)",
					rep.ClaimStates[claim.StateFailed], rep.Rejected+rep.AnswerConflicts, rep.FlaggedForOperators, rep.CachedFailures)
			}
			if v := rep.Verdict(); !strings.Contains(v, fmt.Sprintf("rejected %d (dead-lettered once each, claims failed), conflicts %d", rep.Rejected, rep.AnswerConflicts)) ||
				!strings.Contains(v, fmt.Sprintf("cached failures %d (flagged", rep.CachedFailures)) {
				t.Errorf("verdict %q does not report the answers", v)
			}
		})
	}
}

// forgetfulFail reports a final answer's claim as failed and writes
// nothing: the claim stays claimed, its holder silent, and the next
// delivery takes it over and dead-letters the key again.
type forgetfulFail struct{ claim.Store }

func (forgetfulFail) Fail(context.Context, *claim.FailParams) error { return nil }

// The answers' checks bite: a processor that dead-letters a final answer
// without failing its claim is caught.
func TestChaosDetectsAFinalAnswerNotRecorded(t *testing.T) {
	t.Parallel()
	rep, err := Run(context.Background(), Config{Messages: 200, Seed: 13, Answers: AnswersMixed, Logger: testLogger(t),
		wrapStore: func(s claim.Store) claim.Store { return forgetfulFail{s} }})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Pass() {
		t.Fatal("the harness passed a processor that never fails a claim")
	}
	// The claim stays claimed; every delivery that takes it over gets the
	// replayed decline and dead-letters its copy again (the reconciler's
	// recovery, whose store is not wrapped, finally fails the claim).
	want := []string{"times as " + claim.FailRejected + " (want once)"}
	for _, w := range want {
		if !slices.ContainsFunc(rep.Violations, func(v string) bool { return strings.Contains(v, w) }) {
			t.Errorf("no violation mentions %q: %q", w, rep.Violations)
		}
	}
}

// The replicas run a Go sbclaim.HandlerFunc instead of the HTTP route,
// every fault on: the same exactly-once checks pass on SQLite and
// PostgreSQL, and with a payment API's answers (mapped by the handler to
// Rejected and KeyConflict). The processor outcomes, gathered from every
// replica's metrics (prommetrics), are counted.
func TestChaosGoHandler(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		db      string
		answers Answers
		seed    uint64
	}{
		{"sqlite", "sqlite", AnswersNormal, 21},
		{"postgres", "postgres", AnswersNormal, 22},
		{"sqlite-mixed", "sqlite", AnswersMixed, 23},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			url := ""
			if tc.db == "postgres" {
				url = testkit.PostgresURL(t)
			}
			rep, err := Run(context.Background(), Config{Messages: 150, Faults: AllFaults, Seed: tc.seed, DatabaseURL: url,
				Handler: HandlerGo, Answers: tc.answers, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			rep.Write(&b)
			t.Log("\n" + b.String())
			if !rep.Pass() {
				t.Fatalf("violations:\n%s", strings.Join(rep.Violations, "\n"))
			}
			if !strings.Contains(rep.Verdict(), "running a Go handler") {
				t.Errorf("verdict %q does not name the Go handler", rep.Verdict())
			}
			for _, f := range AllFaults {
				if rep.Happened[f] == 0 {
					t.Errorf("fault %s never happened (planned %d)", f, rep.Planned[f])
				}
			}
			if rep.Kills == 0 || rep.ReplicasStarted != rep.Replicas+rep.Kills {
				t.Errorf("replicas: %d killed, %d started (want every killed replica replaced)", rep.Kills, rep.ReplicasStarted)
			}
			if n := rep.Outcomes[processor.ResultProcessed]; n == 0 || n > rep.Distinct || rep.Outcomes[processor.ResultDuplicate] == 0 {
				t.Errorf("processor outcomes %v: want some processed (at most %d) and some duplicates", rep.Outcomes, rep.Distinct)
			}
			if tc.answers == AnswersMixed && (rep.Rejected < 3 || rep.AnswerConflicts < 3 || rep.CachedFailures < 3) {
				t.Errorf("rejected %d, conflicts %d, cached failures %d: want at least 3 each", rep.Rejected, rep.AnswerConflicts, rep.CachedFailures)
			}
		})
	}
}

func TestConfigValidateHandler(t *testing.T) {
	err := Config{Handler: "python"}.withDefaults().Validate()
	if err == nil || !strings.Contains(err.Error(), `Handler must be http or go (got "python")`) {
		t.Errorf("Validate: %v, want the Handler named", err)
	}
}

// outageFaults are the downstream outage with the faults that kill no
// replica.
var outageFaults = []Fault{FaultResponseLost, FaultLockExpiry, FaultStoreOutage, FaultLostThen503, FaultAckLost, FaultDownstreamOutage}

func runOutage(t *testing.T, dbURL string, seed uint64, noDeferral bool) *Report {
	t.Helper()
	cfg := Config{
		Messages:    300,
		Faults:      outageFaults,
		Seed:        seed,
		DatabaseURL: dbURL,
		NoDeferral:  noDeferral,
		Logger:      testLogger(t),
	}
	if noDeferral {
		// The negative run must outlast the deliveries by a wide margin
		// however slow the machine (-race on a loaded CI runner stretches
		// each delivery): fewer deliveries, a longer window.
		cfg.MaxDeliveryCount, cfg.DownstreamWindow = 3, 8*time.Second
	}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("%s: %v", dbSource(dbURL), err)
	}
	var b strings.Builder
	rep.Write(&b)
	t.Log("\n" + b.String())
	return rep
}

// A downstream that refuses every request for longer than a message's
// deliveries last: delayed retries (deferral) carry every message over
// the window, none is dead-lettered by the broker, and each refused one is
// performed once, after the window.
func checkOutagePass(t *testing.T, dbURL string, seed uint64) {
	t.Helper()
	rep := runOutage(t, dbURL, seed, false)
	if !rep.Pass() {
		t.Fatalf("downstream outage: exactly-once violated:\n%s", strings.Join(rep.Violations, "\n"))
	}
	if len(rep.Windows) != 1 {
		t.Fatalf("windows: %+v, want the outage's", rep.Windows)
	}
	w := rep.Windows[0]
	if rep.BrokerDeadLettered != 0 || rep.FlaggedForOperators != 0 || rep.Postponed == 0 || w.Keys == 0 || w.PerformedAfter == 0 || w.Refused == 0 {
		t.Errorf("dead-lettered by the broker %d, flagged %d, postponed %d, window %+v; want 0, 0, some, some refused and performed after",
			rep.BrokerDeadLettered, rep.FlaggedForOperators, rep.Postponed, w)
	}
	if v := rep.Verdict(); !strings.Contains(v, "dead-lettered by the broker 0, postponed ") {
		t.Errorf("verdict %q does not name the broker's dead letters and the postponed", v)
	}
}

func TestChaosDownstreamOutageSQLite(t *testing.T) {
	t.Parallel()
	checkOutagePass(t, "", 21)
}

func TestChaosDownstreamOutagePostgres(t *testing.T) {
	t.Parallel()
	checkOutagePass(t, testkit.PostgresURL(t), 22)
}

// The old behaviour (no deferral: a refused message is abandoned and
// redelivered at once) spends the deliveries within the window: the
// broker dead-letters messages and the run fails.
func TestChaosDownstreamOutageFailsWithoutDeferral(t *testing.T) {
	t.Parallel()
	rep := runOutage(t, "", 23, true)
	if rep.Pass() {
		t.Fatal("without deferral the downstream outage passed; want the broker's dead letters to fail it")
	}
	if rep.BrokerDeadLettered == 0 || rep.Postponed != 0 {
		t.Errorf("dead-lettered by the broker %d, postponed %d; want some, 0", rep.BrokerDeadLettered, rep.Postponed)
	}
	if v := rep.Verdict(); !strings.HasPrefix(v, "VERDICT: FAIL (dead-lettered by the broker ") || !strings.Contains(v, "MaxDeliveryCountExceeded") {
		t.Errorf("verdict %q: want FAIL naming the broker's dead letters", v)
	}
}

// A misconfiguration (401 for a window, then fixed) opens the route's
// breaker: its messages are postponed, no claim fails, nothing is
// dead-lettered, and every refused message is performed after the fix.
func TestChaosMisconfiguredSQLite(t *testing.T) {
	t.Parallel()
	rep, err := Run(context.Background(), Config{Messages: 300, Faults: []Fault{FaultMisconfigured}, Seed: 24, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	rep.Write(&b)
	t.Log("\n" + b.String())
	if !rep.Pass() {
		t.Fatalf("misconfigured: exactly-once violated:\n%s", strings.Join(rep.Violations, "\n"))
	}
	// A refused request may repeat a key performed before the window (a
	// holder that took over a claim whose outcome was not yet recorded:
	// on a loaded machine a heartbeat can be late); every other refused
	// message is performed after it (and the run checks none during it).
	if w := rep.Windows; len(w) != 1 || w[0].Keys == 0 || w[0].PerformedAfter == 0 || w[0].PerformedAfter+w[0].PerformedBefore != w[0].Keys {
		t.Errorf("windows %+v: want the misconfiguration's, every refused message performed after it (or before it began)", rep.Windows)
	}
	if rep.ClaimStates[claim.StateFailed] != 0 || rep.BrokerDeadLettered != 0 || rep.Postponed == 0 {
		t.Errorf("failed claims %d, dead-lettered by the broker %d, postponed %d; want 0, 0, some",
			rep.ClaimStates[claim.StateFailed], rep.BrokerDeadLettered, rep.Postponed)
	}
}
