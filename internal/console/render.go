package console

import (
	"bytes"
	"fmt"
	"html/template"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// pageTemplate is one page: the layout, the shared partials and the page's
// own "content".
type pageTemplate = template.Template

// pageNames are the templates/<name>.html that define a page.
var pageNames = []string{"overview", "list", "claim", "bulk", "bulkdone", "error"}

var funcs = template.FuncMap{
	"vis":   visible,
	"cut":   cut,
	"stamp": stamp,
	"when":  when,
	"age":   age,
	"seq": func(p *int64) string {
		if p == nil {
			return "—"
		}
		return strconv.FormatInt(*p, 10)
	},
	"dur": humanDuration,
	"f1":  func(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) },
	"inc": func(i int) int { return i + 1 },
	// baseline and right are the bottom and right edges of a chart's plot.
	"baseline": func(c Chart) float64 { return c.PY + c.PH },
	"right":    func(c Chart) float64 { return c.PX + c.PW },
}

func parsePages() (map[string]*pageTemplate, error) {
	base, err := template.New("layout").Funcs(funcs).ParseFS(assets, "templates/layout.html", "templates/partials.html")
	if err != nil {
		return nil, fmt.Errorf("console: templates: %w", err)
	}
	pages := map[string]*pageTemplate{}
	for _, name := range pageNames {
		t, err := base.Clone()
		if err != nil {
			return nil, err
		}
		if t, err = t.ParseFS(assets, "templates/"+name+".html"); err != nil {
			return nil, fmt.Errorf("console: template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// view is what every page gets.
type view struct {
	Title string
	Nav   string // overview | flagged | claims
	Op    *Operator
	CSRF  string // the forms' token; empty without an operator
	Now   time.Time
	Flash *Flash
	Data  any
}

// Flash is a message at the top of a page: the outcome of an action.
type Flash struct {
	Kind  string // ok | error | warn
	Title string
	Lines []string
}

// newView starts the view of r: the operator, and the CSRF token of the
// forms when there is one.
func (s *Server) newView(w http.ResponseWriter, r *http.Request, title, nav string) *view {
	v := &view{Title: title, Nav: nav, Op: s.operator(r)}
	if v.Op != nil {
		v.CSRF = s.csrfToken(v.Op)
	}
	return v
}

// render writes page with status. The page is rendered first, so a
// template error is a clean 500, not half a page.
func (s *Server) render(w http.ResponseWriter, status int, page string, v *view) {
	var buf bytes.Buffer
	if err := s.pages[page].ExecuteTemplate(&buf, "layout", v); err != nil {
		s.log.Error("console: render", "page", page, "err", err)
		http.Error(w, "the page could not be rendered (see the console's log)", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// renderError writes an error page.
func (s *Server) renderError(w http.ResponseWriter, r *http.Request, status int, title string, lines ...string) {
	v := s.newView(w, r, title, "")
	v.Flash = &Flash{Kind: "error", Title: title, Lines: lines}
	s.render(w, status, "error", v)
}

// storeError logs a failed store call and writes a page that says so,
// without the driver's details.
func (s *Server) storeError(w http.ResponseWriter, r *http.Request, what string, err error) {
	s.log.Error("console: "+what, "err", err)
	s.renderError(w, r, http.StatusServiceUnavailable, "The claims database did not answer",
		"Reading "+what+" failed; the console's log has the details. Try again in a moment.")
}

// visible shows producer-controlled text as it is, except the characters
// that would hide or disguise it: controls (tab and newline included) and
// bidirectional overrides are written as escapes; invalid UTF-8 as U+FFFD.
func visible(s string) string {
	if !strings.ContainsFunc(s, isInvisible) && utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	for _, r := range strings.ToValidUTF8(s, "\uFFFD") {
		switch {
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case isInvisible(r) && r < 0x100:
			fmt.Fprintf(&b, `\x%02x`, r)
		case isInvisible(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// cut shortens s to n characters, marking the cut.
func cut(n int, s string) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

const stampLayout = "2006-01-02 15:04:05.000Z"

func stamp(t time.Time) string { return t.UTC().Format(stampLayout) }

// age is how long before now t was, or how long after ("in 3m").
func age(now, t time.Time) string {
	d := now.Sub(t)
	if d < 0 {
		return "in " + humanDuration(-d)
	}
	return humanDuration(d) + " ago"
}

// when is a nullable time with its age by now, or "—".
func when(now time.Time, t *time.Time) string {
	if t == nil {
		return "—"
	}
	return stamp(*t) + " (" + age(now, *t) + ")"
}
