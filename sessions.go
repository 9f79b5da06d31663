package sbclaim

import (
	"context"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/processor"
)

// SessionReceiver is the part of *azservicebus.SessionReceiver a Processor
// uses on a session-enabled queue or subscription (ProcessorConfig.Sessions).
type SessionReceiver interface {
	SessionID() string
	LockedUntil() time.Time
	ReceiveMessages(ctx context.Context, maxMessages int, options *azservicebus.ReceiveMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	CompleteMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.CompleteMessageOptions) error
	AbandonMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.AbandonMessageOptions) error
	DeadLetterMessage(ctx context.Context, message *azservicebus.ReceivedMessage, options *azservicebus.DeadLetterOptions) error
	PeekMessages(ctx context.Context, maxMessageCount int, options *azservicebus.PeekMessagesOptions) ([]*azservicebus.ReceivedMessage, error)
	RenewSessionLock(ctx context.Context, options *azservicebus.RenewSessionLockOptions) error
	GetSessionState(ctx context.Context, options *azservicebus.GetSessionStateOptions) ([]byte, error)
	SetSessionState(ctx context.Context, state []byte, options *azservicebus.SetSessionStateOptions) error
	Close(ctx context.Context) error
}

var _ SessionReceiver = (*azservicebus.SessionReceiver)(nil)

// Sessions configures a Processor for a session-enabled entity
// (requiresSession): each session's messages take effect one at a time,
// in order (docs/sessions.md). Set it instead of NewReceiver.
type Sessions struct {
	// AcceptNext accepts the next session with messages:
	//
	//	func(ctx context.Context) (sbclaim.SessionReceiver, error) {
	//		return client.AcceptNextSessionForQueue(ctx, "ledger", nil)
	//	}
	//
	// Required. Its CodeTimeout error (no session available) is expected:
	// the processor accepts again.
	AcceptNext func(ctx context.Context) (SessionReceiver, error)
	// MaxConcurrent is how many sessions are worked at once (default 8),
	// each one message at a time.
	MaxConcurrent int
	// IdleTimeout releases a session that had no message for this long,
	// so that another can be accepted (default 1m).
	IdleTimeout time.Duration
}

// sessionOptions sets opts for session mode (s nil: none).
func (s *Sessions) sessionOptions(opts *processor.Options) {
	if s == nil {
		return
	}
	opts.MaxConcurrentSessions, opts.SessionIdleTimeout = s.MaxConcurrent, s.IdleTimeout
	if s.AcceptNext == nil {
		return // New names the missing AcceptSession
	}
	opts.AcceptSession = func(ctx context.Context) (processor.SessionReceiver, error) {
		r, err := s.AcceptNext(ctx)
		if err != nil {
			return nil, err
		}
		return r, nil
	}
}
