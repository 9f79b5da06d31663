package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func defaultParams() PlanParams {
	return PlanParams{
		RunID:    "run1",
		Queue:    "payments",
		Topic:    "orders",
		Payments: 50,
		Orders:   10,
		DupShare: 0.3,
		Seed:     42,
	}
}

// tally recomputes from the sends alone what the summary claims.
type tally struct {
	byID      map[string][]Send
	perEntity map[string]int
}

func count(sends []Send) tally {
	t := tally{byID: map[string][]Send{}, perEntity: map[string]int{}}
	for _, s := range sends {
		t.byID[s.MessageID] = append(t.byID[s.MessageID], s)
		t.perEntity[s.Entity]++
	}
	return t
}

func TestNewPlanShape(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		payments, orders int
		share            float64
	}{
		{50, 10, 0.3}, {1, 1, 0.3}, {2, 3, 1}, {10, 4, 0}, {7, 9, 0.5}, {200, 40, 0.9},
	} {
		t.Run(fmt.Sprintf("%d/%d/%v", tc.payments, tc.orders, tc.share), func(t *testing.T) {
			t.Parallel()
			p := defaultParams()
			p.Payments, p.Orders, p.DupShare = tc.payments, tc.orders, tc.share
			plan, err := NewPlan(p)
			if err != nil {
				t.Fatal(err)
			}
			sum := plan.Summary
			got := count(plan.Sends)

			if sum.Total != len(plan.Sends) {
				t.Errorf("Total = %d, sends = %d", sum.Total, len(plan.Sends))
			}
			if got.perEntity["payments"] != sum.Payments.Sent || got.perEntity["orders"] != sum.Orders.Sent {
				t.Errorf("per-entity sends %v, summary says payments %d orders %d", got.perEntity, sum.Payments.Sent, sum.Orders.Sent)
			}

			// Every distinct key, by kind.
			var payKeys, ordKeys, extraPay, extraOrd int
			for id, copies := range got.byID {
				first := copies[0]
				switch {
				case id == sum.PoisonID:
					if len(copies) != 1 || first.Kind != KindPoison || first.Subject != poisonSubject || json.Valid(first.Body) {
						t.Errorf("poison %s: %d copies, kind %s, subject %q, valid JSON %v", id, len(copies), first.Kind, first.Subject, json.Valid(first.Body))
					}
					continue
				case id == sum.ConflictKey:
					if len(copies) != 2 || copies[0].Kind != KindOriginal || copies[1].Kind != KindConflict {
						t.Errorf("conflict %s: want original then conflict, got %v", id, kinds(copies))
					}
					if bytes.Equal(copies[0].Body, copies[1].Body) {
						t.Errorf("conflict %s: bodies are identical", id)
					}
					payKeys++
					continue
				}
				if first.Kind != KindOriginal {
					t.Errorf("%s: first copy is %s, want original", id, first.Kind)
				}
				if !json.Valid(first.Body) {
					t.Errorf("%s: body is not JSON: %s", id, first.Body)
				}
				for _, c := range copies[1:] {
					if c.Kind != KindDuplicate || !bytes.Equal(c.Body, first.Body) || c.Subject != first.Subject || c.Entity != first.Entity {
						t.Errorf("%s: later copy %+v is not an identical duplicate of %+v", id, c, first)
					}
				}
				if len(copies) > 3 {
					t.Errorf("%s: %d copies, want at most 3", id, len(copies))
				}
				switch first.Entity {
				case "payments":
					payKeys++
					extraPay += len(copies) - 1
					if first.Subject != paymentSubject || !strings.HasPrefix(id, "run1-pay-") {
						t.Errorf("%s: subject %q", id, first.Subject)
					}
				case "orders":
					ordKeys++
					extraOrd += len(copies) - 1
					if first.Subject != orderSubject || !strings.HasPrefix(id, "run1-ord-") {
						t.Errorf("%s: subject %q", id, first.Subject)
					}
				default:
					t.Errorf("%s: entity %q", id, first.Entity)
				}
			}
			if payKeys != tc.payments || sum.Payments.UniqueKeys != tc.payments {
				t.Errorf("payment keys = %d, summary %d, want %d", payKeys, sum.Payments.UniqueKeys, tc.payments)
			}
			if ordKeys != tc.orders || sum.Orders.UniqueKeys != tc.orders {
				t.Errorf("order keys = %d, summary %d, want %d", ordKeys, sum.Orders.UniqueKeys, tc.orders)
			}
			if extraPay != sum.Payments.Extra || extraOrd != sum.Orders.Extra {
				t.Errorf("extra copies pay %d ord %d, summary %d %d", extraPay, extraOrd, sum.Payments.Extra, sum.Orders.Extra)
			}
			// The duplicated share, rounded, capped by the keys available
			// (the conflict key is never duplicated).
			wantDup := min(int(float64(tc.payments)*tc.share+0.5), tc.payments-1)
			if len(sum.Payments.Duplicated) != wantDup {
				t.Errorf("duplicated payment keys = %d, want %d", len(sum.Payments.Duplicated), wantDup)
			}
			for _, id := range sum.Payments.Duplicated {
				if len(got.byID[id]) < 2 {
					t.Errorf("summary lists %s as duplicated, but it was sent %d times", id, len(got.byID[id]))
				}
			}
			if wantDup >= 3 && extraPay <= wantDup {
				t.Errorf("with %d duplicated keys some must be sent three times; extra copies = %d", wantDup, extraPay)
			}
		})
	}
}

