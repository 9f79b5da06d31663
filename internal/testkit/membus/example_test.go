package membus_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/testkit/membus"
)

func Example() {
	ctx := context.Background()
	q := membus.NewQueue("orders", membus.QueueOptions{LockDuration: 100 * time.Millisecond, MaxDeliveryCount: 3})
	r := q.NewReceiver()
	defer r.Close(ctx)

	id := "order-1"
	_ = q.SendMessage(ctx, &azservicebus.Message{MessageID: &id, Body: []byte(`{}`)}, nil)

	first, _ := r.ReceiveMessages(ctx, 10, nil)
	q.ExpireLock(id) // the lock is lost mid-work; the broker redelivers
	second, _ := r.ReceiveMessages(ctx, 10, nil)

	var sbErr *azservicebus.Error
	err := r.CompleteMessage(ctx, first[0], nil)
	fmt.Println("late complete:", errors.As(err, &sbErr) && sbErr.Code == azservicebus.CodeLockLost)
	fmt.Println("redelivery count:", second[0].DeliveryCount)
	fmt.Println("complete:", r.CompleteMessage(ctx, second[0], nil))
	s := q.Stats()
	fmt.Println("completed:", s.Completed, "lock losses:", s.LockLosses, "drained:", q.Drained())
	// Output:
	// late complete: true
	// redelivery count: 2
	// complete: <nil>
	// completed: 1 lock losses: 1 drained: true
}
