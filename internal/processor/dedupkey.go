package processor

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// KeyFunc extracts a message's dedup key: the claim's MessageID and the
// downstream idempotency key. It returns an error when the message has no
// usable key; the processor dead-letters such a message.
type KeyFunc func(msg *azservicebus.ReceivedMessage) (string, error)

// ErrNoKey is returned (wrapped) by a KeyFunc for a message without a key.
var ErrNoKey = errors.New("message has no dedup key")

// ParseKeySpec turns SBCLAIM_DEDUP_KEY into a KeyFunc:
//
//	message-id       the Service Bus MessageId (default)
//	property:<name>  an application property (string, or a number/bool/UUID
//	                 rendered as text)
//	cloudevents      ce_source (path-escaped) + "/" + ce_id (CloudEvents
//	                 binary mode over AMQP: ids are unique per source, so
//	                 both are needed; escaping the source keeps source "a/b"
//	                 with id "c" apart from source "a" with id "b/c")
//
// Never CorrelationId, the delivery count, the lock token, the sequence
// number or a receive time: they are not stable across redeliveries or are
// shared by many messages.
func ParseKeySpec(spec string) (KeyFunc, error) {
	switch {
	case spec == "" || spec == "message-id":
		return messageIDKey, nil
	case spec == "cloudevents":
		return cloudEventsKey, nil
	case strings.HasPrefix(spec, "property:"):
		name := strings.TrimPrefix(spec, "property:")
		if strings.TrimSpace(name) == "" || name != strings.TrimSpace(name) {
			return nil, fmt.Errorf("property name %q must be non-empty without surrounding spaces", name)
		}
		return func(msg *azservicebus.ReceivedMessage) (string, error) {
			return propertyKey(msg, name)
		}, nil
	}
	return nil, fmt.Errorf("unknown dedup key %q: want message-id, property:<name> or cloudevents", spec)
}

func messageIDKey(msg *azservicebus.ReceivedMessage) (string, error) {
	if msg.MessageID == "" {
		return "", fmt.Errorf("%w: MessageId is empty", ErrNoKey)
	}
	return msg.MessageID, nil
}

func cloudEventsKey(msg *azservicebus.ReceivedMessage) (string, error) {
	src, err := propertyKey(msg, "ce_source")
	if err != nil {
		return "", err
	}
	id, err := propertyKey(msg, "ce_id")
	if err != nil {
		return "", err
	}
	return url.PathEscape(src) + "/" + id, nil
}

func propertyKey(msg *azservicebus.ReceivedMessage, name string) (string, error) {
	v, ok := msg.ApplicationProperties[name]
	if !ok || v == nil {
		return "", fmt.Errorf("%w: application property %q is missing", ErrNoKey, name)
	}
	var s string
	switch v := v.(type) {
	case string:
		s = v
	case []byte:
		return "", fmt.Errorf("%w: application property %q is binary", ErrNoKey, name)
	case fmt.Stringer:
		s = v.String()
	default:
		s = fmt.Sprint(v)
	}
	if strings.TrimSpace(s) == "" {
		return "", fmt.Errorf("%w: application property %q is empty", ErrNoKey, name)
	}
	return s, nil
}
