package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
)

// Subjects of the mix: the routes file maps paymentSubject to the demo
// downstream; poisonSubject deliberately has no route.
const (
	paymentSubject = "payment"
	poisonSubject  = "refund"
)

// Suffixes of the dedup keys the demo downstream answers specially (see
// replyFor).
const (
	declinedSuffix      = "-declined"
	storedFailureSuffix = "-stored-failure"
)

// mix is the burst the dev command sends: what it holds, so that the
// summary can say what to expect.
type mix struct {
	RunID string
	Sends []*azservicebus.Message
	// Payments are the keys that should each be effected once; Extra the
	// duplicate copies sent with an identical body.
	Payments []string
	Extra    int
	// Conflict is a payment key sent once more with another amount;
	// Declined the key the downstream declines (402); StoredFailure the key
	// it stores a failure under (500, replayed); Poison the MessageID of
	// the message no route takes.
	Conflict, Declined, StoredFailure, Poison string
}

type payment struct {
	PaymentID   string `json:"paymentId"`
	AmountCents int    `json:"amountCents"`
	Currency    string `json:"currency"`
}

// newMix builds the burst for run: n payment keys, round(n × dupShare) of
// them sent two or three times, the conflict, the declined payment, the
// stored failure and the poison message. Copies always come after their
// original; everything else is interleaved by seed.
func newMix(run string, n int, dupShare float64, seed uint64) mix {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	m := mix{RunID: run}
	msg := func(id, subject string, body []byte) *azservicebus.Message {
		ct := "application/json"
		return &azservicebus.Message{MessageID: &id, Subject: &subject, Body: body, ContentType: &ct,
			ApplicationProperties: map[string]any{"dev_run": run}}
	}
	pay := func(id string, cents int) *azservicebus.Message {
		b, _ := json.Marshal(payment{PaymentID: id, AmountCents: cents, Currency: "EUR"}) // static type: cannot fail
		return msg(id, paymentSubject, b)
	}
	var sends []*azservicebus.Message
	for i := range n {
		id := fmt.Sprintf("%s-pay-%04d", run, i+1)
		m.Payments = append(m.Payments, id)
		sends = append(sends, pay(id, 100*(i+1)))
	}
	m.Declined = run + "-pay" + declinedSuffix
	m.StoredFailure = run + "-pay" + storedFailureSuffix
	sends = append(sends, pay(m.Declined, 4200), pay(m.StoredFailure, 9900))
	rng.Shuffle(len(sends), func(i, j int) { sends[i], sends[j] = sends[j], sends[i] })

	// Duplicates: identical copies, after their original. The last key is
	// kept for the conflict.
	dups := min(int(float64(n)*dupShare+0.5), max(n-1, 0))
	for j, idx := range rng.Perm(max(n-1, 0))[:dups] {
		copies := 1
		if j%3 == 2 {
			copies = 2
		}
		id := m.Payments[idx]
		for range copies {
			sends = insertAfter(rng, sends, id, pay(id, 100*(idx+1)))
			m.Extra++
		}
	}
	if n > 0 {
		m.Conflict = m.Payments[n-1]
		sends = insertAfter(rng, sends, m.Conflict, pay(m.Conflict, 100*n+1))
	}
	m.Poison = run + "-poison"
	pos := rng.IntN(len(sends) + 1)
	sends = append(sends[:pos], append([]*azservicebus.Message{msg(m.Poison, poisonSubject, []byte(`{"paymentId": "`+m.Poison+`", "amountCents": `))}, sends[pos:]...)...)
	m.Sends = sends
	return m
}

// insertAfter inserts s at a random position after the first message
// with MessageID id.
func insertAfter(rng *rand.Rand, sends []*azservicebus.Message, id string, s *azservicebus.Message) []*azservicebus.Message {
	first := 0
	for i, m := range sends {
		if *m.MessageID == id {
			first = i
			break
		}
	}
	pos := first + 1 + rng.IntN(len(sends)-first)
	sends = append(sends, nil)
	copy(sends[pos+1:], sends[pos:])
	sends[pos] = s
	return sends
}

// Describe says what the mix holds, in one line per kind.
func (m mix) Describe() string {
	var b strings.Builder
	fmt.Fprintf(&b, "sent %d messages to queue %q (run %s):\n", len(m.Sends), queueName, m.RunID)
	fmt.Fprintf(&b, "  %d payments, %d duplicate copies of them (same MessageId, same body)\n", len(m.Payments), m.Extra)
	if m.Conflict != "" {
		fmt.Fprintf(&b, "  1 key conflict: %s sent again with another amount\n", m.Conflict)
	}
	fmt.Fprintf(&b, "  1 poison message: %s (subject %q has no route, body is not JSON)\n", m.Poison, poisonSubject)
	fmt.Fprintf(&b, "  1 payment the downstream declines: %s (402 card_declined)\n", m.Declined)
	fmt.Fprintf(&b, "  1 payment the downstream stores a failure for: %s (500, replayed under the key)\n", m.StoredFailure)
	return b.String()
}
