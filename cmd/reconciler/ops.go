package main

import (
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os/user"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sbclaim/sbclaim"
	ops "github.com/sbclaim/sbclaim/operator"
)

// previewBytes is how much of a stored payload show prints.
const previewBytes = 200

func listFlags(fs *flag.FlagSet) func(context.Context, *env, []string) int {
	state := fs.String("state", "flagged", "comma-separated states to list ("+joinStates()+"), or all")
	consumer := fs.String("consumer", "", "only claims of this consumer")
	olderThan := fs.Duration("older-than", 0, "only claims claimed longer ago than this (e.g. 1h)")
	limit := fs.Int("limit", 100, "at most this many claims")
	asJSON := fs.Bool("json", false, "print a JSON array instead of a table")
	return func(ctx context.Context, e *env, args []string) int {
		if len(args) > 0 {
			fmt.Fprintf(e.stderr, "reconciler list: unexpected arguments %q\n", args)
			return exitUsage
		}
		states, err := parseStates(*state)
		if err != nil {
			fmt.Fprintf(e.stderr, "reconciler list: --state: %v\n", err)
			return exitUsage
		}
		if *limit < 1 || *olderThan < 0 {
			fmt.Fprintln(e.stderr, "reconciler list: --limit must be at least 1 and --older-than not negative")
			return exitUsage
		}
		st, err := e.openStore(ctx)
		if err != nil {
			return e.fail("list", err)
		}
		defer st.Close()

		var claims []*sbclaim.Claim
		filter := sbclaim.ClaimFilter{States: states, Consumer: *consumer, OlderThan: *olderThan}
		for len(claims) < *limit {
			filter.Limit = min(*limit-len(claims), 500)
			page, err := st.Claims(ctx, filter)
			if err != nil {
				return e.fail("list", err)
			}
			claims = append(claims, page...)
			if len(page) < filter.Limit {
				break
			}
			filter.AfterID = page[len(page)-1].ID
		}
		if *asJSON {
			return e.writeJSON("list", toJSON(claims...))
		}
		now, err := st.Now(ctx)
		if err != nil {
			return e.fail("list", err)
		}
		if len(claims) == 0 {
			fmt.Fprintf(e.stdout, "no %s claims\n", strings.Join(stateNames(states), "/"))
			return exitOK
		}
		writeTable(e.stdout, claims, now)
		return exitOK
	}
}

func writeTable(w io.Writer, claims []*sbclaim.Claim, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tCONSUMER\tMESSAGE ID\tCLAIMED\tHEARTBEAT\tATTEMPTS\tREASON / LAST ERROR")
	for _, c := range claims {
		why := c.FlagReason
		switch {
		case c.State == sbclaim.StateFailed:
			why = c.FailReason + ": " + c.LastError
		case why == "":
			why = c.LastError
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s ago\t%s ago\t%d\t%s\n",
			c.ID, c.State, printable(c.Consumer, 40), printable(c.DedupKey, 40),
			age(now, c.ClaimedAt), age(now, c.HeartbeatAt), c.Attempts, printable(why, 60))
	}
	tw.Flush()
}

func showFlags(fs *flag.FlagSet) func(context.Context, *env, []string) int {
	asJSON := fs.Bool("json", false, "print the claim as JSON")
	return func(ctx context.Context, e *env, args []string) int {
		id, ok := e.claimID("show", args)
		if !ok {
			return exitUsage
		}
		st, err := e.openStore(ctx)
		if err != nil {
			return e.fail("show", err)
		}
		defer st.Close()
		c, err := st.Claim(ctx, id)
		if err != nil {
			return e.fail("show", fmt.Errorf("claim %d: %w", id, err))
		}
		h, err := ops.History(ctx, st, id)
		if err != nil {
			return e.fail("show", fmt.Errorf("history of claim %d: %w", id, err))
		}
		fus, err := st.FollowUps(ctx, id)
		if err != nil {
			return e.fail("show", fmt.Errorf("follow-ups of claim %d: %w", id, err))
		}
		if *asJSON {
			j := toJSON(c)[0]
			j.History = historyJSON(h)
			j.FollowUps = followUpsJSON(fus)
			return e.writeJSON("show", j)
		}
		now, err := st.Now(ctx)
		if err != nil {
			return e.fail("show", err)
		}
		writeClaim(e.stdout, c, h, now)
		writeFollowUps(e.stdout, fus)
		return exitOK
	}
}

// writeClaim prints one claim for an operator: identity, state and times
// (ages by the database clock), the payload (hash and a safe preview) and
// the audit trail. Each block writes to one tabwriter, so the columns of
// every block line up; a new block is one more function called here.
func writeClaim(w io.Writer, c *sbclaim.Claim, h []ops.HistoryEntry, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	writeClaimFields(tw, c, now)
	if len(h) > 0 {
		writeHistory(tw, c, h)
	} else {
		writeAuditTrail(tw, c)
	}
	tw.Flush()
}

