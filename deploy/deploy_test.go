package deploy

import (
	"encoding/json"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sbclaim/sbclaim/internal/sideeffects/routesfile"
)

const appAPIVersion = "2025-07-01"

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.FromSlash(path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// bicepFiles returns main.bicep and the modules.
func bicepFiles(t *testing.T) map[string]string {
	t.Helper()
	files := map[string]string{"main.bicep": read(t, "main.bicep")}
	mods, err := filepath.Glob(filepath.Join("modules", "*.bicep"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range mods {
		files[filepath.ToSlash(m)] = read(t, m)
	}
	return files
}

// stripBicep removes comments and the contents of string literals, so that
// brackets and names inside them do not count.
func stripBicep(src string) string {
	var b strings.Builder
	inString, lineComment, blockComment := false, false, false
	for i := 0; i < len(src); i++ {
		c := src[i]
		switch {
		case lineComment:
			if c == '\n' {
				lineComment = false
				b.WriteByte(c)
			}
		case blockComment:
			if c == '*' && i+1 < len(src) && src[i+1] == '/' {
				blockComment = false
				i++
			}
		case inString:
			if c == '\\' {
				i++
			} else if c == '\'' {
				inString = false
				b.WriteString("''")
			}
		case c == '/' && i+1 < len(src) && src[i+1] == '/':
			lineComment = true
		case c == '/' && i+1 < len(src) && src[i+1] == '*':
			blockComment = true
		case c == '\'':
			inString = true
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}

func TestBicepBracketsBalance(t *testing.T) {
	t.Parallel()
	for name, src := range bicepFiles(t) {
		code := stripBicep(src)
		var stack []byte
		pairs := map[byte]byte{')': '(', ']': '[', '}': '{'}
		line := 1
		for i := 0; i < len(code); i++ {
			switch c := code[i]; c {
			case '\n':
				line++
			case '(', '[', '{':
				stack = append(stack, c)
			case ')', ']', '}':
				if len(stack) == 0 || stack[len(stack)-1] != pairs[c] {
					t.Fatalf("%s:%d: unbalanced %q", name, line, c)
				}
				stack = stack[:len(stack)-1]
			}
		}
		if len(stack) > 0 {
			t.Errorf("%s: %d unclosed brackets", name, len(stack))
		}
	}
}

var resourceType = regexp.MustCompile(`'(Microsoft\.[A-Za-z]+/[A-Za-z/]+)@([0-9]{4}-[0-9]{2}-[0-9]{2}(?:-preview)?)'`)

func TestAppAPIVersions(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for name, src := range bicepFiles(t) {
		for _, m := range resourceType.FindAllStringSubmatch(src, -1) {
			typ, version := m[1], m[2]
			if strings.HasSuffix(version, "-preview") {
				t.Errorf("%s: %s uses a preview API version %s", name, typ, version)
			}
			if strings.HasPrefix(typ, "Microsoft.App/") {
				seen[typ] = true
				if version != appAPIVersion {
					t.Errorf("%s: %s@%s, want %s", name, typ, version, appAPIVersion)
				}
			}
		}
	}
	for _, typ := range []string{"Microsoft.App/managedEnvironments", "Microsoft.App/containerApps", "Microsoft.App/jobs"} {
		if !seen[typ] {
			t.Errorf("no %s resource", typ)
		}
	}
}

var (
	settingName = regexp.MustCompile(`"(SBCLAIM_[A-Z_]+)"`)
	bicepEnv    = regexp.MustCompile(`name: '((?:SBCLAIM|AZURE)_[A-Z_]+)'`)
)

// knownSettings lists the SBCLAIM_ variables a binary's config.go reads.
func knownSettings(t *testing.T, cmd string) map[string]bool {
	t.Helper()
	known := map[string]bool{"AZURE_CLIENT_ID": true}
	for _, m := range settingName.FindAllStringSubmatch(read(t, "../cmd/"+cmd+"/config.go"), -1) {
		known[m[1]] = true
	}
	if len(known) < 5 {
		t.Fatalf("found only %d settings in cmd/%s/config.go", len(known), cmd)
	}
	return known
}

// sections splits main.bicep into the processor app and the reconciler job
// (which ends where the operator console begins; see console_test.go).
func sections(t *testing.T) (processor, reconciler string) {
	t.Helper()
	src := read(t, "main.bicep")
	p := strings.Index(src, "resource processor ")
	r := strings.Index(src, "resource reconcilerJob ")
	if p < 0 || r < 0 || r < p {
		t.Fatal("main.bicep: cannot find the processor app and the reconciler job")
	}
	end := len(src)
	if c := strings.Index(src, "// ---- Operator console (container app"); c > r {
		end = c
	}
	return src[p:r], src[r:end]
}

func envNames(section string) []string {
	var names []string
	for _, m := range bicepEnv.FindAllStringSubmatch(section, -1) {
		names = append(names, m[1])
	}
	return names
}

// announced lists settings a binary is being given in a parallel change
// (the lead's processor rewrite): main.bicep may set them before
// cmd/<binary>/config.go reads them. Once config.go reads one, the entry is
// redundant, and the test logs so.
var announced = map[string][]string{
	"processor": {},
}

func TestEnvVarsAreSettings(t *testing.T) {
	t.Parallel()
	proc, rec := sections(t)
	main := read(t, "main.bicep")
	for cmd, section := range map[string]string{"processor": proc, "reconciler": rec} {
		known := knownSettings(t, cmd)
		for _, a := range announced[cmd] {
			if known[a] {
				t.Logf("cmd/%s/config.go reads %s now: drop it from announced", cmd, a)
			}
			known[a] = true
		}
		names := envNames(section)
		if cmd == "processor" {
			// The entity variables are set through a variable.
			names = append(names, envNames(main[:strings.Index(main, "resource ")])...)
		}
		for _, n := range names {
			if !known[n] {
				t.Errorf("main.bicep sets %s on the %s, which does not read it", n, cmd)
			}
		}
		for _, must := range []string{"AZURE_CLIENT_ID", "SBCLAIM_DATABASE_URL"} {
			if !slices.Contains(names, must) {
				t.Errorf("the %s gets no %s", cmd, must)
			}
		}
	}
	for _, must := range []string{"SBCLAIM_SERVICEBUS_NAMESPACE", "SBCLAIM_CONSUMER", "SBCLAIM_ROUTES", "SBCLAIM_SHUTDOWN_TIMEOUT",
		"SBCLAIM_TERMINATION_GRACE_PERIOD", "SBCLAIM_TAKEOVER_AFTER", "SBCLAIM_STALE_AFTER", "SBCLAIM_HEARTBEAT_INTERVAL"} {
		if !slices.Contains(envNames(proc), must) {
			t.Errorf("the processor gets no %s", must)
		}
	}
	// The reconciler recovers claims by itself, with the processor's routes.
	for _, must := range []string{"SBCLAIM_ROUTES", "SBCLAIM_STALE_AFTER", "SBCLAIM_HEARTBEAT_INTERVAL"} {
		if !slices.Contains(envNames(rec), must) {
			t.Errorf("the reconciler job gets no %s", must)
		}
	}
	// Both read the stale window and the heartbeat from the same parameters.
	for _, v := range []string{"'SBCLAIM_STALE_AFTER', value: staleAfter", "'SBCLAIM_HEARTBEAT_INTERVAL', value: heartbeatInterval"} {
		if !strings.Contains(proc, v) || !strings.Contains(rec, v) {
			t.Errorf("the processor and the reconciler must both set %s", v)
		}
	}
	if strings.Contains(main, "SBCLAIM_SERVICEBUS_CONNECTION_STRING") {
		t.Error("main.bicep sets a connection string: the deployment must use managed identities only")
	}
}

func TestProcessorShapes(t *testing.T) {
	t.Parallel()
	proc, rec := sections(t)
	for _, want := range []string{
		"type: 'Liveness'", "path: '/healthz'",
		"type: 'Readiness'", "path: '/readyz'",
		"type: 'azure-servicebus'", "identity: scalerIdentity.id",
		"fedauth=ActiveDirectoryManagedIdentity",
	} {
		if !strings.Contains(proc+read(t, "main.bicep"), want) {
			t.Errorf("processor app lacks %q", want)
		}
	}
	for _, want := range []string{"triggerType: 'Schedule'", "cronExpression:", "parallelism: 1", "replicaCompletionCount: 1", "replicaTimeout:", "replicaRetryLimit:", "'once'"} {
		if !strings.Contains(rec, want) {
			t.Errorf("reconciler job lacks %q", want)
		}
	}

	grace := regexp.MustCompile(`terminationGracePeriodSeconds: (\d+)`).FindStringSubmatch(proc)
	shutdown := regexp.MustCompile(`'SBCLAIM_SHUTDOWN_TIMEOUT', value: '([^']+)'`).FindStringSubmatch(proc)
	told := regexp.MustCompile(`'SBCLAIM_TERMINATION_GRACE_PERIOD', value: '([^']+)'`).FindStringSubmatch(proc)
	if grace == nil || shutdown == nil || told == nil {
		t.Fatal("processor: no terminationGracePeriodSeconds, SBCLAIM_SHUTDOWN_TIMEOUT or SBCLAIM_TERMINATION_GRACE_PERIOD")
	}
	g, _ := strconv.Atoi(grace[1])
	s, err := time.ParseDuration(shutdown[1])
	if err != nil {
		t.Fatal(err)
	}
	tg, err := time.ParseDuration(told[1])
	if err != nil {
		t.Fatal(err)
	}
	if tg != time.Duration(g)*time.Second {
		t.Errorf("SBCLAIM_TERMINATION_GRACE_PERIOD %v differs from terminationGracePeriodSeconds %ds: the processor would plan its shutdown for the wrong budget", tg, g)
	}
	// The processor refuses to start unless the shutdown timeout, the
	// settle timeout and one store write (their defaults when the app does
	// not set them) add up to less than the grace period.
	budget := s
	for name, def := range map[string]time.Duration{"SBCLAIM_SETTLE_TIMEOUT": 5 * time.Second, "SBCLAIM_STORE_TIMEOUT": 5 * time.Second} {
		d := def
		if m := regexp.MustCompile(`'` + name + `', value: '([^']+)'`).FindStringSubmatch(proc); m != nil {
			if d, err = time.ParseDuration(m[1]); err != nil {
				t.Fatal(err)
			}
		}
		budget += d
	}
	if budget >= time.Duration(g)*time.Second {
		t.Errorf("shutdown + settle + store timeouts = %v do not fit terminationGracePeriodSeconds %ds: the processor would refuse to start", budget, g)
	}
}

func TestRoleAssignments(t *testing.T) {
	t.Parallel()
	all := strings.Join(slices.Collect(maps.Values(bicepFiles(t))), "\n")
	const (
		receiver = "4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0"
		sender   = "69a216fc-b8fb-44d8-bc22-1f3c2cd27a39"
	)
	if !strings.Contains(all, receiver) {
		t.Error("no Azure Service Bus Data Receiver role assignment")
	}
	// Data Sender only on the outbox's targets: an entity of
	// senderQueueNames or senderTopicNames, never the namespace.
	sb := read(t, "modules/servicebus-access.bicep")
	if n := strings.Count(all, sender); n != 1 || !strings.Contains(sb, sender) {
		t.Errorf("Azure Service Bus Data Sender appears %d times, want once, in modules/servicebus-access.bicep", n)
	}
	for _, m := range regexp.MustCompile(`(?s)resource (\w+) 'Microsoft.Authorization/roleAssignments@[^']+' = [^\n]*\n(.*?)\n\}`).FindAllStringSubmatch(sb, -1) {
		if strings.Contains(m[2], "serviceBusDataSender") && !regexp.MustCompile(`scope: sender(Queues|Topics)\[i\]`).MatchString(m[2]) {
			t.Errorf("role assignment %s gives Data Sender beyond the outbox's targets", m[1])
		}
	}
}

var param = regexp.MustCompile(`(?m)^param (\w+) (\w+)( = (.+))?$`)

type bicepParam struct {
	typ, def string
	hasDef   bool
}

func params(t *testing.T) map[string]bicepParam {
	t.Helper()
	ps := map[string]bicepParam{}
	for _, m := range param.FindAllStringSubmatch(read(t, "main.bicep"), -1) {
		ps[m[1]] = bicepParam{typ: m[2], def: strings.Trim(m[4], "'"), hasDef: m[3] != ""}
	}
	return ps
}

type exampleParams struct {
	Parameters map[string]struct {
		Value json.RawMessage `json:"value"`
	} `json:"parameters"`
}

func loadExample(t *testing.T) map[string]json.RawMessage {
	t.Helper()
	var ex exampleParams
	if err := json.Unmarshal([]byte(read(t, "main.parameters.example.json")), &ex); err != nil {
		t.Fatalf("main.parameters.example.json: %v", err)
	}
	out := map[string]json.RawMessage{}
	for k, v := range ex.Parameters {
		out[k] = v.Value
	}
	return out
}

func TestExampleParameters(t *testing.T) {
	t.Parallel()
	ps := params(t)
	ex := loadExample(t)
	for name, raw := range ex {
		p, ok := ps[name]
		if !ok {
			t.Errorf("example sets %q, which main.bicep does not declare", name)
			continue
		}
		var v any
		_ = json.Unmarshal(raw, &v)
		switch v.(type) {
		case string:
			if p.typ != "string" {
				t.Errorf("example %s is a string, main.bicep declares %s", name, p.typ)
			}
		case float64:
			if p.typ != "int" {
				t.Errorf("example %s is a number, main.bicep declares %s", name, p.typ)
			}
		}
	}
	for name, p := range ps {
		if _, ok := ex[name]; !p.hasDef && !ok {
			t.Errorf("required parameter %s is missing from the example", name)
		}
	}

	var routes string
	if err := json.Unmarshal(ex["routesYaml"], &routes); err != nil {
		t.Fatalf("routesYaml: %v", err)
	}
	getenv := func(string) string { return "example-value" }
	if _, err := routesfile.Parse([]byte(routes), getenv, nil, slog.New(slog.DiscardHandler)); err != nil {
		t.Errorf("the example routesYaml does not load: %v", err)
	}
}

// The reconciler's windows, with the defaults and with the example values.
func TestReconcilerWindows(t *testing.T) {
	t.Parallel()
	ps := params(t)
	ex := loadExample(t)
	value := func(name string) string {
		if raw, ok := ex[name]; ok {
			var s any
			_ = json.Unmarshal(raw, &s)
			if f, ok := s.(float64); ok {
				return strconv.Itoa(int(f))
			}
			return s.(string)
		}
		return ps[name].def
	}
	for _, source := range []string{"defaults", "example"} {
		get := func(name string) string {
			if source == "defaults" {
				return ps[name].def
			}
			return value(name)
		}
		dur := func(name string) time.Duration {
			d, err := time.ParseDuration(get(name))
			if err != nil {
				t.Fatalf("%s %s = %q: %v", source, name, get(name), err)
			}
			return d
		}
		deliveries, err := strconv.Atoi(get("entityMaxDeliveryCount"))
		if err != nil {
			t.Fatalf("%s entityMaxDeliveryCount: %v", source, err)
		}
		if stale, hb := dur("staleAfter"), dur("heartbeatInterval"); stale < 3*hb {
			t.Errorf("%s: staleAfter %v < 3 × heartbeatInterval %v", source, stale, hb)
		}
		if ret, lock := dur("retention"), dur("entityLockDuration"); ret < lock*time.Duration(deliveries) {
			t.Errorf("%s: retention %v < lock %v × %d deliveries", source, ret, lock, deliveries)
		}
		if cron := strings.Fields(get("reconcileCron")); len(cron) != 5 {
			t.Errorf("%s: reconcileCron %q is not 5 fields", source, get("reconcileCron"))
		}
	}
}

// resourceDecl matches a resource declaration, its condition if any.
func resourceDecl(symbol string) *regexp.Regexp {
	return regexp.MustCompile(`(?m)^resource ` + symbol + ` '[^']+'(?: existing)? = (?:if \(([^)]*)\) )?\{`)
}

// The first deployment must not wait for a ready replica before the
// database users exist: pass 1 (deployApps=false, the default) creates
// the identities, their role assignments and the sqlStatements output;
// the apps come in pass 2.
func TestTwoPassDeployment(t *testing.T) {
	t.Parallel()
	ps := params(t)
	if p, ok := ps["deployApps"]; !ok || p.typ != "bool" || p.def != "false" {
		t.Fatalf("main.bicep needs `param deployApps bool = false`, has %+v", p)
	}
	main := read(t, "main.bicep")
	for _, app := range []string{"processor", "reconcilerJob"} {
		m := resourceDecl(app).FindStringSubmatch(main)
		if m == nil || m[1] != "deployApps" {
			t.Errorf("resource %s must be deployed `if (deployApps)` (pass 2 only)", app)
		}
	}
	for _, always := range []string{"containerAppsEnv", "processorIdentity", "reconcilerIdentity", "scalerIdentity", "pullIdentity"} {
		m := resourceDecl(always).FindStringSubmatch(main)
		if m == nil || m[1] != "" {
			t.Errorf("resource %s must be deployed in pass 1 (unconditionally)", always)
		}
	}
	for _, mod := range []string{"serviceBusAccess", "acrPull"} {
		m := regexp.MustCompile(`(?m)^module ` + mod + ` '[^']+' = (?:if \(([^)]*)\) )?\{`).FindStringSubmatch(main)
		if m == nil || strings.Contains(m[1], "deployApps") {
			t.Errorf("module %s (role assignments) must be deployed in pass 1", mod)
		}
	}
	// Every output exists after pass 1: none reads a pass-2 resource.
	outputs := main[strings.Index(main, "// ---- Outputs"):]
	if regexp.MustCompile(`\b(processor|reconcilerJob)\.`).MatchString(stripBicep(outputs)) {
		t.Error("an output reads the processor app or the reconciler job, which pass 1 does not deploy")
	}
	// The apps wait for AcrPull (deployed in pass 1, re-applied in pass 2).
	proc, rec := sections(t)
	for name, sec := range map[string]string{"processor": proc, "reconciler job": rec} {
		if !regexp.MustCompile(`dependsOn: \[\s*acrPull\s*\]`).MatchString(sec) {
			t.Errorf("the %s does not depend on acrPull", name)
		}
	}
}

// Re-running the SQL statements must be safe: every CREATE USER and ALTER
// ROLE is guarded.
func TestSQLStatementsIdempotent(t *testing.T) {
	t.Parallel()
	main := read(t, "main.bicep")
	fn := regexp.MustCompile(`(?m)^func usersSql\(.*$`).FindString(main)
	if fn == "" {
		t.Fatal("main.bicep: no usersSql function")
	}
	for _, want := range []string{
		`IF DATABASE_PRINCIPAL_ID(N\'${user}\') IS NULL CREATE USER [${user}] FROM EXTERNAL PROVIDER WITH OBJECT_ID = \'${objectId}\'`,
		`IF NOT EXISTS (SELECT 1 FROM sys.database_role_members`,
		`ALTER ROLE ${role} ADD MEMBER [${user}]`,
	} {
		if !strings.Contains(fn, want) {
			t.Errorf("usersSql lacks %s", want)
		}
	}
	if n := strings.Count(fn, "CREATE USER"); n != 1 {
		t.Errorf("usersSql has %d CREATE USER, want 1 (guarded)", n)
	}
	out := main[strings.Index(main, "output sqlStatements"):]
	for _, want := range []string{
		"usersSql(processorIdentity.name, processorIdentity.properties.principalId, 'sbclaim_processor')",
		"usersSql(reconcilerIdentity.name, reconcilerIdentity.properties.principalId, 'sbclaim_reconciler')",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("sqlStatements lacks %s", want)
		}
	}
	if strings.Contains(out, "CREATE USER") {
		t.Error("sqlStatements has an unguarded CREATE USER; use usersSql")
	}
	// The roles come from sql/grants/sqlserver.sql, itself re-runnable.
	grants := read(t, "../sql/grants/sqlserver.sql")
	for _, role := range []string{"sbclaim_processor", "sbclaim_reconciler"} {
		if !strings.Contains(grants, "IF DATABASE_PRINCIPAL_ID(N'"+role+"') IS NULL\n    CREATE ROLE "+role) {
			t.Errorf("sql/grants/sqlserver.sql does not create role %s idempotently", role)
		}
	}
}

// A change of the routes or of a route secret changes the processor's
// template (Container Apps makes no revision for a secret change alone).
func TestConfigChangeRollsOutRevision(t *testing.T) {
	t.Parallel()
	main := read(t, "main.bicep")
	proc, _ := sections(t)
	hash := regexp.MustCompile(`(?m)^var configHash = (.+)$`).FindStringSubmatch(main)
	if hash == nil || !strings.Contains(hash[1], "routesYaml") || !strings.Contains(hash[1], "routeSecretEnv") {
		t.Fatalf("main.bicep needs a configHash over routesYaml and routeSecretEnv, has %v", hash)
	}
	if !strings.Contains(proc, "value: configHash }") {
		t.Error("the processor's template does not carry configHash (as an environment variable)")
	}
	if strings.Contains(proc, "revisionSuffix") {
		t.Error("a fixed revisionSuffix makes a second deployment with another image fail; use the hash in the template instead")
	}
}

// The reconciler job mounts the processor's routes the same way.
func TestReconcilerJobHasRoutes(t *testing.T) {
	t.Parallel()
	proc, rec := sections(t)
	for _, want := range []string{"secrets: routesSecrets", "routesVolume", "mountPath: '/etc/sbclaim'", "{ name: 'SBCLAIM_ROUTES', value: '/etc/sbclaim/routes.yaml' }", "routeSecretEnvVars"} {
		if !strings.Contains(proc, want) {
			t.Errorf("processor lacks %q", want)
		}
		if !strings.Contains(rec, want) {
			t.Errorf("reconciler job lacks %q", want)
		}
	}
}
