// Package routesfile reads a routes file into package sideeffects' router:
// the YAML and its schema (routesyaml), then the routes
// (sideeffects.BuildRoutes), their requests traced (tracinghttp). The
// binaries, the test kits and the public package routesfile read routes
// files through it; the root package does not import it, so a program
// without a routes file links no YAML or JSON Schema library, and no
// otelhttp.
package routesfile

import (
	"fmt"
	"log/slog"
	"net/http"
	"os"

	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/sideeffects/routesyaml"
	"github.com/sbclaim/sbclaim/internal/tracing/tracinghttp"
)

// Parse validates a routes file (YAML) against routesyaml.Schema, checks
// what a schema cannot and builds one HTTP effect per route, its requests
// sent by client (nil: a client of its own) through a tracing transport
// (Traced): see sideeffects.BuildRoutes for getenv, client and logger. Every problem is
// reported at once, each as a *sideeffects.RoutesError naming the route
// and field (errors.As finds the first).
func Parse(data []byte, getenv func(string) string, client *http.Client, logger *slog.Logger) (*sideeffects.HTTPRouter, error) {
	return sideeffects.BuildRoutes(func(into any) error {
		return routesyaml.Decode(data, into, newProblem)
	}, getenv, Traced(client), logger)
}

// Traced returns a copy of client (nil: a client of its own) whose
// transport traces each request (tracinghttp.Transport): a span per
// request, and the downstream gets its traceparent.
func Traced(client *http.Client) *http.Client {
	if client == nil {
		client = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	c := *client
	c.Transport = tracinghttp.Transport(c.Transport)
	return &c
}

// Load reads the routes file at path (SBCLAIM_ROUTES) and parses it with a
// default HTTP client; see Parse.
func Load(path string, getenv func(string) string, logger *slog.Logger) (*sideeffects.HTTPRouter, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("routes file: %w", err)
	}
	r, err := Parse(data, getenv, nil, logger)
	if err != nil {
		return nil, fmt.Errorf("routes file %s: %w", path, err)
	}
	return r, nil
}

func newProblem(route, field, problem string) error {
	return &sideeffects.RoutesError{Route: route, Field: field, Problem: problem}
}