func kinds(sends []Send) []Kind {
	var ks []Kind
	for _, s := range sends {
		ks = append(ks, s.Kind)
	}
	return ks
}

func TestNewPlanDuplicatesComeAfterOriginal(t *testing.T) {
	t.Parallel()
	for seed := range uint64(50) {
		p := defaultParams()
		p.Seed = seed
		plan, err := NewPlan(p)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for i, s := range plan.Sends {
			if (s.Kind == KindDuplicate || s.Kind == KindConflict) && !seen[s.MessageID] {
				t.Fatalf("seed %d: send %d (%s %s) comes before its original", seed, i, s.Kind, s.MessageID)
			}
			seen[s.MessageID] = true
		}
	}
}

func TestNewPlanDeterministic(t *testing.T) {
	t.Parallel()
	a, err := NewPlan(defaultParams())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewPlan(defaultParams())
	if !reflect.DeepEqual(a, b) {
		t.Error("same params gave different plans")
	}
	p := defaultParams()
	p.Seed++
	c, _ := NewPlan(p)
	if reflect.DeepEqual(a.Sends, c.Sends) {
		t.Error("a different seed gave the same interleaving")
	}
}

func TestNewPlanSingleEntity(t *testing.T) {
	t.Parallel()
	p := defaultParams()
	p.Topic = ""
	plan, err := NewPlan(p)
	if err != nil {
		t.Fatal(err)
	}
	if plan.Summary.Orders != nil || count(plan.Sends).perEntity["orders"] != 0 {
		t.Error("orders planned without a topic")
	}

	p = defaultParams()
	p.Queue = ""
	plan, err = NewPlan(p)
	if err != nil {
		t.Fatal(err)
	}
	if plan.Summary.Payments != nil || plan.Summary.ConflictKey != "" || plan.Summary.PoisonID != "" {
		t.Errorf("queue-only parts planned without a queue: %+v", plan.Summary)
	}
	if len(plan.Sends) != plan.Summary.Orders.Sent {
		t.Errorf("sends %d, orders sent %d", len(plan.Sends), plan.Summary.Orders.Sent)
	}
}

func TestPlanParamsValidate(t *testing.T) {
	t.Parallel()
	for name, mutate := range map[string]func(*PlanParams){
		"no run id":      func(p *PlanParams) { p.RunID = "" },
		"no entity":      func(p *PlanParams) { p.Queue, p.Topic = "", "" },
		"zero payments":  func(p *PlanParams) { p.Payments = 0 },
		"zero orders":    func(p *PlanParams) { p.Orders = 0 },
		"negative share": func(p *PlanParams) { p.DupShare = -0.1 },
		"share above 1":  func(p *PlanParams) { p.DupShare = 1.5 },
	} {
		p := defaultParams()
		mutate(&p)
		if _, err := NewPlan(p); err == nil {
			t.Errorf("%s: NewPlan accepted %+v", name, p)
		}
	}
}

