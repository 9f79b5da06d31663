package chaos

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/testkit/membus"
)

// Fault is a failure the harness injects. Each is switchable and counted.
type Fault string

// The faults. All but StoreOutage are planned per message (at most one per
// message, chosen from the seeded source); StoreOutage is a time window.
const (
	// FaultDieAfterClaim: the replica dies right after its claim commits
	// (no effect, no settlement).
	FaultDieAfterClaim Fault = "die-after-claim"
	// FaultResponseLost: the downstream performs the effect but the
	// response never arrives (the caller times out).
	FaultResponseLost Fault = "response-lost"
	// FaultDieAfterEffect: the replica dies after the effect, before
	// marking the claim processed.
	FaultDieAfterEffect Fault = "die-after-effect"
	// FaultDieAfterProcessed: the replica dies after marking processed,
	// before completing the message.
	FaultDieAfterProcessed Fault = "die-after-processed"
	// FaultLockExpiry: the message's lock expires while its effect runs,
	// and the broker redelivers it to another replica meanwhile.
	FaultLockExpiry Fault = "lock-expiry"
	// FaultStoreOutage: the claim store is unreachable from every replica
	// for a window of time.
	FaultStoreOutage Fault = "store-outage"
	// FaultLostThen503: the downstream performs the effect and the response
	// is lost (as response-lost), then answers the retries 503 (not
	// performed). The effect may have happened, so the claim must not be
	// released for another delivery to take over. (The harness found this
	// under load before sideeffects.RetryPolicy.Do kept an unknown outcome
	// unknown; this fault reproduces it deterministically.)
	FaultLostThen503 Fault = "lost-then-503"
	// FaultAckLost: the store commits a MarkProcessed or Release and then
	// answers claim.ErrUnavailable (the connection broke after COMMIT
	// reached the server). Half of its messages are also answered 503 four
	// times by the downstream, so their effect is definitely not performed
	// and the write that loses its answer is the Release.
	FaultAckLost Fault = "ack-lost"
	// FaultDownstreamOutage: for a window (Config.DownstreamWindow) every
	// request to the downstream is refused: every other one at connect
	// (ECONNREFUSED), the others answered 503. The window is longer than
	// the processors spend on a message's deliveries when each is answered
	// at once (MaxDeliveryCount deliveries of 4 quick attempts), so without
	// delayed retries (Config.NoDeferral) the broker dead-letters messages
	// (MaxDeliveryCountExceeded). Not part of "all".
	FaultDownstreamOutage Fault = "downstream-outage"
	// FaultMisconfigured: for a window every request is answered 401 (a
	// wrong API key), then the configuration is "fixed". A route whose
	// breaker opens on 401 postpones its messages instead of failing their
	// claims. Not part of "all".
	FaultMisconfigured Fault = "misconfigured"
)

// AllFaults lists every fault in the order reports print them.
var AllFaults = []Fault{
	FaultDieAfterClaim, FaultResponseLost, FaultDieAfterEffect,
	FaultDieAfterProcessed, FaultLockExpiry, FaultStoreOutage, FaultLostThen503,
	FaultAckLost,
}

// WindowFaults are the downstream's windows, asked for by name ("all"
// does not include them: each lengthens a run by its window).
var WindowFaults = []Fault{FaultDownstreamOutage, FaultMisconfigured}

// KnownFaults lists every fault: AllFaults, then WindowFaults.
func KnownFaults() []Fault { return slices.Concat(AllFaults, WindowFaults) }

// perMessage reports whether f is planned per message.
func (f Fault) perMessage() bool {
	return f != FaultStoreOutage && !slices.Contains(WindowFaults, f)
}

