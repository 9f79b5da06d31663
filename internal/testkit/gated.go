package testkit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// ServiceBusEnv holds the connection string of a Service Bus namespace or
// of the emulator, for the gated Service Bus suites.
const ServiceBusEnv = "SBCLAIM_TEST_SERVICEBUS_CONNECTION_STRING"

// SQLServerEnv holds the SQL Server URL of the gated SQL Server suites.
const SQLServerEnv = "SBCLAIM_TEST_SQLSERVER_URL"

// Addresses where nothing answers (port 1 of the loopback: a connection
// is refused at once), for RunGated.
const (
	UnreachableServiceBus = "Endpoint=sb://127.0.0.1:1;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=not-a-key;UseDevelopmentEmulator=true;"
	UnreachableSQLServer  = "sqlserver://sa:not-a-password@127.0.0.1:1"
)

// ServiceBusCheckTimeout bounds CheckServiceBus.
const ServiceBusCheckTimeout = 30 * time.Second

// CheckServiceBus is the first step of a gated Service Bus suite: it peeks
// queue once, with a client that retries a refused connection twice rather
// than for the SDK's default of about 45 s, within ServiceBusCheckTimeout.
// Its error names ServiceBusEnv, the endpoint and the cause, so that a
// namespace that is not there fails the suite at once, saying why, instead
// of in the middle of a case after the SDK's retries.
func CheckServiceBus(ctx context.Context, cs, queue string) error {
	client, err := azservicebus.NewClientFromConnectionString(cs, &azservicebus.ClientOptions{
		RetryOptions: azservicebus.RetryOptions{MaxRetries: 2, RetryDelay: 500 * time.Millisecond, MaxRetryDelay: 2 * time.Second},
	})
	if err != nil {
		// The SDK's message may quote the string, key included.
		return fmt.Errorf("%s: the Service Bus client rejects it as a connection string", ServiceBusEnv)
	}
	defer client.Close(context.WithoutCancel(ctx))
	ctx, cancel := context.WithTimeout(ctx, ServiceBusCheckTimeout)
	defer cancel()
	r, err := client.NewReceiverForQueue(queue, nil)
	if err != nil {
		return fmt.Errorf("%s: receiver for queue %q: %w", ServiceBusEnv, queue, err)
	}
	defer r.Close(context.WithoutCancel(ctx))
	if _, err := r.PeekMessages(ctx, 1, nil); err != nil {
		return fmt.Errorf("%s: Service Bus at %s does not answer (a peek of queue %q, within %s): %w",
			ServiceBusEnv, endpoint(cs), queue, ServiceBusCheckTimeout, err)
	}
	return nil
}

// endpoint is the Endpoint of a connection string (no secret in it).
func endpoint(cs string) string {
	for _, part := range strings.Split(cs, ";") {
		if k, v, ok := strings.Cut(part, "="); ok && strings.EqualFold(strings.TrimSpace(k), "Endpoint") {
			return v
		}
	}
	return "(no Endpoint in the connection string)"
}

// RunGatedTimeout is how long a gated suite may take to fail without its
// service in RunGated.
const RunGatedTimeout = time.Minute

// RunGated proves that gated suites still build, find their fixtures and
// fail fast without their service: it runs the tests of the current test
// binary that match pattern (a -test.run pattern) in a child process, with
// env added (each suite's variable pointed at an address where nothing
// answers, such as UnreachableSQLServer) and RequireEnv naming sqlserver
// and servicebus, so a skip fails too. It fails t when the child passes,
// runs nothing, runs longer than RunGatedTimeout, or fails on a missing
// file; it returns the child's output, in which the caller checks that
// each failure names its variable and its cause.
func RunGated(t *testing.T, pattern string, env map[string]string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), RunGatedTimeout)
	defer cancel()
	// The child skips the calling test, so a pattern may match it.
	top, _, _ := strings.Cut(t.Name(), "/")
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run="+pattern, "-test.skip=^"+regexp.QuoteMeta(top)+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), RequireEnv+"=sqlserver,servicebus")
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	start := time.Now()
	b, err := cmd.CombinedOutput()
	out := string(b)
	switch {
	case ctx.Err() != nil:
		t.Fatalf("-test.run=%s without its service still ran after %s (it hangs instead of failing); output:\n%s", pattern, RunGatedTimeout, out)
	case strings.Contains(out, "no tests to run"):
		t.Fatalf("-test.run=%s matches no test; output:\n%s", pattern, out)
	case err == nil:
		t.Fatalf("-test.run=%s passed without its service; output:\n%s", pattern, out)
	case !errors.As(err, new(*exec.ExitError)):
		t.Fatalf("-test.run=%s: %v", pattern, err)
	case strings.Contains(out, "no such file or directory"):
		t.Fatalf("-test.run=%s fails on a missing file; output:\n%s", pattern, out)
	}
	t.Logf("-test.run=%s failed after %s, as it should without its service", pattern, time.Since(start).Round(time.Millisecond))
	return out
}
