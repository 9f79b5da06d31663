package processor_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/processor"
	"github.com/sbclaim/sbclaim/internal/testkit/membus"
)

// These tests run in a synctest bubble: time is fake and moves only when
// every goroutine of the test waits, so the processor's probe interval and
// timeout keep their defaults (10 s and 5 s, the numbers the README
// gives) and the bounds are checked exactly, without sleeping for real
// and without timing that depends on the machine's load.

const (
	probeInterval = 10 * time.Second // processor's default BrokerProbeInterval
	probeTimeout  = 5 * time.Second  // and BrokerProbeTimeout
	pollStep      = 10 * time.Millisecond
)

// TestReadyTurnsFalseWithinIntervalPlusTimeout: whenever Service Bus
// stops answering — here just after a receive brought a message, at
// several points of the probe's cycle — Ready turns false at most
// BrokerProbeInterval + BrokerProbeTimeout (15 s) later, as the README
// says. The probe is due one interval after the broker's last answer,
// and a peek to an unreachable broker hangs until its timeout, as the
// SDK's does. (It used to skip a tick when messages had arrived in the
// last interval, which made the bound nearly two intervals plus the
// timeout.)
func TestReadyTurnsFalseWithinIntervalPlusTimeout(t *testing.T) {
	for _, offset := range []time.Duration{time.Millisecond, probeInterval / 2, probeInterval - time.Millisecond} {
		t.Run("last answer "+offset.String()+" into the cycle", func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				q := membus.NewQueue("orders", membus.QueueOptions{LockDuration: time.Minute})
				r := run(t, q, &probeStore{}, nil)
				start := time.Now()
				synctest.Wait()
				if !r.p.Ready() {
					t.Fatalf("not ready at start: %s", r.p.NotReadyReason())
				}
				// Idle for three cycles: the probes answer, ready all along.
				for time.Since(start) < 3*probeInterval+offset {
					time.Sleep(pollStep / 10)
					if !r.p.Ready() {
						t.Fatalf("not ready while Service Bus answers, after %s: %s", time.Since(start), r.p.NotReadyReason())
					}
				}
				// A message arrives (Service Bus answers), and right after
				// it Service Bus becomes unreachable.
				send(t, q, "m1", "noroute")
				synctest.Wait()
				if s := q.Stats(); s.DeadLettered != 1 {
					t.Fatalf("the message was not received and settled: %+v", s)
				}
				outage := time.Now()
				q.SetUnreachable(true)
				for r.p.Ready() {
					time.Sleep(pollStep)
				}
				took := time.Since(outage)
				if bound := probeInterval + probeTimeout; took > bound+pollStep {
					t.Errorf("Ready turned false %s after Service Bus became unreachable; the bound is interval + timeout = %s", took, bound)
				}
				t.Logf("not ready %s after the outage", took)
				r.stop()
			})
		})
	}
}

// TestStartUpSaysServiceBusDoesNotAnswer: a processor that cannot reach
// Service Bus at start warns, naming it, within the probe interval (the
// first probe fails after its timeout), and keeps warning at most once
// per interval until Service Bus answers; then it says it is ready and
// stops warning.
func TestStartUpSaysServiceBusDoesNotAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := membus.NewQueue("orders", membus.QueueOptions{})
		q.SetUnreachable(true)
		r := run(t, q, &probeStore{}, nil)
		start := time.Now()

		time.Sleep(probeInterval)
		warns := r.logs.find(slog.LevelWarn, "Service Bus does not answer")
		if len(warns) == 0 {
			t.Fatalf("no warning naming Service Bus %s after start; logs:\n%s", probeInterval, r.logs)
		}
		if at := warns[0].Time.Sub(start); at > probeTimeout {
			t.Errorf("the first warning came %s after start, want within the probe's timeout %s", at, probeTimeout)
		}
		if r.p.Ready() || !strings.Contains(r.p.NotReadyReason(), "Service Bus") {
			t.Errorf("ready %v, reason %q; want not ready because of Service Bus", r.p.Ready(), r.p.NotReadyReason())
		}

		time.Sleep(10 * probeInterval)
		warns = r.logs.find(slog.LevelWarn, "Service Bus does not answer")
		elapsed := time.Since(start)
		if max := int(elapsed/probeInterval) + 1; len(warns) < 3 || len(warns) > max {
			t.Errorf("%d warnings in %s; want it said again and again, at most once per %s (%d)", len(warns), elapsed, probeInterval, max)
		}
		checkSpacing(t, warns, probeInterval)
		if last := warns[len(warns)-1]; !strings.Contains(attr(last, "for"), "s") || attr(last, "error") == "" {
			t.Errorf("the warning does not say for how long and why: %v", last)
		}
		if got := r.logs.find(slog.LevelInfo, "ready"); len(got) != 0 {
			t.Errorf("said ready while Service Bus never answered: %v", got)
		}

		q.SetUnreachable(false)
		time.Sleep(probeInterval + probeTimeout)
		if !r.p.Ready() || len(r.logs.find(slog.LevelInfo, "Service Bus answers: ready")) != 1 {
			t.Fatalf("not ready (%s) once Service Bus answers; logs:\n%s", r.p.NotReadyReason(), r.logs)
		}
		n := len(r.logs.find(slog.LevelWarn, "Service Bus"))
		time.Sleep(5 * probeInterval)
		if got := len(r.logs.find(slog.LevelWarn, "Service Bus")); got != n {
			t.Errorf("%d more warnings after Service Bus answered", got-n)
		}
		r.stop()
	})
}

