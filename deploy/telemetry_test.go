package deploy

import (
	"regexp"
	"strings"
	"testing"
)

// TestOpenTelemetryAgent: the openTelemetry parameter (off by default)
// creates a workspace-based Application Insights and turns on the
// environment's managed OpenTelemetry agent with it as the destination of
// traces and logs; both binaries get the sampler variables and no metrics
// exporter (Application Insights takes none from the agent); nothing of
// it exists with the parameter off.
func TestOpenTelemetryAgent(t *testing.T) {
	t.Parallel()
	src := read(t, "main.bicep")
	ps := params(t)
	p, ok := ps["openTelemetry"]
	if !ok || p.typ != "bool" || !p.hasDef {
		t.Fatalf("main.bicep declares no optional bool parameter openTelemetry (got %+v)", p)
	}
	if !regexp.MustCompile(`param openTelemetry bool = false`).MatchString(src) {
		t.Error("openTelemetry must default to false")
	}
	if !regexp.MustCompile(`resource appInsights 'Microsoft\.Insights/components@[0-9-]+' = if \(openTelemetry\)`).MatchString(src) {
		t.Error("no Application Insights component conditioned on openTelemetry")
	}
	if !strings.Contains(src, "WorkspaceResourceId: logs.id") {
		t.Error("Application Insights is not workspace-based on the Log Analytics workspace")
	}

	env := src[strings.Index(src, "resource containerAppsEnv "):]
	env = env[:strings.Index(env, "\n}\n")]
	for _, want := range []string{
		"appInsightsConfiguration: openTelemetry ? {",
		"connectionString: appInsights!.properties.ConnectionString",
		"openTelemetryConfiguration: openTelemetry ? {",
	} {
		if !strings.Contains(env, want) {
			t.Errorf("the managed environment lacks %q", want)
		}
	}
	for _, signal := range []string{"tracesConfiguration", "logsConfiguration"} {
		i := strings.Index(env, signal+": {")
		if i < 0 || !strings.Contains(env[i:min(len(env), i+120)], "destinations: [ 'appInsights' ]") {
			t.Errorf("the agent does not send %s to appInsights", signal)
		}
	}
	if strings.Contains(env, "metricsConfiguration") {
		t.Error("Application Insights takes no metrics from the agent: no metricsConfiguration")
	}

	if !strings.Contains(src, "var otelEnv = openTelemetry ? [") {
		t.Fatal("no otelEnv variable conditioned on openTelemetry")
	}
	otel := src[strings.Index(src, "var otelEnv"):]
	otel = otel[:strings.Index(otel, "] : []")]
	for _, want := range []string{"'OTEL_TRACES_SAMPLER', value: tracesSampler", "'OTEL_TRACES_SAMPLER_ARG', value: tracesSamplerArg", "'OTEL_METRICS_EXPORTER', value: 'none'"} {
		if !strings.Contains(otel, want) {
			t.Errorf("otelEnv lacks %s", want)
		}
	}
	if strings.Contains(otel, "OTEL_EXPORTER_OTLP_ENDPOINT") {
		t.Error("otelEnv sets the OTLP endpoint: the managed agent sets it")
	}
	proc, rec := sections(t)
	for name, section := range map[string]string{"processor": proc, "reconciler": rec} {
		if !regexp.MustCompile(`\], [A-Za-z, ]*otelEnv\)`).MatchString(section) {
			t.Errorf("the %s's env does not include otelEnv", name)
		}
	}
}