// writeHistory prints the claim's history: one row per change of its
// owner or state, oldest first.
func writeHistory(tw io.Writer, c *sbclaim.Claim, h []ops.HistoryEntry) {
	fmt.Fprintln(tw, "History (one row per change of owner or state, kept with the claim)")
	for _, e := range h {
		fmt.Fprintf(tw, "  %s\t%s\tby %s\t%s\n", ts(e.At), e.What, dash(printable(e.By, 0)), printable(e.Detail, 0))
	}
	if c.LateSuccessAt != nil {
		fmt.Fprintf(tw, "  %s\tlate success\tby %s\tthe effect succeeded after it had lost the claim: the effect DID happen\n",
			ts(*c.LateSuccessAt), printable(c.LateSuccessBy, 0))
	}
}

// writeClaimFields prints the claim's row, one "name: value" line each.
func writeClaimFields(tw io.Writer, c *sbclaim.Claim, now time.Time) {
	row := func(k, v string) { fmt.Fprintf(tw, "  %s\t%s\n", k, v) }
	fmt.Fprintf(tw, "Claim %d\n", c.ID)
	row("message id:", printable(c.DedupKey, 0))
	row("consumer:", printable(c.Consumer, 0))
	row("state:", string(c.State))
	row("entity:", dash(printable(c.Entity, 0)))
	row("subject:", dash(printable(c.Subject, 0)))
	row("content type:", dash(printable(c.ContentType, 0)))
	if len(c.Properties) > 0 {
		for i, k := range slices.Sorted(maps.Keys(c.Properties)) {
			label := ""
			if i == 0 {
				label = "properties:"
			}
			row(label, printable(k, 0)+"="+printable(c.Properties[k], 100))
		}
	} else {
		row("properties:", "-")
	}
	row("route:", dash(printable(c.Route, 0))+fingerprintNote(c))
	row("key form:", c.KeyForm)
	row("idempotency key:", printable(c.IdempotencyKey, 0)+keyNote(c))
	row("owner:", c.Owner)
	row("claimed by:", dash(printable(c.ClaimedBy, 0)))
	row("take-overs:", strconv.Itoa(c.TakeOvers))
	row("recoveries:", strconv.Itoa(c.Recoveries))
	row("next attempt:", stamp(now, c.NextAttemptAt))
	if c.DeferredSeq != nil || c.Postponements > 0 {
		row("deferred message:", deferredNote(c))
		row("due at:", stamp(now, c.DueAt))
		row("postponements:", strconv.Itoa(c.Postponements)+", first at "+stamp(now, c.PostponedAt))
	}
	row("delivery count:", strconv.Itoa(c.DeliveryCount))
	row("claimed at:", stamp(now, &c.ClaimedAt))
	row("heartbeat at:", stamp(now, &c.HeartbeatAt)+heartbeatNote(c))
	row("processed at:", stamp(now, c.ProcessedAt))
	row("released at:", stamp(now, c.ReleasedAt))
	if c.State == sbclaim.StateFailed || c.FailedAt != nil {
		row("failed at:", stamp(now, c.FailedAt))
		row("fail reason:", dash(printable(c.FailReason, 0))+"  (the message's dead-letter reason)")
		row("dead letter:", deadLetterNote(c))
	}
	row("attempts:", strconv.Itoa(c.Attempts))
	row("last error:", dash(printable(c.LastError, 0)))
	row("answer:", answerText(c.Answer))
	if c.AnswerAt != nil {
		row("answer at:", stamp(now, c.AnswerAt))
	}
	row("payload hash:", "sha256:"+hex.EncodeToString(c.PayloadHash))
	row("payload:", payloadPreview(c))
}

