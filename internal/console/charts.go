package console

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Chart is a small SVG chart, laid out here and drawn by the "chart"
// template: every coordinate is a number computed on the server, every
// label text goes through html/template.
type Chart struct {
	ID          string
	Title, Desc string // the SVG's <title> and <desc>
	W, H        float64
	// The plot area inside the axes.
	PX, PY, PW, PH float64
	Bars           []Bar
	Line, Area     string // polyline / polygon points, "x,y x,y ..."
	Dots           []Dot
	XTicks, YTicks []Tick
	Empty          string // shown instead of a plot when there is no data
}

// Bar is one bar of a bar chart.
type Bar struct {
	X, Y, W, H float64
	Tip        string
}

// Dot marks one point of a line chart.
type Dot struct {
	X, Y float64
	Tip  string
}

// Tick is an axis label.
type Tick struct {
	X, Y   float64
	Label  string
	Anchor string // text-anchor: start | middle | end
}

const (
	chartW, chartH = 560.0, 180.0
	padLeft        = 44.0
	padRight       = 8.0
	padTop         = 10.0
	padBottom      = 24.0
)

func newChart(id, title, desc string) Chart {
	return Chart{ID: id, Title: title, Desc: desc, W: chartW, H: chartH,
		PX: padLeft, PY: padTop, PW: chartW - padLeft - padRight, PH: chartH - padTop - padBottom}
}

// niceCeil is the smallest of 1, 2, 5 × 10^k that is at least v (1 for 0).
func niceCeil(v float64) float64 {
	if v <= 1 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// barChart lays out one bar per value; labels[i] names bar i (its tooltip),
// ticks[i] (when non-empty) is drawn under it.
func barChart(c Chart, values []int64, tips, ticks []string) Chart {
	var top int64
	for _, v := range values {
		top = max(top, v)
	}
	if len(values) == 0 {
		c.Empty = "no data"
		return c
	}
	ymax := niceCeil(float64(top))
	slot := c.PW / float64(len(values))
	gap := math.Min(4, slot*0.2)
	for i, v := range values {
		h := c.PH * float64(v) / ymax
		x := c.PX + float64(i)*slot + gap/2
		c.Bars = append(c.Bars, Bar{X: x, Y: c.PY + c.PH - h, W: slot - gap, H: h, Tip: tips[i]})
		if ticks[i] != "" {
			c.XTicks = append(c.XTicks, Tick{X: x + (slot-gap)/2, Y: c.PY + c.PH + 16, Label: ticks[i], Anchor: "middle"})
		}
	}
	for _, f := range []float64{0, 0.5, 1} {
		if f == 0.5 && ymax < 2 {
			continue // counts are whole: no 0.5
		}
		c.YTicks = append(c.YTicks, Tick{X: c.PX - 6, Y: c.PY + c.PH*(1-f) + 4, Label: count(ymax * f), Anchor: "end"})
	}
	return c
}

func count(f float64) string {
	if f == math.Trunc(f) {
		return strconv.FormatFloat(f, 'f', 0, 64)
	}
	return strconv.FormatFloat(f, 'f', 1, 64)
}

// durationSteps are the tops a duration axis rounds up to.
var durationSteps = []time.Duration{time.Minute, 5 * time.Minute, 15 * time.Minute, 30 * time.Minute, time.Hour,
	2 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour, 48 * time.Hour, 7 * 24 * time.Hour, 30 * 24 * time.Hour}

func durationCeil(d time.Duration) time.Duration {
	for _, s := range durationSteps {
		if s >= d {
			return s
		}
	}
	return d
}

// lineChart lays out the sampler's readings: x is time, y the oldest age.
// It needs two readings at least half an interval apart.
func lineChart(c Chart, samples []Sample, interval time.Duration) Chart {
	if len(samples) < 2 || samples[len(samples)-1].At.Sub(samples[0].At) < interval/2 {
		c.Empty = fmt.Sprintf("Collecting: the line needs two samples at least %s apart (%d so far).", humanDuration(interval/2), len(samples))
		return c
	}
	t0, t1 := samples[0].At, samples[len(samples)-1].At
	span := t1.Sub(t0)
	var top time.Duration
	for _, s := range samples {
		top = max(top, s.Oldest)
	}
	ymax := durationCeil(max(top, time.Minute))
	var pts []string
	for _, s := range samples {
		x := c.PX + c.PW*float64(s.At.Sub(t0))/float64(span)
		y := c.PY + c.PH*(1-float64(s.Oldest)/float64(ymax))
		pts = append(pts, fmt.Sprintf("%.1f,%.1f", x, y))
		c.Dots = append(c.Dots, Dot{X: x, Y: y, Tip: s.At.Format("15:04 UTC") + ": " + humanDuration(s.Oldest)})
	}
	c.Line = strings.Join(pts, " ")
	c.Area = fmt.Sprintf("%.1f,%.1f %s %.1f,%.1f", c.PX, c.PY+c.PH, c.Line, c.PX+c.PW, c.PY+c.PH)
	if len(c.Dots) > 120 {
		c.Dots = nil // a line of dots says nothing more than the line
	}
	for _, f := range []float64{0, 0.5, 1} {
		c.YTicks = append(c.YTicks, Tick{X: c.PX - 6, Y: c.PY + c.PH*(1-f) + 4, Label: humanDuration(time.Duration(float64(ymax) * f)), Anchor: "end"})
	}
	c.XTicks = []Tick{
		{X: c.PX, Y: c.PY + c.PH + 16, Label: t0.Format("15:04"), Anchor: "start"},
		{X: c.PX + c.PW, Y: c.PY + c.PH + 16, Label: t1.Format("15:04"), Anchor: "end"},
	}
	return c
}

// humanDuration is d for reading: 45s, 12m, 3h05m, 2d4h.
func humanDuration(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Minute:
		return strconv.Itoa(int(d/time.Second)) + "s"
	case d < time.Hour:
		return strconv.Itoa(int(d/time.Minute)) + "m"
	case d < 24*time.Hour:
		return fmt.Sprintf("%dh%02dm", d/time.Hour, (d%time.Hour)/time.Minute)
	}
	return fmt.Sprintf("%dd%dh", d/(24*time.Hour), (d%(24*time.Hour))/time.Hour)
}
