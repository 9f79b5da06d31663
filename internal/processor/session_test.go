package processor_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/metricreg"
	"github.com/sbclaim/sbclaim/internal/processor"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/testkit/membus"
)

// sessionSetup is setup with a session-enabled queue, a short backoff on
// the default route, and options in session mode.
func sessionSetup(t *testing.T, be string) (*bundle, processor.Options) {
	t.Helper()
	b := setup(t, be, membus.QueueOptions{RequiresSession: true, AcceptTimeout: 200 * time.Millisecond})
	b.router.backoff = sideeffects.Backoff{First: 50 * time.Millisecond, Factor: 2, Max: 200 * time.Millisecond, Horizon: time.Hour}
	opts := b.options()
	opts.NewReceiver = nil
	opts.AcceptSession = func(ctx context.Context) (processor.SessionReceiver, error) {
		return b.q.AcceptNextSession(ctx)
	}
	opts.MaxConcurrentSessions = 4
	opts.SessionIdleTimeout = 300 * time.Millisecond
	opts.Metrics = metricreg.ProcessorMetrics(nil)
	return b, opts
}

func (b *bundle) sendInSession(session, id, subj string) {
	b.t.Helper()
	m := &azservicebus.Message{MessageID: &id, SessionID: &session, Subject: &subj, Body: []byte(`{"id":"` + id + `"}`)}
	if err := b.q.SendMessage(context.Background(), m, nil); err != nil {
		b.t.Fatal(err)
	}
}

// journal records, per session, when each message's effect first began
// and when it ended for good, to check the order: no message's first
// attempt begins before the previous message of its session ended.
type journal struct {
	mu     sync.Mutex
	events []string
}

func (j *journal) add(e string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.events = append(j.events, e)
}

func (j *journal) list() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.events)
}

// TestSessionRetryHoldsTheOrder: a retryable answer on a session's first
// message holds the session: the message is neither deferred nor
// abandoned, its retries run after the route's backoff, and the
// session's next messages run only after it succeeded, each once.
func TestSessionRetryHoldsTheOrder(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b, opts := sessionSetup(t, be)
		j := &journal{}
		b.eff.behave = func(_, key string, call int) error {
			j.add(fmt.Sprintf("%s#%d", key, call))
			if key == "a-1" && call <= 2 {
				return sideeffects.Retryable(errors.New("HTTP 503"))
			}
			return nil
		}
		b.start(opts)
		for _, id := range []string{"a-1", "a-2", "a-3"} {
			b.sendInSession("A", id, "pay")
		}
		b.sendInSession("B", "b-1", "pay") // another session goes on meanwhile
		b.waitIdle()

		var order []string
		for _, e := range j.list() {
			if e[0] == 'a' {
				order = append(order, e)
			}
		}
		if want := []string{"a-1#1", "a-1#2", "a-1#3", "a-2#1", "a-3#1"}; !slices.Equal(order, want) {
			t.Errorf("session A's effects ran as %v, want %v", order, want)
		}
		for _, id := range []string{"a-1", "a-2", "a-3", "b-1"} {
			if got := b.eff.Performed(id); got != 1 {
				t.Errorf("%s performed %d times, want once", id, got)
			}
			if c := b.claimOf(id); c.State != claim.StateProcessed || c.SessionID != string(id[0]-'a'+'A') {
				t.Errorf("%s: claim %s in session %q, want processed, in session %c", id, c.State, c.SessionID, id[0]-'a'+'A')
			}
		}
		s := b.q.Stats()
		if s.Deferrals != 0 || s.Abandoned != 0 || s.Redeliveries != 0 {
			t.Errorf("deferrals %d, abandons %d, redeliveries %d: a held retry keeps its message", s.Deferrals, s.Abandoned, s.Redeliveries)
		}
		if got := metricValue(opts.Metrics.Postponed.With("effect")); got != 2 {
			t.Errorf("postponed %v times, want 2 (two held retries)", got)
		}
	})
}

// TestSessionFinalAnswerLetsTheSessionGoOn: a decline fails the claim and
// dead-letters the message once; the session's next message runs.
func TestSessionFinalAnswerLetsTheSessionGoOn(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b, opts := sessionSetup(t, be)
		b.answering(func(ctx context.Context, key string, _ int) error {
			if key == "a-1" {
				return decline(ctx)
			}
			return nil
		})
		b.start(opts)
		b.sendInSession("A", "a-1", "pay")
		b.sendInSession("A", "a-2", "pay")
		b.waitIdle()

		if dl := b.deadLettersOf("a-1"); len(dl) != 1 || *dl[0].DeadLetterReason != processor.ReasonEffectRejected {
			t.Fatalf("dead letters of a-1: %d (%v), want one EffectRejected", len(dl), b.deadLetterReasons())
		}
		if c := b.claimOf("a-1"); c.State != claim.StateFailed {
			t.Errorf("a-1: claim %s, want failed", c.State)
		}
		if c := b.claimOf("a-2"); c.State != claim.StateProcessed || b.eff.Performed("a-2") != 1 {
			t.Errorf("a-2: claim %s, performed %d: the session goes on after a final answer", c.State, b.eff.Performed("a-2"))
		}
		for _, s := range b.q.Sessions() {
			if len(s.State) != 0 {
				t.Errorf("session %s has state %s: nothing holds it", s.ID, s.State)
			}
		}
	})
}

