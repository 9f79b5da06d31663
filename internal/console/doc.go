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
//   - POST /bulk        runs it, claim by claim, and reports each outcome.
//
// The console serves no health check: the platform's probes reach a
// container's port directly, without the sign-in in front, so /healthz
// and /metrics are on a port of their own (SBCLAIM_HTTP_ADDR in
// cmd/reconciler) and the console's port answers only operators.
//
// Pages are server-rendered with html/template from embedded templates;
// the stylesheet, a few lines of script (disabling a form's buttons once it
// is sent) and nothing else are embedded too: no CDN, no build step. Charts
// are SVG drawn on the server.
//
// # Identity and safety
//
// Every route — pages, actions, the static files, unknown paths — needs an
// identity, established before routing; without one the answer is 401
// and nothing is read or changed. The identity comes one way, chosen in
// Options:
//
//   - OIDC (the deployed console): a token signed by the configured
//     issuer (Microsoft Entra ID), in X-MS-TOKEN-AAD-ID-TOKEN (the
//     platform's sign-in forwards it when its token store is on) or in
//     Authorization: Bearer. The console verifies it itself with go-oidc:
//     the signature against the keys the issuer publishes (discovery, then
//     JWKS), the issuer, the audience (the app registration's client id),
//     the expiry. The operator is the verified claims: preferred_username
//     (else upn, email, name) and oid (else sub). The principal headers
//     beside the token are ignored: they are plain text anybody who reaches
//     the port can send.
//   - TrustIdentityHeaders: the platform's X-MS-CLIENT-PRINCIPAL-NAME and
//     -ID, unverified, only for a console behind a front that strips and
//     sets them on a port nothing else reaches; pages and the audit mark
//     the identity "unverified header".
//   - LocalOperator (local development): nobody signs in, every page says
//     so, the audit records the name with "(local, not signed in)", and
//     only requests addressed to localhost, 127.0.0.1 or [::1] are
//     answered (403 otherwise), so a page on a DNS name rebound to
//     127.0.0.1 can neither read nor act.
//
// Every state-changing request is a POST that must carry a CSRF token (an
// HMAC of the verified identity under a random key of the process: no
// cookie, nothing the caller chooses) and pass net/http's cross-origin
// protection (Sec-Fetch-Site, Origin). Responses
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
