// Command sqliteonly is the smallest deployment of sbclaim: one consumer
// process with its claims table in a SQLite file, one Go handler, the
// processor on a Service Bus queue, until SIGTERM. It imports the root
// package and the SQLite store only, so it links no other database driver,
// no OpenTelemetry exporter, no Prometheus client and no routes-file
// parser (its test pins what it reaches).
//
//	SBCLAIM_DATABASE_URL=sqlite:/var/lib/orders/claims.db \
//	SBCLAIM_SERVICEBUS_CONNECTION_STRING='Endpoint=sb://...' SBCLAIM_QUEUE=orders \
//	go run ./sqliteonly
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim"
	_ "github.com/sbclaim/sbclaim/store/sqlite" // sqlite: URLs
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := run(ctx, os.Getenv, logger); err != nil {
		logger.Error("sqliteonly", "err", err)
		os.Exit(1)
	}
}

// order is the message's body.
type order struct {
	ID    int64 `json:"id"`
	Total int64 `json:"total_cents"`
}

// ship is the effect: here it only logs, with the key a real downstream
// would deduplicate on.
func ship(logger *slog.Logger) sbclaim.HandlerFunc {
	return sbclaim.JSON(func(ctx context.Context, d *sbclaim.Delivery, o order) error {
		logger.InfoContext(ctx, "ship", "order", o.ID, "idempotency_key", d.IdempotencyKey())
		return nil
	})
}

func run(ctx context.Context, getenv func(string) string, logger *slog.Logger) error {
	dbURL, connStr, queue := getenv("SBCLAIM_DATABASE_URL"), getenv("SBCLAIM_SERVICEBUS_CONNECTION_STRING"), getenv("SBCLAIM_QUEUE")
	for name, v := range map[string]string{"SBCLAIM_DATABASE_URL": dbURL, "SBCLAIM_SERVICEBUS_CONNECTION_STRING": connStr, "SBCLAIM_QUEUE": queue} {
		if v == "" {
			return fmt.Errorf("%s is required", name)
		}
	}
	if err := sbclaim.Migrate(ctx, dbURL); err != nil {
		return err
	}
	store, err := sbclaim.OpenStore(ctx, dbURL)
	if err != nil {
		return err
	}
	defer store.Close()
	router, err := sbclaim.NewRouter(sbclaim.Route{Name: "ship", Handler: ship(logger)})
	if err != nil {
		return err
	}
	client, err := azservicebus.NewClientFromConnectionString(connStr, nil)
	if err != nil {
		return err
	}
	defer client.Close(context.WithoutCancel(ctx))
	p, err := sbclaim.NewProcessor(sbclaim.ProcessorConfig{
		Consumer: "shipping", Entity: queue, Store: store, Router: router, Logger: logger,
		NewReceiver: func(context.Context) (sbclaim.Receiver, error) { return client.NewReceiverForQueue(queue, nil) },
	})
	if err != nil {
		return err
	}
	return p.Run(ctx)
}