// writeAuditTrail prints what the claim's row keeps of its story, oldest
// first: the claim, the last take-over, flag, key revision and
// resolution.
func writeAuditTrail(tw io.Writer, c *sbclaim.Claim) {
	fmt.Fprintln(tw, "Audit trail (the claim is older than its history: the row keeps the last take-over, flag and resolution)")
	first := printable(c.ClaimedBy, 0)
	switch {
	case c.TakeOvers == 1:
		first = printable(c.PreviousHolder, 0)
	case c.TakeOvers > 1:
		first = "(not kept: taken over since)"
	}
	fmt.Fprintf(tw, "  %s\tclaimed\tby %s\n", ts(c.ClaimedAt), dash(first))
	if c.ReleasedAt != nil {
		fmt.Fprintf(tw, "  %s\treleased\t%s\n", ts(*c.ReleasedAt), printable(c.LastError, 0))
	}
	if c.TakenOverAt != nil {
		more := ""
		if c.TakeOvers > 1 {
			more = fmt.Sprintf(" (the last of %d take-overs)", c.TakeOvers)
		}
		fmt.Fprintf(tw, "  %s\ttaken over\tby %s via %s from %s (owner %s)%s: %s\n", ts(*c.TakenOverAt), printable(c.ClaimedBy, 0),
			c.TakeOverPath, dash(printable(c.PreviousHolder, 0)), cmp.Or(c.PreviousOwner, nilOwner), more, printable(c.TakeOverReason, 0))
	}
	if c.FlaggedAt != nil {
		fmt.Fprintf(tw, "  %s\tflagged\t%s\n", ts(*c.FlaggedAt), dash(printable(c.FlagReason, 0)))
	}
	if c.KeyRevisedAt != nil {
		fmt.Fprintf(tw, "  %s\tnew key\t%s (revision %d) chosen by %s: %s\n", ts(*c.KeyRevisedAt), printable(c.IdempotencyKey, 0), c.KeyRevision,
			dash(printable(c.KeyRevisedBy, 0)), printable(c.KeyRevisionNote, 0))
	}
	if c.FailedAt != nil {
		fmt.Fprintf(tw, "  %s\tfailed\t%s: %s\n", ts(*c.FailedAt), printable(c.FailReason, 0), printable(c.LastError, 0))
	}
	if c.LateSuccessAt != nil {
		fmt.Fprintf(tw, "  %s\tlate success\tthe effect of %s succeeded after it had lost the claim: the effect DID happen\n",
			ts(*c.LateSuccessAt), printable(c.LateSuccessBy, 0))
	}
	if c.ProcessedAt != nil && (c.ResolvedAt == nil || c.Resolution != sbclaim.ResolutionRedriven) {
		fmt.Fprintf(tw, "  %s\tprocessed\t\n", ts(*c.ProcessedAt))
	}
	if c.ResolvedAt != nil {
		fmt.Fprintf(tw, "  %s\tresolved\tas %s by %s: %s\n", ts(*c.ResolvedAt), c.Resolution,
			printable(c.ResolvedBy, 0), printable(c.ResolutionNote, 0))
	}
}

// nilOwner is how an owner token that was never set prints.
const nilOwner = "00000000-0000-0000-0000-000000000000"

func fingerprintNote(c *sbclaim.Claim) string {
	if c.Fingerprint == "" {
		return ""
	}
	return "  (effect fingerprint " + c.Fingerprint + ")"
}

func heartbeatNote(c *sbclaim.Claim) string {
	switch c.State {
	case sbclaim.StateClaimed:
		return "  (time since the owning processor last showed life)"
	case sbclaim.StateReleased:
		return "  (released: waiting for a redelivery to take it over)"
	case sbclaim.StateFailed:
		return "  (failed: a final answer; never taken over)"
	}
	return ""
}

// keyNote says where a claim's idempotency key comes from.
func keyNote(c *sbclaim.Claim) string { return "  (" + printable(c.KeyFormNote, 0) + ")" }

// entryJSON is a history entry for scripts.
type entryJSON struct {
	ID            int64                `json:"id"`
	At            time.Time            `json:"at"`
	What          string               `json:"what"`
	From          sbclaim.ClaimState   `json:"from"`
	To            sbclaim.ClaimState   `json:"to"`
	By            string               `json:"by"`
	Path          sbclaim.TakeOverPath `json:"path,omitempty"`
	Reason        string               `json:"reason"`
	PreviousOwner string               `json:"previous_owner,omitempty"`
	Owner         string               `json:"owner"`
	Key           string               `json:"key"`
}

func historyJSON(h []ops.HistoryEntry) []entryJSON {
	out := make([]entryJSON, len(h))
	for i, e := range h {
		out[i] = entryJSON{ID: e.ID, At: e.At, What: e.What, From: e.From, To: e.To, By: e.By, Path: e.Path,
			Reason: e.Reason, PreviousOwner: e.PreviousOwner, Owner: e.Owner, Key: e.Key}
	}
	return out
}

// deadLetterNote says which delivery dead-letters a failed claim's
// message.
func deadLetterNote(c *sbclaim.Claim) string {
	if c.DeadLetterSeq == nil {
		return "none yet: the next delivery of its message, if one comes, is dead-lettered with the fail reason"
	}
	return fmt.Sprintf("by the delivery with sequence number %d (later copies complete)", *c.DeadLetterSeq)
}

// answerText renders the downstream's last answer on one line: the
// status, the step, the recorded headers and fields (each value escaped).
func answerText(a *sbclaim.Answer) string {
	if a == nil {
		return "-"
	}
	var b strings.Builder
	if a.Status != 0 {
		fmt.Fprintf(&b, "HTTP %d", a.Status)
	} else {
		b.WriteString("no status")
	}
	if a.Step != "" {
		fmt.Fprintf(&b, " (step %s)", printable(a.Step, 0))
	}
	for _, m := range []map[string]string{a.Headers, a.Fields} {
		for _, k := range slices.Sorted(maps.Keys(m)) {
			fmt.Fprintf(&b, "  %s=%s", printable(k, 0), printable(m[k], 100))
		}
	}
	if a.Truncated {
		b.WriteString("  (truncated)")
	}
	return b.String()
}

