package emulator

import (
	"slices"
	"strings"
	"testing"
)

// TestComposeTracing: Jaeger all-in-one takes OTLP on the compose network
// and shows its UI on the loopback only, and every sbclaim service sends
// its traces there through the standard OpenTelemetry variables.
func TestComposeTracing(t *testing.T) {
	t.Parallel()
	compose := loadCompose(t)
	j, ok := compose.Services["jaeger"]
	if !ok {
		t.Fatal("no jaeger service")
	}
	if !strings.HasPrefix(j.Image, "jaegertracing/") || !pinnedTag.MatchString(j.Image) {
		t.Errorf("jaeger image %q: pin a release (X.Y.Z)", j.Image)
	}
	if !slices.Contains(j.Ports, "127.0.0.1:16686:16686") {
		t.Errorf("jaeger ports %v: publish the UI on 127.0.0.1:16686", j.Ports)
	}
	n := 0
	for name, svc := range compose.Services {
		if !strings.HasPrefix(name, "processor") && name != "reconciler" {
			continue
		}
		n++
		if got := svc.Environment["OTEL_EXPORTER_OTLP_ENDPOINT"]; got != "http://jaeger:4318" {
			t.Errorf("%s: OTEL_EXPORTER_OTLP_ENDPOINT = %q, want http://jaeger:4318", name, got)
		}
		if got := svc.Environment["OTEL_EXPORTER_OTLP_PROTOCOL"]; got != "http/protobuf" {
			t.Errorf("%s: OTEL_EXPORTER_OTLP_PROTOCOL = %q, want http/protobuf (Jaeger's 4318)", name, got)
		}
		if got := svc.Environment["OTEL_METRICS_EXPORTER"]; got != "none" {
			t.Errorf("%s: OTEL_METRICS_EXPORTER = %q, want none (Jaeger takes no metrics)", name, got)
		}
	}
	if n < 2 {
		t.Fatalf("found %d processor/reconciler services", n)
	}
}
