// Package console is the operator console: a small web application, served
// by `reconciler console` (or inside `reconciler run`), in which operators
// review the claims table and act on flagged claims with the same guarded
// actions as the CLI (reconciler.Redrive and reconciler.Resolve: one
// implementation of each action, two front ends).
//
// # Pages
//
//   - GET /             overview: counts of the open work by state, consumer
//     and flag reason, flagged claims per hour, the age of the oldest
//     unfinished claim over time and the ages of the unfinished claims now;
//   - GET /claims       list with filters (state, consumer, route, reason
//     prefix, older than) in the query string, keyset-paged (after=<id>);
//   - GET /claims/{id}  one claim: every field and timestamp with its age by
//     the database clock, the idempotency key and its revisions, the
//     take-over audit, the downstream's recorded answer, a failed claim's
//     reason and dead letter, a payload preview, the audit trail and the
//     actions (none on a failed claim: the downstream's answer is final);
//   - POST /claims/{id}/redrive, POST /claims/{id}/resolve: the actions; a
//     redrive with new_key=1 and a note runs under a new idempotency key,
//     offered only on a route with allowNewKey (never in bulk);
//   - GET /bulk         the confirm page of a bulk action on the flagged
//     claims a filter matches (how many, which, at most MaxBulk);
//   - POST /bulk        runs it, claim by claim, and reports each outcome;
//   - GET /healthz      the database answers (for the platform's probes).
//
// Pages are server-rendered with html/template from embedded templates;
// the stylesheet, a few lines of script (disabling a form's buttons once it
// is sent) and nothing else are embedded too: no CDN, no build step. Charts
// are SVG drawn on the server.
//
// # Identity and safety
//
// Actions are recorded with the identity the platform's built-in
// authentication (Container Apps "Easy Auth", Microsoft Entra ID) passes
// in X-MS-CLIENT-PRINCIPAL-NAME and X-MS-CLIENT-PRINCIPAL-ID; the platform
// removes those headers from clients' requests, so only it can set them.
// A request without them is read-only: pages render without action forms
// and every POST is refused (403). Options.LocalOperator (the setting
// SBCLAIM_CONSOLE_LOCAL_OPERATOR) names an operator for local development
// instead: the headers are then ignored, every page says "local
// development, not signed in", and the audit records the name with
// "(local, not signed in)".
//
// Every state-changing request is a POST that must carry a CSRF token (an
// HMAC of the operator's identity under a random per-browser secret in a
// SameSite=Strict, HttpOnly cookie, __Host- prefixed over HTTPS) and pass
// net/http's cross-origin protection (Sec-Fetch-Site, Origin). Responses
// carry a Content-Security-Policy without inline script or style
// (default-src 'self'; frame-ancestors 'none'), X-Frame-Options DENY,
// X-Content-Type-Options nosniff, Referrer-Policy same-origin and
// Cache-Control no-store. Every producer-controlled text (message id,
// subject, properties, payload, errors, reasons, the recorded answer's
// headers and fields, notes) goes through
// html/template's escaping, with control and bidirectional-override
// characters shown as escapes. The console shows route names and
// fingerprints, never the routes file, its secrets or the database URL.
//
// # Costs
//
// The overview is one Store.Overview call (see claim.Store: it reads only
// the partial indexes of unfinished and flagged claims) per page view, and
// the sampler one Store.Stats call a minute. The list is one Store.List
// call per page; its filters are residual predicates on the index the
// state selects (flagged: ix_claims_flagged, failed: ix_claims_failed), so
// a filter on all states pages through the table by primary key, 50 rows
// a page.
package console
