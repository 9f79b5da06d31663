package sbclaim

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
)

// JSON adapts a handler of a typed payload: it decodes the message's body
// as JSON into a T and calls h with it. A body that does not decode is
// Permanent, with a reason naming the type and the decoder's error: it
// can never succeed, so h is not called, the claim fails and the message
// is dead-lettered once.
//
//	Handler: sbclaim.JSON(func(ctx context.Context, d *sbclaim.Delivery, o Order) error {
//		return charge(ctx, o, d.IdempotencyKey())
//	}),
func JSON[T any](h func(ctx context.Context, d *Delivery, v T) error) HandlerFunc {
	return func(ctx context.Context, d *Delivery) error {
		v, err := decodeBody[T](d)
		if err != nil {
			return err
		}
		return h(ctx, d, v)
	}
}

// JSONTx is JSON for a transactional handler (TxHandlerFunc): a body that
// does not decode is Permanent and rolls back; h runs inside the claim's
// transaction otherwise.
func JSONTx[T any](h func(ctx context.Context, tx *sql.Tx, d *Delivery, v T) error) TxHandlerFunc {
	return func(ctx context.Context, tx *sql.Tx, d *Delivery) error {
		v, err := decodeBody[T](d)
		if err != nil {
			return err
		}
		return h(ctx, tx, d, v)
	}
}

func decodeBody[T any](d *Delivery) (T, error) {
	var v T
	if err := json.Unmarshal(d.Message().Body, &v); err != nil {
		return v, Permanent(fmt.Errorf("the message body does not decode as JSON into %T: %w", v, err))
	}
	return v, nil
}
