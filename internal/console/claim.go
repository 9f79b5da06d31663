package console

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/reconciler"
)

// previewBytes is how much of a stored payload the claim page shows.
const previewBytes = 4096

type claimData struct {
	C             *claim.Claim
	Props         [][2]string
	Payload       payloadView
	Hash          string
	PreviousOwner string
	Trail         []event
	// History: Trail comes from the claim's history (every change); else
	// (a claim older than the history) from what its row keeps.
	History bool
	Answer  *answerView // nil: no answer recorded
	KeyNote string      // where the idempotency key comes from
	// Failed: the downstream's answer is final; the page shows why and
	// offers no action.
	Failed     bool
	FailWhy    string // what the fail reason means
	DeadLetter string // which delivery dead-letters its message
	// Actions: shown when the claim is flagged and someone is signed in.
	Flagged    bool
	CanRedrive bool
	NoRedrive  string // why redrive is not offered
	// HandOff: the routes do not have the claim's route (a Go handler in
	// the user's own binary), so the page offers to hand it to the
	// binary that runs it; HandOffWhy says so.
	HandOff    bool
	HandOffWhy string
	// NewKey is the key a redrive under a new key would use, "" when the
	// claim's route does not allow one (or redrive is not offered).
	NewKey string
	// Retry: the claim is failed and someone is signed in: the page offers
	// to retry it after a fix, here (CanRedrive, with RetryNewKey the key a
	// retry under a new key would use, "" when the route does not allow
	// one) or handed off (RetryHandOff: its route is not here, or its
	// payload was not stored: then its re-submitted dead letter runs it).
	Retry        bool
	RetryHandOff bool
	// FollowUps are the messages the claim's effect published (the
	// outbox), by position; none when the store has no outbox.
	FollowUps   []*claim.StoredFollowUp
	RetryNewKey string
	MaxNote     int
}

// answerView is the downstream's recorded answer as the page lists it:
// headers and fields sorted by name, so two views of a claim read alike.
type answerView struct {
	Status    int
	Step      string
	Headers   [][2]string
	Fields    [][2]string
	Truncated bool
}

type payloadView struct {
	Stored    bool
	Note      string // why it is not there
	Size      int
	Kind      string // json | text | binary
	Text      string // json or text, as shown
	Truncated bool
}

type event struct {
	At     time.Time
	What   string
	By     string
	Detail string
}

func claimID(r *http.Request) (int64, bool) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	return id, err == nil && id > 0
}

func (s *Server) serveClaim(w http.ResponseWriter, r *http.Request) {
	id, ok := claimID(r)
	if !ok {
		s.renderError(w, r, http.StatusNotFound, "Not found", "Claim ids are positive integers.")
		return
	}
	var flash *Flash
	switch r.URL.Query().Get("done") {
	case "redriven":
		flash = &Flash{Kind: "ok", Title: "Redriven"}
	case "resolved":
		flash = &Flash{Kind: "ok", Title: "Resolved"}
	case "handedoff":
		flash = &Flash{Kind: "ok", Title: "Handed off"}
	case "retried":
		flash = &Flash{Kind: "ok", Title: "Retried"}
	}
	s.renderClaim(w, r, http.StatusOK, id, flash)
}

