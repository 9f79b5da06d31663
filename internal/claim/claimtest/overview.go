package claimtest

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// The operator console's store methods: List's Route and ReasonPrefix
// filters, and Overview.
func (s *suite) consoleTests() []struct {
	name string
	fn   func(t *testing.T)
} {
	return []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"ListFiltersByRouteAndReasonPrefix", s.listRouteAndReason},
		{"SessionIDRoundTripsAndFiltersTheList", s.listSession},
		{"OverviewCountsTheOpenWorkOnly", s.overview},
		{"OverviewGroupsReasonsAndBoundsConsumers", s.overviewGroups},
		{"OverviewRefusesBadParams", s.overviewParams},
	}
}

// flagWith claims p and flags it with reason (its holder is not required
// to be silent).
func flagWith(t *testing.T, st claim.Store, p claim.ClaimParams, reason string) *claim.Claim {
	t.Helper()
	c := mustWin(t, st, p)
	f, err := st.Flag(ctxT(t), &claim.FlagParams{ID: c.ID, Owner: c.Owner, State: claim.StateClaimed, Reason: reason})
	if err != nil {
		t.Fatalf("flag claim %d: %v", c.ID, err)
	}
	return f
}

func withRoute(p claim.ClaimParams, route string) claim.ClaimParams {
	p.Route = route
	return p
}

func (s *suite) listRouteAndReason(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	// Reasons with LIKE's special characters in them, and case variants.
	a := flagWith(t, st, withRoute(msg("", "billing", "b"), "payments"), "100% sure: the downstream answered 402")
	b := flagWith(t, st, withRoute(msg("", "billing", "b"), "payments"), "1000 sure: no")
	c := flagWith(t, st, withRoute(msg("", "billing", "b"), "payments-v2"), "a_b [x] done")
	d := flagWith(t, st, withRoute(msg("", "shipping", "b"), "payments"), "axb [y] done")
	e := flagWith(t, st, withRoute(msg("", "billing", "b"), "refunds"), "No heartbeat since 2026")
	f := flagWith(t, st, withRoute(msg("", "billing", "b"), "refunds"), `back\slash reason`)
	open := mustWin(t, st, withRoute(msg("", "billing", "b"), "payments"))

	check := func(name string, p *claim.ListParams, want ...*claim.Claim) {
		t.Helper()
		got, err := st.List(ctx, p)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if fmt.Sprint(ids(got)) != fmt.Sprint(ids(want)) {
			t.Fatalf("%s: got %v, want %v", name, ids(got), ids(want))
		}
	}
	check("route is exact", &claim.ListParams{Route: "payments"}, a, b, d, open)
	check("route and state", &claim.ListParams{Route: "payments", States: []claim.State{claim.StateFlagged}}, a, b, d)
	check("route and consumer", &claim.ListParams{Route: "payments", Consumer: "billing", States: []claim.State{claim.StateFlagged}}, a, b)
	check("route matches nothing", &claim.ListParams{Route: "pay"})
	check("% is a plain character", &claim.ListParams{ReasonPrefix: "100% "}, a)
	check("_ is a plain character", &claim.ListParams{ReasonPrefix: "a_b"}, c)
	check("[ is a plain character", &claim.ListParams{ReasonPrefix: "a_b [x]"}, c)
	check("[ does not open a class", &claim.ListParams{ReasonPrefix: "axb [x"})
	check("backslash is a plain character", &claim.ListParams{ReasonPrefix: `back\s`}, f)
	check("prefix, not substring", &claim.ListParams{ReasonPrefix: "sure"})
	check("case counts", &claim.ListParams{ReasonPrefix: "no heartbeat"})
	check("exact case", &claim.ListParams{ReasonPrefix: "No heartbeat"}, e)
	check("whole reason", &claim.ListParams{ReasonPrefix: "1000 sure: no"}, b)
	check("longer than the reason", &claim.ListParams{ReasonPrefix: "1000 sure: no!"})
	check("shared prefix", &claim.ListParams{ReasonPrefix: "10"}, a, b)
	check("route and reason", &claim.ListParams{ReasonPrefix: "10", Route: "payments", Consumer: "billing"}, a, b)
	check("paged", &claim.ListParams{ReasonPrefix: "10", Limit: 1, AfterID: a.ID}, b)
	if _, err := st.List(ctx, &claim.ListParams{Route: strings.Repeat("r", 65)}); err == nil {
		t.Error("List with a 65-character route succeeded")
	}
	if _, err := st.List(ctx, &claim.ListParams{ReasonPrefix: strings.Repeat("r", 401)}); err == nil {
		t.Error("List with a 401-character reason prefix succeeded")
	}
}

