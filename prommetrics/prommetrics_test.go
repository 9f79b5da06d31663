package prommetrics_test

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/prommetrics"
	"github.com/sbclaim/sbclaim/sbclaimtest"
)

// TestAProcessedMessageIsExported: a message worked by a processor with
// prommetrics.New(reg) shows on reg, under the documented names.
func TestAProcessedMessageIsExported(t *testing.T) {
	reg := prometheus.NewRegistry()
	router, err := sbclaim.NewRouter(sbclaim.Route{Name: "ship", Handler: func(context.Context, *sbclaim.Delivery) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	res := sbclaimtest.Work(t, sbclaim.ProcessorConfig{Router: router, Metrics: prommetrics.New(reg)}, sbclaimtest.Message(t, "order-1", "", map[string]int{"id": 1}))
	if res.Settlement != sbclaimtest.Completed {
		t.Fatalf("settlement = %s, want completed", res.Settlement)
	}
	const want = `
# HELP sbclaim_messages_total Messages finished, by outcome (processed, duplicate, conflict, released, dead_lettered, failed, unknown, abandoned, lost, flagged).
# TYPE sbclaim_messages_total counter
sbclaim_messages_total{outcome="processed"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sbclaim_messages_total"); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(reg, "sbclaim_effect_duration_seconds"); err != nil || n != 1 {
		t.Errorf("sbclaim_effect_duration_seconds series = %d, %v; want 1 (route ship, outcome ok)", n, err)
	}
}

// TestANilRegistererRecordsUnexported: New(nil) gives working metrics
// registered nowhere (promauto.With(nil)'s convention), and a processor
// with no Metrics at all records nothing and runs.
func TestANilRegistererRecordsUnexported(t *testing.T) {
	router, err := sbclaim.NewRouter(sbclaim.Route{Name: "ship", Handler: func(context.Context, *sbclaim.Delivery) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []*sbclaim.Metrics{prommetrics.New(nil), nil} {
		res := sbclaimtest.Work(t, sbclaim.ProcessorConfig{Router: router, Metrics: m}, sbclaimtest.Message(t, "order-1", "", map[string]int{"id": 1}))
		if res.Settlement != sbclaimtest.Completed {
			t.Errorf("settlement = %s, want completed", res.Settlement)
		}
	}
}

// TestARegistryConflictPanics: a name already registered with other help
// is a programming error, reported as prometheus.MustRegister does.
func TestARegistryConflictPanics(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "sbclaim_lock_renewals_total", Help: "something else"}))
	defer func() {
		if recover() == nil {
			t.Error("New on a registry with a conflicting sbclaim_lock_renewals_total did not panic")
		}
	}()
	prommetrics.New(reg)
}