// payloadPreview renders a stored payload safely for a terminal: at most
// previewBytes, every non-printable byte escaped, truncation said plainly.
func payloadPreview(c *sbclaim.Claim) string {
	p := c.Payload
	if p == nil {
		switch {
		case c.ProcessedAt != nil:
			return "(not stored: cleared when the claim was processed)"
		case c.FailedAt != nil:
			return "(not stored: cleared when the claim failed)"
		}
		return "(not stored)"
	}
	if len(p) <= previewBytes {
		return fmt.Sprintf("%d bytes: %s", len(p), strconv.Quote(string(p)))
	}
	return fmt.Sprintf("%d bytes: %s ... (truncated: first %d of %d bytes shown)",
		len(p), strconv.Quote(string(p[:previewBytes])), previewBytes, len(p))
}

func resolveFlags(fs *flag.FlagSet) func(context.Context, *env, []string) int {
	as := fs.String("as", "", "resolution: done (the effect happened, checked by hand) or discarded (it must not happen)")
	note := fs.String("note", "", "why (required; kept on the claim)")
	by := fs.String("by", "", "operator name (default: $SBCLAIM_OPERATOR, else the OS user)")
	return func(ctx context.Context, e *env, args []string) int {
		id, ok := e.claimID("resolve", args)
		if !ok {
			return exitUsage
		}
		res := sbclaim.Resolution(*as)
		if res != sbclaim.ResolutionDone && res != sbclaim.ResolutionDiscarded {
			fmt.Fprintf(e.stderr, "reconciler resolve: --as must be done or discarded (got %q); use 'reconciler redrive' to re-run the effect\n", *as)
			return exitUsage
		}
		if strings.TrimSpace(*note) == "" {
			fmt.Fprintln(e.stderr, "reconciler resolve: --note is required: say why, for whoever reads this claim next")
			return exitUsage
		}
		operator, err := e.operator(*by)
		if err != nil {
			fmt.Fprintf(e.stderr, "reconciler resolve: %v\n", err)
			return exitUsage
		}
		st, err := e.openStore(ctx)
		if err != nil {
			return e.fail("resolve", err)
		}
		defer st.Close()
		c, err := ops.Resolve(ctx, st, id, res, operator, *note)
		if err != nil {
			return e.refuse("resolve", id, err)
		}
		e.logger.Info("claim resolved", "claim_id", c.ID, "message_id", c.DedupKey, "consumer", c.Consumer,
			"resolution", c.Resolution, "by", c.ResolvedBy)
		fmt.Fprintf(e.stdout, "claim %d resolved as %s by %s\n", c.ID, c.Resolution, printable(c.ResolvedBy, 0))
		return exitOK
	}
}