func (s *suite) overview(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	empty, err := st.Overview(ctx, &claim.OverviewParams{})
	if err != nil {
		t.Fatal(err)
	}
	if empty.Now.IsZero() || empty.Claimed+empty.Released+empty.Flagged+empty.Redriving != 0 || empty.OldestUnfinished != nil ||
		empty.OldestFlagged != nil || len(empty.Consumers) != 0 || empty.MoreConsumers || len(empty.FlaggedPerHour) != 0 ||
		empty.OtherReasons != 0 || len(empty.Reasons) != 0 || len(empty.UnfinishedOlderThan) != len(claim.AgeBuckets) {
		t.Fatalf("overview of an empty table: %+v", empty)
	}
	for i, n := range empty.UnfinishedOlderThan {
		if n != 0 {
			t.Fatalf("empty table: %d claims older than %s", n, claim.AgeBuckets[i])
		}
	}

	// billing: 2 claimed (one 2 h old), 1 released, 2 flagged (one 3 h
	// ago), 1 being redriven; shipping: 1 flagged 30 h ago (outside the
	// window), 1 claimed. Finished claims count nowhere.
	old := mustWin(t, st, msg("", "billing", "b"))
	s.backdate(t, st, old.ID, 2*time.Hour)
	mustWin(t, st, msg("", "billing", "b"))
	rel := mustWin(t, st, msg("", "billing", "b"))
	if err := st.Release(ctx, &claim.ReleaseParams{ID: rel.ID, Owner: rel.Owner}); err != nil {
		t.Fatal(err)
	}
	fresh := flagWith(t, st, msg("", "billing", "b"), "no heartbeat since x")
	earlier := flagWith(t, st, msg("", "billing", "b"), "route changed: x")
	s.backdate(t, st, earlier.ID, 3*time.Hour)
	redrive := flagWith(t, st, msg("", "billing", "b"), "recovery: x")
	if _, err := st.TakeOver(ctx, &claim.TakeOverParams{ID: redrive.ID, PreviousOwner: redrive.Owner, Owner: uuid.New(),
		Path: claim.PathOperator, By: "operator:alice", Reason: "redrive", Route: redrive.Route, Fingerprint: redrive.Fingerprint}); err != nil {
		t.Fatal(err)
	}
	gone := flagWith(t, st, msg("", "shipping", "b"), "no heartbeat since y")
	s.backdate(t, st, gone.ID, 30*time.Hour)
	mustWin(t, st, msg("", "shipping", "b"))
	done := mustWin(t, st, msg("", "billing", "b"))
	if err := st.MarkProcessed(ctx, &claim.MarkProcessedParams{ID: done.ID, Owner: done.Owner}); err != nil {
		t.Fatal(err)
	}
	resolved := flagWith(t, st, msg("", "billing", "b"), "no heartbeat since z")
	if _, err := st.Resolve(ctx, &claim.ResolveParams{ID: resolved.ID, Resolution: claim.ResolutionDone, By: "op", Note: "n"}); err != nil {
		t.Fatal(err)
	}

	got, err := st.Overview(ctx, &claim.OverviewParams{ReasonPrefixes: []string{"no heartbeat", "route changed"}})
	if err != nil {
		t.Fatal(err)
	}
	if got.Claimed != 4 || got.Released != 1 || got.Flagged != 3 || got.Redriving != 1 {
		t.Errorf("counts: claimed %d released %d flagged %d redriving %d, want 4 (one being redriven), 1, 3, 1",
			got.Claimed, got.Released, got.Flagged, got.Redriving)
	}
	if want := mustGet(t, st, old.ID).ClaimedAt; got.OldestUnfinished == nil || !got.OldestUnfinished.Equal(want) {
		t.Errorf("oldest unfinished %v, want %v", got.OldestUnfinished, want)
	}
	if want := mustGet(t, st, gone.ID).FlaggedAt; got.OldestFlagged == nil || !got.OldestFlagged.Equal(*want) {
		t.Errorf("oldest flagged %v, want %v", got.OldestFlagged, want)
	}
	wantConsumers := []claim.ConsumerCounts{
		{Consumer: "billing", Claimed: 3, Released: 1, Flagged: 2},
		{Consumer: "shipping", Claimed: 1, Flagged: 1},
	}
	if !slices.Equal(got.Consumers, wantConsumers) || got.MoreConsumers {
		t.Errorf("consumers %+v (more %v), want %+v", got.Consumers, got.MoreConsumers, wantConsumers)
	}
	if fmt.Sprint(got.Reasons) != "[2 1]" || got.OtherReasons != 0 {
		t.Errorf("reasons %v other %d, want [2 1] (no heartbeat: 2, route changed: 1) and 0", got.Reasons, got.OtherReasons)
	}
	// The per-hour series: the open claims flagged in the last 24 hours,
	// by the hour of their FlaggedAt (the redrive's too: it is open).
	want := map[time.Time]int64{}
	for _, c := range []*claim.Claim{fresh, earlier, redrive} {
		want[mustGet(t, st, c.ID).FlaggedAt.Truncate(time.Hour)]++
	}
	gotHours := map[time.Time]int64{}
	for i, h := range got.FlaggedPerHour {
		if h.Hour.Location() != time.UTC || !h.Hour.Equal(h.Hour.Truncate(time.Hour)) {
			t.Errorf("hour %v is not the start of a UTC hour", h.Hour)
		}
		if i > 0 && !got.FlaggedPerHour[i-1].Hour.Before(h.Hour) {
			t.Errorf("hours out of order: %v", got.FlaggedPerHour)
		}
		gotHours[h.Hour] = h.Count
	}
	if fmt.Sprint(gotHours) != fmt.Sprint(want) {
		t.Errorf("flagged per hour %v, want %v", gotHours, want)
	}
	// A window of 2 hours holds only the fresh ones.
	narrow, err := st.Overview(ctx, &claim.OverviewParams{FlaggedHours: 2})
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, h := range narrow.FlaggedPerHour {
		n += h.Count
	}
	if n != 2 || narrow.OtherReasons != 3 || len(narrow.Reasons) != 0 {
		t.Errorf("2-hour window: %d flagged (%v), other reasons %d; want 2 and 3", n, narrow.FlaggedPerHour, narrow.OtherReasons)
	}
	// Ages: only the claim backdated 2 h is older than 15 minutes; it is
	// younger than 6 hours.
	ages := map[time.Duration]int64{}
	for i, b := range claim.AgeBuckets {
		ages[b] = got.UnfinishedOlderThan[i]
	}
	if ages[15*time.Minute] != 1 || ages[time.Hour] != 1 || ages[6*time.Hour] != 0 || ages[24*time.Hour] != 0 {
		t.Errorf("unfinished older than %v: %v, want 1 older than 15m and 1h, none older than 6h", claim.AgeBuckets, got.UnfinishedOlderThan)
	}
}

