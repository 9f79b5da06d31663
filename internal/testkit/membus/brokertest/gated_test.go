package brokertest_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/testkit"
	"github.com/sbclaim/sbclaim/internal/testkit/membus"
)

// The gated TestServiceBusContract runs only with a Service Bus; these
// keep it from rotting meanwhile, on every test run.

// TestServiceBusContractFindsItsFixtures: every file the gated run opens
// exists, and the emulator's Config.json has the entities it uses by
// default.
func TestServiceBusContractFindsItsFixtures(t *testing.T) {
	for _, f := range fixtures {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("the gated contract suite opens %s: %v", f, err)
		}
	}
	q, sub := emulatorDeliveries(t, envOr(queueEnv, "brokertest"), envOr(topicEnv, "brokertest-topic"))
	if q < 1 || sub < 1 {
		t.Errorf("max delivery counts %d and %d", q, sub)
	}
}

// TestServiceBusContractFailsFastWithoutServiceBus runs the gated suite
// against a connection string where nothing answers: it must fail within
// a minute (testkit.RunGated), naming the variable and the cause, not
// hang and not fail on a path.
func TestServiceBusContractFailsFastWithoutServiceBus(t *testing.T) {
	out := testkit.RunGated(t, "^TestServiceBusContract$", map[string]string{testkit.ServiceBusEnv: testkit.UnreachableServiceBus})
	for _, want := range []string{"--- FAIL: TestServiceBusContract", testkit.ServiceBusEnv, "sb://127.0.0.1:1", "connection refused"} {
		if !strings.Contains(out, want) {
			t.Errorf("the failure does not say %q:\n%s", want, out)
		}
	}
}

// noLockedUntil is a broker that forgets LockedUntil on its deliveries.
type noLockedUntil struct{ *membus.Receiver }

func (r noLockedUntil) ReceiveMessages(ctx context.Context, n int, o *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	msgs, err := r.Receiver.ReceiveMessages(ctx, n, o)
	for _, m := range msgs {
		m.LockedUntil = nil
	}
	return msgs, err
}

// TestLockDurationProbeIsBounded: the lock-duration probe measures a
// broker that sets LockedUntil, fails at once naming LockedUntil on one
// that does not (it looped until the suite's 20-minute deadline), and
// gives up after its timeout when the probe never comes back.
func TestLockDurationProbeIsBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	send := func(q *membus.Queue, id string) {
		t.Helper()
		if err := q.SendMessage(ctx, &azservicebus.Message{MessageID: &id}, nil); err != nil {
			t.Fatal(err)
		}
	}

	q := membus.NewQueue("probe", membus.QueueOptions{LockDuration: 5 * time.Second})
	send(q, "left-over")
	send(q, "probe-1")
	if d, err := probeLockDuration(ctx, q.NewReceiver(), "probe-1", time.Minute); err != nil || d != 5*time.Second {
		t.Errorf("a broker that sets LockedUntil: %v, %v; want 5s", d, err)
	}

	q = membus.NewQueue("probe", membus.QueueOptions{LockDuration: 5 * time.Second})
	send(q, "probe-2")
	// A generous timeout: the probe must fail on the missing property
	// long before it.
	_, err := probeLockDuration(ctx, noLockedUntil{q.NewReceiver()}, "probe-2", time.Minute)
	if err == nil || !strings.Contains(err.Error(), "without LockedUntil") {
		t.Errorf("a broker without LockedUntil: %v; want an error naming LockedUntil", err)
	}

	q = membus.NewQueue("probe", membus.QueueOptions{})
	_, err = probeLockDuration(ctx, q.NewReceiver(), "probe-3", 50*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "did not come back within 50ms") {
		t.Errorf("a probe that never comes back: %v", err)
	}
}