// ParseFaults reads a -faults value: "all", "none" or a comma-separated
// list of fault names, where "all" stands for AllFaults
// ("all,downstream-outage").
func ParseFaults(s string) ([]Fault, error) {
	switch strings.TrimSpace(s) {
	case "all", "":
		return slices.Clone(AllFaults), nil
	case "none":
		return nil, nil
	}
	var out []Fault
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		fs := []Fault{Fault(part)}
		if part == "all" {
			fs = AllFaults
		}
		for _, f := range fs {
			if !slices.Contains(KnownFaults(), f) {
				names := make([]string, 0, len(AllFaults)+len(WindowFaults))
				for _, a := range KnownFaults() {
					names = append(names, string(a))
				}
				return nil, fmt.Errorf("unknown fault %q (want all, none or a comma list of all and %s)", f, strings.Join(names, ", "))
			}
			if !slices.Contains(out, f) {
				out = append(out, f)
			}
		}
	}
	return out, nil
}

// faultBook is the plan (which message gets which fault) and the record
// of what happened.
//
// A fault that fires at a processor hook is planned on spare messages too
// (a planned message can miss its fault when an earlier fault already
// settled its fate), but fires on at most limit[f] of them.
type faultBook struct {
	mu      sync.Mutex
	plan    map[string]Fault // message ID → fault
	fired   map[string]bool  // message ID → its fault already fired
	limit   map[Fault]int    // how many messages a fault fires on at most
	nfired  map[Fault]int
	planned map[Fault]int
	counts  map[Fault]int
	// hit is every message a fault actually happened to (the key explains
	// a flagged claim; see harness.explain).
	hit map[string]Fault
}

func newFaultBook() *faultBook {
	return &faultBook{
		plan: map[string]Fault{}, fired: map[string]bool{}, limit: map[Fault]int{}, nfired: map[Fault]int{},
		planned: map[Fault]int{}, counts: map[Fault]int{}, hit: map[string]Fault{},
	}
}

// assign plans f on id; spare plans count toward nothing until they fire.
func (b *faultBook) assign(id string, f Fault, spare bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.plan[id] = f
	if !spare {
		b.planned[f]++
		b.limit[f]++
	}
}

func (b *faultBook) planFor(id string) Fault {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.plan[id]
}

// fire reports, once per message, whether f is planned for id; the first
// caller takes the fault.
func (b *faultBook) fire(id string, f Fault) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.plan[id] != f || b.fired[id] || b.nfired[f] >= b.limit[f] {
		return false
	}
	b.fired[id] = true
	b.nfired[f]++
	return true
}

// markHit records that f happened to id. Only a fault that really
// happened explains a flagged claim: a planned fault that fired on a dead
// replica, or a lock expiry that found no lock, did nothing.
func (b *faultBook) markHit(id string, f Fault) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.hit[id] = f
}

// hitOn returns the fault that happened to id, if any.
func (b *faultBook) hitOn(id string) (Fault, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f, ok := b.hit[id]
	return f, ok
}

func (b *faultBook) count(f Fault, n int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.counts[f] += n
}

func (b *faultBook) snapshot() (planned, happened map[Fault]int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	planned, happened = map[Fault]int{}, map[Fault]int{}
	for k, v := range b.planned {
		planned[k] = v
	}
	for k, v := range b.counts {
		happened[k] = v
	}
	return planned, happened
}

// outage makes the store unreachable for every replica while active.
type outage struct {
	active  atomic.Bool
	refused atomic.Int64

	mu sync.Mutex
	// refusedIDs are the claims whose outcome-changing calls (MarkProcessed,
	// Release, RecordAttempt, Heartbeat, TakeOver) an outage refused: such a
	// claim may legitimately be left for the reconciler.
	refusedIDs map[int64][]string
}

// outageOps are the calls on an existing claim whose refusal can leave it
// unfinished.
var outageOps = []string{"MarkProcessed", "Release", "Fail", "RecordAttempt", "Heartbeat", "TakeOver", "TakeDeadLetter"}

func (o *outage) gate(_ context.Context, op string, id int64) error {
	if !o.active.Load() {
		return nil
	}
	o.refused.Add(1)
	if id != 0 && slices.Contains(outageOps, op) {
		o.mu.Lock()
		if o.refusedIDs == nil {
			o.refusedIDs = map[int64][]string{}
		}
		if !slices.Contains(o.refusedIDs[id], op) {
			o.refusedIDs[id] = append(o.refusedIDs[id], op)
		}
		o.mu.Unlock()
	}
	return fmt.Errorf("chaos: store outage: %s: %w", op, claim.ErrUnavailable)
}

