package sim

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

var (
	seeds     = flag.Int("sim.seeds", 5000, "how many seeds TestSimulation runs")
	firstSeed = flag.Uint64("sim.first", 1, "the first seed of the run")
	oneSeed   = flag.Uint64("sim.seed", 0, "replay this one seed verbosely (0: run -sim.seeds seeds)")
)

// TestSimulation runs the real processor, reconciler and SQLite store
// against a simulated broker, downstream, clock and fault schedule, one
// synctest bubble per seed, and checks the exactly-once invariants.
func TestSimulation(t *testing.T) {
	if *oneSeed != 0 {
		r := runSeed(t, *oneSeed, true)
		for _, line := range r.trace {
			t.Log(line)
		}
		report(t, r)
		return
	}
	n := *seeds
	if testing.Short() {
		n = min(n, 200)
	}
	start := time.Now()
	var simulated time.Duration
	failures, ran := 0, 0
	for s := *firstSeed; s < *firstSeed+uint64(n); s++ {
		r := runSeed(t, s, false)
		ran++
		simulated += r.simulated
		if len(r.violations) > 0 {
			failures++
			report(t, r)
			if failures >= 3 {
				break
			}
		}
	}
	t.Logf("%d seeds, %.1f simulated hours, in %s", ran, simulated.Hours(), time.Since(start).Round(time.Millisecond))
}

func runSeed(t *testing.T, seed uint64, verbose bool) *result {
	var r *result
	synctest.Test(t, func(*testing.T) {
		if verbose && os.Getenv("SIM_LOG") != "" {
			r = run(seed, os.Stderr)
		} else {
			r = run(seed, nil)
		}
	})
	return r
}

func report(t *testing.T, r *result) {
	t.Helper()
	if len(r.violations) == 0 {
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: %d violations\n", r.seed, len(r.violations))
	for _, v := range r.violations {
		fmt.Fprintf(&b, "  - %s\n", v)
	}
	b.WriteString("  trace:\n")
	for _, line := range traceOf(r) {
		fmt.Fprintf(&b, "    %s\n", line)
	}
	fmt.Fprintf(&b, "  replay: go test ./internal/testkit/sim -run TestSimulation -sim.seed=%d -v\n", r.seed)
	t.Error(b.String())
}