func redriveFlags(fs *flag.FlagSet) func(context.Context, *env, []string) int {
	by := fs.String("by", "", "operator name (default: $SBCLAIM_OPERATOR, else the OS user)")
	note := fs.String("note", "redriven", "note kept on the claim (required with --new-key and --handoff)")
	newKey := fs.Bool("new-key", false, "redrive under a new idempotency key (the claim's key with :r<N>), recorded on the claim: only for a route with allowNewKey, "+
		"and only after checking the downstream did nothing under the old key (see docs/flagged-claims.md)")
	handOff := fs.Bool("handoff", false, "for a claim whose route is not in the routes file (a Go handler in your own binary): hand it off, "+
		"released for the reconciler passes running in that binary, which re-run it with the same idempotency key")
	return func(ctx context.Context, e *env, args []string) int {
		id, ok := e.claimID("redrive", args)
		if !ok {
			return exitUsage
		}
		noteGiven := false
		fs.Visit(func(f *flag.Flag) { noteGiven = noteGiven || f.Name == "note" })
		switch {
		case *newKey && *handOff:
			fmt.Fprintln(e.stderr, "reconciler redrive: --new-key and --handoff go separately: a hand-off re-runs the claim with its key")
			return exitUsage
		case *newKey && (!noteGiven || strings.TrimSpace(*note) == ""):
			fmt.Fprintln(e.stderr, "reconciler redrive: --new-key needs --note: say what you checked on the downstream "+
				"(that it did nothing under the old key), for whoever reads this claim next")
			return exitUsage
		case *handOff && (!noteGiven || strings.TrimSpace(*note) == ""):
			fmt.Fprintln(e.stderr, "reconciler redrive: --handoff needs --note: say why it should run again, for whoever reads this claim next")
			return exitUsage
		case !*handOff && e.cfg.RoutesPath == "":
			fmt.Fprintln(e.stderr, "reconciler redrive: SBCLAIM_ROUTES (--routes) is required: the processors' routes file (or consumer=path pairs); "+
				"for a claim whose route is a Go handler in your own binary, use --handoff")
			return exitUsage
		}
		operator, err := e.operator(*by)
		if err != nil {
			fmt.Fprintf(e.stderr, "reconciler redrive: %v\n", err)
			return exitUsage
		}
		var routers map[string]*sbclaim.Router
		if !*handOff {
			if routers, err = e.routes(); err != nil {
				return e.fail("redrive", err)
			}
		}
		st, err := e.openStore(ctx)
		if err != nil {
			return e.fail("redrive", err)
		}
		defer st.Close()

		if *handOff {
			return e.handOff(ctx, st, id, operator, *note)
		}
		c, err := ops.Redrive(ctx, st, id, ops.RedriveOptions{
			By: operator, Note: *note, NewKey: *newKey, Routers: routers, Logger: e.logger,
			HeartbeatInterval: e.cfg.HeartbeatInterval, QueryTimeout: e.cfg.QueryTimeout,
		})
		var act *ops.ActionError
		if err == nil {
			key := "idempotency key " + printable(c.IdempotencyKey, 0)
			if *newKey {
				key = fmt.Sprintf("the new idempotency key %s (revision %d, recorded on the claim)", printable(c.IdempotencyKey, 0), c.KeyRevision)
			}
			fmt.Fprintf(e.stdout, "claim %d redriven: the effect succeeded with %s; resolved as %s by %s\n",
				c.ID, key, c.Resolution, printable(c.ResolvedBy, 0))
			if c.Answer != nil {
				fmt.Fprintf(e.stdout, "answer: %s\n", answerText(c.Answer))
			}
			return exitOK
		}
		if !errors.As(err, &act) {
			return e.refuse("redrive", id, err)
		}
		switch {
		case act.Kind == ops.ActionEffectFailed && act.Outcome.Final():
			status := ""
			if act.Answer != nil && act.Answer.Status != 0 {
				status = fmt.Sprintf(" (HTTP %d)", act.Answer.Status)
			}
			back := "The claim is failed: a final answer; it is never redriven or flagged again (only retried after a fix: reconciler retry), and the next delivery of its message, if one comes, is dead-lettered."
			if !act.Failed {
				back = "Failing the claim could not be written: the redrive's hold lapses within SBCLAIM_STALE_AFTER, and the reconciler's next run gets the same answer."
			}
			fmt.Fprintf(e.stderr, "reconciler redrive: claim %d: the downstream gave a final answer with idempotency key %s: outcome %s%s: %v\n%s\n",
				id, printable(act.IdempotencyKey, 0), act.Outcome, status, act.Err, back)
			return exitFailure
		case act.Kind == ops.ActionEffectFailed:
			back := "The claim is flagged again with this failure as its reason."
			if !act.Reflagged {
				back = "Flagging it again failed too: the reconciler flags it again within SBCLAIM_STALE_AFTER."
			}
			maybe := ""
			if act.Outcome == sbclaim.OutcomeUnknown {
				maybe = " The outcome is unknown: the effect MAY have been performed; check the downstream before you resolve it."
			}
			fmt.Fprintf(e.stderr, "reconciler redrive: claim %d: the effect failed with idempotency key %s (outcome %s after %d attempt(s)): %v\n%s%s\n"+
				"Redrive it again later, or resolve it by hand: reconciler resolve %d --as done|discarded --note '...'\n",
				id, printable(act.IdempotencyKey, 0), act.Outcome, act.Attempts, act.Err, back, maybe, id)
			return exitFailure
		case act.Kind == ops.ActionNotRecorded:
			fmt.Fprintf(e.stderr, "reconciler redrive: claim %d: the effect WAS performed (idempotency key %s), but recording it failed: %v\n"+
				"Do NOT redrive it again to be sure: it happened. The claim stays held by this redrive until its hold lapses;\n"+
				"within SBCLAIM_STALE_AFTER the reconciler flags it again (\"redrive ... stopped\"), then record it:\n"+
				"  reconciler resolve %d --as done --note 'redrive performed the effect; recording failed'\n",
				id, printable(act.IdempotencyKey, 0), act.Err, id)
			return exitFailure
		}
		code := e.refuse("redrive", id, err)
		if c := act.Claim; c != nil && c.State == sbclaim.StateFlagged && c.Payload != nil && !routesHere(routers, c) {
			// Its effect is code the routes file does not have: a Go
			// handler in the user's own binary can run it.
			fmt.Fprintf(e.stderr, "Its route %s is not in the routes file: if it is a Go handler in your own binary, hand it off to that binary's reconciler:\n"+
				"  reconciler redrive %d --handoff --note '...'\n", dash(strconv.Quote(c.Route)), id)
		}
		return code
	}
}