// refusedFor returns the calls on claim id an outage refused.
func (o *outage) refusedFor(id int64) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.refusedIDs[id])
}

// replicaDeadError is what a dead replica's store, receiver and HTTP client
// return: nothing they do reaches anything any more.
func replicaDeadError(id int, what string) error {
	return fmt.Errorf("chaos: replica %d is dead (%s)", id, what)
}

// killReceiver is a replica's receiver. Once the replica is dead every call
// fails at once and does nothing: a blocked ReceiveMessages returns
// CodeClosed, settlements and renewals fail with CodeConnectionLost (the
// locks the replica held run out, like a crashed process's).
type killReceiver struct {
	killSettle
	r *membus.Receiver
}

// messageSettler settles a delivery: a queue's receiver or a session's.
type messageSettler interface {
	CompleteMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.CompleteMessageOptions) error
	AbandonMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.AbandonMessageOptions) error
	DeadLetterMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.DeadLetterOptions) error
}

// killSettle is the settlement of a replica that may be killed, for both
// kinds of receiver: once the replica is dead every call fails at once
// and does nothing; each settlement is noted, and a completion checked.
type killSettle struct {
	set messageSettler
	rep *replica
}

func (k *killReceiver) closed() error {
	return fmt.Errorf("%w: %w", replicaDeadError(k.rep.id, "receive"), &azservicebus.Error{Code: azservicebus.CodeClosed})
}

func (k killSettle) lost(op string) error {
	return fmt.Errorf("%w: %w", replicaDeadError(k.rep.id, op), &azservicebus.Error{Code: azservicebus.CodeConnectionLost})
}

func (k *killReceiver) ReceiveMessages(ctx context.Context, n int, o *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	if k.rep.dead.Load() {
		return nil, k.closed()
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(k.rep.killCtx, cancel)
	defer stop()
	msgs, err := k.r.ReceiveMessages(ctx, n, o)
	if err != nil && k.rep.dead.Load() {
		return nil, k.closed()
	}
	for _, m := range msgs {
		k.rep.h.sawDelivery(m)
		k.rep.received(m)
	}
	return msgs, err
}

func (k killSettle) CompleteMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.CompleteMessageOptions) error {
	if k.rep.dead.Load() {
		return k.lost("complete")
	}
	sent := time.Now()
	err := k.set.CompleteMessage(ctx, m, o)
	k.rep.settled(m, "complete", err)
	if err == nil {
		k.rep.h.checkCompletion(m, k.rep.host, sent)
	}
	return err
}

func (k killSettle) AbandonMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.AbandonMessageOptions) error {
	if k.rep.dead.Load() {
		return k.lost("abandon")
	}
	err := k.set.AbandonMessage(ctx, m, o)
	k.rep.settled(m, "abandon", err)
	return err
}

func (k killSettle) DeadLetterMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.DeadLetterOptions) error {
	if k.rep.dead.Load() {
		return k.lost("dead-letter")
	}
	err := k.set.DeadLetterMessage(ctx, m, o)
	k.rep.settled(m, "dead-letter", err)
	return err
}

func (k *killReceiver) RenewMessageLock(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.RenewMessageLockOptions) error {
	if k.rep.dead.Load() {
		return k.lost("renew lock")
	}
	return k.r.RenewMessageLock(ctx, m, o)
}

func (k *killReceiver) DeferMessage(ctx context.Context, m *azservicebus.ReceivedMessage, o *azservicebus.DeferMessageOptions) error {
	if k.rep.dead.Load() {
		return k.lost("defer")
	}
	err := k.r.DeferMessage(ctx, m, o)
	k.rep.settled(m, "defer", err)
	return err
}

func (k *killReceiver) ReceiveDeferredMessages(ctx context.Context, seqs []int64, o *azservicebus.ReceiveDeferredMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	if k.rep.dead.Load() {
		return nil, k.lost("receive deferred")
	}
	msgs, err := k.r.ReceiveDeferredMessages(ctx, seqs, o)
	for _, m := range msgs {
		// A fetched message is held like a received one (a replica
		// killed holding it is in its history).
		k.rep.h.sawDelivery(m)
		k.rep.received(m)
	}
	return msgs, err
}