// renderClaim renders the claim page as the claim is now, with flash (an
// action's outcome) on top. An "ok" flash from a redirect is only kept
// when the claim shows that outcome, so a link cannot make the page claim
// something that did not happen.
func (s *Server) renderClaim(w http.ResponseWriter, r *http.Request, status int, id int64, flash *Flash) {
	v := s.newView(w, r, fmt.Sprintf("Claim %d", id), "claims")
	ctx, cancel := s.storeCtx(r)
	defer cancel()
	c, err := s.opts.Store.Get(ctx, id)
	if errors.Is(err, claim.ErrNotFound) {
		s.renderError(w, r, http.StatusNotFound, "Not found", fmt.Sprintf("There is no claim %d (purged, or never claimed).", id))
		return
	}
	if err != nil {
		s.storeError(w, r, "the claim", err)
		return
	}
	if v.Now, err = s.opts.Store.Now(ctx); err != nil {
		s.storeError(w, r, "the database clock", err)
		return
	}
	if flash != nil && flash.Kind == "ok" {
		switch {
		case flash.Title == "Redriven" && c.State == claim.StateResolved && c.Resolution == claim.ResolutionRedriven:
			flash.Lines = []string{fmt.Sprintf("The effect succeeded with idempotency key %q%s; the claim is resolved as redriven by %s.",
				visible(c.Key()), revisionNote(c), visible(c.ResolvedBy))}
		case flash.Title == "Resolved" && c.State == claim.StateResolved:
			flash.Lines = []string{fmt.Sprintf("Resolved as %s by %s.", c.Resolution, visible(c.ResolvedBy))}
		case flash.Title == "Retried" && c.State == claim.StateResolved && c.Resolution == claim.ResolutionRedriven:
			flash.Lines = []string{fmt.Sprintf("The effect succeeded with idempotency key %q%s; the claim is resolved as redriven by %s. A re-submitted dead letter of its message completes as a duplicate.",
				visible(c.Key()), revisionNote(c), visible(c.ResolvedBy))}
		case flash.Title == "Retried" && c.State == claim.StateReleased && c.TakeOverPath == claim.PathOperator:
			flash.Lines = []string{fmt.Sprintf("Released with idempotency key %q: the reconciler that runs route %q re-runs it from its stored payload once released for its stale window (SBCLAIM_STALE_AFTER); without a stored payload, re-submit its dead letter. This page shows how it ended.",
				visible(c.Key()), visible(c.Route))}
		case flash.Title == "Handed off" && c.State == claim.StateReleased && c.TakeOverPath == claim.PathOperator:
			flash.Lines = []string{fmt.Sprintf("Released for the reconciler that runs route %q, which re-runs it with idempotency key %q once it has been released for its stale window (SBCLAIM_STALE_AFTER). This page shows how it ended.",
				visible(c.Route), visible(c.Key()))}
		default:
			flash = nil
		}
	}
	v.Flash = flash
	h, err := s.opts.Store.History(ctx, id)
	if err != nil && !errors.Is(err, claim.ErrNotFound) {
		s.storeError(w, r, "the claim's history", err)
		return
	}
	d := &claimData{C: c, Hash: "sha256:" + hex.EncodeToString(c.PayloadHash), Payload: preview(c), Trail: historyTrail(c, h),
		History: len(h) > 0 && h[0].What == claim.ChangeClaimed,
		Answer:  viewAnswer(c.Answer), KeyNote: keyNote(c), Failed: c.State == claim.StateFailed,
		FailWhy: failReasons[c.FailReason], DeadLetter: deadLetter(c), Flagged: c.State == claim.StateFlagged, MaxNote: MaxNote}
	if c.PreviousOwner != uuid.Nil {
		d.PreviousOwner = c.PreviousOwner.String()
	}
	if ob, ok := s.opts.Store.(claim.Outbox); ok {
		if d.FollowUps, err = ob.FollowUps(ctx, id); err != nil {
			s.storeError(w, r, "the claim's follow-ups", err)
			return
		}
	}
	d.Props = sortedPairs(c.Properties)
	switch {
	case len(s.opts.Routes) == 0:
		d.NoRedrive = "Redrive is off: the console was started without the processors' routes (SBCLAIM_ROUTES)."
	case c.Payload == nil:
		d.NoRedrive = "Its payload was not stored (payload storage was off when it was claimed), so it cannot be re-run; resolve it by hand."
	default:
		d.CanRedrive = true
	}
	if d.Flagged && c.Payload != nil && !s.routesHere(c) {
		d.HandOff = true
		d.HandOffWhy = fmt.Sprintf("Its route %q is not in the processors' routes this console was given (SBCLAIM_ROUTES): "+
			"if it is a Go handler in your own binary, hand the claim to that binary.", visible(c.Route))
		if c.Route == "" {
			d.HandOffWhy = "The claim records no route, and the processors' routes this console was given (SBCLAIM_ROUTES) route it to no effect: " +
				"if its effect is a Go handler in your own binary, hand the claim to that binary."
		}
	}
	if d.Flagged && d.CanRedrive && s.allowsNewKey(c) {
		d.NewKey = c.NextKey()
	}
	if d.Failed {
		d.Retry = true
		d.RetryHandOff = !s.retryHere(c)
		if !d.RetryHandOff && s.allowsNewKey(c) {
			d.RetryNewKey = c.NextKey()
		}
	}
	v.Title = fmt.Sprintf("Claim %d", c.ID)
	v.Data = d
	s.render(w, status, "claim", v)
}

