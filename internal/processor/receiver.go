package processor

import (
	"context"
	"errors"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// Receiver is the part of *azservicebus.Receiver the processor uses. The
// SDK's receiver satisfies it as it is; so does the in-memory broker that
// tests and the chaos harness use (package membus).
type Receiver interface {
	ReceiveMessages(ctx context.Context, maxMessages int, options *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	CompleteMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.CompleteMessageOptions) error
	AbandonMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.AbandonMessageOptions) error
	DeadLetterMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.DeadLetterOptions) error
	RenewMessageLock(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.RenewMessageLockOptions) error
	// DeferMessage and ReceiveDeferredMessages carry delayed retries: a
	// deferred message stays in its queue or subscription, is not
	// delivered again, and is fetched by its sequence number when due.
	DeferMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.DeferMessageOptions) error
	ReceiveDeferredMessages(ctx context.Context, sequenceNumbers []int64, options *azservicebus.ReceiveDeferredMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	// PeekMessages probes the broker for readiness (no lock is taken).
	PeekMessages(ctx context.Context, maxMessageCount int, options *azservicebus.PeekMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	Close(ctx context.Context) error
}

var _ Receiver = (*azservicebus.Receiver)(nil)

// NewReceiverFunc opens a receiver. The processor calls it at start and
// again, with backoff, when a receiver reports CodeConnectionLost or
// CodeClosed.
type NewReceiverFunc func(ctx context.Context) (Receiver, error)

func sbCode(err error) azservicebus.Code {
	var sbErr *azservicebus.Error
	if errors.As(err, &sbErr) {
		return sbErr.Code
	}
	return ""
}

func isLockLost(err error) bool { return sbCode(err) == azservicebus.CodeLockLost }

func isNotFound(err error) bool { return sbCode(err) == azservicebus.CodeNotFound }

// needsNewReceiver reports whether a receive error means the receiver (its
// link or connection) is gone and must be recreated.
func needsNewReceiver(err error) bool {
	c := sbCode(err)
	return c == azservicebus.CodeConnectionLost || c == azservicebus.CodeClosed
}
