package console

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// filter is the list's query string: the filters of a shared link.
type filter struct {
	States    []claim.State
	Consumer  string
	Route     string
	Session   string // the message's session (session-enabled entities)
	Reason    string // a prefix of the flag reason
	OlderText string // as typed: 90m, 2h, 3d
	OlderThan time.Duration
	After     int64 // keyset paging
}

// parseDuration reads Go durations plus a day unit (3d, 1d12h).
func parseDuration(s string) (time.Duration, error) {
	days := time.Duration(0)
	if i := strings.IndexByte(s, 'd'); i > 0 {
		n, err := strconv.Atoi(s[:i])
		if err != nil || n < 0 || n > 3650 {
			return 0, fmt.Errorf("%q is not a duration (write 90m, 2h or 3d)", s)
		}
		days, s = time.Duration(n)*24*time.Hour, s[i+1:]
		if s == "" {
			return days, nil
		}
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%q is not a duration (write 90m, 2h or 3d)", s)
	}
	return days + d, nil
}

// parseFilter reads a filter from a query string, with a message for each
// value it cannot use.
func parseFilter(q url.Values) (filter, []string) {
	var (
		f    filter
		errs []string
	)
	for _, v := range q["state"] {
		if v == "" || v == "all" {
			continue
		}
		st := claim.State(v)
		if !st.Valid() {
			errs = append(errs, fmt.Sprintf("state %q is not a claim state", visible(v)))
			continue
		}
		if !slices.Contains(f.States, st) {
			f.States = append(f.States, st)
		}
	}
	slices.SortFunc(f.States, func(a, b claim.State) int { return slices.Index(claim.States, a) - slices.Index(claim.States, b) })
	text := func(name string, maxLen int) string {
		v := strings.TrimSpace(q.Get(name))
		if utf8.RuneCountInString(v) > maxLen || !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
			errs = append(errs, fmt.Sprintf("%s is longer than %d characters", name, maxLen))
			return ""
		}
		return v
	}
	f.Consumer = text("consumer", 200)
	f.Route = text("route", 64)
	f.Session = text("session", claim.MaxMessageIDLength)
	// The reason prefix keeps its spaces: "route " and "route" differ.
	if v := q.Get("reason"); utf8.RuneCountInString(v) > 400 || !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
		errs = append(errs, "reason is longer than 400 characters")
	} else {
		f.Reason = v
	}
	if v := strings.TrimSpace(q.Get("older")); v != "" {
		d, err := parseDuration(v)
		if err != nil {
			errs = append(errs, "older than: "+err.Error())
		} else {
			f.OlderText, f.OlderThan = v, d
		}
	}
	if v := q.Get("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			errs = append(errs, fmt.Sprintf("after %q is not a claim id", visible(v)))
		} else {
			f.After = n
		}
	}
	return f, errs
}

// query is the filter as a query string, without the page position.
func (f filter) query() url.Values {
	q := url.Values{}
	for _, s := range f.States {
		q.Add("state", string(s))
	}
	for k, v := range map[string]string{"consumer": f.Consumer, "route": f.Route, "session": f.Session, "reason": f.Reason, "older": f.OlderText} {
		if v != "" {
			q.Set(k, v)
		}
	}
	return q
}

func (f filter) listParams(limit int) *claim.ListParams {
	return &claim.ListParams{States: f.States, Consumer: f.Consumer, Route: f.Route, SessionID: f.Session, ReasonPrefix: f.Reason,
		OlderThan: f.OlderThan, AfterID: f.After, Limit: limit}
}

// describe is the filter in words, for the confirm page.
func (f filter) describe() []string {
	var out []string
	if len(f.States) > 0 {
		names := make([]string, len(f.States))
		for i, s := range f.States {
			names[i] = string(s)
		}
		out = append(out, "state: "+strings.Join(names, ", "))
	}
	for _, kv := range [][2]string{{"consumer", f.Consumer}, {"route", f.Route}, {"session", f.Session}, {"reason starts with", f.Reason}, {"claimed more than", f.OlderText}} {
		if kv[1] != "" {
			v := strconv.Quote(visible(kv[1]))
			if kv[0] == "claimed more than" {
				v = kv[1] + " ago"
			}
			out = append(out, kv[0]+": "+v)
		}
	}
	if len(out) == 0 {
		out = append(out, "every claim")
	}
	return out
}

type listData struct {
	F       filter
	States  []stateOption
	Claims  []*claim.Claim
	Next    string // the next page, "" on the last
	First   string // the first page, "" on it
	Self    string // this page's link
	Errors  []string
	BulkRed string // the confirm pages of the bulk actions on this filter
	BulkRes string
	// BulkRet is the confirm page of the bulk retry of the failed claims
	// the filter matches; Failing: the filter can match failed claims.
	BulkRet  string
	Failing  bool
	Flagging bool // the filter can match flagged claims
}

type stateOption struct {
	State   claim.State
	Checked bool
}

func (s *Server) serveList(w http.ResponseWriter, r *http.Request) {
	f, errs := parseFilter(r.URL.Query())
	nav := "claims"
	if slices.Equal(f.States, []claim.State{claim.StateFlagged}) {
		nav = "flagged"
	}
	v := s.newView(w, r, "Claims", nav)
	d := &listData{F: f, Errors: errs}
	for _, st := range claim.States {
		d.States = append(d.States, stateOption{st, slices.Contains(f.States, st)})
	}
	q := f.query()
	d.Self = listURL(q)
	if f.After > 0 {
		d.First = d.Self
		self := f.query()
		self.Set("after", strconv.FormatInt(f.After, 10))
		d.Self = listURL(self)
	}
	d.Flagging = len(f.States) == 0 || slices.Contains(f.States, claim.StateFlagged)
	if d.Flagging {
		b := f.query()
		b.Set("action", "redrive")
		d.BulkRed = "/bulk?" + b.Encode()
		b.Set("action", "resolve")
		d.BulkRes = "/bulk?" + b.Encode()
	}
	d.Failing = len(f.States) == 0 || slices.Contains(f.States, claim.StateFailed)
	if d.Failing {
		b := f.query()
		b.Set("action", "retry")
		d.BulkRet = "/bulk?" + b.Encode()
	}
	if len(errs) > 0 {
		v.Data = d
		s.render(w, http.StatusBadRequest, "list", v)
		return
	}
	ctx, cancel := s.storeCtx(r)
	defer cancel()
	claims, err := s.opts.Store.List(ctx, f.listParams(PageSize+1))
	if err != nil {
		s.storeError(w, r, "the claims", err)
		return
	}
	if len(claims) > PageSize {
		claims = claims[:PageSize]
		next := f.query()
		next.Set("after", strconv.FormatInt(claims[len(claims)-1].ID, 10))
		d.Next = listURL(next)
	}
	d.Claims = claims
	if v.Now, err = s.opts.Store.Now(ctx); err != nil {
		s.storeError(w, r, "the database clock", err)
		return
	}
	v.Data = d
	s.render(w, http.StatusOK, "list", v)
}