// routesHere reports whether the routers route a claim to the route it
// was taken for, so that a redrive here can run its effect.
func routesHere(routers map[string]*sbclaim.Router, c *sbclaim.Claim) bool {
	r := routerFor(routers, c.Consumer)
	if r == nil {
		return false
	}
	name, ok := ops.RouteOf(r, c)
	return ok && (c.Route == "" || name == c.Route)
}

// handOff is the redrive of a claim whose effect is a Go handler in the
// user's own binary: released, audited, for that binary's reconciler
// passes to re-run with the claim's idempotency key.
func (e *env) handOff(ctx context.Context, st *sbclaim.Store, id int64, operator, note string) int {
	c, err := ops.HandOff(ctx, st, id, operator, note)
	if err != nil {
		return e.refuse("redrive", id, err)
	}
	e.logger.Info("claim handed off", "claim_id", c.ID, "message_id", c.DedupKey, "consumer", c.Consumer, "route", c.Route, "by", operator)
	fmt.Fprintf(e.stdout, "claim %d handed off by %s: released for the reconciler that runs route %s, which re-runs it with idempotency key %s\n"+
		"within its SBCLAIM_STALE_AFTER; 'reconciler show %d' tells how it ended\n",
		c.ID, printable(operator, 0), dash(strconv.Quote(c.Route)), printable(c.IdempotencyKey, 0), c.ID)
	return exitOK
}

// refuse explains an action that did not happen: a refusal (someone else
// acted first, or the claim cannot take the action) says what the claim
// is now, and that nothing was changed.
func (e *env) refuse(cmd string, id int64, err error) int {
	var act *ops.ActionError
	switch {
	case errors.As(err, &act) && act.Kind == ops.ActionRefused:
		fmt.Fprintf(e.stderr, "reconciler %s: refused: %s\n", cmd, printable(act.Error(), 0))
		return exitFailure
	case errors.Is(err, sbclaim.ErrNotFound):
		return e.fail(cmd, fmt.Errorf("claim %d not found", id))
	}
	return e.fail(cmd, err)
}

func (e *env) claimID(cmd string, args []string) (int64, bool) {
	if len(args) != 1 {
		fmt.Fprintf(e.stderr, "reconciler %s: want exactly one claim id (got %d arguments)\n", cmd, len(args))
		return 0, false
	}
	id, err := strconv.ParseInt(args[0], 10, 64)
	if err != nil || id < 1 {
		fmt.Fprintf(e.stderr, "reconciler %s: claim id %q is not a positive integer\n", cmd, args[0])
		return 0, false
	}
	return id, true
}

// operator is who acts: --by, else SBCLAIM_OPERATOR, else the OS user.
func (e *env) operator(by string) (string, error) {
	if by = strings.TrimSpace(by); by != "" {
		return by, nil
	}
	if e.cfg.Operator != "" {
		return e.cfg.Operator, nil
	}
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username, nil
	}
	return "", errors.New("cannot tell who you are: pass --by or set SBCLAIM_OPERATOR")
}

func (e *env) writeJSON(cmd string, v any) int {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return e.fail(cmd, err)
	}
	return exitOK
}

