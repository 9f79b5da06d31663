package metricreg_test

import (
	"reflect"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sbclaim/sbclaim/internal/metricreg"
	"github.com/sbclaim/sbclaim/internal/processor"
)

// TestEveryInstrumentIsSet: ProcessorMetrics and NopMetrics set every
// field of processor.Metrics (one left nil would panic on its first use),
// and each of ProcessorMetrics' is a registered Prometheus collector.
func TestEveryInstrumentIsSet(t *testing.T) {
	reg := prometheus.NewRegistry()
	for name, m := range map[string]*processor.Metrics{"ProcessorMetrics": metricreg.ProcessorMetrics(reg), "NopMetrics": processor.NopMetrics()} {
		v := reflect.ValueOf(m).Elem()
		for i := range v.NumField() {
			if v.Field(i).IsNil() {
				t.Errorf("%s: %s is nil", name, v.Type().Field(i).Name)
			}
		}
	}
	m := metricreg.ProcessorMetrics(reg) // a second registration shares the first's collectors
	m.Messages.With("processed").Inc()
	m.EffectSeconds.With("r", "ok").Observe(0.1)
	m.RouteBreakerTrips.With("r", "failures").Inc()
	m.RouteBreakerOpen.With("r").Set(1)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if n := reflect.TypeFor[processor.Metrics]().NumField(); len(mfs) < 4 || n < 20 {
		t.Fatalf("gathered %d families; Metrics has %d fields", len(mfs), n)
	}
	got := map[string]bool{}
	for _, mf := range mfs {
		got[mf.GetName()] = true
	}
	for _, want := range []string{"sbclaim_messages_total", "sbclaim_effect_duration_seconds", "sbclaim_route_breaker_trips_total", "sbclaim_route_breaker_open"} {
		if !got[want] {
			t.Errorf("%s not gathered: %v", want, got)
		}
	}
}
