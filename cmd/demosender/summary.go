package main

import (
	"fmt"
	"io"
	"strings"
)

// Print writes the summary for a person watching the demo: what was sent
// and which effect counts demoapi's GET /_counts should show once the
// processors have drained the entities.
func (s Summary) Print(w io.Writer) {
	var b strings.Builder
	fmt.Fprintf(&b, "demosender run %s: sent %d messages\n", s.RunID, s.Total)
	if p := s.Payments; p != nil {
		fmt.Fprintf(&b, "\nqueue %q (subject %q):\n", p.Entity, paymentSubject)
		fmt.Fprintf(&b, "  %d distinct payment keys (%s-pay-0001 .. %s-pay-%04d), %d messages in all\n",
			p.UniqueKeys, s.RunID, s.RunID, p.UniqueKeys, p.Sent)
		fmt.Fprintf(&b, "  %d keys sent more than once with an identical body (%d extra copies): %s\n",
			len(p.Duplicated), p.Extra, shortList(p.Duplicated, 6))
		fmt.Fprintf(&b, "  conflict: key %s sent twice with different bodies\n", s.ConflictKey)
		fmt.Fprintf(&b, "  poison:   message %s (subject %q, no route, body is not JSON)\n", s.PoisonID, poisonSubject)
	}
	if o := s.Orders; o != nil {
		fmt.Fprintf(&b, "\ntopic %q (subject %q, one copy per subscription):\n", o.Entity, orderSubject)
		fmt.Fprintf(&b, "  %d distinct order keys (%s-ord-0001 .. %s-ord-%04d), %d messages in all\n",
			o.UniqueKeys, s.RunID, s.RunID, o.UniqueKeys, o.Sent)
		fmt.Fprintf(&b, "  %d keys sent more than once with an identical body (%d extra copies): %s\n",
			len(o.Duplicated), o.Extra, shortList(o.Duplicated, 6))
	}
	if l := s.Ledger; l != nil {
		fmt.Fprintf(&b, "\nqueue %q (session-enabled, subject %q):\n", l.Entity, entrySubject)
		fmt.Fprintf(&b, "  %d ledger entries (%s-ent-0001 .. %s-ent-%04d) in %d accounts, each account a session; %d messages in all\n",
			l.UniqueKeys, s.RunID, s.RunID, l.UniqueKeys, s.Accounts, l.Sent)
		fmt.Fprintf(&b, "  %d entries sent more than once with an identical body (%d extra copies): %s\n",
			len(l.Duplicated), l.Extra, shortList(l.Duplicated, 6))
	}
	b.WriteString("\nexpected once the processors are idle:\n")
	if p := s.Payments; p != nil {
		fmt.Fprintf(&b, "  GET /_counts: every %s-pay-* key exactly 1 effect (%d keys), duplicates included\n", s.RunID, p.UniqueKeys)
		fmt.Fprintf(&b, "  %s: 1 effect (whichever body was claimed first); the other copy dead-lettered IdempotencyKeyConflict\n", s.ConflictKey)
		fmt.Fprintf(&b, "  %s: no effect; dead-lettered NoRoute\n", s.PoisonID)
	}
	if o := s.Orders; o != nil {
		fmt.Fprintf(&b, "  GET /_counts: every %s-ord-* key exactly 1 effect per subscription consumer (%d keys);\n", s.RunID, o.UniqueKeys)
		b.WriteString("    with docker-compose.yml that is 2: billing -> /invoices and notifications -> /emails\n")
	}
	if s.Payments != nil && s.Orders != nil {
		fmt.Fprintf(&b, "  with docker-compose.yml, totalEffects grows by %d + 2 x %d = %d for this run\n",
			s.Payments.UniqueKeys, s.Orders.UniqueKeys, s.Payments.UniqueKeys+2*s.Orders.UniqueKeys)
	}
	if l := s.Ledger; l != nil {
		fmt.Fprintf(&b, "  GET /_counts: every %s-ent-* key exactly 1 effect (%d keys), each account's in the order sent (processor-ledger's log)\n", s.RunID, l.UniqueKeys)
	}
	b.WriteString("  any count above 1 per consumer is a duplicate effect: a bug worth a report\n")
	_, _ = io.WriteString(w, b.String())
}

func shortList(ids []string, max int) string {
	if len(ids) == 0 {
		return "(none)"
	}
	if len(ids) <= max {
		return strings.Join(ids, ", ")
	}
	return strings.Join(ids[:max], ", ") + fmt.Sprintf(", ... (%d more)", len(ids)-max)
}
