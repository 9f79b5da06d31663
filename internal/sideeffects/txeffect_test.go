package sideeffects_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"
	"github.com/google/uuid"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/sideeffects"
	"github.com/sbclaim/sbclaim/internal/testkit"
	"github.com/sbclaim/sbclaim/internal/testkit/testdb"
)

// txStore is a claims store plus the database it lives in (the ledger
// table of the tests is created beside the claims table).
type txStore interface {
	claim.Store
	DB() *sql.DB
}

type txDialect struct {
	name string
	open func(t *testing.T) txStore
	// ph returns the n-th (1-based) placeholder.
	ph func(n int) string
}

func TestTxEffectSQLite(t *testing.T) {
	t.Parallel()
	testTxEffect(t, txDialect{
		name: "sqlite",
		open: func(t *testing.T) txStore { return testdb.SQLite(t) },
		ph:   func(int) string { return "?" },
	})
}

func TestTxEffectPostgres(t *testing.T) {
	t.Parallel()
	testkit.PostgresURL(t) // skip (naming the variable) before any subtest
	testTxEffect(t, txDialect{
		name: "postgres",
		open: func(t *testing.T) txStore { return testdb.Postgres(t) },
		ph:   func(n int) string { return fmt.Sprintf("$%d", n) },
	})
}

// ledgerEffect is the transactional effect under test: it books every line
// of the message into the ledger table, using only the transaction it is
// given. A line with a non-positive amount violates the table's CHECK
// constraint after the earlier lines were written.
func ledgerEffect(d txDialect) sideeffects.TxEffect {
	return sideeffects.TxEffectFunc(func(ctx context.Context, tx *sql.Tx, msg *azservicebus.ReceivedMessage, key string) error {
		var body struct{ Lines []int }
		if err := json.Unmarshal(msg.Body, &body); err != nil {
			return sideeffects.Permanent(err)
		}
		for i, amount := range body.Lines {
			_, err := tx.ExecContext(ctx,
				fmt.Sprintf("INSERT INTO ledger (message_id, line, amount) VALUES (%s, %s, %s)", d.ph(1), d.ph(2), d.ph(3)),
				key, i, amount)
			if err != nil {
				return sideeffects.Permanent(fmt.Errorf("book line %d: %w", i, err))
			}
		}
		return nil
	})
}

