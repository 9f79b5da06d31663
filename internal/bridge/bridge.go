// Package bridge lets the module's own tools (the chaos harness, the
// operator console, packages operator, prommetrics and routesfile) reach
// the internal value behind a public sbclaim handle, and wrap an internal
// value in one, without widening the public API. The root package fills
// the functions in its init; importing github.com/sbclaim/sbclaim is
// enough to have them set.
package bridge

import (
	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/processor"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
)

var (
	// StoreOf returns the claim.Store behind an *sbclaim.Store.
	StoreOf func(store any) claim.Store
	// NewStore wraps a claim.Store (a fault-injecting wrapper, say) in an
	// *sbclaim.Store.
	NewStore func(s claim.Store) any
	// NewClaim returns the public view (*sbclaim.Claim) of a claim, for
	// package operator.
	NewClaim func(c *claim.Claim) any
	// RouterOf returns the router behind an *sbclaim.Router.
	RouterOf func(router any) sideeffects.Router
	// NewRouter wraps a router (a fault-injecting wrapper of RouterOf's,
	// say) in an *sbclaim.Router that routes every message through it.
	NewRouter func(r sideeffects.Router) any
	// NewRoutesFile wraps a routes file's router, read from path, in an
	// *sbclaim.RoutesFile, for package routesfile.
	NewRoutesFile func(path string, r *sideeffects.HTTPRouter) any
	// NewMetrics wraps a processor's instruments in an *sbclaim.Metrics,
	// for package prommetrics.
	NewMetrics func(m *processor.Metrics) any
)
