package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
)

// Subjects the demo sends. The compose routes files map them to demoapi
// endpoints; poisonSubject deliberately has no route.
const (
	paymentSubject = "payment"
	orderSubject   = "order"
	entrySubject   = "ledger.entry"
	poisonSubject  = "refund"
)

// Kind says why a message is in the burst.
type Kind string

// The kinds of message in a burst.
const (
	KindOriginal  Kind = "original"  // first send of a key
	KindDuplicate Kind = "duplicate" // same MessageID, byte-identical body
	KindConflict  Kind = "conflict"  // same MessageID, different body
	KindPoison    Kind = "poison"    // no route and not JSON: must be dead-lettered
)

// Send is one message of the burst.
type Send struct {
	Entity    string // queue or topic name
	MessageID string
	Subject   string
	Body      []byte
	Kind      Kind
	SessionID string // the account, on the session-enabled queue; "" elsewhere
}

// PlanParams configures a burst.
type PlanParams struct {
	// RunID prefixes every MessageID, so that running the demo again does
	// not land on the claims of the previous run.
	RunID string
	// Queue receives the payments, the conflict and the poison message.
	// Empty skips them.
	Queue string
	// Topic receives the orders. Empty skips them.
	Topic string
	// SessionQueue, a session-enabled queue, receives the ledger entries:
	// Entries of them in accounts of about entriesPerAccount, each account
	// a session, its entries in order. Empty skips them.
	SessionQueue string
	Entries      int
	// Payments is the number of distinct payment keys sent to Queue.
	Payments int
	// Orders is the number of distinct order keys sent to Topic.
	Orders int
	// DupShare is the fraction (0..1) of keys that are sent more than once;
	// every third duplicated key is sent three times, the others twice.
	DupShare float64
	// Seed makes the interleaving reproducible.
	Seed uint64
}

// Validate reports the first invalid field.
func (p *PlanParams) Validate() error {
	var errs []error
	if p.RunID == "" {
		errs = append(errs, errors.New("RunID is required"))
	}
	if p.Queue == "" && p.Topic == "" && p.SessionQueue == "" {
		errs = append(errs, errors.New("at least one of Queue, Topic and SessionQueue is required"))
	}
	if p.SessionQueue != "" && p.Entries < 1 {
		//lint:ignore ST1005 the error names the field
		errs = append(errs, fmt.Errorf("Entries must be at least 1 when SessionQueue is set, got %d", p.Entries))
	}
	if p.Queue != "" && p.Payments < 1 {
		//lint:ignore ST1005 the error names the field, as every config error here does
		errs = append(errs, fmt.Errorf("Payments must be at least 1 when Queue is set, got %d", p.Payments))
	}
	if p.Topic != "" && p.Orders < 1 {
		//lint:ignore ST1005 the error names the field
		errs = append(errs, fmt.Errorf("Orders must be at least 1 when Topic is set, got %d", p.Orders))
	}
	if p.DupShare < 0 || p.DupShare > 1 {
		errs = append(errs, fmt.Errorf("DupShare must be within [0, 1], got %v", p.DupShare))
	}
	return errors.Join(errs...)
}

// Plan is a burst and what it should cause downstream.
type Plan struct {
	Sends   []Send
	Summary Summary
}

// EntitySummary counts what one entity receives.
type EntitySummary struct {
	Entity     string
	UniqueKeys int      // distinct MessageIDs, counting the conflict key once and excluding the poison message
	Sent       int      // messages sent, duplicates included
	Duplicated []string // keys sent more than once with an identical body
	Extra      int      // how many extra identical copies were sent
}

// Summary tells a user what the burst contained and so what to expect.
type Summary struct {
	RunID       string
	Payments    *EntitySummary // nil when no queue
	Orders      *EntitySummary // nil when no topic
	Ledger      *EntitySummary // nil when no session queue
	Accounts    int            // sessions of the ledger entries
	ConflictKey string         // same key, different payload (on the queue)
	PoisonID    string         // MessageID of the poison message (on the queue)
	Total       int
}

// payment and order are the demo payloads.
type payment struct {
	PaymentID   string `json:"paymentId"`
	AmountCents int    `json:"amountCents"`
	Currency    string `json:"currency"`
}

type entry struct {
	EntryID     string `json:"entryId"`
	Account     string `json:"account"`
	Seq         int    `json:"seq"` // the entry's place in its account
	AmountCents int    `json:"amountCents"`
}

// entriesPerAccount is about how many ledger entries an account gets.
const entriesPerAccount = 4

type order struct {
	OrderID  string `json:"orderId"`
	Customer string `json:"customer"`
	Items    int    `json:"items"`
}

