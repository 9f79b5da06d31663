package chaos

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/claimdb"
	"github.com/sbclaim/sbclaim/internal/processor"
	"github.com/sbclaim/sbclaim/internal/testkit/membus"
)

// maxListed bounds how many violations and wrong keys a report keeps.
const maxListed = 20

// Report is what a chaos run found.
type Report struct {
	Config   Config
	Database string // redacted
	Dialect  claimdb.Dialect

	Sent, Distinct, Poison, Conflicts int
	Replicas, ReplicasStarted, Kills  int
	// Tracing summarises the spans of a run with Config.Tracing.
	Tracing *TracingSummary

	// EffectsPerKey maps an effect count to how many routed keys had it
	// (all keys must be at 1).
	EffectsPerKey     map[int]int
	Effects, Requests int // downstream totals
	Queue             membus.Stats
	ClaimStates       map[claim.State]int
	Outcomes          map[processor.Result]int // processor outcomes, all replicas

	Planned, Happened map[Fault]int
	// BrokerDeadLettered counts the messages the broker dead-lettered
	// because their deliveries ran out (MaxDeliveryCountExceeded): each is
	// a violation. Postponed counts the processors' postponed outcomes
	// (the message deferred until its retry is due).
	BrokerDeadLettered, Postponed int
	// Windows are the downstream's windows (downstream-outage,
	// misconfigured) and what they did.
	Windows       []WindowReport
	OutageRefused int64 // store calls refused during outages
	RoundTrips    int64 // store calls by the replicas
	// Batches and Batched count the replicas' group-committed outcome
	// batches and the writes they carried.
	Batches, Batched int64

	Ticks, Flagged, Redriven int
	FlagReasons              map[string]int
	// FlagExplained counts flagged claims by what explains them (a killed
	// replica holding the message, a fault on its key, an outage refusing
	// a call on it, or UNEXPLAINED: a violation).
	FlagExplained map[string]int
	// FlagSamples keeps, per explanation kind, the histories of the first
	// few flagged claims (WriteFlagSamples prints them).
	FlagSamples map[string][]string
	Unexplained int
	// EffectsByProcessor, EffectsByReconciler and EffectsByRedrive count
	// routed keys whose effect was performed by a delivery's request, by
	// the reconciler's recovery, or only by an operator's redrive.
	EffectsByProcessor, EffectsByReconciler, EffectsByRedrive int

	// RecoveredByRedelivery and RecoveredByReconciler count processed
	// claims whose last holder took them over (a redelivery from a silent
	// or releasing holder; the reconciler's recovery pass).
	// FlaggedForOperators counts claims that were ever flagged.
	RecoveredByRedelivery, RecoveredByReconciler, FlaggedForOperators int
	// HistoryRows counts the history rows checked (checkHistory): one per
	// change of a routed claim's owner or state.
	HistoryRows int
	// UnansweredGrants counts grants the history shows whose call failed
	// without a refusal (a timeout, a replica killed mid-call): committed,
	// never answered, so never traced (checkHistory).
	UnansweredGrants int
	// RecoveryExplained counts reconciler recoveries by what explains
	// them (each must be explained, like a flag).
	RecoveryExplained map[string]int
	// Rejected, AnswerConflicts and CachedFailures count the keys the
	// downstream declined, answered as a key conflict, or failed with an
	// answer stored under the key (AnswersMixed).
	Rejected, AnswerConflicts, CachedFailures int
	// FinalFlaggedFirst counts declined or conflicting keys whose claim
	// was flagged first (a manual route after a crash) and failed by the
	// operator's redrive.
	FinalFlaggedFirst int
	// FinalAfterHandOff counts declined or conflicting keys whose claim a
	// processor handed to the reconciler (deliveries spent on
	// postponements, the message completed) and the recovery failed: no
	// message was left to dead-letter.
	FinalAfterHandOff int
	// RepeatedByTakeOver counts keys whose effect request was sent by more
	// than one holder (after a take-over, with the same key).
	RepeatedByTakeOver int
	// Sessions is the number of sessions of a session run (0: none), and
	// OutOfOrder the messages whose first effect request arrived before
	// the previous message of their session reached a final outcome
	// (each a violation).
	Sessions, OutOfOrder int
	// TimeToEffect is, per key, the time from its first send to its one
	// effect; DeliveryToEffect from its first delivery.
	TimeToEffect, DeliveryToEffect []time.Duration

	DrainTime, ReconcileTime, Duration time.Duration

	Violations     []string
	moreViolations int
	WrongKeys      int
	// Histories are the recorded histories of the first unexplained
	// flagged claims' keys.
	Histories []string
}

