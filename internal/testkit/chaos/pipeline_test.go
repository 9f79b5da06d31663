package chaos

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/messaging/azservicebus"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/testkit"
	"github.com/sbclaim/sbclaim/internal/testkit/membus"
)

func runPipeline(t *testing.T, dbURL string, detection bool) {
	t.Helper()
	rep, err := RunPipeline(context.Background(), PipelineConfig{Payments: 120, Replicas: 2, Seed: 7, DatabaseURL: dbURL,
		DuplicateDetection: detection, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	rep.Write(&out)
	t.Log("\n" + out.String())
	if !rep.Pass() {
		t.Fatalf("pipeline failed:\n%s", out.String())
	}
	for _, want := range []string{"VERDICT A effects: PASS", "VERDICT follow-ups: PASS", "VERDICT B effects: PASS", "VERDICT: PASS"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	if rep.Kills == 0 {
		t.Error("no replica was killed")
	}
}

// The outbox pipeline under every fault: A's effects once, its follow-ups
// sent at least once with one MessageId each, B's effects once.
func TestPipelineSQLite(t *testing.T) {
	t.Run("duplicate detection off", func(t *testing.T) { runPipeline(t, "", false) })
	t.Run("duplicate detection on", func(t *testing.T) { runPipeline(t, "", true) })
}

func TestPipelinePostgres(t *testing.T) {
	runPipeline(t, testkit.PostgresURL(t), false)
}

// The report catches a follow-up resent under a new MessageId (the bug
// the outbox exists to prevent) and the second receipt it causes.
func TestPipelineReportCatchesANewMessageIdPerSend(t *testing.T) {
	db, err := OpenDatabase(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	p := &pipeline{cfg: PipelineConfig{Payments: 1, NoFaults: true}, db: db, ns: membus.NewNamespace(),
		queueA: membus.NewQueue(PipelineQueueA, membus.QueueOptions{}), queueB: membus.NewQueue(PipelineTarget, membus.QueueOptions{}),
		charges: newKeyLedger(), receipts: newKeyLedger(), faults: map[PipelineFault]int{}}
	p.ns.AddQueue(p.queueB, false)
	p.charges.perform("payments/pay-1", "pay-1")
	s, _ := p.ns.NewSender(PipelineTarget)
	for _, id := range []string{claim.FollowUpMessageID(PipelineConsumerA, "pay-1", 1), "a-new-id"} {
		if err := s.SendMessage(context.Background(), &azservicebus.Message{MessageID: &id, Body: []byte("pay-1")}, nil); err != nil {
			t.Fatal(err)
		}
		p.receipts.perform("receipts/"+id, "pay-1")
	}
	rep := p.report(context.Background(), []string{"pay-1"})
	var out bytes.Buffer
	rep.Write(&out)
	for _, want := range []string{"VERDICT A effects: PASS", "VERDICT follow-ups: FAIL", "VERDICT B effects: FAIL", "VERDICT: FAIL",
		"follow-up sent with MessageIds", "2 receipts, want 1"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the report lacks %q:\n%s", want, out.String())
		}
	}
}
