package sbclaim

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin"
)

// DefaultMaxDeliveryCount is the MaxDeliveryCount a Processor assumes
// when ProcessorConfig.MaxDeliveryCount is zero: Service Bus's own default
// for a new entity.
const DefaultMaxDeliveryCount = 10

// EntityAdmin is the part of the Service Bus administration client that
// CheckMaxDeliveryCount uses; *admin.Client (package
// github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus/admin)
// satisfies it as it is. Reading an entity's properties needs Manage
// rights on it (a connection string with Manage, or the Azure Service Bus
// Data Owner role); Azure Service Bus Data Receiver does not give them.
type EntityAdmin interface {
	GetQueue(ctx context.Context, queueName string, options *admin.GetQueueOptions) (*admin.GetQueueResponse, error)
	GetSubscription(ctx context.Context, topicName, subscriptionName string, options *admin.GetSubscriptionOptions) (*admin.GetSubscriptionResponse, error)
}

var _ EntityAdmin = (*admin.Client)(nil)

// EntityName names the entity a processor receives from: a queue, or a
// topic and one of its subscriptions.
type EntityName struct {
	Queue        string
	Topic        string
	Subscription string
}

// String is the queue, or topic/subscription (as claims record it).
func (e EntityName) String() string {
	if e.Queue != "" {
		return e.Queue
	}
	return e.Topic + "/" + e.Subscription
}

// DeliveryBudget is what CheckMaxDeliveryCount found.
type DeliveryBudget struct {
	// MaxDeliveryCount is the value for ProcessorConfig.MaxDeliveryCount:
	// the entity's when it was read, else the configured value, else
	// DefaultMaxDeliveryCount.
	MaxDeliveryCount int
	// Checked reports that the entity's MaxDeliveryCount was read and
	// MaxDeliveryCount is it.
	Checked bool
	// Unchecked, when Checked is false, says why the entity could not be
	// read (no Manage rights, no answer in time, ...). MaxDeliveryCount is
	// then an assumption: if the entity allows fewer deliveries, a long
	// outage dead-letters messages the processor believed had deliveries
	// left.
	Unchecked error
}

// DeliveryCountMismatchError is returned by CheckMaxDeliveryCount when the
// configured MaxDeliveryCount differs from the entity's. A processor must
// not start with it: the hand-off before the broker's last delivery counts
// deliveries by the configured value.
type DeliveryCountMismatchError struct {
	Entity     EntityName
	Configured int // the value the processor was given
	Actual     int // the entity's MaxDeliveryCount
}

func (e *DeliveryCountMismatchError) Error() string {
	return fmt.Sprintf("MaxDeliveryCount is configured as %d, but entity %s has MaxDeliveryCount %d", e.Configured, e.Entity, e.Actual)
}

// ErrNotAuthorized wraps, in DeliveryBudget.Unchecked, an administration
// request that Service Bus refused (401 or 403): the identity lacks Manage
// rights on the entity.
var ErrNotAuthorized = errors.New("not authorized to read the entity's properties (needs Manage rights, which Azure Service Bus Data Receiver does not give)")

// CheckMaxDeliveryCount reads the MaxDeliveryCount of entity through a and
// compares it with configured (0: not configured). The read is bounded by
// ctx: give it a short deadline. It returns
//
//   - the entity's value, Checked, when it equals configured or nothing
//     was configured;
//   - a *DeliveryCountMismatchError when configured differs from it;
//   - configured (or DefaultMaxDeliveryCount), not Checked, with the
//     reason in Unchecked, when the entity could not be read: the
//     administration API refused the identity (ErrNotAuthorized), did not
//     answer, or does not know the entity. A nil a counts as "could not
//     be read".
//
// The error is nil unless the values differ.
func CheckMaxDeliveryCount(ctx context.Context, a EntityAdmin, entity EntityName, configured int) (DeliveryBudget, error) {
	assumed := configured
	if assumed <= 0 {
		assumed = DefaultMaxDeliveryCount
	}
	unchecked := func(err error) (DeliveryBudget, error) {
		return DeliveryBudget{MaxDeliveryCount: assumed, Unchecked: err}, nil
	}
	if a == nil {
		return unchecked(errors.New("no administration client"))
	}
	actual, found, err := readMaxDeliveryCount(ctx, a, entity)
	switch {
	case err != nil:
		return unchecked(describeAdminError(ctx, err))
	case !found:
		return unchecked(fmt.Errorf("the administration API does not know entity %s", entity))
	case actual <= 0:
		return unchecked(fmt.Errorf("entity %s reports no MaxDeliveryCount", entity))
	case configured > 0 && configured != actual:
		return DeliveryBudget{}, &DeliveryCountMismatchError{Entity: entity, Configured: configured, Actual: actual}
	}
	return DeliveryBudget{MaxDeliveryCount: actual, Checked: true}, nil
}

func readMaxDeliveryCount(ctx context.Context, a EntityAdmin, e EntityName) (n int, found bool, err error) {
	if e.Queue != "" {
		q, err := a.GetQueue(ctx, e.Queue, nil)
		if err != nil || q == nil || q.MaxDeliveryCount == nil {
			return 0, q != nil, err
		}
		return int(*q.MaxDeliveryCount), true, nil
	}
	s, err := a.GetSubscription(ctx, e.Topic, e.Subscription, nil)
	if err != nil || s == nil || s.MaxDeliveryCount == nil {
		return 0, s != nil, err
	}
	return int(*s.MaxDeliveryCount), true, nil
}

// describeAdminError turns an administration error into one line: the
// SDK's *azcore.ResponseError prints the whole HTTP exchange.
func describeAdminError(ctx context.Context, err error) error {
	var re *azcore.ResponseError
	switch {
	case errors.As(err, &re) && (re.StatusCode == http.StatusUnauthorized || re.StatusCode == http.StatusForbidden):
		return fmt.Errorf("%w: HTTP %d", ErrNotAuthorized, re.StatusCode)
	case errors.As(err, &re):
		return fmt.Errorf("the administration API answered HTTP %d %s", re.StatusCode, re.ErrorCode)
	case ctx.Err() != nil:
		return fmt.Errorf("no answer from the administration API in time: %w", err)
	}
	return fmt.Errorf("the administration API could not be reached: %w", err)
}
