package console

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/internal/bridge"
	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/reconciler"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
)

//go:embed templates/*.html static/*
var assets embed.FS

// Defaults and bounds.
const (
	// MaxBulk is the most claims one bulk action touches.
	MaxBulk = 100
	// PageSize is the number of claims per list page.
	PageSize = 50
	// DefaultSampleInterval and DefaultSampleCapacity: the sampler of the
	// oldest unfinished claim's age keeps 12 hours at one sample a minute.
	DefaultSampleInterval = time.Minute
	DefaultSampleCapacity = 720
	// DefaultBulkTime bounds a bulk action: claims not reached by then are
	// reported as not attempted.
	DefaultBulkTime = 10 * time.Minute
	// MaxNote is the longest note an operator may write (the SQL Server
	// column holds 4000).
	MaxNote = 2000
	// maxNameLength bounds the operator's name taken from a token or a header.
	maxNameLength = 150
)

// ReasonGroup is one group of flag reasons on the overview: the flagged
// claims whose reason starts with Prefix (the first group that matches).
type ReasonGroup struct {
	Label, Prefix string
}

// DefaultReasonGroups are the reasons the processor and the reconciler
// write, by what an operator does about them. Reasons in none of them are
// counted as "other"; the list's reason filter takes any prefix.
var DefaultReasonGroups = []ReasonGroup{
	{"no heartbeat: the processor stopped mid-effect", "no heartbeat since "},
	{"released and not taken over", "released and not taken over since "},
	{"recovery: the outcome is still unknown", "recovery: the outcome is still unknown"},
	{"recovery: the downstream refused it", "recovery: the downstream answered"},
	{"route changed since it was claimed", "route changed"},
	{"route cannot be re-run (manual or database-only)", "route "},
	{"a redrive failed or stopped", "redrive by "},
	{"no routes for its consumer", "no routes for consumer "},
	{"the routes file routes no effect to it", "the routes file routes no effect"},
	{"no stored payload", "no stored payload"},
}

// Options configure a console.
type Options struct {
	Store claim.Store
	// Routes are the processors' routes, for redrive; without them redrive
	// is refused (the page says to set SBCLAIM_ROUTES).
	Routes reconciler.Routes
	// The identity of the operators: exactly one of OIDC (tokens signed by
	// the identity provider, verified by the console), TrustIdentityHeaders
	// and LocalOperator. Without an identity every route answers 401.
	OIDC *OIDC
	// TrustIdentityHeaders takes the identity from the platform's
	// X-MS-CLIENT-PRINCIPAL-NAME/-ID headers without verifying it: only
	// behind a trusted front that strips them from clients' requests and
	// sets them itself, on a port nothing else can reach. Anybody who
	// reaches the port directly can claim to be anyone.
	TrustIdentityHeaders bool
	// LocalOperator, when set, is the operator of every request, for local
	// development: identity headers and tokens are ignored, every page says
	// "local development, not signed in", and only requests addressed to a
	// loopback host (localhost, 127.0.0.1, [::1]) are answered.
	LocalOperator string
	Logger        *slog.Logger // nil discards
	// Retry, HeartbeatInterval and StoreTimeout are the redrive's (see
	// reconciler.RedriveParams); zero values take its defaults.
	Retry             sideeffects.RetryPolicy
	HeartbeatInterval time.Duration
	StoreTimeout      time.Duration
	// BulkLimit bounds a bulk action (default and maximum MaxBulk);
	// BulkTime bounds its duration (default DefaultBulkTime).
	BulkLimit int
	BulkTime  time.Duration
	// SampleInterval and SampleCapacity shape the in-process history of
	// the oldest unfinished claim's age.
	SampleInterval time.Duration
	SampleCapacity int
	// ReasonGroups group the overview's flagged claims (default
	// DefaultReasonGroups; at most claim.MaxReasonGroups).
	ReasonGroups []ReasonGroup
}

// Server is the console: an http.Handler, and the sampler that Run drives.
type Server struct {
	opts    Options
	log     *slog.Logger
	pages   map[string]*pageTemplate
	sampler *Sampler
	handler http.Handler
	// verifier checks tokens (Options.OIDC); csrfKey keys the forms'
	// CSRF tokens.
	verifier *tokenVerifier
	csrfKey  []byte
}

