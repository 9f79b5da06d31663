// Command stripe charges an order's card once per order: it consumes
// payment events ({"order":42,"amount_cents":1999}) from a Service Bus
// queue and creates one Stripe PaymentIntent for each, through Stripe's
// official Go SDK, with sbclaim's idempotency key as Stripe's
// Idempotency-Key. It runs sbclaim's processor and reconciler in one
// binary.
//
//	SBCLAIM_DATABASE_URL=sqlite:/tmp/claims.db \
//	SBCLAIM_SERVICEBUS_CONNECTION_STRING='Endpoint=sb://...' SBCLAIM_QUEUE=payments \
//	STRIPE_SECRET_KEY=sk_test_... go run ./stripe
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/stripe/stripe-go/v82"

	"github.com/sbclaim/sbclaim"
	"github.com/sbclaim/sbclaim/operator"
	_ "github.com/sbclaim/sbclaim/store/postgres" // the claims stores SBCLAIM_DATABASE_URL may name
	_ "github.com/sbclaim/sbclaim/store/sqlite"
	_ "github.com/sbclaim/sbclaim/store/sqlserver"
)

// Charge returns the handler that charges one payment event: a confirmed
// PaymentIntent sent with the claim's idempotency key, so every repeat of
// the effect (a retry, a take-over after a crash, the reconciler's
// recovery) is the same request to Stripe, which replays its first answer.
func Charge(sc *stripe.Client) sbclaim.HandlerFunc {
	return func(ctx context.Context, d *sbclaim.Delivery) error {
		var ev struct {
			Order       int64 `json:"order"`
			AmountCents int64 `json:"amount_cents"`
		}
		if err := json.Unmarshal(d.Message().Body, &ev); err != nil {
			return sbclaim.Permanent(err)
		}
		params := &stripe.PaymentIntentCreateParams{
			Amount: stripe.Int64(ev.AmountCents), Currency: stripe.String(string(stripe.CurrencyUSD)),
			PaymentMethod: stripe.String("pm_card_visa"), Confirm: stripe.Bool(true),
			Metadata: map[string]string{"order": strconv.FormatInt(ev.Order, 10)},
		}
		params.SetIdempotencyKey(d.IdempotencyKey())
		pi, err := sc.V1PaymentIntents.Create(ctx, params)
		var se *stripe.Error
		switch {
		case err == nil:
			d.ReportAnswer(ctx, http.StatusOK, nil, map[string]string{"payment_intent": pi.ID})
			return nil
		case errors.As(err, &se) && se.HTTPStatusCode >= 500 && se.LastResponse != nil &&
			se.LastResponse.Header.Get("Idempotent-Replayed") == "true":
			// A failure Stripe stored under the key, replayed: every repeat
			// would get it again. A person decides (flagged at once).
			d.ReportAnswer(ctx, se.HTTPStatusCode, http.Header{"Idempotent-Replayed": {"true"}, "Request-Id": {se.RequestID}}, nil)
			return sbclaim.NeedsOperator(err)
		case !errors.As(err, &se) || se.HTTPStatusCode >= 500:
			return err // a broken connection or a 5xx: unknown, repeated with the same key
		case se.Code == stripe.ErrorCodeIdempotencyKeyInUse:
			// 409: a request with this key is still running (a take-over
			// during a slow call). Stripe did nothing for this one and
			// stored nothing: retried later, with the same key.
			return sbclaim.NotPerformed(err)
		case se.Type == stripe.ErrorTypeCard:
			return sbclaim.Rejected(err) // a decline: Stripe's final answer for this key
		case se.Type == stripe.ErrorTypeIdempotency:
			return sbclaim.KeyConflict(err) // the key was used with other parameters
		case se.HTTPStatusCode == http.StatusUnauthorized || se.HTTPStatusCode == http.StatusForbidden:
			// A wrong or rotated key: nothing was done. The route's breaker
			// holds its payments until a probe succeeds; none fails.
			return sbclaim.Misconfigured(err)
		case se.HTTPStatusCode == http.StatusTooManyRequests:
			return sbclaim.NotPerformed(err) // rate limited: Stripe did nothing
		default:
			return sbclaim.Permanent(err) // another 4xx: will never succeed as sent
		}
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Getenv, slog.New(slog.NewJSONHandler(os.Stderr, nil))); err != nil {
		fmt.Fprintln(os.Stderr, "stripe:", err)
		os.Exit(1)
	}
}

// run wires the handler into sbclaim: the claims store, a router with the
// handler's route, a processor on the queue and a reconciler with the same
// router (it recovers the claims of replicas that died with the same
// handler and key). Both stop when ctx ends.
func run(ctx context.Context, getenv func(string) string, logger *slog.Logger) error {
	dbURL, queue := getenv("SBCLAIM_DATABASE_URL"), getenv("SBCLAIM_QUEUE")
	if err := sbclaim.Migrate(ctx, dbURL); err != nil {
		return err
	}
	store, err := sbclaim.OpenStore(ctx, dbURL)
	if err != nil {
		return err
	}
	defer store.Close()
	client, err := azservicebus.NewClientFromConnectionString(getenv("SBCLAIM_SERVICEBUS_CONNECTION_STRING"), nil)
	if err != nil {
		return err
	}
	defer client.Close(context.Background())

	router, err := sbclaim.NewRouter(sbclaim.Route{
		Name:     "charge",
		Match:    sbclaim.MatchSubject("payment.requested"),
		Handler:  Charge(stripe.NewClient(getenv("STRIPE_SECRET_KEY"))),
		JSONBody: true,
		// Stripe forgets a key after 24 hours: an older claim is flagged
		// instead of repeated with its key.
		KeyLifetime: 24 * time.Hour,
		// A stored failure may be redriven under a new key, after checking.
		AllowNewKey: true,
	})
	if err != nil {
		return err
	}
	processor, err := sbclaim.NewProcessor(sbclaim.ProcessorConfig{
		Consumer: "billing", Entity: queue, Store: store, Router: router, Logger: logger,
		NewReceiver: func(context.Context) (sbclaim.Receiver, error) {
			return client.NewReceiverForQueue(queue, nil)
		},
	})
	if err != nil {
		return err
	}
	reconciler, err := operator.NewReconciler(operator.ReconcilerConfig{
		Store: store, Routers: map[string]*sbclaim.Router{"billing": router}, Logger: logger,
	})
	if err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	recDone := make(chan error, 1)
	go func() { recDone <- reconciler.Run(ctx) }()
	err = processor.Run(ctx)
	cancel() // the processor stopped: stop the reconciler too
	return errors.Join(err, <-recDone)
}