// TestSessionHoldOnFailureHoldsIt: on a route that holds its session on
// failure, a decline dead-letters the message and holds the session: its
// next message does not run, the session state names the claim, and
// nobody else takes the session while it is held.
func TestSessionHoldOnFailureHoldsIt(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b, opts := sessionSetup(t, be)
		b.router.holdSession = true
		b.answering(func(ctx context.Context, key string, _ int) error {
			if key == "a-1" {
				return decline(ctx)
			}
			return nil
		})
		b.start(opts)
		b.sendInSession("A", "a-1", "pay")
		b.sendInSession("A", "a-2", "pay")
		b.sendInSession("B", "b-1", "pay")

		b.eventually("session A held", func() bool { return metricValue(opts.Metrics.SessionsHeld) == 1 })
		b.eventually("b-1 processed", func() bool { return b.eff.Performed("b-1") == 1 })
		failed := b.claimOf("a-1")
		if failed.State != claim.StateFailed || len(b.deadLettersOf("a-1")) != 1 {
			t.Fatalf("a-1: claim %s, %d dead letters: want failed, dead-lettered once", failed.State, len(b.deadLettersOf("a-1")))
		}
		state := sessionState(t, b.q, "A")
		var hold struct {
			HeldBy int64 `json:"heldByClaim"`
		}
		if err := json.Unmarshal(state, &hold); err != nil || hold.HeldBy != failed.ID {
			t.Fatalf("session A's state %q (%v), want it to name claim %d", state, err, failed.ID)
		}
		if got := b.eff.Calls("a-2"); got != 0 {
			t.Fatalf("a-2 ran %d times while its session was held", got)
		}
	})
}

// TestSessionHeldUntilAnOperatorActs: an unknown outcome on a manual
// route in a session flags the claim; with HoldSessionOnFailure the
// session waits until an operator resolves it, then goes on.
func TestSessionHeldUntilAnOperatorActs(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b, opts := sessionSetup(t, be)
		b.router.holdSession = true
		b.eff.behave = func(_, key string, _ int) error {
			if key == "a-1" {
				return sideeffects.Unknown(errors.New("timeout after the request was sent"))
			}
			return nil
		}
		b.start(opts)
		b.sendInSession("A", "a-1", "manual")
		b.sendInSession("A", "a-2", "pay")
		b.eventually("session A held", func() bool { return metricValue(opts.Metrics.SessionsHeld) == 1 })
		c := b.claimOf("a-1")
		if c.State != claim.StateFlagged {
			t.Fatalf("a-1: claim %s, want flagged", c.State)
		}
		if got := b.eff.Calls("a-2"); got != 0 {
			t.Fatalf("a-2 ran %d times while its session was held", got)
		}
		if _, err := b.store.Resolve(context.Background(), &claim.ResolveParams{ID: c.ID, Resolution: claim.ResolutionDone, By: "ops", Note: "checked: charged"}); err != nil {
			t.Fatal(err)
		}
		b.waitIdle()
		if got := b.eff.Performed("a-2"); got != 1 {
			t.Errorf("a-2 performed %d times after the operator resolved a-1, want once", got)
		}
		if state := sessionState(t, b.q, "A"); len(state) != 0 {
			t.Errorf("session A's state %q after the hold was lifted, want none", state)
		}
	})
}

