package console

import (
	"context"
	"math"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sbclaim/sbclaim/internal/claim"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func TestBarChartLayout(t *testing.T) {
	c := barChart(newChart("x", "t", "d"), []int64{0, 3, 7}, []string{"a", "b", "c"}, []string{"0", "", "2"})
	if len(c.Bars) != 3 || c.Empty != "" {
		t.Fatalf("bars %d, empty %q", len(c.Bars), c.Empty)
	}
	// 7 rounds up to 10: the tallest bar is 70% of the plot.
	if c.Bars[0].H != 0 || !near(c.Bars[2].H, c.PH*0.7) || !near(c.Bars[1].H, c.PH*0.3) {
		t.Errorf("heights %v %v %v of %v", c.Bars[0].H, c.Bars[1].H, c.Bars[2].H, c.PH)
	}
	for _, b := range c.Bars {
		if !near(b.Y+b.H, c.PY+c.PH) || b.X < c.PX || b.X+b.W > c.PX+c.PW+1e-9 {
			t.Errorf("bar %+v leaves the plot", b)
		}
	}
	if len(c.XTicks) != 2 || c.YTicks[2].Label != "10" {
		t.Errorf("ticks %+v %+v", c.XTicks, c.YTicks)
	}
	if e := barChart(newChart("x", "t", "d"), nil, nil, nil); e.Empty == "" {
		t.Error("an empty bar chart draws bars")
	}
}

func TestLineChartNeedsTwoSamplesApart(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	for name, samples := range map[string][]Sample{
		"none":     nil,
		"one":      {{At: t0, Oldest: time.Minute}},
		"same ms":  {{At: t0, Oldest: time.Minute}, {At: t0, Oldest: time.Minute}},
		"too near": {{At: t0, Oldest: time.Minute}, {At: t0.Add(10 * time.Second), Oldest: time.Minute}},
	} {
		if c := lineChart(newChart("x", "t", "d"), samples, time.Minute); c.Empty == "" || c.Line != "" {
			t.Errorf("%s: a line from %d samples", name, len(samples))
		}
	}
	samples := []Sample{{At: t0, Oldest: 0}, {At: t0.Add(time.Minute), Oldest: 40 * time.Minute}, {At: t0.Add(2 * time.Minute), Oldest: 10 * time.Minute}}
	c := lineChart(newChart("x", "t", "d"), samples, time.Minute)
	if c.Empty != "" || len(strings.Fields(c.Line)) != 3 || len(c.Dots) != 3 {
		t.Fatalf("line %q dots %d empty %q", c.Line, len(c.Dots), c.Empty)
	}
	// 40m rounds up to 1h: the second point is at 2/3 of the height.
	if d := c.Dots[1]; !near(d.X, c.PX+c.PW/2) || !near(d.Y, c.PY+c.PH*(1-40.0/60)) {
		t.Errorf("second point at %v,%v", d.X, d.Y)
	}
	if !strings.HasPrefix(c.Area, "44.0,") || c.XTicks[0].Label != "10:00" || c.XTicks[1].Label != "10:02" || c.YTicks[2].Label != "1h00m" {
		t.Errorf("area %q ticks %+v %+v", c.Area, c.XTicks, c.YTicks)
	}
}

func TestHumanDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		-time.Second: "0s", 0: "0s", 45 * time.Second: "45s", 12*time.Minute + 5*time.Second: "12m",
		3*time.Hour + 5*time.Minute: "3h05m", 52 * time.Hour: "2d4h",
	} {
		if got := humanDuration(d); got != want {
			t.Errorf("humanDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

// statsStore answers Stats with a clock that moves a minute a call.
type statsStore struct {
	claim.Store
	now    time.Time
	oldest *time.Time
}

func (s *statsStore) Stats(context.Context) (*claim.Stats, error) {
	s.now = s.now.Add(time.Minute)
	return &claim.Stats{Now: s.now, Claimed: 2, Released: 1, OldestUnfinished: s.oldest}, nil
}

func TestSamplerKeepsTheLastReadings(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	oldest := t0.Add(-time.Hour)
	st := &statsStore{now: t0, oldest: &oldest}
	s := NewSampler(st, time.Minute, 3)
	if len(s.Samples()) != 0 || !s.Started().IsZero() {
		t.Fatal("a new sampler has samples")
	}
	for range 5 {
		if err := s.Sample(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	got := s.Samples()
	if len(got) != 3 || !got[0].At.Equal(t0.Add(3*time.Minute)) || !got[2].At.Equal(t0.Add(5*time.Minute)) ||
		got[2].Oldest != time.Hour+5*time.Minute || got[2].Unfinished != 3 {
		t.Errorf("samples %+v", got)
	}
	if !s.Started().Equal(t0.Add(time.Minute)) {
		t.Errorf("started %v", s.Started())
	}
	st.oldest = nil
	if err := s.Sample(context.Background()); err != nil {
		t.Fatal(err)
	}
	if last := s.Samples()[2]; last.Oldest != 0 {
		t.Errorf("no unfinished claim: oldest %v", last.Oldest)
	}
}

func TestVisible(t *testing.T) {
	for in, want := range map[string]string{
		"plain": "plain", "a\nb\tc": `a\nb\tc`, "nul\x00": `nul\x00`, "esc\x1b[31m": `esc\x1b[31m`,
		"rtl\u202eevil": `rtl\u202eevil`, "bad\xffutf8": "bad\uFFFDutf8", "<script>": "<script>", // html/template escapes it
	} {
		if got := visible(in); got != want {
			t.Errorf("visible(%q) = %q, want %q", in, got, want)
		}
	}
	if got := visibleLines("line1\nline2\x07"); got != "line1\nline2\\x07" {
		t.Errorf("visibleLines: %q", got)
	}
}

// A list's link holds its filter, and reading the link gives it back.
func TestFilterLinksRoundTrip(t *testing.T) {
	q := url.Values{"state": {"flagged", "claimed", "flagged"}, "consumer": {"billing"}, "route": {"payments"},
		"session": {"account 7"}, "reason": {"route "}, "older": {"1d2h"}, "after": {"42"}}
	f, errs := parseFilter(q)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if !slices.Equal(f.States, []claim.State{claim.StateClaimed, claim.StateFlagged}) || f.Reason != "route " ||
		f.OlderThan != 26*time.Hour || f.After != 42 {
		t.Fatalf("filter %+v", f)
	}
	again, errs := parseFilter(f.query())
	if len(errs) > 0 || !slices.Equal(again.States, f.States) || again.Consumer != f.Consumer || again.Route != f.Route || again.Session != "account 7" ||
		again.Reason != f.Reason || again.OlderThan != f.OlderThan || again.After != 0 {
		t.Errorf("round trip: %+v -> %+v (%v)", f, again, errs)
	}
	p := f.listParams(51)
	if p.Route != "payments" || p.SessionID != "account 7" || p.ReasonPrefix != "route " || p.AfterID != 42 || p.Limit != 51 || p.OlderThan != 26*time.Hour {
		t.Errorf("list params %+v", p)
	}
	for _, bad := range []url.Values{{"state": {"bogus"}}, {"older": {"soon"}}, {"older": {"-1h"}}, {"after": {"x"}},
		{"consumer": {strings.Repeat("c", 201)}}, {"session": {strings.Repeat("s", 129)}}, {"reason": {strings.Repeat("r", 401)}}} {
		if _, errs := parseFilter(bad); len(errs) == 0 {
			t.Errorf("filter %v accepted", bad)
		}
	}
}