// claimJSON is a claim for scripts: snake_case fields, the payload hash in
// hex, the payload itself left out (it may hold personal data; use show).
type claimJSON struct {
	ID              int64              `json:"id"`
	MessageID       string             `json:"message_id"`
	Consumer        string             `json:"consumer"`
	Owner           string             `json:"owner"`
	State           sbclaim.ClaimState `json:"state"`
	Entity          string             `json:"entity"`
	Subject         string             `json:"subject"`
	ContentType     string             `json:"content_type"`
	Properties      map[string]string  `json:"properties"`
	PayloadHash     string             `json:"payload_hash"`
	PayloadSize     *int               `json:"payload_size"` // null when not stored
	DeliveryCount   int                `json:"delivery_count"`
	ClaimedBy       string             `json:"claimed_by"`
	ClaimedAt       time.Time          `json:"claimed_at"`
	HeartbeatAt     time.Time          `json:"heartbeat_at"`
	ProcessedAt     *time.Time         `json:"processed_at"`
	ReleasedAt      *time.Time         `json:"released_at"`
	Attempts        int                `json:"attempts"`
	LastError       string             `json:"last_error"`
	FlaggedAt       *time.Time         `json:"flagged_at"`
	FlagReason      string             `json:"flag_reason"`
	ResolvedAt      *time.Time         `json:"resolved_at"`
	ResolvedBy      string             `json:"resolved_by"`
	Resolution      sbclaim.Resolution `json:"resolution"`
	ResolutionNote  string             `json:"resolution_note"`
	Route           string             `json:"route"`
	Fingerprint     string             `json:"fingerprint"`
	TakeOvers       int                `json:"take_overs"`
	TakenOverAt     *time.Time         `json:"taken_over_at"`
	TakeOverPath    string             `json:"take_over_path"`
	TakeOverReason  string             `json:"take_over_reason"`
	PreviousOwner   string             `json:"previous_owner"`
	PreviousHolder  string             `json:"previous_holder"`
	Recoveries      int                `json:"recoveries"`
	NextAttemptAt   *time.Time         `json:"next_attempt_at"`
	LateSuccessAt   *time.Time         `json:"late_success_at"`
	LateSuccessBy   string             `json:"late_success_by"`
	FailedAt        *time.Time         `json:"failed_at"`
	FailReason      string             `json:"fail_reason"`
	DeadLetterSeq   *int64             `json:"dead_letter_seq"` // the delivery that dead-letters a failed claim; null: none yet
	Answer          *answerJSON        `json:"answer"`          // the downstream's last answer; null: none
	AnswerAt        *time.Time         `json:"answer_at"`
	Key             string             `json:"idempotency_key"` // what the effect is sent with
	KeyRevision     int                `json:"key_revision"`
	KeyRevisedBy    string             `json:"key_revised_by"`
	KeyRevisedAt    *time.Time         `json:"key_revised_at"`
	KeyRevisionNote string             `json:"key_revision_note"`
	KeyForm         string             `json:"key_form"`
	DeferredSeq     *int64             `json:"deferred_seq"` // the deferred message's sequence number; null: none
	DueAt           *time.Time         `json:"due_at"`       // when the deferred message is fetched; null: not waiting
	Postponements   int                `json:"postponements"`
	PostponedAt     *time.Time         `json:"postponed_at"` // the first postponement
	// History is the claim's history (show only).
	History []entryJSON `json:"history,omitempty"`
	// FollowUps are the messages its effect published (show only).
	FollowUps []followUpJSON `json:"follow_ups,omitempty"`
}

// followUpJSON is one follow-up of a claim for scripts.
type followUpJSON struct {
	Position      int        `json:"position"`
	MessageID     string     `json:"message_id"`
	To            string     `json:"to"`
	Subject       string     `json:"subject,omitempty"`
	Sent          bool       `json:"sent"`
	SentAt        *time.Time `json:"sent_at"`
	Attempts      int        `json:"attempts"`
	LastError     string     `json:"last_error,omitempty"`
	NextAttemptAt *time.Time `json:"next_attempt_at"`
}

func followUpsJSON(fus []sbclaim.SentFollowUp) []followUpJSON {
	var out []followUpJSON
	for _, f := range fus {
		out = append(out, followUpJSON{Position: f.Position, MessageID: f.MessageID, To: f.To, Subject: f.Subject, Sent: f.Sent,
			SentAt: f.SentAt, Attempts: f.Attempts, LastError: f.LastError, NextAttemptAt: f.NextAttemptAt})
	}
	return out
}

// writeFollowUps prints the messages the claim's effect published (the
// outbox) and whether each was sent.
func writeFollowUps(w io.Writer, fus []sbclaim.SentFollowUp) {
	if len(fus) == 0 {
		return
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "Follow-ups (messages the effect published, sent by the processors' relay)")
	for _, f := range fus {
		state := "pending"
		if f.Sent && f.SentAt != nil {
			state = "sent " + ts(*f.SentAt)
		}
		detail := ""
		if f.Attempts > 0 {
			detail = fmt.Sprintf("%d attempt(s)", f.Attempts)
		}
		if f.LastError != "" && !f.Sent {
			detail += "; last error: " + printable(f.LastError, 200)
		}
		fmt.Fprintf(tw, "  %d\tto %s\t%s\t%s\t%s\t%s\n", f.Position, printable(f.To, 0), dash(printable(f.Subject, 80)),
			printable(f.MessageID, 0), state, detail)
	}
	tw.Flush()
}

// answerJSON is a claim's answer for scripts.
type answerJSON struct {
	Status    int               `json:"status"`
	Step      string            `json:"step,omitempty"`
	Headers   map[string]string `json:"headers,omitempty"`
	Fields    map[string]string `json:"fields,omitempty"`
	Truncated bool              `json:"truncated,omitempty"`
}

func toAnswerJSON(a *sbclaim.Answer) *answerJSON {
	if a == nil {
		return nil
	}
	return &answerJSON{Status: a.Status, Step: a.Step, Headers: a.Headers, Fields: a.Fields, Truncated: a.Truncated}
}

