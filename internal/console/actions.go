package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/reconciler"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
)

// maxForm bounds the body of a POST (a bulk form holds MaxBulk ids and a
// note).
const maxForm = 64 << 10

// authorize is the gate of every POST: the request has an identity
// (authenticate established it), and the form carries that identity's
// CSRF token. It writes the refusal and returns nil otherwise.
func (s *Server) authorize(w http.ResponseWriter, r *http.Request) *Operator {
	op := s.operator(r)
	if op == nil { // authenticate lets no such request through
		s.unauthorized(w, r, "the request carries no identity")
		return nil
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	if err := r.ParseForm(); err != nil {
		s.renderError(w, r, http.StatusBadRequest, "Refused: the form could not be read", "Nothing was changed.")
		return nil
	}
	if !s.checkCSRF(r, op) {
		s.renderError(w, r, http.StatusForbidden, "Refused: the form's security token is missing or wrong",
			"The page may be old, or the form did not come from this console. Reload the page and try again. Nothing was changed.")
		return nil
	}
	return op
}

// note reads the form's note: trimmed, at most MaxNote characters, no
// control characters but newlines.
func note(r *http.Request) (string, error) {
	n := strings.TrimSpace(r.PostFormValue("note"))
	switch {
	case utf8.RuneCountInString(n) > MaxNote:
		return "", fmt.Errorf("the note is longer than %d characters", MaxNote)
	case !utf8.ValidString(n) || strings.ContainsFunc(n, func(r rune) bool { return r != '\n' && isInvisible(r) }):
		return "", errors.New("the note holds control characters")
	}
	return strings.ReplaceAll(n, "\r\n", "\n"), nil
}

// actionCtx is the context of an action: detached from the request, so a
// closed tab does not cut a redrive off between its effect and its record.
func actionCtx(r *http.Request) context.Context { return context.WithoutCancel(r.Context()) }

func (s *Server) redriveParams(id int64, op *Operator, n string) *reconciler.RedriveParams {
	return &reconciler.RedriveParams{ID: id, By: op.By(), Note: n, Routes: s.opts.Routes, Retry: s.opts.Retry,
		HeartbeatInterval: s.opts.HeartbeatInterval, StoreTimeout: s.opts.StoreTimeout, Logger: s.log}
}

// actionForm reads what the redrive and retry forms share: the claim id,
// the verified operator (authorize writes the refusal), the note and
// new_key, which is "1" from the form of an action under a new key; any
// other value is refused rather than read as a same-key action the
// operator did not ask for. noteNeeded says why a note is required
// ("" when it is not). ok is false when the response was written.
func (s *Server) actionForm(w http.ResponseWriter, r *http.Request, noteNeeded func(newKey bool) string) (id int64, op *Operator, n string, newKey, ok bool) {
	if id, op, ok = s.actionClaim(w, r); !ok {
		return 0, nil, "", false, false
	}
	n, err := note(r)
	v := r.PostFormValue("new_key")
	newKey = v == "1"
	switch {
	case err != nil:
	case v != "" && v != "1":
		err = errors.New("new_key must be 1 or absent")
	case n == "" && noteNeeded(newKey) != "":
		err = errors.New(noteNeeded(newKey))
	}
	if err != nil {
		s.refuse(w, r, id, err)
		return 0, nil, "", false, false
	}
	return id, op, n, newKey, true
}

func (s *Server) serveRedrive(w http.ResponseWriter, r *http.Request) {
	id, op, n, newKey, ok := s.actionForm(w, r, func(newKey bool) string {
		if newKey {
			return "a redrive under a new key needs a note: say what you checked on the downstream, for whoever reads this claim next"
		}
		return ""
	})
	if !ok {
		return
	}
	if len(s.opts.Routes) == 0 {
		s.renderClaim(w, r, http.StatusConflict, id, &Flash{Kind: "error", Title: "Refused: redrive is off",
			Lines: []string{"The console was started without the processors' routes (SBCLAIM_ROUTES). Nothing was changed."}})
		return
	}
	p := s.redriveParams(id, op, n)
	p.NewKey = newKey
	_, err := reconciler.Redrive(actionCtx(r), s.opts.Store, p)
	if err == nil {
		s.log.Info("console: claim redriven", "claim_id", id, "by", op.By(), "new_key", p.NewKey)
		http.Redirect(w, r, fmt.Sprintf("/claims/%d?done=redriven", id), http.StatusSeeOther)
		return
	}
	s.actionFailed(w, r, id, "redrive", op, err)
}

// serveHandOff is the redrive of a claim whose effect is code the console
// does not have (a Go handler in the user's own binary): the claim is
// released, audited, for that binary's reconciler passes to re-run with
// its idempotency key.
func (s *Server) serveHandOff(w http.ResponseWriter, r *http.Request) {
	id, op, ok := s.actionClaim(w, r)
	if !ok {
		return
	}
	n, err := note(r)
	if err == nil && n == "" {
		err = errors.New("a note is required: say why it should run again, for whoever reads this claim next")
	}
	if err != nil {
		s.refuse(w, r, id, err)
		return
	}
	_, err = reconciler.HandOff(actionCtx(r), s.opts.Store, &reconciler.HandOffParams{ID: id, By: op.By(), Note: n, StoreTimeout: s.opts.StoreTimeout})
	if err == nil {
		s.log.Info("console: claim handed off", "claim_id", id, "by", op.By())
		http.Redirect(w, r, fmt.Sprintf("/claims/%d?done=handedoff", id), http.StatusSeeOther)
		return
	}
	s.actionFailed(w, r, id, "hand-off", op, err)
}

// retry runs reconciler.Retry on claim id: here when the console can run
// its effect (retryHere), else handed off.
func (s *Server) retry(ctx context.Context, id int64, op *Operator, n string, newKey bool) (*claim.Claim, error) {
	gctx, cancel := context.WithTimeout(ctx, s.opts.StoreTimeout)
	c, err := s.opts.Store.Get(gctx, id)
	cancel()
	if err != nil {
		return nil, err
	}
	return reconciler.Retry(ctx, s.opts.Store, &reconciler.RetryParams{ID: id, By: op.By(), Note: n, NewKey: newKey,
		HandOff: !s.retryHere(c), Routes: s.opts.Routes, Retry: s.opts.Retry,
		HeartbeatInterval: s.opts.HeartbeatInterval, StoreTimeout: s.opts.StoreTimeout, Logger: s.log})
}

// serveRetry runs a failed claim again after a fix (see reconciler.Retry):
// a note (what was fixed) is required; new_key=1 retries under the next
// key, on a route that allows it.
func (s *Server) serveRetry(w http.ResponseWriter, r *http.Request) {
	id, op, n, newKey, ok := s.actionForm(w, r, func(bool) string {
		return "a note is required: say what was fixed, for whoever reads this claim next"
	})
	if !ok {
		return
	}
	_, err := s.retry(actionCtx(r), id, op, n, newKey)
	if err == nil {
		s.log.Info("console: failed claim retried", "claim_id", id, "by", op.By(), "new_key", newKey)
		http.Redirect(w, r, fmt.Sprintf("/claims/%d?done=retried", id), http.StatusSeeOther)
		return
	}
	s.actionFailed(w, r, id, "retry", op, err)
}

// actionFailure is what the operator reads when an action did not
// complete: a refusal (nothing changed), a failed effect, or an effect
// that WAS performed but not recorded.
func actionFailure(id int64, err error) (int, *Flash) {
	var (
		refused *reconciler.RefusedError
		effErr  *reconciler.EffectError
		recErr  *reconciler.RecordError
	)
	switch {
	case errors.As(err, &refused):
		return http.StatusConflict, &Flash{Kind: "error", Title: "Refused", Lines: []string{visible(refused.Error()) + "."}}
	case errors.As(err, &effErr) && effErr.Outcome.Final():
		status := ""
		if effErr.Answer != nil && effErr.Answer.Status != 0 {
			status = fmt.Sprintf(" (HTTP %d)", effErr.Answer.Status)
		}
		lines := []string{fmt.Sprintf("The effect %q got a final answer with idempotency key %q: outcome %s%s after %d attempt(s): %s.",
			visible(effErr.Route), visible(effErr.Key), effErr.Outcome, status, effErr.Attempts, visible(claim.ErrorText(effErr.Err)))}
		if effErr.Failed {
			lines = append(lines, "The claim is now failed, not flagged: the downstream's answer for this key is final, so it is finished and is never redriven, resolved or flagged again (only retried, after fixing what made the downstream refuse it); the next delivery of its message, if one comes, is dead-lettered with its fail reason.")
			return http.StatusBadGateway, &Flash{Kind: "error", Title: "The downstream's answer was final: the claim is failed", Lines: lines}
		}
		lines = append(lines, "Failing the claim could not be written: the redrive's hold lapses within the stale window (SBCLAIM_STALE_AFTER), and the reconciler's next run gets the same answer.")
		return http.StatusBadGateway, &Flash{Kind: "error", Title: "The downstream's answer was final, but failing the claim was not recorded", Lines: lines}
	case errors.As(err, &effErr):
		lines := []string{fmt.Sprintf("The effect %q failed with idempotency key %q: outcome %s after %d attempt(s): %s.",
			visible(effErr.Route), visible(effErr.Key), effErr.Outcome, effErr.Attempts, visible(claim.ErrorText(effErr.Err)))}
		if effErr.Reflagged {
			lines = append(lines, "The claim is flagged again with this failure as its reason.")
		} else {
			lines = append(lines, "Flagging it again failed too: the reconciler flags it again within its stale window (SBCLAIM_STALE_AFTER).")
		}
		if effErr.Outcome == sideeffects.OutcomeUnknown {
			lines = append(lines, "The outcome is unknown: the effect MAY have been performed. Check the downstream before you resolve it.")
		}
		lines = append(lines, "Redrive it again later, or resolve it by hand.")
		return http.StatusBadGateway, &Flash{Kind: "error", Title: "The redrive's effect failed", Lines: lines}
	case errors.As(err, &recErr):
		return http.StatusInternalServerError, &Flash{Kind: "warn", Title: "The effect WAS performed, but recording it failed",
			Lines: []string{
				fmt.Sprintf("The downstream performed the effect with idempotency key %q; writing the claim's resolution failed: %s.",
					visible(recErr.Key), visible(claim.ErrorText(recErr.Err))),
				"Do NOT redrive it again to be sure: it happened.",
				"The claim stays held by this redrive until its hold lapses; within the stale window (SBCLAIM_STALE_AFTER) the reconciler flags it again (\"redrive ... stopped\"). Then resolve it as done, with a note that the redrive performed the effect.",
			}}
	case errors.Is(err, claim.ErrNotFound):
		return http.StatusNotFound, nil
	}
	return http.StatusInternalServerError, &Flash{Kind: "error", Title: "The action failed",
		Lines: []string{visible(claim.ErrorText(err)), "Reload the claim to see its state before you try again."}}
}

// resolution reads the form's "as": done or discarded.
func resolution(r *http.Request) (claim.Resolution, bool) {
	res := claim.Resolution(r.PostFormValue("as"))
	return res, res == claim.ResolutionDone || res == claim.ResolutionDiscarded
}

func (s *Server) serveResolve(w http.ResponseWriter, r *http.Request) {
	id, op, ok := s.actionClaim(w, r)
	if !ok {
		return
	}
	res, ok := resolution(r)
	if !ok {
		s.renderClaim(w, r, http.StatusBadRequest, id, &Flash{Kind: "error", Title: "Refused: resolve as done or discarded",
			Lines: []string{"Nothing was changed."}})
		return
	}
	n, err := note(r)
	if err == nil && n == "" {
		err = errors.New("a note is required: say why, for whoever reads this claim next")
	}
	if err != nil {
		s.refuse(w, r, id, err)
		return
	}
	_, err = reconciler.Resolve(actionCtx(r), s.opts.Store, &reconciler.ResolveParams{ID: id, Resolution: res, By: op.By(), Note: n,
		StoreTimeout: s.opts.StoreTimeout})
	if err == nil {
		s.log.Info("console: claim resolved", "claim_id", id, "resolution", res, "by", op.By())
		http.Redirect(w, r, fmt.Sprintf("/claims/%d?done=resolved", id), http.StatusSeeOther)
		return
	}
	s.actionFailed(w, r, id, "resolve", op, err)
}

// Bulk actions act on the flagged claims a filter matches, at most
// BulkLimit of them, oldest id first. The confirm page (GET) says how many
// and which; its form names them, and the POST acts on exactly those, each
// through the same guarded action as one claim's page (a claim someone
// else changed meanwhile is refused, and the others go on).

type bulkData struct {
	Action    string      // redrive | resolve | retry
	State     claim.State // the claims it acts on: flagged, or failed for retry
	Filter    []string
	FilterQ   string // the filter's query string, for the form and the links
	ListLink  string
	Claims    []*claim.Claim
	More      bool
	Limit     int
	NoRedrive string
	MaxNote   int
}

func (s *Server) bulkFilter(q url.Values) (filter, string, []string) {
	f, errs := parseFilter(q)
	action := q.Get("action")
	if action != "redrive" && action != "resolve" && action != "retry" {
		errs = append(errs, "action must be redrive, resolve or retry")
	}
	// Actions apply to flagged claims only (retry: failed ones), whatever
	// the filter said.
	f.States, f.After = []claim.State{claim.StateFlagged}, 0
	if action == "retry" {
		f.States = []claim.State{claim.StateFailed}
	}
	return f, action, errs
}

func (s *Server) serveBulkConfirm(w http.ResponseWriter, r *http.Request) {
	f, action, errs := s.bulkFilter(r.URL.Query())
	v := s.newView(w, r, "Bulk "+action, "flagged")
	if len(errs) > 0 {
		v.Flash = &Flash{Kind: "error", Title: "Refused: the filter is not valid", Lines: errs}
		s.render(w, http.StatusBadRequest, "error", v)
		return
	}
	ctx, cancel := s.storeCtx(r)
	defer cancel()
	claims, err := s.opts.Store.List(ctx, f.listParams(s.opts.BulkLimit+1))
	if err != nil {
		s.storeError(w, r, "the claims", err)
		return
	}
	if v.Now, err = s.opts.Store.Now(ctx); err != nil {
		s.storeError(w, r, "the database clock", err)
		return
	}
	d := &bulkData{Action: action, State: f.States[0], Filter: f.describe(), FilterQ: f.query().Encode(), ListLink: listURL(f.query()),
		Limit: s.opts.BulkLimit, MaxNote: MaxNote}
	if len(claims) > s.opts.BulkLimit {
		claims, d.More = claims[:s.opts.BulkLimit], true
	}
	d.Claims = claims
	if action == "redrive" && len(s.opts.Routes) == 0 {
		d.NoRedrive = "Redrive is off: the console was started without the processors' routes (SBCLAIM_ROUTES)."
	}
	v.Data = d
	s.render(w, http.StatusOK, "bulk", v)
}

type bulkResult struct {
	ID      int64
	Kind    string // ok | refused | failed | performed | skipped | error
	Outcome string
	Text    string
}

type bulkDoneData struct {
	Action   string
	Results  []bulkResult
	Counts   []string
	ListLink string
	Warn     bool // some effect was performed but not recorded
}

func (s *Server) serveBulk(w http.ResponseWriter, r *http.Request) {
	op := s.authorize(w, r)
	if op == nil {
		return
	}
	q, err := url.ParseQuery(r.PostFormValue("filter"))
	if err != nil {
		q = url.Values{}
	}
	q.Set("action", r.PostFormValue("action"))
	f, action, errs := s.bulkFilter(q)
	var ids []int64
	seen := map[int64]bool{}
	for _, v := range r.PostForm["id"] {
		id, err := strconv.ParseInt(v, 10, 64)
		if err != nil || id < 1 {
			errs = append(errs, fmt.Sprintf("%q is not a claim id", visible(v)))
			continue
		}
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	switch {
	case len(ids) == 0:
		errs = append(errs, "no claims were named")
	case len(ids) > s.opts.BulkLimit:
		errs = append(errs, fmt.Sprintf("%d claims named; a bulk action takes at most %d", len(ids), s.opts.BulkLimit))
	}
	n, err := note(r)
	if err != nil {
		errs = append(errs, err.Error())
	}
	res, ok := resolution(r)
	if action == "retry" && n == "" && err == nil {
		errs = append(errs, "a note is required: say what was fixed, for whoever reads these claims next")
	}
	if action == "resolve" {
		if !ok {
			errs = append(errs, "resolve as done or discarded")
		}
		if n == "" && err == nil {
			errs = append(errs, "a note is required: say why, for whoever reads these claims next")
		}
	}
	if action == "redrive" && len(s.opts.Routes) == 0 {
		errs = append(errs, "redrive is off: the console was started without the processors' routes (SBCLAIM_ROUTES)")
	}
	if len(errs) > 0 {
		lines := append(errs, "Nothing was changed.")
		s.renderError(w, r, http.StatusBadRequest, "Refused: the bulk action is not valid", lines...)
		return
	}

	ctx := actionCtx(r)
	deadline := time.Now().Add(s.opts.BulkTime)
	d := &bulkDoneData{Action: action, ListLink: listURL(f.query())}
	tally := map[string]int{}
	for _, id := range ids {
		if time.Now().After(deadline) {
			d.Results = append(d.Results, bulkResult{ID: id, Kind: "skipped", Outcome: "not attempted",
				Text: fmt.Sprintf("the bulk action's time (%s) ran out; run it again for the rest", s.opts.BulkTime)})
			tally["not attempted"]++
			continue
		}
		var err error
		switch action {
		case "redrive":
			_, err = reconciler.Redrive(ctx, s.opts.Store, s.redriveParams(id, op, n))
		case "retry":
			var c *claim.Claim
			c, err = s.retry(ctx, id, op, n, false)
			if err == nil && c.State == claim.StateReleased {
				err = errHandedOff
			}
		default:
			_, err = reconciler.Resolve(ctx, s.opts.Store, &reconciler.ResolveParams{ID: id, Resolution: res, By: op.By(), Note: n,
				StoreTimeout: s.opts.StoreTimeout})
		}
		br := bulkResult{ID: id, Kind: "ok", Outcome: "redriven"}
		switch {
		case action == "resolve":
			br.Outcome = "resolved as " + string(res)
		case action == "retry" && errors.Is(err, errHandedOff):
			br.Outcome, br.Text, err = "retried, handed off", "released for the binary that runs its route, or (no stored payload) for its re-submitted dead letter", nil
		case action == "retry":
			br.Outcome = "retried"
		}
		if err != nil {
			_, flash := actionFailure(id, err)
			var (
				recErr  *reconciler.RecordError
				refused *reconciler.RefusedError
				effErr  *reconciler.EffectError
			)
			switch {
			case errors.As(err, &refused):
				br.Kind, br.Outcome = "refused", "refused, nothing changed"
			case errors.As(err, &recErr):
				br.Kind, br.Outcome, d.Warn = "performed", "performed, NOT recorded", true
			case errors.Is(err, claim.ErrNotFound):
				br.Kind, br.Outcome, flash = "refused", "not found", &Flash{Lines: []string{"there is no such claim"}}
			case errors.As(err, &effErr) && effErr.Failed:
				br.Kind, br.Outcome = "failed", "final answer, claim failed"
			case errors.As(err, &effErr):
				br.Kind, br.Outcome = "failed", "effect failed"
			default:
				br.Kind, br.Outcome = "error", "error"
			}
			br.Text = strings.Join(flash.Lines, " ")
		}
		tally[br.Outcome]++
		d.Results = append(d.Results, br)
	}
	for _, o := range []string{"redriven", "retried", "retried, handed off", "resolved as done", "resolved as discarded", "refused, nothing changed", "not found",
		"final answer, claim failed", "effect failed", "performed, NOT recorded", "error", "not attempted"} {
		if tally[o] > 0 {
			d.Counts = append(d.Counts, fmt.Sprintf("%d %s", tally[o], o))
		}
	}
	s.log.Info("console: bulk action", "action", action, "claims", len(ids), "by", op.By(), "outcome", strings.Join(d.Counts, ", "))
	v := s.newView(w, r, "Bulk "+action, "flagged")
	v.Data = d
	s.render(w, http.StatusOK, "bulkdone", v)
}

// errHandedOff marks, inside serveBulk, a retry that released its claim
// instead of running it.
var errHandedOff = errors.New("handed off")

// actionClaim reads the claim id of an action's path and the operator
// allowed to act; ok is false when it answered the request itself (no
// such id, no operator).
func (s *Server) actionClaim(w http.ResponseWriter, r *http.Request) (id int64, op *Operator, ok bool) {
	if id, ok = claimID(r); !ok {
		s.renderError(w, r, http.StatusNotFound, "Not found", "Claim ids are positive integers.")
		return 0, nil, false
	}
	if op = s.authorize(w, r); op == nil {
		return 0, nil, false
	}
	return id, op, true
}

// refuse shows claim id with the reason an action was refused before it
// changed anything.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, id int64, err error) {
	s.renderClaim(w, r, http.StatusBadRequest, id, &Flash{Kind: "error", Title: "Refused: " + err.Error(), Lines: []string{"Nothing was changed."}})
}

// actionFailed shows the outcome of an action on claim id that did not
// complete (a refusal, someone acting first, a store error), or "not
// found" when there is no such claim.
func (s *Server) actionFailed(w http.ResponseWriter, r *http.Request, id int64, action string, op *Operator, err error) {
	status, flash := actionFailure(id, err)
	s.log.Warn("console: "+action+" did not complete", "claim_id", id, "by", op.By(), "err", err)
	if status == http.StatusNotFound {
		s.renderError(w, r, status, "Not found", fmt.Sprintf("There is no claim %d.", id))
		return
	}
	s.renderClaim(w, r, status, id, flash)
}