func (k *killReceiver) PeekMessages(ctx context.Context, n int, o *azservicebus.PeekMessagesOptions) ([]*azservicebus.ReceivedMessage, error) {
	if k.rep.dead.Load() {
		return nil, k.lost("peek")
	}
	return k.r.PeekMessages(ctx, n, o)
}

func (k *killReceiver) Close(ctx context.Context) error { return k.r.Close(ctx) }

// received notes a delivery the replica now holds.
func (r *replica) received(m *azservicebus.ReceivedMessage) {
	r.mu.Lock()
	r.held[m.LockToken] = m.MessageID
	r.mu.Unlock()
	r.h.hist.add(m.MessageID, "%s received delivery %d (lock %x)", r.host, m.DeliveryCount, m.LockToken[:4])
}

// settled notes that the replica settled (or tried to settle) a delivery:
// it no longer holds it, whatever the broker answered.
func (r *replica) settled(m *azservicebus.ReceivedMessage, op string, err error) {
	r.mu.Lock()
	delete(r.held, m.LockToken)
	r.mu.Unlock()
	r.h.hist.add(m.MessageID, "%s %s delivery %d (lock %x): %s", r.host, op, m.DeliveryCount, m.LockToken[:4], errText(err))
}

// RedriveHeader marks the effect requests of the operators' redrives, and
// RecoveryHeader those of the reconciler's recovery pass, so the report
// can tell effects a delivery performed from effects only the reconciler
// or an operator performed.
const (
	RedriveHeader  = "X-Chaos-Redrive"
	RecoveryHeader = "X-Chaos-Recovery"
)

// taggedTransport sets header on every request.
type taggedTransport struct {
	base   http.RoundTripper
	header string
}

func (t taggedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set(t.header, "1")
	return t.base.RoundTrip(req)
}

// killTransport is a replica's HTTP transport: a dead replica sends no new
// request. (A request already on the wire when the replica dies is
// answered; the replica can no longer record or settle anything.)
type killTransport struct {
	base http.RoundTripper
	rep  *replica
}

func (t *killTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.rep.dead.Load() {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, replicaDeadError(t.rep.id, "http")
	}
	if d, ok := req.Context().Value(deliveryKey{}).(string); ok {
		req = req.Clone(req.Context())
		req.Header.Set(DeliveryHeader, d)
	}
	resp, err := t.base.RoundTrip(req)
	if err != nil && req.Context().Err() != nil {
		// No answer before the route's timeout (or the attempt's end):
		// the outcome is unknown, whether a fault hung the answer or the
		// machine was too slow to give it in time.
		t.rep.h.noteTimeout(req.Header.Get("Idempotency-Key"))
	}
	return resp, err
}

// DeliveryHeader tells the downstream which delivery (replica and lock
// token) sent an effect request, so the harness can check that only one
// delivery of a message ever ran its effect (the claim's job), whatever
// the downstream's own deduplication hides.
const DeliveryHeader = "X-Chaos-Delivery"

type deliveryKey struct{}

func withDelivery(ctx context.Context, rep *replica, m *azservicebus.ReceivedMessage) context.Context {
	return context.WithValue(ctx, deliveryKey{}, fmt.Sprintf("replica-%d/%x", rep.id, m.LockToken[:6]))
}

// trackWriter notes the status a handler wrote (0: none) and whether the
// answer was an idempotent replay.
type trackWriter struct {
	http.ResponseWriter
	status   int
	replayed bool
}

func (w *trackWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
		w.replayed = w.Header().Get("Idempotent-Replayed") == "true"
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *trackWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

// mayHavePerformed reports whether an answer leaves the effect possibly
// performed (as the product's classification table sees it): no answer,
// 2xx, 409 (in flight) or a 5xx other than 503.
func mayHavePerformed(status int) bool {
	switch {
	case status == 0, status >= 200 && status < 300, status == http.StatusConflict:
		return true
	case status >= 500:
		return status != http.StatusServiceUnavailable
	}
	return false
}