// maxHistories bounds how many key histories a report keeps.
const maxHistories = 5

func (r *Report) history(key, events string) {
	if len(r.Histories) < maxHistories {
		r.Histories = append(r.Histories, fmt.Sprintf("%s:\n    %s", key, events))
	}
}

func (r *Report) violate(format string, args ...any) {
	if len(r.Violations) >= maxListed {
		r.moreViolations++
		return
	}
	r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
}

func (r *Report) wrongKey(format string, args ...any) {
	r.WrongKeys++
	r.violate(format, args...)
}

// maxSamples bounds FlagSamples per kind.
const maxSamples = 3

// WriteFlagSamples prints the histories of a few flagged claims of each
// explanation kind: what the harness saw happen to their keys.
func (r *Report) WriteFlagSamples(w io.Writer) {
	for _, kind := range sortedKeys(r.FlagSamples) {
		for _, s := range r.FlagSamples[kind] {
			fmt.Fprintf(w, "FLAGGED [%s] %s\n", kind, s)
		}
	}
}

// RecoveryLine is the report's "recovery:" line: who healed what, and how
// long a key waited for its effect.
func (r *Report) RecoveryLine() string {
	return fmt.Sprintf("recovery: recovered by redelivery %d, recovered by reconciler %d, flagged for operators %d, "+
		"time to effect p50 %s p99 %s max %s (from first send; from first delivery p50 %s p99 %s max %s)",
		r.RecoveredByRedelivery, r.RecoveredByReconciler, r.FlaggedForOperators,
		quantile(r.TimeToEffect, 0.5), quantile(r.TimeToEffect, 0.99), quantile(r.TimeToEffect, 1),
		quantile(r.DeliveryToEffect, 0.5), quantile(r.DeliveryToEffect, 0.99), quantile(r.DeliveryToEffect, 1))
}

// quantile returns the q-quantile of ds (nearest rank), rounded for
// reading; "-" when empty.
func quantile(ds []time.Duration, q float64) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := int(q*float64(len(s))+0.5) - 1
	i = min(max(i, 0), len(s)-1)
	return s[i].Round(time.Millisecond).String()
}

// Pass reports whether the run found no violation.
func (r *Report) Pass() bool { return len(r.Violations) == 0 }

// Verdict is the report's one-line verdict.
func (r *Report) Verdict() string {
	if r.Pass() {
		return fmt.Sprintf("VERDICT: PASS %d messages, %d sends, %d replicas (%d killed and replaced)%s: every routed message's effect happened exactly once, %d faults injected; flagged for operators %d%s%s",
			r.Distinct, r.Sent, r.Replicas, r.Kills, r.handlerNote(), sum(r.Happened), r.FlaggedForOperators, r.answersLine(), r.windowsNote())
	}
	reasons := slices.Clone(r.Violations)
	if r.moreViolations > 0 {
		reasons = append(reasons, fmt.Sprintf("and %d more", r.moreViolations))
	}
	head := "VERDICT: FAIL"
	if len(r.Windows) > 0 {
		head += " (" + strings.TrimPrefix(r.windowsNote(), "; ") + ")"
	}
	return head + ": " + strings.Join(reasons, "; ")
}

// windowsNote is the verdict's part on the downstream's windows: what
// the broker dead-lettered, what was postponed, and how long after each
// window its refused messages were all performed.
func (r *Report) windowsNote() string {
	if len(r.Windows) == 0 {
		return ""
	}
	s := fmt.Sprintf("; dead-lettered by the broker %d, postponed %d", r.BrokerDeadLettered, r.Postponed)
	for _, w := range r.Windows {
		s += fmt.Sprintf("; %s: %d of %d refused messages performed after the window, the last %s after its end", w.Fault, w.PerformedAfter, w.Keys, w.LastEffect.Round(time.Millisecond))
	}
	return s
}

// WindowLines are the report's lines on the downstream's windows.
func (r *Report) WindowLines() []string {
	if len(r.Windows) == 0 {
		return nil
	}
	lines := []string{fmt.Sprintf("downstream windows: dead-lettered by the broker %d (MaxDeliveryCountExceeded), postponed %d (deferrals at the broker %d, fetched by sequence number %d)",
		r.BrokerDeadLettered, r.Postponed, r.Queue.Deferrals, r.Queue.DeferredReceives)}
	for _, w := range r.Windows {
		lines = append(lines, fmt.Sprintf("  %s: window %s, %d requests refused for %d messages; %d of them performed after the window ended (%d before it began: the refused request was a repeat); from the window's end to the last effect %s",
			w.Fault, w.Duration.Round(time.Millisecond), w.Refused, w.Keys, w.PerformedAfter, w.PerformedBefore, w.LastEffect.Round(time.Millisecond)))
	}
	return lines
}