// allowsNewKey reports whether the routes send c to an effect that allows
// a redrive under a new key (allowNewKey in the routes file), the way
// reconciler.Redrive routes it: a claim its routes do not route, or route
// to another effect than it was taken for, is refused there anyway, so
// the page does not offer the form for it.
func (s *Server) allowsNewKey(c *claim.Claim) bool {
	router := s.opts.Routes.For(c.Consumer)
	if router == nil {
		return false
	}
	h, err := router.Route(reconciler.MessageFromClaim(c))
	return err == nil && h.Effect != nil && h.AllowNewKey && !c.RouteDiffers(h.Name, h.Fingerprint)
}

// retryHere reports whether a retry of c runs its effect here: the
// console has the routes, the claim its payload, and the routes its route.
func (s *Server) retryHere(c *claim.Claim) bool {
	return len(s.opts.Routes) > 0 && c.Payload != nil && s.routesHere(c)
}

// routesHere reports whether the console's routes send c to the route it
// was taken for, so that a redrive here can run its effect (a database-only
// route cannot be re-run anywhere: no hand-off for it either).
func (s *Server) routesHere(c *claim.Claim) bool {
	router := s.opts.Routes.For(c.Consumer)
	if router == nil {
		return false
	}
	h, err := router.Route(reconciler.MessageFromClaim(c))
	return err == nil && (c.Route == "" || h.Name == c.Route || h.Effect == nil)
}

// sortedPairs is m as name/value pairs sorted by name.
func sortedPairs(m map[string]string) [][2]string {
	out := make([][2]string, 0, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, [2]string{k, m[k]})
	}
	return out
}

func viewAnswer(a *claim.Answer) *answerView {
	if a == nil {
		return nil
	}
	return &answerView{Status: a.Status, Step: a.Step, Headers: sortedPairs(a.Headers), Fields: sortedPairs(a.Fields), Truncated: a.Truncated}
}

// failReasons say what each fail reason means, for whoever reads a failed
// claim.
var failReasons = map[string]string{
	claim.FailRejected:  "the downstream's final business answer (such as a card decline); it may have recorded it",
	claim.FailPermanent: "the downstream refused the request for good; not performed",
	claim.FailConflict:  "the downstream says the key was used with another payload",
}

// keyNote says where a claim's idempotency key comes from.
func keyNote(c *claim.Claim) string { return visible(c.FormNote()) }

// revisionNote is keyNote for a sentence about the key: nothing for the
// message id.
func revisionNote(c *claim.Claim) string {
	if c.KeyRevision == 0 {
		return ""
	}
	return fmt.Sprintf(" (a new key, revision %d, chosen by %s)", c.KeyRevision, visible(dash(c.KeyRevisedBy)))
}

// deadLetter says which delivery carries a failed claim's message to the
// dead-letter queue.
func deadLetter(c *claim.Claim) string {
	switch {
	case c.FailedAt == nil:
		return ""
	case c.DeadLetterSeq == nil:
		return "none yet: the next delivery of its message, if one comes, is dead-lettered with the fail reason"
	}
	return fmt.Sprintf("the delivery with sequence number %d (every other copy completes)", *c.DeadLetterSeq)
}

// preview shows a stored payload safely: JSON indented, other valid UTF-8
// as text (control characters other than newline and tab escaped), binary
// as hex; at most previewBytes, the cut said plainly.
func preview(c *claim.Claim) payloadView {
	p := c.Payload
	if p == nil {
		switch {
		case c.ProcessedAt != nil:
			return payloadView{Note: "not stored: cleared when the claim was processed"}
		case c.FailedAt != nil:
			return payloadView{Note: "not stored: cleared when the claim failed"}
		}
		return payloadView{Note: "not stored (payload storage was off when it was claimed)"}
	}
	v := payloadView{Stored: true, Size: len(p)}
	if len(p) > previewBytes {
		p, v.Truncated = p[:previewBytes], true
	}
	var indented bytes.Buffer
	switch {
	case !v.Truncated && json.Valid(p) && json.Indent(&indented, p, "", "  ") == nil:
		v.Kind, v.Text = "json", visibleLines(indented.String())
	case utf8.Valid(p) || (v.Truncated && utf8.Valid(trimPartialRune(p))):
		v.Kind, v.Text = "text", visibleLines(string(trimPartialRune(p)))
	default:
		v.Kind, v.Text = "binary", hex.Dump(p[:min(len(p), 512)])
		if len(p) > 512 {
			v.Truncated = true
		}
	}
	return v
}

