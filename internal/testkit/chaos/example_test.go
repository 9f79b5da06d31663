package chaos_test

import (
	"context"
	"fmt"

	"github.com/sbclaim/sbclaim/internal/testkit/chaos"
)

// A check-then-insert guard lets both instances act on one message
// delivered twice: the scenario passes when it reproduces that bug.
func ExampleRunScenario() {
	res, err := chaos.RunScenario(context.Background(), chaos.ScenarioNaive, chaos.ScenarioConfig{})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(res.Verdict())
	// Output: VERDICT: PASS naive: 2 effects (expected: the bug reproduced)
}

// A short run with every fault on; the last line of Report.Write is the
// verdict.
func ExampleRun() {
	rep, err := chaos.Run(context.Background(), chaos.Config{
		Messages: 100,
		Replicas: 2,
		Faults:   []chaos.Fault{chaos.FaultDieAfterEffect, chaos.FaultResponseLost},
		Seed:     42,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(rep.Pass(), rep.EffectsPerKey[1] == rep.Distinct)
	// Output: true true
}