func (s *suite) overviewGroups(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	for i, n := range []int{3, 1, 2} {
		for range n {
			flagWith(t, st, msg("", fmt.Sprintf("consumer-%d", i), "b"), fmt.Sprintf("reason %d%%: x_y", i))
		}
	}
	got, err := st.Overview(ctx, &claim.OverviewParams{MaxConsumers: 2, ReasonPrefixes: []string{"reason 2%", "reason ", "reason 1"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []claim.ConsumerCounts{{Consumer: "consumer-0", Flagged: 3}, {Consumer: "consumer-2", Flagged: 2}}
	if !slices.Equal(got.Consumers, want) || !got.MoreConsumers {
		t.Errorf("consumers %+v (more %v), want %+v and more", got.Consumers, got.MoreConsumers, want)
	}
	// First match wins: "reason 1" comes after "reason ", which takes it.
	if fmt.Sprint(got.Reasons) != "[2 4 0]" || got.OtherReasons != 0 {
		t.Errorf("reasons %v other %d, want [2 4 0] and 0", got.Reasons, got.OtherReasons)
	}
	// % in a prefix is a plain character: "reason %" matches none.
	got, err = st.Overview(ctx, &claim.OverviewParams{ReasonPrefixes: []string{"reason %", "REASON"}})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got.Reasons) != "[0 0]" || got.OtherReasons != 6 {
		t.Errorf("reasons %v other %d, want [0 0] and 6", got.Reasons, got.OtherReasons)
	}
}

func (s *suite) overviewParams(t *testing.T) {
	st := s.h.NewStore(t)
	ctx := ctxT(t)
	for name, p := range map[string]*claim.OverviewParams{
		"hours too many":    {FlaggedHours: claim.MaxFlaggedHours + 1},
		"hours negative":    {FlaggedHours: -1},
		"consumers too":     {MaxConsumers: claim.MaxOverviewConsumers + 1},
		"empty prefix":      {ReasonPrefixes: []string{""}},
		"too many prefixes": {ReasonPrefixes: slices.Repeat([]string{"x"}, claim.MaxReasonGroups+1)},
		"long prefix":       {ReasonPrefixes: []string{strings.Repeat("x", 401)}},
	} {
		if _, err := st.Overview(ctx, p); err == nil {
			t.Errorf("%s: Overview(%+v) succeeded", name, p)
		}
	}
	if _, err := st.Overview(ctx, &claim.OverviewParams{FlaggedHours: claim.MaxFlaggedHours, MaxConsumers: claim.MaxOverviewConsumers,
		ReasonPrefixes: slices.Repeat([]string{strings.Repeat("x", 400)}, claim.MaxReasonGroups)}); err != nil {
		t.Errorf("Overview at every bound: %v", err)
	}
}
