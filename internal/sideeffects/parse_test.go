package sideeffects

import (
	"fmt"
	"log/slog"
	"net/http"
	"os"

	"github.com/sbclaim/sbclaim/internal/sideeffects/routesyaml"
	"github.com/sbclaim/sbclaim/internal/tracing/tracinghttp"
)

// ParseRoutes and LoadRoutes are package routesfile's Parse and Load, for
// this package's own tests (which cannot import routesfile: it imports
// this package).
func ParseRoutes(data []byte, getenv func(string) string, client *http.Client, logger *slog.Logger) (*HTTPRouter, error) {
	if client == nil {
		client = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	c := *client
	c.Transport = tracinghttp.Transport(c.Transport)
	client = &c
	return BuildRoutes(func(into any) error {
		return routesyaml.Decode(data, into, func(route, field, problem string) error {
			return &RoutesError{Route: route, Field: field, Problem: problem}
		})
	}, getenv, client, logger)
}

func LoadRoutes(path string, getenv func(string) string, logger *slog.Logger) (*HTTPRouter, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("routes file: %w", err)
	}
	r, err := ParseRoutes(data, getenv, nil, logger)
	if err != nil {
		return nil, fmt.Errorf("routes file %s: %w", path, err)
	}
	return r, nil
}
