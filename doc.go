// Package sbclaim gives Azure Service Bus consumers exactly-once effects
// on top of at-least-once delivery.
//
// Service Bus redelivers: a producer retries a send whose ack was lost, a
// lock expires during a slow call, a replica dies between its work and its
// CompleteMessage. sbclaim's Processor receives each message (peek-lock),
// claims it by committing a row whose unique index on (dedup key,
// consumer) lets exactly one replica win, runs the message's handler with
// an idempotency key to send downstream, records the outcome and settles
// the message — completing it on the success path and on the duplicate
// path. A claim whose holder died is taken over by the message's next
// delivery, or by the reconciler (package operator), and its handler run
// again with the same key, so the downstream deduplicates the repeat. Only
// what a person must decide is flagged for operators.
//
// # Handlers
//
// A HandlerFunc is your code: a Stripe charge through stripe-go, an email
// through its SDK. It gets a *Delivery with the SDK's message and the
// idempotency key, and returns what happened: nil (performed),
// NotPerformed, Misconfigured, Rejected, Permanent, KeyConflict or
// NeedsOperator; any other error, or a panic, means the outcome is
// unknown. Rejected, Permanent and KeyConflict have the same effect (the
// claim fails, the message is dead-lettered once, the effect is never
// repeated) and differ only in the dead letter's reason: EffectRejected,
// EffectFailed, IdempotencyKeyConflict. NotPerformedAfter passes on the
// delay a downstream asked for. A TxHandlerFunc writes only to the
// claims database, in the transaction that inserts the claim (Store.Rebind
// writes its ? placeholders in the store's dialect).
//
// What a handler writer needs, in short: HandlerFunc and TxHandlerFunc,
// Delivery, the outcome wrappers above, HTTPOutcome (a net/http answer or
// error to the outcome, by the routes file's rules: one call for a
// raw-HTTP handler), JSON and JSONTx (a typed payload), Route, Router and
// Middleware (Router.Use), and package sbclaimtest (Work, Start). The rest
// of this package opens the store and runs the processor; package
// operator runs the reconciler and serves operators (resolve, redrive,
// retry, history).
//
//	charge := func(ctx context.Context, d *sbclaim.Delivery) error {
//		params := &stripe.PaymentIntentCreateParams{Amount: stripe.Int64(1999), Currency: stripe.String("usd")}
//		params.SetIdempotencyKey(d.IdempotencyKey()) // the same on every repeat
//		_, err := sc.V1PaymentIntents.Create(ctx, params)
//		var se *stripe.Error
//		if errors.As(err, &se) && se.Type == stripe.ErrorTypeCard {
//			return sbclaim.Rejected(err) // a decline: final, dead-lettered once
//		}
//		return err // nil: performed; anything else: unknown, repeated with the key
//	}
//
// # Routing
//
// A Router picks each message's Route by name and Match (MatchSubject,
// MatchProperty, or a function); each route says whether its downstream
// honours the key (RecoveryAuto) or not (RecoveryManual). A routes file
// (HTTP calls configured in YAML, read by package routesfile: Load and
// Parse, which were LoadRoutesFile and ParseRoutesFile) is one entry among
// Go routes (Router.AddRoutesFile).
//
// # Running it
//
// OpenStore opens the claims table (SQL Server, PostgreSQL or SQLite,
// whose package under store/ the program imports; Migrate creates it),
// NewProcessor runs the protocol on a receiver the SDK opens (or package
// sbclaimtest's in-memory queue), and operator.NewReconciler runs the
// periodic passes — recovery with your handlers, the flags for operators
// and the purge — in your binary or in the reconciler command.
//
// Package sbclaimtest has what a handler's tests need: Work (one message
// through the real protocol, and what became of it), an in-memory queue
// with Service Bus's delivery semantics, a SQLite store in the test's
// directory, short delays, and crashes.
//
// What not every program needs is in packages of its own, so that this
// one links none of their libraries: the stores (store/sqlite,
// store/postgres, store/sqlserver), package prommetrics (the processor's
// metrics for a Prometheus registry: ProcessorConfig.Metrics, which
// replaced ProcessorConfig.Registerer), package routesfile (YAML, JSON
// Schema, otelhttp) and package otelsetup (OpenTelemetry's exporters from
// OTEL_*; this package uses only the OpenTelemetry API).
//
// The protocol, the claim states and why they are shaped so are in
// docs/design.md; running and operating it in the guides (docs/README.md).
package sbclaim