func testTxEffect(t *testing.T, d txDialect) {
	const consumer = "ledger"
	setup := func(t *testing.T) (txStore, sideeffects.Router) {
		s := d.open(t)
		_, err := s.DB().ExecContext(context.Background(), `CREATE TABLE ledger (
			message_id VARCHAR(128) NOT NULL,
			line       INTEGER NOT NULL,
			amount     INTEGER NOT NULL CHECK (amount > 0),
			PRIMARY KEY (message_id, line))`)
		if err != nil {
			t.Fatal(err)
		}
		r, err := sideeffects.NewRouter(sideeffects.Route{
			Name: "ledger", Match: sideeffects.Match{Subject: "credit"}, TxEffect: ledgerEffect(d), JSONBody: true,
		})
		if err != nil {
			t.Fatal(err)
		}
		return s, r
	}
	// claimTx is how the processor runs a TxEffect: inside the store's
	// ClaimTx, with the transaction as the only handle.
	claimTx := func(ctx context.Context, s txStore, r sideeffects.Router, msg *azservicebus.ReceivedMessage) (claim.ClaimResult, error) {
		h, err := r.Route(msg)
		if err != nil {
			return claim.ClaimResult{}, err
		}
		return s.ClaimTx(ctx, &claim.ClaimTxParams{Host: "test", Claim: claim.ClaimParams{
			Owner:       uuid.New(),
			MessageID:   msg.MessageID,
			Consumer:    consumer,
			Subject:     *msg.Subject,
			PayloadHash: claim.HashPayload(msg.Body),
		}}, func(ctx context.Context, tx *sql.Tx) error {
			return h.TxEffect.PerformTx(ctx, tx, msg, msg.MessageID)
		})
	}
	ledgerRows := func(t *testing.T, s txStore, key string) int {
		t.Helper()
		var n int
		err := s.DB().QueryRowContext(context.Background(),
			"SELECT COUNT(*) FROM ledger WHERE message_id = "+d.ph(1), key).Scan(&n)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	claims := func(t *testing.T, s txStore, key string) []*claim.Claim {
		t.Helper()
		all, err := s.List(context.Background(), &claim.ListParams{Consumer: consumer, Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		var out []*claim.Claim
		for _, c := range all {
			if c.MessageID == key {
				out = append(out, c)
			}
		}
		return out
	}
	credit := func(id string, lines ...int) *azservicebus.ReceivedMessage {
		subject := "credit"
		body, _ := json.Marshal(map[string][]int{"lines": lines})
		return &azservicebus.ReceivedMessage{MessageID: id, Subject: &subject, Body: body}
	}

	t.Run("effect and marker commit together", func(t *testing.T) {
		t.Parallel()
		s, r := setup(t)
		res, err := claimTx(context.Background(), s, r, credit("ok-1", 5, 7))
		if err != nil || res.Outcome != claim.OutcomeWon {
			t.Fatalf("ClaimTx: %v, %v", res.Outcome, err)
		}
		if n := ledgerRows(t, s, "ok-1"); n != 2 {
			t.Errorf("ledger rows = %d, want 2", n)
		}
		cs := claims(t, s, "ok-1")
		if len(cs) != 1 || cs[0].State != claim.StateProcessed {
			t.Errorf("claims = %+v, want one processed", cs)
		}
	})

	t.Run("effect write fails: marker not committed", func(t *testing.T) {
		t.Parallel()
		s, r := setup(t)
		// Line 0 is written, line 1 violates the CHECK constraint.
		res, err := claimTx(context.Background(), s, r, credit("bad-1", 5, -1))
		if err == nil {
			t.Fatalf("ClaimTx succeeded (%v) although the effect failed", res.Outcome)
		}
		if sideeffects.Classify(err) != sideeffects.OutcomePermanent {
			t.Errorf("ClaimTx lost the effect's classification: %v", err)
		}
		if n := ledgerRows(t, s, "bad-1"); n != 0 {
			t.Errorf("ledger rows = %d, want 0: the effect's first write escaped the rollback", n)
		}
		if cs := claims(t, s, "bad-1"); len(cs) != 0 {
			t.Errorf("the marker was committed without the effect: %+v", cs[0])
		}
		// The failed attempt left no marker behind: the key can still be
		// claimed, and an effect that succeeds commits.
		res, err = claimTx(context.Background(), s, r, credit("bad-1", 5, 1))
		if err != nil || res.Outcome != claim.OutcomeWon {
			t.Errorf("retry after the failed effect: %v, %v (want won)", res.Outcome, err)
		}
	})

	t.Run("marker fails: effect not run nor committed", func(t *testing.T) {
		t.Parallel()
		s, r := setup(t)
		msg := credit("dup-1", 3)
		if res, err := claimTx(context.Background(), s, r, msg); err != nil || res.Outcome != claim.OutcomeWon {
			t.Fatalf("first ClaimTx: %v, %v", res.Outcome, err)
		}
		// The redelivery: the marker insert hits the claims index, so the
		// effect must not run (and a write of it must not commit).
		res, err := claimTx(context.Background(), s, r, msg)
		if err != nil || res.Outcome != claim.OutcomeDuplicate {
			t.Fatalf("redelivery: %v, %v (want duplicate)", res.Outcome, err)
		}
		// Same key, another payload: a conflict, and no effect either.
		res, err = claimTx(context.Background(), s, r, credit("dup-1", 4, 4))
		if err != nil || res.Outcome != claim.OutcomeConflict {
			t.Fatalf("conflict: %v, %v (want conflict)", res.Outcome, err)
		}
		if n := ledgerRows(t, s, "dup-1"); n != 1 {
			t.Errorf("ledger rows = %d, want 1", n)
		}
	})

	t.Run("concurrent deliveries: one effect", func(t *testing.T) {
		t.Parallel()
		s, r := setup(t)
		const n = 8
		msg := credit("race-1", 9)
		outcomes := make([]claim.Outcome, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := claimTx(context.Background(), s, r, msg)
				outcomes[i], errs[i] = res.Outcome, err
			}()
		}
		wg.Wait()
		won := 0
		for i := range n {
			switch {
			case errs[i] != nil:
				t.Errorf("delivery %d: %v", i, errs[i])
			case outcomes[i] == claim.OutcomeWon:
				won++
			case outcomes[i] != claim.OutcomeDuplicate:
				t.Errorf("delivery %d: %v", i, outcomes[i])
			}
		}
		if won != 1 {
			t.Errorf("%d deliveries won, want 1", won)
		}
		if got := ledgerRows(t, s, "race-1"); got != 1 {
			t.Errorf("ledger rows = %d, want 1", got)
		}
	})

	t.Run("malformed body never reaches the store", func(t *testing.T) {
		t.Parallel()
		s, r := setup(t)
		subject := "credit"
		_, err := claimTx(context.Background(), s, r, &azservicebus.ReceivedMessage{MessageID: "m", Subject: &subject, Body: []byte("{")})
		var ie *sideeffects.InputError
		if !errors.As(err, &ie) || ie.Reason != sideeffects.ReasonMalformedBody {
			t.Errorf("err = %v, want MalformedBody", err)
		}
		if cs := claims(t, s, "m"); len(cs) != 0 {
			t.Errorf("a claim was taken for bad input")
		}
	})
}
