package deploy

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

// The delivery budget is one fact: the entity's MaxDeliveryCount. The
// processor's identity (Data Receiver) cannot read it at start, so the
// deployment gives it the value, and checks that value against the
// entity itself (read with the deployer's rights) before any app gets it.
func TestDeliveryBudgetIsTheEntitys(t *testing.T) {
	t.Parallel()
	main := read(t, "main.bicep")
	module := read(t, "modules/servicebus-access.bicep")
	proc, rec := sections(t)

	// The module reads the MaxDeliveryCount of the entity in use.
	out := regexp.MustCompile(`(?m)^output maxDeliveryCount int = (.+)$`).FindStringSubmatch(module)
	if out == nil {
		t.Fatal("modules/servicebus-access.bicep has no `output maxDeliveryCount int` (the entity's MaxDeliveryCount)")
	}
	if want := "useQueue ? queue.properties.maxDeliveryCount : topicSubscription.properties.maxDeliveryCount"; out[1] != want {
		t.Errorf("output maxDeliveryCount = %s, want %s (the queue's, or the subscription's)", out[1], want)
	}

	// main.bicep uses entityMaxDeliveryCount only when it is the entity's.
	v := regexp.MustCompile(`(?m)^var maxDeliveryCount = (.+)$`).FindStringSubmatch(main)
	if v == nil {
		t.Fatal("main.bicep has no `var maxDeliveryCount` (entityMaxDeliveryCount, checked against the entity)")
	}
	check := regexp.MustCompile(`^serviceBusAccess\.outputs\.maxDeliveryCount == entityMaxDeliveryCount \? entityMaxDeliveryCount : fail\('(.+)'\)$`).FindStringSubmatch(v[1])
	if check == nil {
		t.Fatalf("var maxDeliveryCount = %s; want it to fail() unless entityMaxDeliveryCount equals serviceBusAccess.outputs.maxDeliveryCount", v[1])
	}
	for _, part := range []string{"entityMaxDeliveryCount=${entityMaxDeliveryCount}", "${serviceBusAccess.outputs.maxDeliveryCount}", "${entityLabel}"} {
		if !strings.Contains(check[1], part) {
			t.Errorf("the mismatch message does not show %s: %s", part, check[1])
		}
	}

	// Both apps get the checked value, and nothing else names the parameter.
	const env = "{ name: 'SBCLAIM_MAX_DELIVERY_COUNT', value: string(maxDeliveryCount) }"
	for name, sec := range map[string]string{"processor": proc, "reconciler job": rec} {
		if n := strings.Count(sec, "'SBCLAIM_MAX_DELIVERY_COUNT'"); n != 1 || !strings.Contains(sec, env) {
			t.Errorf("the %s must set SBCLAIM_MAX_DELIVERY_COUNT once, as %s", name, env)
		}
	}
	uses := regexp.MustCompile(`\bentityMaxDeliveryCount\b`).FindAllStringIndex(stripBicep(main), -1)
	// The declaration and the two in the check; the fail message is a
	// string, which stripBicep empties.
	if len(uses) != 3 {
		t.Errorf("main.bicep names entityMaxDeliveryCount %d times outside strings, want 3 (declared, compared, used once checked): every use goes through maxDeliveryCount", len(uses))
	}
	// The processor accepts 1..2000; the parameter must not allow more.
	if !regexp.MustCompile(`@minValue\(1\)\n@maxValue\(2000\)\nparam entityMaxDeliveryCount int`).MatchString(main) {
		t.Error("param entityMaxDeliveryCount needs @minValue(1) and @maxValue(2000), the range the processor accepts")
	}
}

// KEDA's Service Bus scaler counts active messages, not deferred ones: a
// processor scaled to zero leaves due delayed retries unfetched. The
// deployment refuses processorMinReplicas=0 while deferral is on.
func TestScaleToZeroNeedsDeferralOff(t *testing.T) {
	t.Parallel()
	main := read(t, "main.bicep")
	proc, _ := sections(t)
	ps := params(t)

	if p, ok := ps["deferral"]; !ok || p.typ != "bool" || p.def != "true" {
		t.Fatalf("main.bicep needs `param deferral bool = true`, has %+v", p)
	}
	if !strings.Contains(proc, "{ name: 'SBCLAIM_DEFERRAL', value: deferral ? 'true' : 'false' }") {
		t.Error("the processor's SBCLAIM_DEFERRAL must come from the deferral parameter (as 'true' or 'false': string() of a bool is 'True')")
	}
	if !strings.Contains(proc, "minReplicas: processorMinReplicasChecked\n") {
		t.Error("the processor's scale must use processorMinReplicasChecked, not processorMinReplicas")
	}
	v := regexp.MustCompile(`(?m)^var processorMinReplicasChecked = processorMinReplicas < 1 && deferral \? fail\('(.+)'\) : processorMinReplicas$`).FindStringSubmatch(main)
	if v == nil {
		t.Fatal("main.bicep needs `var processorMinReplicasChecked = processorMinReplicas < 1 && deferral ? fail('…') : processorMinReplicas`")
	}
	for _, part := range []string{"processorMinReplicas=0", "deferral=true", "active messages only", "deferred", "deferral=false"} {
		if !strings.Contains(v[1], part) {
			t.Errorf("the refusal does not say %q: %s", part, v[1])
		}
	}

	// The condition pinned above, applied to the defaults and the example.
	refuses := func(minReplicas int, deferral bool) bool { return minReplicas < 1 && deferral }
	min := func(source string, raw json.RawMessage) int {
		var n int
		if err := json.Unmarshal(raw, &n); err != nil {
			t.Fatalf("%s processorMinReplicas: %v", source, err)
		}
		return n
	}
	def := min("default", json.RawMessage(ps["processorMinReplicas"].def))
	ex := loadExample(t)
	exDeferral := true
	if raw, ok := ex["deferral"]; ok {
		if err := json.Unmarshal(raw, &exDeferral); err != nil {
			t.Fatalf("example deferral: %v", err)
		}
	}
	if refuses(def, true) {
		t.Errorf("the defaults (processorMinReplicas=%d, deferral=true) are refused", def)
	}
	if raw, ok := ex["processorMinReplicas"]; ok && refuses(min("example", raw), exDeferral) {
		t.Errorf("main.parameters.example.json sets processorMinReplicas=0 with deferral on: the deployment refuses it")
	}

	// The deploy documentation says which way the template went.
	section := deployDoc(t)
	for _, want := range []string{"processorMinReplicas=0", "deferral=false", "KEDA"} {
		if !strings.Contains(section, want) {
			t.Errorf("the README's deploy section does not mention %s (scale to zero and delayed retries)", want)
		}
	}
}

// deployDoc is the deployment guide: docs/deploy.md where the README's
// deploy section has moved there, else that section of the README.
func deployDoc(t *testing.T) string {
	t.Helper()
	if b, err := os.ReadFile("../docs/deploy.md"); err == nil {
		return string(b)
	}
	readme := read(t, "../README.md")
	i := strings.Index(readme, "\n## Deploy to Azure Container Apps")
	if i < 0 {
		t.Fatal("neither docs/deploy.md nor the README's deploy section")
	}
	section := readme[i+1:]
	if j := strings.Index(section[3:], "\n## "); j >= 0 {
		section = section[:j+3]
	}
	return section
}