// TestStartUpSaysTheStoreDoesNotAnswer: a processor whose claims store
// refuses writes at start warns, naming the store, before it receives
// anything; it receives nothing (no delivery count burnt), keeps warning
// at most once per probe interval, and receives once the store answers.
func TestStartUpSaysTheStoreDoesNotAnswer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := membus.NewQueue("orders", membus.QueueOptions{LockDuration: time.Minute})
		send(t, q, "m1", "noroute")
		st := &probeStore{}
		st.down.Store(true)
		r := run(t, q, st, nil)
		start := time.Now()

		time.Sleep(probeInterval)
		warns := r.logs.find(slog.LevelWarn, "claim store")
		if len(warns) == 0 {
			t.Fatalf("no warning naming the claim store %s after start; logs:\n%s", probeInterval, r.logs)
		}
		if r.p.Ready() || !strings.Contains(r.p.NotReadyReason(), "claim store") {
			t.Errorf("ready %v, reason %q; want not ready because of the claim store", r.p.Ready(), r.p.NotReadyReason())
		}

		time.Sleep(10 * probeInterval)
		warns = r.logs.find(slog.LevelWarn, "claim store")
		elapsed := time.Since(start)
		if max := int(elapsed/probeInterval) + 1; len(warns) < 3 || len(warns) > max {
			t.Errorf("%d warnings in %s; want it said again and again, at most once per %s (%d)", len(warns), elapsed, probeInterval, max)
		}
		checkSpacing(t, warns, probeInterval)
		if s := q.Stats(); s.Deliveries != 0 {
			t.Errorf("%d deliveries while the store refused writes: want none", s.Deliveries)
		}

		st.down.Store(false)
		time.Sleep(2 * probeInterval) // the store probe's backoff is at most 15 s
		synctest.Wait()
		if !r.p.Ready() || len(r.logs.find(slog.LevelInfo, "claim store accepts writes again")) != 1 {
			t.Fatalf("not ready (%s) once the store answers; logs:\n%s", r.p.NotReadyReason(), r.logs)
		}
		if s := q.Stats(); s.DeadLettered != 1 {
			t.Errorf("the message was not received once the store answered: %+v", s)
		}
		r.stop()
	})
}

// TestStartUpSaysTheReceiverCannotBeOpened: a receiver that cannot be
// opened is said at once, naming Service Bus, then at most once per
// interval, however fast the retries.
func TestStartUpSaysTheReceiverCannotBeOpened(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := membus.NewQueue("orders", membus.QueueOptions{})
		var fail atomic.Bool
		fail.Store(true)
		r := run(t, q, &probeStore{}, func(o *processor.Options) {
			next := o.NewReceiver
			o.NewReceiver = func(ctx context.Context) (processor.Receiver, error) {
				if fail.Load() {
					return nil, &azservicebus.Error{Code: azservicebus.CodeUnauthorizedAccess}
				}
				return next(ctx)
			}
		})
		start := time.Now()
		synctest.Wait()
		if warns := r.logs.find(slog.LevelWarn, "cannot open a Service Bus receiver"); len(warns) != 1 || !warns[0].Time.Equal(start) {
			t.Fatalf("want one warning at once; logs:\n%s", r.logs)
		}
		time.Sleep(10 * probeInterval)
		warns := r.logs.find(slog.LevelWarn, "cannot open a Service Bus receiver")
		if max := int(time.Since(start)/probeInterval) + 1; len(warns) < 3 || len(warns) > max {
			t.Errorf("%d warnings in %s; want again and again, at most %d", len(warns), time.Since(start), max)
		}
		checkSpacing(t, warns, probeInterval)
		fail.Store(false)
		time.Sleep(time.Minute)
		if !r.p.Ready() {
			t.Errorf("not ready once the receiver opens: %s", r.p.NotReadyReason())
		}
		r.stop()
	})
}