func TestParseConfig(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"SBCLAIM_SERVICEBUS_CONNECTION_STRING": "Endpoint=sb://servicebus;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=SAS_KEY_VALUE;UseDevelopmentEmulator=true;",
		"SBCLAIM_QUEUE":                        "payments",
		"SBCLAIM_TOPIC":                        "orders",
	}
	var stderr bytes.Buffer
	cfg, err := parseConfig([]string{"-n", "7", "-dup-share", "0.5"}, func(k string) string { return env[k] }, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Plan.Payments != 7 || cfg.Plan.DupShare != 0.5 || cfg.Plan.Queue != "payments" || cfg.Plan.Topic != "orders" {
		t.Errorf("plan params = %+v", cfg.Plan)
	}
	if cfg.Plan.RunID == "" || cfg.Plan.Seed == 0 {
		t.Errorf("run id %q and seed %d must default to random values", cfg.Plan.RunID, cfg.Plan.Seed)
	}

	_, err = parseConfig(nil, func(string) string { return "" }, &stderr)
	if err == nil || !strings.Contains(err.Error(), "SBCLAIM_SERVICEBUS_CONNECTION_STRING") {
		t.Errorf("missing connection string: err = %v", err)
	}
}

func TestSummaryPrint(t *testing.T) {
	t.Parallel()
	plan, err := NewPlan(defaultParams())
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	plan.Summary.Print(&out)
	for _, want := range []string{
		"sent " + fmt.Sprint(plan.Summary.Total) + " messages",
		"50 distinct payment keys",
		"conflict: key " + plan.Summary.ConflictKey,
		"poison:   message " + plan.Summary.PoisonID,
		"10 distinct order keys",
		"GET /_counts",
		"totalEffects grows by 50 + 2 x 10 = 70",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
}

// TestNewPlanLedgerEntriesInSessions: the ledger entries go to the
// session queue, every one (copies included) with its account as
// SessionID, and each account's entries are sent in their order (the
// order the session must keep).
func TestNewPlanLedgerEntriesInSessions(t *testing.T) {
	t.Parallel()
	p := defaultParams()
	p.Queue, p.Topic, p.SessionQueue, p.Entries = "", "", "ledger", 24
	plan, err := NewPlan(p)
	if err != nil {
		t.Fatal(err)
	}
	if plan.Summary.Ledger == nil || plan.Summary.Accounts != 6 || plan.Summary.Ledger.UniqueKeys != 24 {
		t.Fatalf("summary %+v / %+v", plan.Summary, plan.Summary.Ledger)
	}
	last := map[string]int{} // account → highest seq sent (originals)
	seen := map[string]bool{}
	for _, s := range plan.Sends {
		var e entry
		if err := json.Unmarshal(s.Body, &e); err != nil {
			t.Fatal(err)
		}
		if s.Entity != "ledger" || s.SessionID == "" || s.SessionID != e.Account || s.Subject != entrySubject {
			t.Fatalf("send %+v (account %s)", s, e.Account)
		}
		if seen[s.MessageID] {
			continue // a duplicate: after its original
		}
		seen[s.MessageID] = true
		if e.Seq != last[e.Account]+1 {
			t.Errorf("account %s: entry %s (seq %d) sent after seq %d", e.Account, s.MessageID, e.Seq, last[e.Account])
		}
		last[e.Account] = e.Seq
	}
	var out bytes.Buffer
	plan.Summary.Print(&out)
	if !strings.Contains(out.String(), "24 ledger entries") || !strings.Contains(out.String(), "in 6 accounts") {
		t.Errorf("summary:\n%s", out.String())
	}
	p.Entries = 0
	if _, err := NewPlan(p); err == nil || !strings.Contains(err.Error(), "Entries") {
		t.Errorf("Entries 0 with a session queue: %v", err)
	}
}
