// Package claim is the protocol of sbclaim: the claims table's model and
// states, the Store every database implements, and the sentinels stores
// translate driver errors into.
//
// A claim is a marker row, unique per (MessageID, Consumer), committed
// before an external effect runs. Exactly one replica's insert wins; the
// others see a duplicate and complete their copy of the message. See
// DESIGN.md §2 for the per-message protocol and §5 for the states.
package claim
