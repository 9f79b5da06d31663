// Package membus is an in-memory Azure Service Bus queue for tests and the
// chaos harness. It speaks the SDK's own types end to end: producers send
// *azservicebus.Message, consumers receive *azservicebus.ReceivedMessage
// from a *Receiver whose methods have the signatures of
// *azservicebus.Receiver, and failures are *azservicebus.Error values with
// the SDK's codes (check them with errors.As and Error.Code, as with the
// real SDK). Code written against a small receiver interface runs unchanged
// on either.
//
// What it models, as the service does:
//
//   - Peek-lock delivery. Each delivery is a new *ReceivedMessage with a new
//     random LockToken, LockedUntil = now + LockDuration, and DeliveryCount
//     1 on the first delivery, +1 on each redelivery. SequenceNumber and
//     EnqueuedTime are assigned at send; a nil MessageID gets a generated
//     one.
//   - ReceiveMessages blocks until a message is available (or ctx ends or
//     the receiver is closed), then gathers for TimeAfterFirstMessage
//     (default 20ms) up to maxMessages. Messages gathered are returned with
//     a nil error even if ctx ends meanwhile; ctx.Err() only when none were.
//     A call whose ctx has already ended locks nothing.
//   - Settlement by lock token, from any receiver on the queue (as the SDK
//     allows since 1.10). Complete removes the message; Abandon makes it
//     available at once; DeadLetter moves it to the dead-letter queue with
//     its reason and description; RenewMessageLock extends the lock by
//     LockDuration from now and updates msg.LockedUntil.
//   - Lock expiry: a delivery whose lock runs out is redelivered. Settling or
//     renewing an expired, settled or superseded delivery fails with
//     CodeLockLost. (Through the SDK, a second settlement of a message on
//     the link it came from returns nil instead: go-amqp does not send it.
//     See brokertest.Features.SecondSettlementIsNoOp.) After
//     MaxDeliveryCount deliveries, an abandon or expiry dead-letters the
//     message with ReasonMaxDeliveryCountExceeded.
//   - Closed receivers fail every call with CodeClosed; locks they handed
//     out are kept until they run out, like a crashed replica's.
//   - Topics fan each sent message out to every subscription, each a Queue.
//   - Deferral: DeferMessage sets a locked delivery aside, and only
//     ReceiveDeferredMessages, by its sequence number, delivers it again
//     (each such fetch counts as a delivery); see deferral.go for each
//     point the processor's delayed retries rely on.
//   - Sessions (QueueOptions.RequiresSession): AcceptNextSession with a
//     timeout (CodeTimeout), one receiver per session, FIFO per session,
//     the session lock as every held message's lock (RenewSessionLock,
//     expiry, Close releases it) and session state; see session.go.
//
// The broker contract suite (package brokertest) checks these behaviours,
// the ones the processor relies on, on every test run (TestContract), and
// against a real namespace or the emulator when
// SBCLAIM_TEST_SERVICEBUS_CONNECTION_STRING is set.
//
// Switchable faults (FailReceives, FailSettlements, FailRenewals,
// ExpireLock, ExpireAllLocks, DuplicateSends) reproduce what a consumer sees
// in production: connection loss, settlements that never arrive, locks lost
// mid-work and producer retries that enqueue a message twice. Stats,
// DeadLetters, Completed, Drained and WaitIdle let tests wait for and check
// the outcome without sleeping.
//
// A Namespace (sender.go) routes a producer's sends by entity name to
// queues and topics, keeps what was sent to each, and models duplicate
// detection by MessageId for the entities that have it (the outbox relay's
// resends).
//
// What it does not model: deferral within a session, accepting a named
// session (AcceptSessionForQueue), scheduled messages (rejected at a
// queue's own SendMessage; a Namespace sender enqueues them at once),
// receive-and-delete mode, transactions, duplicate detection on a queue's
// own SendMessage (duplicates always get through, which is the case the
// consumer must handle), message TTL and expiry, prefetch
// and the SDK's release of messages that arrive between ReceiveMessages
// calls, auto-forwarding, and reading the dead-letter sub-queue through a
// receiver (use DeadLetters). Lock expiry is evaluated lazily on each call,
// plus a timer for blocked callers, so the package starts no goroutines.
package membus