// trimPartialRune drops an incomplete UTF-8 sequence left by the cut.
func trimPartialRune(p []byte) []byte {
	for i := 0; i < utf8.UTFMax && len(p) > 0; i++ {
		if utf8.Valid(p) {
			return p
		}
		p = p[:len(p)-1]
	}
	return p
}

// visibleLines is visible, keeping newlines and tabs (a payload's layout).
func visibleLines(s string) string {
	var b []rune
	for _, r := range s {
		switch {
		case r == '\n', r == '\t':
			b = append(b, r)
		case isInvisible(r):
			b = append(b, []rune(visible(string(r)))...)
		default:
			b = append(b, r)
		}
	}
	return string(b)
}

// historyTrail is the claim's audit trail, oldest first: one event per
// entry of its history, and the late success its row notes (no change of
// owner or state). A claim taken before the history existed (its history
// does not start with "claimed") shows, for the time before its first
// entry, what its row keeps (trail).
func historyTrail(c *claim.Claim, h []claim.HistoryEntry) []event {
	if len(h) == 0 {
		return trail(c)
	}
	var out []event
	if h[0].What != claim.ChangeClaimed {
		for _, e := range trail(c) {
			if e.At.Before(h[0].At) && e.What != "late success" {
				out = append(out, e)
			}
		}
	}
	for _, e := range h {
		out = append(out, event{At: e.At, What: string(e.What), By: e.By, Detail: e.Detail()})
	}
	if c.LateSuccessAt != nil {
		out = append(out, event{At: *c.LateSuccessAt, What: "late success", By: c.LateSuccessBy,
			Detail: "its effect succeeded after it had lost the claim: the effect DID happen"})
	}
	slices.SortStableFunc(out, func(a, b event) int { return a.At.Compare(b.At) })
	return out
}

// trail is the claim's audit trail, oldest first, from what its row keeps
// (the last take-over, flag and resolution; earlier ones are counted, not
// kept): for claims taken before the history existed.
func trail(c *claim.Claim) []event {
	first := c.ClaimedBy
	switch {
	case c.TakeOvers == 1:
		first = c.PreviousHolder
	case c.TakeOvers > 1:
		first = "(not kept: taken over since)"
	}
	out := []event{{At: c.ClaimedAt, What: "claimed", By: first, Detail: fmt.Sprintf("delivery %d", c.DeliveryCount)}}
	if c.ReleasedAt != nil {
		out = append(out, event{At: *c.ReleasedAt, What: "released", Detail: c.LastError})
	}
	if c.TakenOverAt != nil {
		detail := fmt.Sprintf("via %s from %s (owner %s)", c.TakeOverPath, dash(c.PreviousHolder), c.PreviousOwner)
		if c.TakeOvers > 1 {
			detail += fmt.Sprintf(", the last of %d take-overs", c.TakeOvers)
		}
		if c.TakeOverReason != "" {
			detail += ": " + c.TakeOverReason
		}
		out = append(out, event{At: *c.TakenOverAt, What: "taken over", By: c.ClaimedBy, Detail: detail})
	}
	if c.FlaggedAt != nil {
		out = append(out, event{At: *c.FlaggedAt, What: "flagged", Detail: c.FlagReason})
	}
	if c.KeyRevisedAt != nil {
		out = append(out, event{At: *c.KeyRevisedAt, What: "new key", By: c.KeyRevisedBy,
			Detail: fmt.Sprintf("%s (revision %d): %s", c.Key(), c.KeyRevision, c.KeyRevisionNote)})
	}
	if c.FailedAt != nil {
		out = append(out, event{At: *c.FailedAt, What: "failed", Detail: c.FailReason + ": " + c.LastError})
	}
	if c.LateSuccessAt != nil {
		out = append(out, event{At: *c.LateSuccessAt, What: "late success", By: c.LateSuccessBy,
			Detail: "its effect succeeded after it had lost the claim: the effect DID happen"})
	}
	if c.ProcessedAt != nil && (c.ResolvedAt == nil || c.Resolution != claim.ResolutionRedriven) {
		out = append(out, event{At: *c.ProcessedAt, What: "processed"})
	}
	if c.ResolvedAt != nil {
		out = append(out, event{At: *c.ResolvedAt, What: "resolved as " + string(c.Resolution), By: c.ResolvedBy, Detail: c.ResolutionNote})
	}
	slices.SortStableFunc(out, func(a, b event) int { return a.At.Compare(b.At) })
	return out
}

func dash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}
