package console

import (
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// overviewHours is how many hours the flagged-per-hour chart covers.
const overviewHours = 24

type overviewData struct {
	O *claim.Overview
	// Cards, in order.
	OldestUnfinished, OldestFlagged string
	Consumers                       []consumerRow
	MoreConsumers                   bool
	Reasons                         []reasonRow
	OtherReasons                    int64
	FlaggedChart, AgeChart, Ages    Chart
	AgeNow                          string
	SamplerSince                    string
	SampleEvery                     string
	Samples                         int
	ListFlagged, ListOpen           string
	// Sessions are the failed or flagged claims of sessions' messages
	// (at most maxSessionRows): a route with holdSessionOnFailure holds
	// each one's session until an operator acts on it.
	Sessions     []sessionRow
	MoreSessions bool
}

// sessionRow is a failed or flagged claim of a session's message.
type sessionRow struct {
	C    *claim.Claim
	Link string // the session's claims
}

// maxSessionRows bounds the overview's list of held sessions.
const maxSessionRows = 20

type consumerRow struct {
	claim.ConsumerCounts
	Link string
}

type reasonRow struct {
	Label, Prefix string
	Count         int64
	Link          string
}

// ageBucketLabels name the bars of the ages chart: under the first of
// claim.AgeBuckets, between two, over the last.
var ageBucketLabels = []string{"< 1m", "1–5m", "5–15m", "15m–1h", "1–6h", "6–24h", "> 24h"}

func (s *Server) serveOverview(w http.ResponseWriter, r *http.Request) {
	v := s.newView(w, r, "Overview", "overview")
	prefixes := make([]string, len(s.opts.ReasonGroups))
	for i, g := range s.opts.ReasonGroups {
		prefixes[i] = g.Prefix
	}
	ctx, cancel := s.storeCtx(r)
	defer cancel()
	o, err := s.opts.Store.Overview(ctx, &claim.OverviewParams{FlaggedHours: overviewHours, ReasonPrefixes: prefixes})
	if err != nil {
		s.storeError(w, r, "the overview", err)
		return
	}
	v.Now = o.Now
	held, err := s.opts.Store.List(ctx, &claim.ListParams{States: []claim.State{claim.StateFailed, claim.StateFlagged}, InSession: true, Limit: maxSessionRows + 1})
	if err != nil {
		s.storeError(w, r, "the held sessions", err)
		return
	}
	d := &overviewData{O: o, MoreConsumers: o.MoreConsumers, OtherReasons: o.OtherReasons,
		ListFlagged: listURL(url.Values{"state": {"flagged"}}),
		ListOpen:    listURL(url.Values{"state": {"claimed", "released", "flagged"}})}
	if d.MoreSessions = len(held) > maxSessionRows; d.MoreSessions {
		held = held[:maxSessionRows]
	}
	for _, c := range held {
		d.Sessions = append(d.Sessions, sessionRow{C: c, Link: listURL(url.Values{"session": {c.SessionID}})})
	}
	d.OldestUnfinished, d.OldestFlagged = "none", "none"
	if o.OldestUnfinished != nil {
		d.OldestUnfinished = humanDuration(o.Now.Sub(*o.OldestUnfinished))
	}
	if o.OldestFlagged != nil {
		d.OldestFlagged = humanDuration(o.Now.Sub(*o.OldestFlagged))
	}
	d.AgeNow = d.OldestUnfinished
	for _, c := range o.Consumers {
		d.Consumers = append(d.Consumers, consumerRow{c, listURL(url.Values{"state": {"claimed", "released", "flagged"}, "consumer": {c.Consumer}})})
	}
	for i, g := range s.opts.ReasonGroups {
		if o.Reasons[i] == 0 {
			continue
		}
		d.Reasons = append(d.Reasons, reasonRow{Label: g.Label, Prefix: g.Prefix, Count: o.Reasons[i],
			Link: listURL(url.Values{"state": {"flagged"}, "reason": {g.Prefix}})})
	}

	// Flagged per hour: every hour of the window, zeros included.
	last := o.Now.UTC().Truncate(time.Hour)
	byHour := map[time.Time]int64{}
	for _, h := range o.FlaggedPerHour {
		byHour[h.Hour] = h.Count
	}
	values, tips, ticks := make([]int64, overviewHours), make([]string, overviewHours), make([]string, overviewHours)
	for i := range overviewHours {
		h := last.Add(time.Duration(i-overviewHours+1) * time.Hour)
		values[i] = byHour[h]
		tips[i] = fmt.Sprintf("%s–%s UTC: %d flagged", h.Format("Jan 2 15:04"), h.Add(time.Hour).Format("15:04"), values[i])
		if i%6 == 0 || i == overviewHours-1 {
			ticks[i] = h.Format("15:00")
		}
	}
	d.FlaggedChart = barChart(newChart("flagged-per-hour", "Open flagged claims per hour of flagging, last 24 hours (UTC)",
		"Claims flagged in each hour that are still open: flagged, or being redriven or recovered. Resolved claims have left the chart."),
		values, tips, ticks)

	// The oldest unfinished claim's age, as sampled by this process.
	samples := s.sampler.Samples()
	d.Samples = len(samples)
	d.SampleEvery = humanDuration(s.sampler.Interval())
	if st := s.sampler.Started(); !st.IsZero() {
		d.SamplerSince = stamp(st)
	}
	d.AgeChart = lineChart(newChart("oldest-unfinished", "Age of the oldest unfinished claim since the console started",
		"Sampled by this console process; not stored in the database."), samples, s.sampler.Interval())

	// Ages of the unfinished claims now: the cumulative counts, split.
	open := o.Claimed + o.Released
	older := o.UnfinishedOlderThan
	counts := make([]int64, len(older)+1)
	counts[0] = max(open-older[0], 0)
	for i := 1; i < len(older); i++ {
		counts[i] = max(older[i-1]-older[i], 0)
	}
	counts[len(older)] = older[len(older)-1]
	tips = make([]string, len(counts))
	for i, n := range counts {
		tips[i] = fmt.Sprintf("claimed %s ago: %d", ageBucketLabels[i], n)
	}
	d.Ages = barChart(newChart("unfinished-ages", "Unfinished claims by age, now",
		"How long ago each claimed or released claim was claimed."), counts, tips, ageBucketLabels)

	v.Data = d
	s.render(w, http.StatusOK, "overview", v)
}

// listURL is the list page with query q.
func listURL(q url.Values) string { return "/claims?" + q.Encode() }