func checkSpacing(t *testing.T, recs []slog.Record, interval time.Duration) {
	t.Helper()
	for i := 1; i < len(recs); i++ {
		if gap := recs[i].Time.Sub(recs[i-1].Time); gap < interval {
			t.Errorf("warnings %d and %d are %s apart, less than %s", i-1, i, gap, interval)
		}
	}
}

// running is a processor started in a synctest bubble.
type running struct {
	p    *processor.Processor
	logs *logRecorder
	stop func()
}

// run starts a processor with default probe settings on q (through a
// receiver whose peek hangs while q is unreachable, like the SDK's) and
// st, without group commit.
func run(t *testing.T, q *membus.Queue, st claim.Store, tweak func(*processor.Options)) *running {
	t.Helper()
	logs := &logRecorder{}
	opts := processor.Options{
		Consumer: "billing",
		Entity:   "orders",
		Store:    st,
		Router:   &router{eff: newEffects()},
		NewReceiver: func(context.Context) (processor.Receiver, error) {
			return sdkLikeReceiver{q.NewReceiver()}, nil
		},
		MaxConcurrentCalls: 1,
		NoGroupCommit:      true,
		Logger:             slog.New(logs.handler()),
	}
	if tweak != nil {
		tweak(&opts)
	}
	p, err := processor.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop) // in the bubble, before it checks every goroutine ended
	return &running{p: p, logs: logs, stop: stop}
}

func send(t *testing.T, q *membus.Queue, id, subject string) {
	t.Helper()
	if err := q.SendMessage(context.Background(), &azservicebus.Message{MessageID: &id, Subject: &subject, Body: []byte(`{}`)}, nil); err != nil {
		t.Fatal(err)
	}
}

// sdkLikeReceiver is a membus receiver whose peek, while the broker is
// unreachable, hangs until its context ends, as the SDK's does while it
// retries the connection: the worst case of the readiness probe.
type sdkLikeReceiver struct{ *membus.Receiver }

func (r sdkLikeReceiver) PeekMessages(ctx context.Context, n int, o *azservicebus.PeekMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	msgs, err := r.Receiver.PeekMessages(ctx, n, o)
	var sbErr *azservicebus.Error
	if errors.As(err, &sbErr) && sbErr.Code == azservicebus.CodeConnectionLost {
		<-ctx.Done()
		return nil, fmt.Errorf("peek: %w", ctx.Err())
	}
	return msgs, err
}

// probeStore is a claim store that only answers the processor's store
// probe (a heartbeat of no claim): unavailable while down is set.
// Anything else panics: these tests dead-letter their messages before
// any claim.
type probeStore struct {
	claim.Store
	down atomic.Bool
}

func (s *probeStore) Heartbeat(_ context.Context, p *claim.HeartbeatParams) error {
	if s.down.Load() {
		return fmt.Errorf("injected: %w", claim.ErrUnavailable)
	}
	return claim.ErrStateChanged
}

// logRecorder keeps every record logged through its handlers.
type logRecorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logRecorder) handler() slog.Handler { return recordingHandler{l: l} }

// find returns the records at level whose message contains text.
func (l *logRecorder) find(level slog.Level, text string) []slog.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []slog.Record
	for _, r := range l.recs {
		if r.Level == level && strings.Contains(r.Message, text) {
			out = append(out, r)
		}
	}
	return out
}

func (l *logRecorder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	for _, r := range l.recs {
		fmt.Fprintf(&b, "%s %s %s", r.Time.Format(time.TimeOnly+".000"), r.Level, r.Message)
		r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
		b.WriteByte('\n')
	}
	return b.String()
}

func attr(r slog.Record, key string) string {
	var v string
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == key {
			v = a.Value.String()
			return false
		}
		return true
	})
	return v
}

type recordingHandler struct {
	l     *logRecorder
	attrs []slog.Attr
}

func (recordingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h recordingHandler) Handle(_ context.Context, r slog.Record) error {
	r = r.Clone()
	r.AddAttrs(h.attrs...)
	h.l.mu.Lock()
	defer h.l.mu.Unlock()
	h.l.recs = append(h.l.recs, r)
	return nil
}

func (h recordingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return recordingHandler{l: h.l, attrs: append(slices.Clone(h.attrs), as...)}
}

func (h recordingHandler) WithGroup(string) slog.Handler { return h }
