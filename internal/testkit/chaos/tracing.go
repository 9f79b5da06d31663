package chaos

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// tracingKit records the spans of a run or a benchmark cell with tracing
// on: the OpenTelemetry SDK with an always-on sampler and a batching span
// processor, exporting to memory (what a deployment pays, minus the
// network). A nil kit is tracing off.
type tracingKit struct {
	exp *tracetest.InMemoryExporter
	tp  *sdktrace.TracerProvider
}

func newTracingKit(on bool) *tracingKit {
	if !on {
		return nil
	}
	exp := tracetest.NewInMemoryExporter()
	return &tracingKit{exp: exp, tp: sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(exp))}
}

// provider is the kit's provider; nil (the global no-op one) when off.
func (k *tracingKit) provider() trace.TracerProvider {
	if k == nil {
		return nil
	}
	return k.tp
}

// finish flushes and stops the provider and returns the spans recorded.
func (k *tracingKit) finish(ctx context.Context) tracetest.SpanStubs {
	if k == nil {
		return nil
	}
	_ = k.tp.ForceFlush(ctx)
	spans := k.exp.GetSpans() // before Shutdown, which empties the exporter
	_ = k.tp.Shutdown(ctx)
	return spans
}

// TracingSummary is what a run with tracing on recorded.
type TracingSummary struct {
	Spans        int            // spans exported
	ByName       map[string]int // spans per name
	Leaks        []string       // attributes that carry the effect URL's path
	ProcessLinks int            // process spans linked to an earlier delivery's trace
}

// report checks the run's spans: no attribute may carry the effect URL's
// path (the harness's downstream serves /effects), and every settled
// delivery's process span must be there.
func (k *tracingKit) report(ctx context.Context, rep *Report) {
	if k == nil {
		return
	}
	spans := k.finish(ctx)
	s := &TracingSummary{Spans: len(spans), ByName: map[string]int{}}
	for _, sp := range spans {
		s.ByName[sp.Name]++
		for _, kv := range sp.Attributes {
			if strings.Contains(kv.Value.String(), "/effects") {
				s.Leaks = append(s.Leaks, fmt.Sprintf("span %q %s=%q", sp.Name, kv.Key, kv.Value.String()))
			}
		}
		if strings.HasPrefix(sp.Name, "process ") {
			for _, l := range sp.Links {
				for _, a := range l.Attributes {
					if a.Key == "sbclaim.link" && a.Value.AsString() == "previous_attempt" {
						s.ProcessLinks++
					}
				}
			}
		}
	}
	rep.Tracing = s
	if len(s.Leaks) > 0 {
		rep.violate("tracing: %d span attributes carry the effect URL's path, e.g. %s", len(s.Leaks), s.Leaks[0])
	}
	if s.ByName["process "+QueueName] == 0 {
		rep.violate("tracing: no process span recorded")
	}
}

// write prints the summary line of a run with tracing on.
func (s *TracingSummary) write(w io.Writer) {
	if s == nil {
		return
	}
	fmt.Fprintf(w, "tracing (always-on, in memory): %d spans: %d process, %d claim, %d take-over, %d effect attempt, %d HTTP, %d outcome-write batches, %d settle; %d redeliveries linked to the delivery that abandoned; %d URL paths in attributes\n",
		s.Spans, s.ByName["process "+QueueName], s.ByName["claim"], s.ByName["takeover"], s.ByName["effect attempt"], s.ByName["POST"],
		s.ByName["write outcomes"], s.ByName["complete "+QueueName]+s.ByName["abandon "+QueueName]+s.ByName["dead_letter "+QueueName],
		s.ProcessLinks, len(s.Leaks))
}

// TracingCost is the processor's throughput with tracing off and on in
// one benchmark cell: the best of TracingRounds alternating runs of each
// (a shared machine's other work only ever lowers a run).
type TracingCost struct {
	Off, On *BenchResult
}

// TracingRounds is how many runs of each side TracingCost takes.
const TracingRounds = 5

// CPURatio is on/off CPU time per message.
func (c *TracingCost) CPURatio() float64 {
	if c == nil || c.Off.CPUPerMessage() == 0 {
		return 0
	}
	return float64(c.On.CPUPerMessage()) / float64(c.Off.CPUPerMessage())
}

// Ratio is on/off throughput.
func (c *TracingCost) Ratio() float64 {
	if c == nil || c.Off.PerSecond() == 0 {
		return 0
	}
	return c.On.PerSecond() / c.Off.PerSecond()
}

// benchTracing measures the two-phase variant with tracing off and on.
func benchTracing(ctx context.Context, p BenchParams) (*TracingCost, error) {
	c := &TracingCost{}
	for range TracingRounds {
		for _, on := range []bool{false, true} {
			q := p
			q.Variant, q.Tracing = VariantTwoPhase, on
			r, err := RunBench(ctx, q)
			if err != nil {
				return nil, fmt.Errorf("tracing %t: %w", on, err)
			}
			best := &c.Off
			if on {
				best = &c.On
			}
			if *best == nil || r.PerSecond() > (*best).PerSecond() {
				*best = r
			}
		}
	}
	return c, nil
}

// writeTracingCost writes the tracing section of the benchmark report.
func writeTracingCost(w io.Writer, rows []tracingRow) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "\n### Tracing cost: the processor (a) with tracing off and on\n\nOn: the OpenTelemetry SDK with an always-on sampler and a batching span processor exporting to memory (every span of every message kept: a process span, its claim, effect attempt, HTTP client, outcome write and settle spans, and the group-commit batch spans). Off: no SDK (the global no-op provider), as sbclaim runs when no OTLP endpoint is set. Best of %d alternating runs of each.\n\n", TracingRounds)
	fmt.Fprintf(w, "| db | latency | conc | off msg/s | on msg/s | on/off | CPU/msg off | CPU/msg on | CPU on/off | spans/msg | alloc/msg off · on |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %s | %d | %.0f | %.0f | %.2f | %s | %s | %.2f | %.1f | %s · %s |\n", r.dialect, r.latency, r.conc,
			r.cost.Off.PerSecond(), r.cost.On.PerSecond(), r.cost.Ratio(),
			r.cost.Off.CPUPerMessage().Round(time.Microsecond), r.cost.On.CPUPerMessage().Round(time.Microsecond), r.cost.CPURatio(),
			float64(r.cost.On.Spans)/float64(max(r.cost.On.Done, 1)), bytesText(r.cost.Off.AllocPerMessage()), bytesText(r.cost.On.AllocPerMessage()))
	}
}

type tracingRow struct {
	dialect string
	latency time.Duration
	conc    int
	cost    *TracingCost
}
