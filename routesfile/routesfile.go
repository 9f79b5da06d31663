// Package routesfile reads a routes file: HTTP routes for users who do not
// write Go, each calling an HTTP API with the message (or a request mapped
// from its JSON body) and the idempotency key (docs/routes.md has the
// format). A program registers the file's routes on its router:
//
//	f, err := routesfile.Load("routes.yaml", nil)
//	...
//	err = router.AddRoutesFile(f)
//
// The file is YAML, validated against a JSON Schema; this package links
// the libraries for both, which the root package does not. Load and Parse
// were sbclaim.LoadRoutesFile and sbclaim.ParseRoutesFile, and Options
// sbclaim.RoutesFileOptions.
package routesfile

import (
	"fmt"
	"log/slog"
	"net/http"
	"os"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/internal/bridge"
	routes "github.com/sbclaim/sbclaim/internal/sideeffects/routesfile"
)

// Options tune Load and Parse. The zero value (and nil) is usable.
type Options struct {
	// Getenv reads the variables headers name with fromEnv (default
	// os.Getenv).
	Getenv func(string) string
	// Logger receives warnings about the file (default: discarded).
	Logger *slog.Logger
	// HTTPClient sends the routes' requests (default: a client of the
	// routes' own). Its transport, proxy and TLS settings are used as
	// they are; redirects are never followed, whatever its CheckRedirect,
	// and each request is bounded by its route's timeout.
	HTTPClient *http.Client
}

func (o *Options) withDefaults() Options {
	var out Options
	if o != nil {
		out = *o
	}
	if out.Getenv == nil {
		out.Getenv = os.Getenv
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	return out
}

// Load reads and checks the routes file at path. Every problem is
// reported at once, naming the route and field; secrets are redacted.
func Load(path string, opts *Options) (*sbclaim.RoutesFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("routes file: %w", err)
	}
	o := opts.withDefaults()
	r, err := routes.Parse(data, o.Getenv, o.HTTPClient, o.Logger)
	if err != nil {
		return nil, fmt.Errorf("routes file %s: %w", path, err)
	}
	return bridge.NewRoutesFile(path, r).(*sbclaim.RoutesFile), nil
}

// Parse checks a routes file's content (YAML) as Load does, for a program
// that holds it in memory (embedded, generated, or fetched from its
// configuration store).
func Parse(data []byte, opts *Options) (*sbclaim.RoutesFile, error) {
	o := opts.withDefaults()
	r, err := routes.Parse(data, o.Getenv, o.HTTPClient, o.Logger)
	if err != nil {
		return nil, fmt.Errorf("routes file: %w", err)
	}
	return bridge.NewRoutesFile("(parsed)", r).(*sbclaim.RoutesFile), nil
}