// NewPlan builds the burst described by p. It is a pure function of p.
//
// Per entity, keys are sent in order; duplicates are interleaved at random
// positions after their original (so that they race the original on another
// replica, or arrive after it has been processed), and the conflicting copy
// always comes after the original it conflicts with. Ordering across the
// wire is not guaranteed with several receivers anyway: whichever copy is
// claimed first wins, and the processor's outcome is the same either way.
func NewPlan(p PlanParams) (Plan, error) {
	if err := p.Validate(); err != nil {
		return Plan{}, fmt.Errorf("demosender plan: %w", err)
	}
	rng := rand.New(rand.NewPCG(p.Seed, p.Seed^0x9e3779b97f4a7c15))
	plan := Plan{Summary: Summary{RunID: p.RunID}}

	if p.Queue != "" {
		originals := make([]Send, p.Payments)
		for i := range originals {
			id := fmt.Sprintf("%s-pay-%04d", p.RunID, i+1)
			originals[i] = Send{
				Entity:    p.Queue,
				MessageID: id,
				Subject:   paymentSubject,
				Body:      mustJSON(payment{PaymentID: id, AmountCents: 100 * (i + 1), Currency: "EUR"}),
				Kind:      KindOriginal,
			}
		}
		sends, sum := withDuplicates(rng, p.Queue, originals, p.DupShare)

		// The conflict reuses the last payment key with another amount: a
		// producer bug that must be dead-lettered (IdempotencyKeyConflict),
		// never completed silently. The last key is never duplicated (see
		// withDuplicates), so the summary stays simple.
		last := originals[len(originals)-1]
		conflict := last
		conflict.Kind = KindConflict
		conflict.Body = mustJSON(payment{PaymentID: last.MessageID, AmountCents: 100*p.Payments + 1, Currency: "EUR"})
		sends = insertAfter(rng, sends, last.MessageID, conflict)
		plan.Summary.ConflictKey = last.MessageID

		// The poison message has no route and a body that is not JSON.
		poison := Send{
			Entity:    p.Queue,
			MessageID: p.RunID + "-poison-1",
			Subject:   poisonSubject,
			Body:      []byte(`{"paymentId": "` + p.RunID + `-poison-1", "amountCents": `),
			Kind:      KindPoison,
		}
		pos := rng.IntN(len(sends) + 1)
		sends = append(sends[:pos], append([]Send{poison}, sends[pos:]...)...)
		plan.Summary.PoisonID = poison.MessageID

		sum.Sent = len(sends)
		plan.Summary.Payments = &sum
		plan.Sends = append(plan.Sends, sends...)
	}

	if p.Topic != "" {
		originals := make([]Send, p.Orders)
		for i := range originals {
			id := fmt.Sprintf("%s-ord-%04d", p.RunID, i+1)
			originals[i] = Send{
				Entity:    p.Topic,
				MessageID: id,
				Subject:   orderSubject,
				Body:      mustJSON(order{OrderID: id, Customer: fmt.Sprintf("customer-%d", i%7+1), Items: i%5 + 1}),
				Kind:      KindOriginal,
			}
		}
		sends, sum := withDuplicates(rng, p.Topic, originals, p.DupShare)
		sum.Sent = len(sends)
		plan.Summary.Orders = &sum
		plan.Sends = append(plan.Sends, sends...)
	}

	if p.SessionQueue != "" {
		accounts := max(1, p.Entries/entriesPerAccount)
		originals := make([]Send, p.Entries)
		for i := range originals {
			id := fmt.Sprintf("%s-ent-%04d", p.RunID, i+1)
			account := fmt.Sprintf("%s-acct-%02d", p.RunID, i%accounts+1)
			originals[i] = Send{
				Entity:    p.SessionQueue,
				MessageID: id,
				Subject:   entrySubject,
				Body:      mustJSON(entry{EntryID: id, Account: account, Seq: i/accounts + 1, AmountCents: 50 * (i + 1)}),
				Kind:      KindOriginal,
				SessionID: account,
			}
		}
		// A duplicate is a copy: same account, after its original.
		sends, sum := withDuplicates(rng, p.SessionQueue, originals, p.DupShare)
		sum.Sent = len(sends)
		plan.Summary.Ledger, plan.Summary.Accounts = &sum, accounts
		plan.Sends = append(plan.Sends, sends...)
	}

	plan.Summary.Total = len(plan.Sends)
	return plan, nil
}

// withDuplicates returns originals with round(len*share) keys re-sent: every
// third of them twice more, the others once more. The last original is
// never duplicated (NewPlan uses it for the conflict). Which keys are
// duplicated is drawn from rng.
func withDuplicates(rng *rand.Rand, entity string, originals []Send, share float64) ([]Send, EntitySummary) {
	sum := EntitySummary{Entity: entity, UniqueKeys: len(originals)}
	candidates := len(originals) - 1
	n := int(float64(len(originals))*share + 0.5)
	n = min(n, candidates)

	sends := append([]Send(nil), originals...)
	if n <= 0 {
		return sends, sum
	}
	picked := rng.Perm(candidates)[:n]
	for j, idx := range picked {
		copies := 1
		if j%3 == 2 {
			copies = 2
		}
		orig := originals[idx]
		sum.Duplicated = append(sum.Duplicated, orig.MessageID)
		for range copies {
			dup := orig
			dup.Kind = KindDuplicate
			sends = insertAfter(rng, sends, orig.MessageID, dup)
			sum.Extra++
		}
	}
	return sends, sum
}

// insertAfter inserts s at a random position after the first send with
// MessageID id.
func insertAfter(rng *rand.Rand, sends []Send, id string, s Send) []Send {
	first := -1
	for i := range sends {
		if sends[i].MessageID == id {
			first = i
			break
		}
	}
	// Positions first+1 .. len(sends) inclusive.
	pos := first + 1 + rng.IntN(len(sends)-first)
	sends = append(sends, Send{})
	copy(sends[pos+1:], sends[pos:])
	sends[pos] = s
	return sends
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("demosender: marshal %T: %v", v, err)) // static types: cannot fail
	}
	return b
}
