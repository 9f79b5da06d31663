// Package sideeffects runs the effects of claimed messages and sorts every
// result into one of six outcomes. The outcomes (see Outcome and Classify):
//
//   - ok: the effect happened — mark the claim processed, complete;
//   - retryable: definitely not performed, may succeed later — release the
//     claim, abandon;
//   - permanent: definitely not performed, never will be — fail the claim,
//     dead-letter once;
//   - rejected: the downstream's final business answer for the key (a card
//     decline): finished, possibly recorded downstream, never repeated —
//     fail the claim, dead-letter once;
//   - conflict: the key was already used with another payload — fail the
//     claim, dead-letter once;
//   - unknown: may or may not have happened — keep the claim with its last
//     error; the reconciler flags it for an operator.
//
// Retryable and unknown are retried (RetryPolicy); the others are Final.
//
// There are two kinds of effect. An Effect calls something outside the
// claims database (an HTTP API, a mailer) and receives the message's dedup
// key, which it must pass downstream as the idempotency key, unchanged on
// every attempt. A TxEffect writes only to the claims database and receives
// the *sql.Tx in which the claim marker is inserted (the store's ClaimTx
// calls it): the marker and its writes commit together or not at all.
//
// A Router resolves a message to its Handler. Routes (built by NewRouter)
// maps subjects to Go effects; HTTPRouter (built by BuildRoutes from a
// routes file, SBCLAIM_ROUTES, that package routesfile reads: the YAML and
// its schema live there, so this package links neither) maps them to HTTP
// calls; Chain combines routers.
//
// # The HTTP effect
//
// Each route sends the message body, with the message's ContentType (or the
// route's), to a fixed method and URL. The URL is never built from message
// content: a URL containing template syntax ({, }, $, <, > or their
// percent-encodings), or that is not an absolute http/https URL, is refused
// at start-up.
//
// The one exception is a request mapping (a route's or step's `request`,
// mapping.go): a JSON message's fields, picked by JSON Pointer, with fixed
// values beside them, become a form-encoded or JSON body, and whole path
// segments written {name} in the URL. Placeholders anywhere but a whole
// path segment (the scheme, host, port, query, fragment) are refused at
// start-up; a path value is one segment of RFC 3986 unreserved characters,
// never empty, "." or "..", and anything else is refused rather than
// percent-encoded. HTTPRouter.Route builds every mapped request before
// any claim and returns an *InputError with ReasonMappingFailed when it
// cannot; the route's fingerprint covers the URL template and the
// mapping. Configured headers take their values from the file ({value:
// ...}) or, for secrets, from environment variables ({fromEnv: NAME}); a
// missing variable is a start-up error naming the route, header and
// variable, and secret values are redacted from every log line, error and
// recorded answer.
//
// A URL's path and query are never written to a log line, an error (and so
// a claim or a dead-letter description) or an Answer: webhook URLs carry
// their secret in the path (Slack, Teams) and some APIs take their key in
// the query. Logs and errors name the route, the step and the host; the
// *url.Error net/http returns is rewritten to scheme://host; a downstream
// that echoes its URL has the path and the (long enough) query values
// redacted.
//
// A message's ContentType becomes the Content-Type header only when
// CheckContentType accepts it (a media type, printable ASCII, bounded): a
// CR/LF would make net/http refuse the request before connecting, which
// looks retryable and loops. HTTPRouter.Route returns an *InputError with
// ReasonInvalidContentType before any claim (the processor checks every
// message the same way), and the effect, called anyway, answers permanent
// without sending.
//
// Every request carries Idempotency-Key: the claim's key (scoped to the
// consumer for new claims, "<consumer>/<dedup key>", escaped; the raw
// dedup key for claims taken before key forms and for a route with
// key: raw), extended per step by StepKey for a route with steps
// ("<key>/<step>" scoped, "<key>:<step>" raw). Steps run in order, each as its own request
// with its own classification. If step 2 fails and the effect is retried,
// step 1 is sent again with the same key (key/step1) and the downstream
// replays its first answer instead of acting twice. A step that fails as
// retryable, permanent or unknown after an earlier step was performed makes
// the effect partial, reported as unknown so that the claim is kept for an
// operator. A rejected or conflict answer from a later step stays rejected
// or conflict: it is the downstream's final word about that step's key
// (every retry would replay it), so the effect is finished — partially —
// and the error names the steps that were performed.
//
// Every request goes through an otelhttp transport (tracinghttp.Transport,
// set by routesfile.Parse):
// when the attempt's context carries a span, the request gets a client span
// (method, host and status only) and carries its traceparent; otherwise
// the application properties traceparent, tracestate and Diagnostic-Id are
// forwarded as headers when the message carries them. Redirects are never
// followed. Each route has a timeout per request (default 10s).
//
// One Perform call makes one attempt per step; RetryPolicy.Do retries the
// whole effect (same key every time) with exponential backoff and jitter,
// bounded by attempts and a time budget inside the lock-renewal window.
// (net/http itself may resend a request whose reused keep-alive connection
// turned out dead before any answer: it treats a request carrying
// Idempotency-Key as replayable. That is safe for the same reason, and is
// why the downstream may count more requests than attempts were logged.)
//
// # Recovery: may sbclaim repeat an effect on its own?
//
// A route's recovery is auto (the default) or manual. auto says the
// downstream deduplicates on Idempotency-Key, so repeating an attempt whose
// outcome is unknown with the same key is safe: retries repeat it, a
// redelivery takes over a claim whose holder went silent, and the
// reconciler's recovery pass re-runs it. manual says the downstream does
// not honour the key: an unknown outcome is never repeated without an
// operator (RetryPolicy.StopOnUnknown, no take-over of a silent holder,
// the reconciler flags the claim).
//
// Each Handler carries its route's name and Fingerprint (for an HTTP
// route, each step's name, method and URL; not its headers, so rotating a
// secret changes nothing). Claims record both, and a claim is never taken
// over or redriven under another route or fingerprint: the same key must
// reach the same effect, and a renamed step would send new step keys.
//
// # Answer rules
//
// A route may list answer rules (answers: in the routes file), tried in
// order before the default table; the first that matches decides:
//
//	answers:
//	  - {status: 402, outcome: rejected}
//	  - {status: 400, field: /error/type, equals: idempotency_error, outcome: conflict}
//	  - {status: 409, outcome: retryable}
//	  - {status: 5xx, header: Idempotent-Replayed, value: "true", outcome: flag}
//	  - {status: 5xx, outcome: unknown}           # a class; or a range "500-599"
//
// status is a code, a range or a class; field (a JSON Pointer, RFC 6901)
// and equals narrow a rule to answers whose JSON body has that value there
// (same JSON type; numbers compared as numbers; a body that is not JSON, or
// larger than 64 KiB, matches no field rule); header and value narrow it
// to answers with that response header (name and value compared without
// case, surrounding white space ignored, any of the header's lines). All
// of a rule's conditions must hold. outcome is ok, rejected, permanent,
// retryable, unknown, conflict or flag: unknown, and a person must decide
// (NeedsOperator: the retry loop stops, and the claim is flagged at once;
// for a failure the downstream stored under the key and replays). An
// answer no rule matches is classified by the table below. A retryable or
// unknown rule honours Retry-After (both are retried, and the downstream
// said when to come back); the other outcomes are not retried. A step's
// own rules are tried before its route's.
//
// A route's keyLifetime (Handler.KeyLifetime) says how long its
// downstream keeps a key: an older claim is flagged instead of repeated
// with its key. Neither rules nor the key lifetime are part of the
// fingerprint.
//
// # What is kept of an answer
//
// Every HTTP answer, whatever its status, becomes an Answer: the status,
// the step, and the values of the response headers and JSON fields the
// route lists under record: (record: {headers: [Request-Id], fields: [/id,
// /error/charge]}). Headers that carry secrets cannot be listed
// (Authorization, Proxy-Authorization, Cookie, Set-Cookie, and any header
// the route sets from the environment). Answers are bounded
// (MaxAnswerEntries entries, MaxAnswerValueBytes per value cut on a UTF-8
// boundary, MaxAnswerBytes as JSON), cleaned of control characters and
// redacted. The HTTP effect reports each one to the context's recorder
// (RecordAnswers; ReportAnswer lets a Go effect do the same), and a failed
// attempt's *Error carries it (Error.Answer, AnswerOf). For a route with
// steps, the recorder's Last answer is the last step's that got one.
//
// A failed answer's error message carries an excerpt of the body (at most
// MaxExcerptBytes, control characters removed, secrets redacted before the
// cut) unless the route says excerpt: false — for a downstream that echoes
// the request, where the excerpt could carry personal data; record the
// fields that matter instead.
//
// # A new key
//
// Some downstreams store a failure under the key and replay it to every
// retry (Stripe stores a 500): no same-key retry or redrive can ever
// succeed. A route with allowNewKey: true (Handler.AllowNewKey) lets an
// operator redrive a claim under a new key, <key>:r<N>. A new key is a new
// request: the downstream deduplicates nothing against the old key, so it
// is safe only once an operator has checked that nothing was done under
// the old one; on a route with steps it repeats every step.
//
// # Response classification
//
// One table in code (statusTable in classify.go) decides an answer no rule
// matched; the first row that matches wins:
//
//	| Answer                                              | Outcome   | Why / what happens next                                            |
//	|-----------------------------------------------------|-----------|--------------------------------------------------------------------|
//	| 2xx                                                 | ok        | performed (or replayed by the downstream's idempotency layer)      |
//	| 3xx                                                 | permanent | redirects are not followed; the route URL is wrong                 |
//	| 408 Request Timeout                                 | retryable | not performed; Retry-After honoured                                |
//	| 409 Conflict                                        | unknown   | same key still in flight downstream; retry later with the same key |
//	| 422 Unprocessable Entity                            | conflict  | the key was already used with another payload                      |
//	| 429 Too Many Requests                               | retryable | rate limited, not performed; Retry-After honoured                  |
//	| other 4xx                                           | permanent | the downstream rejected the request; not performed                 |
//	| 500 Internal Server Error                           | unknown   | the downstream may have performed the effect                       |
//	| 502 Bad Gateway                                     | unknown   | the downstream may have performed the effect                       |
//	| 503 Service Unavailable                             | retryable | not performed; Retry-After honoured                                |
//	| 504 Gateway Timeout                                 | unknown   | the downstream may have performed the effect                       |
//	| other 5xx                                           | unknown   | the downstream may have performed the effect                       |
//	| no answer: DNS, dial or TLS error (nothing sent)    | retryable | no connection was made, so nothing reached the downstream          |
//	| no answer: timeout or error after the request began | unknown   | the downstream may have received and performed it                  |
//	| not sent: the message's ContentType is invalid      | permanent | CheckContentType refused it; nothing was sent                      |
//
// Retry-After is read as delay-seconds or an HTTP-date; it replaces the
// next backoff wait, and when it would end after the retry budget the loop
// stops and the message goes back to the broker instead. Whether the
// request was sent is known from net/http/httptrace (GotConn, WroteRequest)
// and net.OpError's "dial" operation.
//
// Retryable and unknown outcomes are retried by RetryPolicy (same key, so
// safe); ok, permanent, rejected and conflict stop it. Once an attempt was
// unknown, a later retryable or permanent answer leaves the effect unknown,
// while a later rejected or conflict answer — the downstream's own final
// word about the key — ends it (see RetryPolicy.Do). After the last
// attempt, retryable releases the claim and abandons the message, unknown
// keeps the claim.
package sideeffects