// TestSessionCrashHandsTheSessionAndClaimOver: a replica dies after
// claiming a session's first message. The session lock runs out, the
// session goes to the next receiver with the same message, whose
// delivery takes the silent holder's claim over and runs the effect
// once; only then does the session's next message run.
func TestSessionCrashHandsTheSessionAndClaimOver(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b, opts := sessionSetup(t, be)
		j := &journal{}
		b.eff.behave = func(_, key string, _ int) error {
			j.add(key)
			return nil
		}
		var crashes atomic.Int32
		dying := opts
		dying.Host = "dying"
		dying.Hooks.AfterClaim = func(_ context.Context, m *azservicebus.ReceivedMessage) error {
			if m.MessageID == "a-1" && crashes.Add(1) == 1 {
				return processor.ErrCrash
			}
			return nil
		}
		b.start(dying)
		b.sendInSession("A", "a-1", "pay")
		b.sendInSession("A", "a-2", "pay")
		b.eventually("the crash", func() bool { return crashes.Load() >= 1 })
		survivor := opts
		survivor.Host = "survivor"
		b.start(survivor)
		b.waitIdle()

		if got := j.list(); !slices.Equal(got, []string{"a-1", "a-2"}) {
			t.Errorf("effects ran as %v, want [a-1 a-2]", got)
		}
		c := b.claimOf("a-1")
		if c.State != claim.StateProcessed || c.TakeOverPath != claim.PathRedelivery {
			t.Errorf("a-1: claim %s taken over by %q, want processed after a redelivery's take-over", c.State, c.TakeOverPath)
		}
		if s := b.q.Stats(); s.SessionLockExpiries == 0 || s.Redeliveries == 0 {
			t.Errorf("session lock expiries %d, redeliveries %d: the session should have been handed over by its lock running out", s.SessionLockExpiries, s.Redeliveries)
		}
	})
}

func sessionState(t *testing.T, q *membus.Queue, id string) []byte {
	t.Helper()
	for _, s := range q.Sessions() {
		if s.ID == id {
			return s.State
		}
	}
	t.Fatalf("no session %s", id)
	return nil
}

func TestSessionOptionsAreChecked(t *testing.T) {
	b, opts := sessionSetup(t, "sqlite")
	for name, mutate := range map[string]func(*processor.Options){
		"both receivers":     func(o *processor.Options) { o.NewReceiver = b.options().NewReceiver },
		"negative sessions":  func(o *processor.Options) { o.MaxConcurrentSessions = -1 },
		"negative idle":      func(o *processor.Options) { o.SessionIdleTimeout = -time.Second },
		"sessions, no mode":  func(o *processor.Options) { o.AcceptSession, o.NewReceiver = nil, b.options().NewReceiver },
		"no receiver at all": func(o *processor.Options) { o.AcceptSession = nil },
	} {
		o := opts
		mutate(&o)
		if _, err := processor.New(o); err == nil {
			t.Errorf("%s: New accepted the options", name)
		}
	}
}

// TestSessionLockLostEndsAHeldRetry: a session whose lock is lost while
// its message waits for a retry ends the wait at once (it would otherwise
// last the route's ten-minute backoff): the claim, not performed, is
// released, and the session's next holder takes it over and runs it.
func TestSessionLockLostEndsAHeldRetry(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b, opts := sessionSetup(t, be)
		b.router.backoff = sideeffects.Backoff{First: 10 * time.Minute, Factor: 1, Max: 10 * time.Minute, Horizon: time.Hour}
		b.eff.behave = func(_, key string, call int) error {
			if key == "a-1" && call == 1 {
				return sideeffects.Retryable(errors.New("HTTP 503"))
			}
			return nil
		}
		b.start(opts)
		b.sendInSession("A", "a-1", "pay")
		b.sendInSession("A", "a-2", "pay")
		b.eventually("a-1 held for a retry", func() bool {
			return metricValue(opts.Metrics.Postponed.With("effect")) == 1
		})
		if n := b.q.ExpireSessionLock("A"); n != 1 {
			t.Fatalf("expired %d session locks, want 1", n)
		}
		b.waitIdle() // within a minute: far less than the backoff
		if b.eff.Performed("a-1") != 1 || b.eff.Performed("a-2") != 1 || b.eff.Calls("a-2") != 1 {
			t.Errorf("a-1 performed %d, a-2 performed %d (calls %d): want each once", b.eff.Performed("a-1"), b.eff.Performed("a-2"), b.eff.Calls("a-2"))
		}
		if c := b.claimOf("a-1"); c.State != claim.StateProcessed || c.TakeOvers != 1 {
			t.Errorf("a-1: claim %s after %d take-overs, want processed after one (released by the holder that lost its session)", c.State, c.TakeOvers)
		}
	})
}

// TestSessionOnTheProcessSpanAndLogs: a session's message is traced and
// logged with its session id.
func TestSessionOnTheProcessSpanAndLogs(t *testing.T) {
	b, opts := sessionSetup(t, "sqlite")
	tp, sr := recorder(t)
	opts.TracerProvider = tp
	b.start(opts)
	b.sendInSession("acct-9", "a-1", "pay")
	b.waitIdle()
	b.eventually("the process span", func() bool { return len(spans(sr.Ended()).named("process orders")) == 1 })
	sp := spans(sr.Ended()).named("process orders")[0]
	found := false
	for _, kv := range sp.Attributes() {
		found = found || (kv.Key == "sbclaim.session_id" && kv.Value.AsString() == "acct-9")
	}
	if !found {
		t.Errorf("process span attributes %v: no sbclaim.session_id=acct-9", sp.Attributes())
	}
	if !strings.Contains(b.logs.String(), `"message finished","consumer":"billing","message_id":"a-1","delivery_count":1,"session_id":"acct-9"`) {
		t.Errorf("the final log line has no session_id:\n%s", b.logs.tail(5))
	}
}