// SessionLines are a session run's two verdict lines: the order, and the
// exactly-once counts.
func (r *Report) SessionLines() []string {
	if !r.Config.Sessions {
		return nil
	}
	doubled, lost := 0, r.EffectsPerKey[0]
	for n, keys := range r.EffectsPerKey {
		if n > 1 {
			doubled += keys
		}
	}
	return []string{
		fmt.Sprintf("sessions: %d sessions; out of order %d (a message's first effect request arrived before the previous message of its session reached a final outcome)",
			r.Sessions, r.OutOfOrder),
		fmt.Sprintf("sessions: exactly once: doubled %d, lost %d, dead-lettered by the broker %d (besides final answers, conflicts and unroutable messages)",
			doubled, lost, r.BrokerDeadLettered),
	}
}

// handlerNote names a Go handler in the verdict (the HTTP route is the
// default, and the verdict reads as it always did).
func (r *Report) handlerNote() string {
	s := ""
	if r.Config.Handler == HandlerGo {
		s = " running a Go handler"
	}
	if r.Config.Sessions {
		s += fmt.Sprintf(" in %d sessions, out of order %d", r.Sessions, r.OutOfOrder)
	}
	return s
}

func sum[K comparable](m map[K]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// Write prints the report; its last line is the verdict.
func (r *Report) Write(w io.Writer) {
	c := r.Config
	faults := make([]string, len(c.Faults))
	for i, f := range c.Faults {
		faults[i] = string(f)
	}
	fmt.Fprintf(w, "chaos run: seed %d, %s, %d replicas x %d concurrent calls, lock %s, heartbeat %s, stale after %s, %s handler\n",
		c.Seed, r.Database, r.Replicas, c.MaxConcurrentCalls, c.LockDuration, c.HeartbeatInterval, c.StaleAfter, c.Handler)
	fmt.Fprintf(w, "  (the seed fixes which messages are duplicated and faulted; goroutine scheduling still varies between runs)\n")
	fmt.Fprintf(w, "faults on: %s\n", cmpOr(strings.Join(faults, ","), "none"))
	fmt.Fprintf(w, "sent: %d sends = %d routed messages (%d sent 2-3 times) + %d conflicting payloads + %d unroutable (poison)\n",
		r.Sent, r.Distinct, r.Sent-r.Distinct-r.Conflicts-r.Poison, r.Conflicts, r.Poison)
	fmt.Fprintf(w, "time: drained in %s, reconciled in %s (%d ticks), total %s\n",
		r.DrainTime.Round(time.Millisecond), r.ReconcileTime.Round(time.Millisecond), r.Ticks, r.Duration.Round(time.Millisecond))

	fmt.Fprintf(w, "downstream effects per key:")
	for _, n := range sortedKeys(r.EffectsPerKey) {
		fmt.Fprintf(w, " %d effect(s): %d keys;", n, r.EffectsPerKey[n])
	}
	fmt.Fprintf(w, " total effects %d, raw requests %d; keys whose effect request was sent again by a holder that took the claim over: %d\n", r.Effects, r.Requests, r.RepeatedByTakeOver)
	fmt.Fprintf(w, "effects performed by a delivery: %d keys; by the reconciler's recovery: %d keys; only by an operator's redrive: %d keys\n",
		r.EffectsByProcessor, r.EffectsByReconciler, r.EffectsByRedrive)
	fmt.Fprintln(w, r.RecoveryLine())
	r.Tracing.write(w)

	q := r.Queue
	fmt.Fprintf(w, "queue: sent %d, completed %d, dead-lettered %d %s, still in queue %d; deliveries %d (redeliveries %d), lock expiries %d, lock losses %d; deferrals %d, fetched by sequence number %d\n",
		q.Sent, q.Completed, q.DeadLettered, fmtMap(q.DeadLetterReasons), q.Active+q.Locked+q.Deferred, q.Deliveries, q.Redeliveries, q.LockExpiries, q.LockLosses,
		q.Deferrals, q.DeferredReceives)

	fmt.Fprintf(w, "claims by final state:")
	for _, s := range claim.States {
		fmt.Fprintf(w, " %s %d;", s, r.ClaimStates[s])
	}
	fmt.Fprintf(w, " reconciler flagged %d %s; operators' redrives at the end %d\n", r.Flagged, fmtMap(r.FlagReasons), r.Redriven)
	fmt.Fprintf(w, "history: %d rows over %d claims, chained change by change, one per grant the harness traced (and %d committed grants whose caller got an error instead)\n", r.HistoryRows, r.Distinct, r.UnansweredGrants)
	fmt.Fprintf(w, "flagged claims explained by: %s (unexplained %d); reconciler recoveries explained by: %s\n",
		fmtMap(r.FlagExplained), r.Unexplained, fmtMap(r.RecoveryExplained))

	fmt.Fprintf(w, "processor outcomes (all replicas):")
	for _, o := range outcomes {
		if n := r.Outcomes[o]; n > 0 {
			fmt.Fprintf(w, " %s %d;", o, n)
		}
	}
	fmt.Fprintf(w, " store round trips %d (%.2f per send); outcome writes group-committed: %d in %d batches\n",
		r.RoundTrips, float64(r.RoundTrips)/float64(max(r.Sent, 1)), r.Batched, r.Batches)

	fmt.Fprintf(w, "faults (planned / happened):")
	for _, f := range KnownFaults() {
		if !slices.Contains(c.Faults, f) {
			continue
		}
		switch {
		case f.perMessage():
			fmt.Fprintf(w, " %s %d/%d;", f, r.Planned[f], r.Happened[f])
		case slices.Contains(WindowFaults, f):
			fmt.Fprintf(w, " %s %d window of %s;", f, r.Happened[f], c.DownstreamWindow)
		default:
			fmt.Fprintf(w, " %s %d windows of %s (%d store calls refused);", f, r.Happened[f], c.OutageDuration, r.OutageRefused)
		}
	}
	fmt.Fprintf(w, " replicas killed %d, started %d\n", r.Kills, r.ReplicasStarted)
	for _, l := range r.WindowLines() {
		fmt.Fprintln(w, l)
	}
	for _, l := range r.SessionLines() {
		fmt.Fprintln(w, l)
	}
	for _, v := range r.Violations {
		fmt.Fprintf(w, "VIOLATION: %s\n", v)
	}
	for _, hs := range r.Histories {
		fmt.Fprintf(w, "HISTORY %s\n", hs)
	}
	fmt.Fprintln(w, r.Verdict())
}

var outcomes = []processor.Result{
	processor.ResultProcessed, processor.ResultDuplicate, processor.ResultConflict,
	processor.ResultReleased, processor.ResultPostponed, processor.ResultHandedOff, processor.ResultDeadLettered, processor.ResultUnknown,
	processor.ResultAbandoned, processor.ResultLost, processor.ResultFlagged, processor.ResultCrashed,
}

func outcomeCounts(m *processor.Metrics) map[processor.Result]int {
	out := map[processor.Result]int{}
	for _, o := range outcomes {
		out[o] = int(testutil.ToFloat64(m.Messages.With(string(o)).(prometheus.Collector)))
	}
	return out
}

func sortedKeys[K int | string, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func fmtMap(m map[string]int) string {
	if len(m) == 0 {
		return "()"
	}
	parts := make([]string, 0, len(m))
	for _, k := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%s=%d", cmpOr(k, "(none)"), m[k]))
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// gatheredCounter sums the counter name over every replica's metrics.
func gatheredCounter(g prometheus.Gatherer, name string, rep *Report) int {
	families, err := g.Gather()
	if err != nil {
		rep.violate("gather the replicas' metrics: %v", err)
		return 0
	}
	n := 0
	for _, mf := range families {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				n += int(m.GetCounter().GetValue())
			}
		}
	}
	return n
}

// gatheredOutcomes sums sbclaim_messages_total by outcome over every
// replica's metrics, registered on g by sbclaim.NewProcessor (each
// replica's under its own host label). A gather that fails is a
// violation: the report must not show counts it could not read.
func gatheredOutcomes(g prometheus.Gatherer, rep *Report) map[processor.Result]int {
	out := map[processor.Result]int{}
	families, err := g.Gather()
	if err != nil {
		rep.violate("gather the replicas' metrics: %v", err)
		return out
	}
	for _, mf := range families {
		if mf.GetName() != "sbclaim_messages_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" {
					out[processor.Result(l.GetValue())] += int(m.GetCounter().GetValue())
				}
			}
		}
	}
	return out
}
