package processor_test

import (
	"fmt"
	"html"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// writeWaterfall renders the spans of root's trace (and the spans linked
// from it, such as the group-commit batch) as an HTML waterfall, for the
// README's screenshot: SBCLAIM_TRACE_HTML=/tmp/trace.html go test -run
// TestTraceOfOneMessage ./internal/processor/, then headless Chromium.
func writeWaterfall(t *testing.T, path string, all spans, root sdktrace.ReadOnlySpan) {
	t.Helper()
	tid := root.SpanContext().TraceID()
	var rows spans
	linked := map[string]bool{}
	for _, s := range all {
		if s.SpanContext().TraceID() == tid {
			rows = append(rows, s)
			for _, l := range s.Links() {
				linked[l.SpanContext.SpanID().String()] = true
			}
		}
	}
	for _, s := range all {
		if s.SpanContext().TraceID() != tid && linked[s.SpanContext().SpanID().String()] {
			rows = append(rows, s)
		}
	}
	depth := func(s sdktrace.ReadOnlySpan) int {
		d := 0
		for p := s.Parent(); p.IsValid(); {
			var next sdktrace.ReadOnlySpan
			for _, c := range rows {
				if c.SpanContext().SpanID() == p.SpanID() {
					next = c
				}
			}
			if next == nil {
				break
			}
			d++
			p = next.Parent()
		}
		return d
	}
	// Depth-first order: children after their parent, by start time.
	slices.SortFunc(rows, func(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) })
	var ordered spans
	var visit func(parent string)
	seen := map[string]bool{}
	visit = func(parent string) {
		for _, s := range rows {
			id := s.SpanContext().SpanID().String()
			p := ""
			if s.Parent().IsValid() && s.Parent().TraceID() == s.SpanContext().TraceID() {
				p = s.Parent().SpanID().String()
			}
			if p == parent && !seen[id] {
				seen[id] = true
				ordered = append(ordered, s)
				visit(id)
			}
		}
	}
	visit("")
	start, end := ordered[0].StartTime(), ordered[0].EndTime()
	for _, s := range ordered {
		if s.StartTime().Before(start) {
			start = s.StartTime()
		}
		if s.EndTime().After(end) {
			end = s.EndTime()
		}
	}
	total := end.Sub(start)
	keep := []attribute.Key{"messaging.system", "messaging.destination.name", "messaging.operation.type", "messaging.message.id",
		"messaging.servicebus.message.delivery_count", "messaging.servicebus.disposition_status", "sbclaim.claim.id", "sbclaim.claim.outcome",
		"sbclaim.route", "sbclaim.outcome", "sbclaim.effect.attempt", "sbclaim.effect.outcome", "sbclaim.outcome_write", "sbclaim.count",
		"http.request.method", "http.response.status_code", "server.address"}
	var b strings.Builder
	fmt.Fprintf(&b, `<!doctype html><meta charset="utf-8"><title>sbclaim trace</title><style>
body{font:13px system-ui,sans-serif;margin:16px;color:#222}h1{font-size:15px;margin:0 0 4px}p{margin:0 0 10px;color:#555}
.row{display:flex;align-items:center;height:30px;border-bottom:1px solid #eee}.name{width:330px;flex:none;white-space:nowrap;overflow:hidden}
.kind{color:#888;font-size:11px;margin-left:4px}.track{position:relative;flex:1;height:100%%}
.bar{position:absolute;top:6px;height:12px;border-radius:2px}.attrs{position:absolute;top:18px;right:0;font-size:10px;color:#666;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.dur{width:70px;flex:none;text-align:right;color:#555}</style>
<h1>One message's trace — trace %s</h1><p>process span linked to the producer (%d link(s)); the group-commit batch is its own trace, linked both ways (shown last). %s total.</p>`,
		tid, len(root.Links()), total.Round(time.Microsecond))
	colors := map[string]string{"process": "#4e79a7", "claim": "#f28e2b", "effect": "#59a14f", "POST": "#76b7b2", "downstream": "#b07aa1", "outcome": "#edc948", "write": "#e15759", "complete": "#9c755f"}
	for _, s := range ordered {
		left := float64(s.StartTime().Sub(start)) / float64(total) * 100
		width := max(float64(s.EndTime().Sub(s.StartTime()))/float64(total)*100, 0.3)
		first, _, _ := strings.Cut(s.Name(), " ")
		color := colors[first]
		if color == "" {
			color = "#bab0ac"
		}
		var attrs []string
		for _, k := range keep {
			for _, kv := range s.Attributes() {
				if kv.Key == k {
					attrs = append(attrs, fmt.Sprintf("%s=%s", strings.TrimPrefix(strings.TrimPrefix(string(k), "messaging."), "sbclaim."), kv.Value.String()))
				}
			}
		}
		if len(s.Links()) > 0 {
			attrs = append(attrs, fmt.Sprintf("links=%d", len(s.Links())))
		}
		indent := depth(s) * 16
		if s.SpanContext().TraceID() != tid {
			indent = 0
		}
		fmt.Fprintf(&b, `<div class="row"><div class="name" style="padding-left:%dpx">%s<span class="kind">%s</span></div><div class="track"><div class="bar" style="left:%.2f%%;width:%.2f%%;background:%s"></div><div class="attrs" style="left:%.2f%%">%s</div></div><div class="dur">%s</div></div>`+"\n",
			indent, html.EscapeString(s.Name()), strings.ToLower(s.SpanKind().String()), min(left, 99.7), width, color, min(left, 60), html.EscapeString(strings.Join(attrs, " · ")),
			s.EndTime().Sub(s.StartTime()).Round(10*time.Microsecond))
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s (%d spans)", path, len(ordered))
}