// TestSessionHoldSurvivesACrash: the replica that failed the claim dies
// before dead-lettering the message or recording the hold; the session's
// next holder dead-letters it (the failed claim's copy) and holds the
// session all the same.
func TestSessionHoldSurvivesACrash(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b, opts := sessionSetup(t, be)
		b.router.holdSession = true
		b.answering(func(ctx context.Context, key string, _ int) error {
			if key == "a-1" {
				return decline(ctx)
			}
			return nil
		})
		var crashes atomic.Int32
		opts.Hooks.AfterFail = func(_ context.Context, m *azservicebus.ReceivedMessage) error {
			if crashes.Add(1) == 1 {
				return processor.ErrCrash
			}
			return nil
		}
		b.start(opts)
		b.sendInSession("A", "a-1", "pay")
		b.sendInSession("A", "a-2", "pay")
		b.eventually("session A held", func() bool { return metricValue(opts.Metrics.SessionsHeld) == 1 })
		if crashes.Load() != 1 || len(b.deadLettersOf("a-1")) != 1 || b.eff.Calls("a-1") != 1 || b.eff.Calls("a-2") != 0 {
			t.Fatalf("crashes %d, a-1 dead letters %d, calls a-1 %d a-2 %d: want 1, 1, 1, 0", crashes.Load(), len(b.deadLettersOf("a-1")), b.eff.Calls("a-1"), b.eff.Calls("a-2"))
		}
		if state := sessionState(t, b.q, "A"); !strings.Contains(string(state), fmt.Sprintf(`"heldByClaim":%d`, b.claimOf("a-1").ID)) {
			t.Errorf("session A's state %q does not name a-1's claim", state)
		}
	})
}

// TestSessionModeReadiness: on an idle session-enabled entity the
// processor is ready once an accept came back empty (within
// BrokerProbeInterval, the deadline the service gets), and not ready
// while Service Bus cannot be reached.
func TestSessionModeReadiness(t *testing.T) {
	b := setup(t, "sqlite", membus.QueueOptions{RequiresSession: true, AcceptTimeout: time.Hour})
	opts := b.options()
	opts.NewReceiver = nil
	opts.AcceptSession = func(ctx context.Context) (processor.SessionReceiver, error) { return b.q.AcceptNextSession(ctx) }
	opts.BrokerProbeInterval = 200 * time.Millisecond
	p, _ := b.start(opts)
	b.eventually("ready on an idle entity", p.Ready)
	b.q.SetUnreachable(true)
	b.eventually("not ready while Service Bus is unreachable", func() bool { return !p.Ready() })
	if why := p.NotReadyReason(); !strings.Contains(why, "Service Bus") {
		t.Errorf("not ready because %q", why)
	}
	b.q.SetUnreachable(false)
	b.eventually("ready again", p.Ready)
}

// TestSessionManualSilentHolderIsFlaggedAtOnce: on a manual route a crash
// leaves a claim nobody may repeat. In a session the next holder flags it
// at once (without sessions the copy completes and the reconciler flags
// it later, while the session would have gone on past an open outcome);
// the effect ran once, and the session goes on after the flag.
func TestSessionManualSilentHolderIsFlaggedAtOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, be string) {
		b, opts := sessionSetup(t, be)
		var crashes atomic.Int32
		opts.Hooks.AfterClaim = func(_ context.Context, m *azservicebus.ReceivedMessage) error {
			if m.MessageID == "a-1" && crashes.Add(1) == 1 {
				return processor.ErrCrash
			}
			return nil
		}
		b.start(opts)
		b.sendInSession("A", "a-1", "manual")
		b.sendInSession("A", "a-2", "pay")
		b.waitIdle()
		c := b.claimOf("a-1")
		if c.State != claim.StateFlagged || !strings.Contains(c.FlagReason, "in session A") {
			t.Errorf("a-1: claim %s (%q), want flagged by the session's next holder", c.State, c.FlagReason)
		}
		if b.eff.Calls("a-1") != 0 || b.eff.Performed("a-2") != 1 {
			t.Errorf("a-1 called %d times (the crash came before its effect), a-2 performed %d: want 0 and 1", b.eff.Calls("a-1"), b.eff.Performed("a-2"))
		}
	})
}
