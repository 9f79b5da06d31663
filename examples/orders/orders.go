// Package orders records an order placed on Service Bus as a row of the
// application's own orders table, once per order: a transactional handler
// (sbclaim.TxHandlerFunc) writes the row in the transaction that inserts
// the message's claim, so the row and the claim commit together or not at
// all, and a duplicate delivery never reaches the handler.
//
// The orders table lives in the claims database (the transaction is the
// only way in); the application creates it with its own migrations.
package orders

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/sbclaim/sbclaim"
)

// Schema creates the orders table (SQLite and PostgreSQL; on SQL Server
// use BIGINT for INTEGER). claim_id links each row to the claim of the
// message that wrote it; the primary key is the order, so even a write
// outside sbclaim could not record it twice.
const Schema = `CREATE TABLE IF NOT EXISTS orders (
	order_id     BIGINT PRIMARY KEY,
	amount_cents BIGINT NOT NULL,
	claim_id     BIGINT NOT NULL
)`

// Event is an order.placed message's body.
type Event struct {
	Order       int64 `json:"order"`
	AmountCents int64 `json:"amount_cents"`
}

// Record is the route's handler: it writes the order with its claim's id,
// in the claim's transaction. A body that is not an order is refused for
// good (the message is dead-lettered once); a database error rolls back
// the row and the claim, and the message is delivered again.
func Record(ctx context.Context, tx *sql.Tx, d *sbclaim.Delivery) error {
	var ev Event
	if err := json.Unmarshal(d.Message().Body, &ev); err != nil {
		return sbclaim.Permanent(fmt.Errorf("order %s: %w", d.DedupKey(), err))
	}
	if ev.Order <= 0 || ev.AmountCents <= 0 {
		return sbclaim.Permanent(errors.New("order and amount_cents must be positive"))
	}
	// $1, $2, $3 on PostgreSQL, @p1, @p2, @p3 on SQL Server.
	_, err := tx.ExecContext(ctx, `INSERT INTO orders (order_id, amount_cents, claim_id) VALUES (?, ?, ?)`,
		ev.Order, ev.AmountCents, d.ClaimID())
	return err
}

// Route is the orders route, for a Router.
func Route() sbclaim.Route {
	return sbclaim.Route{Name: "orders", Match: sbclaim.MatchSubject("order.placed"), TxHandler: Record, JSONBody: true}
}