func toJSON(claims ...*sbclaim.Claim) []claimJSON {
	out := make([]claimJSON, 0, len(claims))
	for _, c := range claims {
		j := claimJSON{
			ID: c.ID, MessageID: c.DedupKey, Consumer: c.Consumer, Owner: c.Owner, State: c.State,
			Entity: c.Entity, Subject: c.Subject, ContentType: c.ContentType, Properties: c.Properties,
			PayloadHash: hex.EncodeToString(c.PayloadHash), DeliveryCount: c.DeliveryCount, ClaimedBy: c.ClaimedBy,
			ClaimedAt: c.ClaimedAt, HeartbeatAt: c.HeartbeatAt, ProcessedAt: c.ProcessedAt, ReleasedAt: c.ReleasedAt,
			Attempts: c.Attempts, LastError: c.LastError, FlaggedAt: c.FlaggedAt, FlagReason: c.FlagReason,
			ResolvedAt: c.ResolvedAt, ResolvedBy: c.ResolvedBy, Resolution: c.Resolution, ResolutionNote: c.ResolutionNote,
			Route: c.Route, Fingerprint: c.Fingerprint, TakeOvers: c.TakeOvers, TakenOverAt: c.TakenOverAt,
			TakeOverPath: string(c.TakeOverPath), TakeOverReason: c.TakeOverReason, PreviousOwner: c.PreviousOwner, PreviousHolder: c.PreviousHolder,
			Recoveries: c.Recoveries, NextAttemptAt: c.NextAttemptAt, LateSuccessAt: c.LateSuccessAt, LateSuccessBy: c.LateSuccessBy,
			FailedAt: c.FailedAt, FailReason: c.FailReason, DeadLetterSeq: c.DeadLetterSeq, Answer: toAnswerJSON(c.Answer), AnswerAt: c.AnswerAt,
			Key: c.IdempotencyKey, KeyRevision: c.KeyRevision, KeyRevisedBy: c.KeyRevisedBy, KeyRevisedAt: c.KeyRevisedAt, KeyRevisionNote: c.KeyRevisionNote,
			KeyForm:     c.KeyForm,
			DeferredSeq: c.DeferredSeq, DueAt: c.DueAt, Postponements: c.Postponements, PostponedAt: c.PostponedAt,
		}
		if c.Payload != nil {
			n := len(c.Payload)
			j.PayloadSize = &n
		}
		if j.Properties == nil {
			j.Properties = map[string]string{}
		}
		out = append(out, j)
	}
	return out
}

func parseStates(s string) ([]sbclaim.ClaimState, error) {
	if s == "all" || s == "" {
		return nil, nil
	}
	var states []sbclaim.ClaimState
	for part := range strings.SplitSeq(s, ",") {
		st := sbclaim.ClaimState(strings.TrimSpace(part))
		if !st.Valid() {
			return nil, fmt.Errorf("unknown state %q (want %s, or all)", part, joinStates())
		}
		states = append(states, st)
	}
	return states, nil
}

func joinStates() string { return strings.Join(stateNames(sbclaim.ClaimStates()), ", ") }

func stateNames(states []sbclaim.ClaimState) []string {
	if len(states) == 0 {
		return []string{"matching"}
	}
	names := make([]string, len(states))
	for i, s := range states {
		names[i] = string(s)
	}
	return names
}

// printable makes producer-controlled text safe for a terminal: control
// and other non-printable characters are escaped; max > 0 truncates.
func printable(s string, max int) string {
	q := strconv.Quote(s)
	q = q[1 : len(q)-1]
	if r := []rune(q); max > 0 && len(r) > max {
		return string(r[:max-3]) + "..."
	}
	return q
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func ts(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000Z") }

func stamp(now time.Time, t *time.Time) string {
	if t == nil {
		return "-"
	}
	return ts(*t) + " (" + age(now, *t) + " ago)"
}

// age is now - t by the database clock, rounded for reading.
func age(now, t time.Time) string {
	d := now.Sub(t)
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	case d < 48*time.Hour:
		return d.Round(time.Second).String()
	}
	return fmt.Sprintf("%dd%s", d/(24*time.Hour), (d % (24 * time.Hour)).Round(time.Minute))
}

// deferredNote explains a claim's deferred message.
func deferredNote(c *sbclaim.Claim) string {
	switch {
	case c.DeferredSeq == nil:
		return "-  (none now)"
	case c.Deferred:
		return fmt.Sprintf("sequence number %d, deferred at Service Bus until it is due", *c.DeferredSeq)
	case c.State == sbclaim.StateClaimed:
		return fmt.Sprintf("sequence number %d, claim held by %s (the message is fetched, or stays deferred until it is settled)", *c.DeferredSeq, printable(c.ClaimedBy, 0))
	case c.State == sbclaim.StateReleased:
		return fmt.Sprintf("sequence number %d, handed back: fetched again once its holder is silent", *c.DeferredSeq)
	}
	return fmt.Sprintf("sequence number %d (not waiting for it: it is settled once its holder is silent, or forgotten if it is gone)", *c.DeferredSeq)
}