// New builds a console. It does not touch the store: Run starts sampling.
func New(opts Options) (*Server, error) {
	if opts.Store == nil {
		return nil, errors.New("console: Store is required")
	}
	if opts.LocalOperator != "" {
		if err := validName(opts.LocalOperator); err != nil {
			return nil, fmt.Errorf("console: LocalOperator: %w", err)
		}
	}
	modes := 0
	for _, on := range []bool{opts.OIDC != nil, opts.TrustIdentityHeaders, opts.LocalOperator != ""} {
		if on {
			modes++
		}
	}
	if modes != 1 {
		return nil, errors.New("console: set exactly one of OIDC, TrustIdentityHeaders and LocalOperator (the operators' identity)")
	}
	if o := opts.OIDC; o != nil && (o.Issuer == "" || o.Audience == "") {
		return nil, errors.New("console: OIDC needs an Issuer and an Audience")
	}
	opts.BulkLimit = min(cmp.Or(opts.BulkLimit, MaxBulk), MaxBulk)
	opts.BulkTime = cmp.Or(opts.BulkTime, DefaultBulkTime)
	if opts.ReasonGroups == nil {
		opts.ReasonGroups = DefaultReasonGroups
	}
	if len(opts.ReasonGroups) > claim.MaxReasonGroups {
		return nil, fmt.Errorf("console: at most %d reason groups, got %d", claim.MaxReasonGroups, len(opts.ReasonGroups))
	}
	s := &Server{opts: opts, log: cmp.Or(opts.Logger, slog.New(slog.DiscardHandler)), csrfKey: newCSRFKey()}
	if opts.OIDC != nil {
		s.verifier = &tokenVerifier{cfg: *opts.OIDC}
	}
	s.sampler = NewSampler(opts.Store, cmp.Or(opts.SampleInterval, DefaultSampleInterval), cmp.Or(opts.SampleCapacity, DefaultSampleCapacity))
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	s.pages = pages
	s.handler = s.routes()
	return s, nil
}

// NewPublic builds a console on the public API's values: the claims store
// and the processors' routers by consumer (the "" entry serves consumers
// without one of their own; none: redrive is off). They replace
// opts.Store and opts.Routes. A program built on package sbclaim (the
// reconciler command) needs no internal claim type to serve the console.
func NewPublic(store *sbclaim.Store, routers map[string]*sbclaim.Router, opts Options) (*Server, error) {
	if store == nil {
		return nil, errors.New("console: Store is required")
	}
	opts.Store, opts.Routes = bridge.StoreOf(store), nil
	if len(routers) > 0 {
		opts.Routes = make(reconciler.Routes, len(routers))
		for consumer, r := range routers {
			opts.Routes[consumer] = bridge.RouterOf(r)
		}
	}
	return New(opts)
}

// ValidOperatorName checks an operator name from the configuration
// (Options.LocalOperator).
func ValidOperatorName(name string) error { return validName(name) }

func validName(name string) error {
	switch {
	case strings.TrimSpace(name) != name || name == "":
		return errors.New("must not be empty or start or end with white space")
	case utf8.RuneCountInString(name) > maxNameLength:
		return fmt.Errorf("must be at most %d characters", maxNameLength)
	case strings.ContainsFunc(name, isInvisible):
		return errors.New("must not contain control or bidirectional-override characters")
	}
	return nil
}

// Sampler returns the console's sampler (tests drive it directly).
func (s *Server) Sampler() *Sampler { return s.sampler }

// Run samples the oldest unfinished claim's age until ctx ends. With
// Options.OIDC it first reads the identity provider's discovery document,
// logging an error when it cannot (requests retry it).
func (s *Server) Run(ctx context.Context) {
	if s.verifier != nil {
		if _, err := s.verifier.get(ctx); err != nil {
			s.log.Error("console: every request will be refused until the identity provider answers", "err", err)
		}
	}
	s.sampler.Run(ctx, s.log)
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", s.serveOverview)
	mux.HandleFunc("GET /claims", s.serveList)
	mux.HandleFunc("GET /claims/{id}", s.serveClaim)
	mux.HandleFunc("POST /claims/{id}/redrive", s.serveRedrive)
	mux.HandleFunc("POST /claims/{id}/handoff", s.serveHandOff)
	mux.HandleFunc("POST /claims/{id}/retry", s.serveRetry)
	mux.HandleFunc("POST /claims/{id}/resolve", s.serveResolve)
	mux.HandleFunc("GET /bulk", s.serveBulkConfirm)
	mux.HandleFunc("POST /bulk", s.serveBulk)
	static, err := fs.Sub(assets, "static")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	files := http.StripPrefix("/static/", http.FileServerFS(static))
	mux.Handle("GET /static/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=3600")
		files.ServeHTTP(w, r)
	}))
	// No catch-all: an action's path by GET is 405 Method Not Allowed.
	// Cross-origin protection refuses unsafe requests that a browser marks
	// as cross-site (Sec-Fetch-Site) or whose Origin is not this host,
	// before any handler runs; the CSRF token is checked in the handlers.
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.renderError(w, r, http.StatusForbidden, "Refused: cross-origin request",
			"This request came from another site. Nothing was changed.")
	}))
	// Every route, the static files included, needs an identity: the
	// gate runs before routing, so an unknown path is 401 too.
	return securityHeaders(s.authenticate(cop.Handler(mux)))
}

// contentSecurityPolicy: nothing but this origin's own files; no inline
// script or style, no plugins, no framing, forms post here only.
const contentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"

// securityHeaders sets the headers every response carries.
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		h.Set("Cross-Origin-Opener-Policy", "same-origin")
		h.Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

// storeCtx bounds one store call of a page.
func (s *Server) storeCtx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), cmp.Or(s.opts.StoreTimeout, reconciler.DefaultQueryTimeout))
}
