package deploy

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// consoleSection is main.bicep's operator console: the container app and
// its authentication configuration.
func consoleSection(t *testing.T) string {
	t.Helper()
	src := read(t, "main.bicep")
	c := strings.Index(src, "// ---- Operator console (container app")
	o := strings.Index(src, "// ---- Outputs")
	if c < 0 || o < c {
		t.Fatal("main.bicep: no operator console section before the outputs")
	}
	return src[c:o]
}

// The console is a container app running `reconciler console` with
// external ingress on its port, in pass 2 only and only with
// deployConsole, never in local-development mode; it gets only the
// settings the reconciler binary reads, the processors' routes for
// redrive, and a new revision when they change.
func TestConsoleApp(t *testing.T) {
	t.Parallel()
	main := read(t, "main.bicep")
	sec := consoleSection(t)
	ps := params(t)
	for name, typ := range map[string]string{"deployConsole": "bool", "consoleClientId": "string", "consoleClientSecret": "string",
		"consoleAllowedGroups": "array", "consoleAllowedPrincipals": "array", "consoleTenantId": "string"} {
		if p, ok := ps[name]; !ok || p.typ != typ || !p.hasDef {
			t.Errorf("main.bicep needs `param %s %s = ...` (optional: the console is off by default), has %+v", name, typ, p)
		}
	}
	if ps["deployConsole"].def != "false" {
		t.Error("deployConsole must default to false")
	}
	if !regexp.MustCompile(`@secure\(\)\s*\nparam consoleClientSecret string`).MatchString(main) {
		t.Error("consoleClientSecret must be @secure()")
	}
	for _, sym := range []string{"consoleApp", "consoleAuth"} {
		m := resourceDecl(sym).FindStringSubmatch(main)
		if m == nil || m[1] != "deployApps && deployConsole" {
			t.Errorf("resource %s must be deployed `if (deployApps && deployConsole)` (pass 2, console on), has %v", sym, m)
		}
	}
	if m := resourceDecl("consoleIdentity").FindStringSubmatch(main); m == nil || m[1] != "" {
		t.Error("the console identity must be deployed in pass 1 (its database user is created before pass 2)")
	}
	for _, want := range []string{
		"resource consoleApp 'Microsoft.App/containerApps@2025-07-01'",
		"image: reconcilerImage", "'console'",
		"external: true", "targetPort: 8082", "allowInsecure: false",
		"{ name: 'SBCLAIM_CONSOLE_ADDR', value: ':8082' }", "{ name: 'SBCLAIM_HTTP_ADDR', value: ':8081' }",
		"{ name: 'SBCLAIM_CONSOLE_OIDC_ISSUER', value: consoleIssuer }", "{ name: 'SBCLAIM_CONSOLE_OIDC_AUDIENCE', value: consoleClientId }",
		"{ name: 'SBCLAIM_CONSOLE_ALLOWED_GROUPS', value: join(consoleAllowedGroups, ',') }",
		"{ name: 'SBCLAIM_CONSOLE_ALLOWED_PRINCIPALS', value: join(consoleAllowedPrincipals, ',') }",
		"path: '/healthz'", "type: 'Liveness'", "type: 'Readiness'",
		"maxReplicas: 1",
		"secrets: concat(routesSecrets, consoleAuthSecrets, consoleTokenStoreSecrets)", "routesVolume", "mountPath: '/etc/sbclaim'",
		"{ name: 'SBCLAIM_ROUTES', value: '/etc/sbclaim/routes.yaml' }", "routeSecretEnvVars",
		"value: configHash }",
		"databaseUrl(sqlHost, sqlDatabaseName, consoleIdentity.properties.clientId)",
	} {
		if !strings.Contains(sec, want) {
			t.Errorf("the console app lacks %q", want)
		}
	}
	if !regexp.MustCompile(`dependsOn: \[\s*acrPull\s*\]`).MatchString(sec) {
		t.Error("the console app does not depend on acrPull")
	}
	// Never local-development mode in Azure, never unverified headers:
	// the console verifies the token the platform's sign-in forwards.
	for _, never := range []string{"SBCLAIM_CONSOLE_LOCAL_OPERATOR", "SBCLAIM_CONSOLE_INSECURE_TRUST_IDENTITY_HEADERS"} {
		if slices.Contains(envNames(main), never) {
			t.Errorf("main.bicep sets %s: the deployed console must verify the operator's token", never)
		}
	}
	known := knownSettings(t, "reconciler")
	names := envNames(sec)
	for _, n := range names {
		if !known[n] {
			t.Errorf("main.bicep sets %s on the console, which the reconciler binary does not read", n)
		}
	}
	for _, must := range []string{"AZURE_CLIENT_ID", "SBCLAIM_DATABASE_URL", "SBCLAIM_ROUTES", "SBCLAIM_CONSOLE_ADDR"} {
		if !slices.Contains(names, must) {
			t.Errorf("the console gets no %s", must)
		}
	}
	// The console's address is known in pass 1 (from the environment), so
	// the app registration's redirect URI can be set before pass 2.
	outputs := main[strings.Index(main, "// ---- Outputs"):]
	for _, want := range []string{"output consoleUrl string", "output consoleRedirectUri string", "/.auth/login/aad/callback", "output consoleIdentityPrincipalId string"} {
		if !strings.Contains(outputs, want) {
			t.Errorf("outputs lack %q", want)
		}
	}
	if regexp.MustCompile(`\b(consoleApp|consoleAuth)\.`).MatchString(stripBicep(outputs)) {
		t.Error("an output reads the console app, which pass 1 does not deploy")
	}
	if !strings.Contains(main, "var consoleUrl = 'https://${consoleAppName}.${containerAppsEnv.properties.defaultDomain}'") {
		t.Error("consoleUrl is not the app's name on the environment's default domain")
	}
}

// Built-in authentication: Microsoft Entra ID, every unauthenticated
// request redirected to the login page, HTTPS only, the app registration
// and the allowed principals from the parameters, the client secret from a
// Container Apps secret.
func TestConsoleAuthentication(t *testing.T) {
	t.Parallel()
	sec := consoleSection(t)
	i := strings.Index(sec, "resource consoleAuth ")
	if i < 0 {
		t.Fatal("no consoleAuth resource")
	}
	auth := sec[i:]
	for _, want := range []string{
		"resource consoleAuth 'Microsoft.App/containerApps/authConfigs@2025-07-01'",
		"parent: consoleApp", "name: 'current'",
		"platform: {\n      enabled: true", "unauthenticatedClientAction: 'RedirectToLoginPage'", "redirectToProvider: 'azureactivedirectory'",
		"requireHttps: true",
		"azureActiveDirectory: {\n        enabled: true", "clientId: consoleClientId",
		"clientSecretSettingName: empty(consoleClientSecret) ? null : consoleAuthSecretName",
		"openIdIssuer: consoleIssuer",
		"tokenStore: {\n        enabled: !empty(consoleTokenStoreSasUrl)", "sasUrlSettingName: consoleTokenStoreSecretName",
		"groups: consoleAllowedGroups", "identities: consoleAllowedPrincipals",
	} {
		if !strings.Contains(auth, want) {
			t.Errorf("the console's authConfigs lacks %q", want)
		}
	}
	if strings.Contains(auth, "excludedPaths") || strings.Contains(auth, "AllowAnonymous") {
		t.Error("the console's sign-in lets some requests through unauthenticated")
	}
	main := read(t, "main.bicep")
	if !regexp.MustCompile(`(?s)var consoleAuthSecrets = empty\(consoleClientSecret\) \? \[\] : \[\s*\{\s*name: consoleAuthSecretName\s*value: consoleClientSecret`).MatchString(main) {
		t.Error("the client secret must reach the app only as the Container Apps secret consoleAuthSecretName")
	}
	if !regexp.MustCompile(`@secure\(\)\s*\nparam consoleTokenStoreSasUrl string = ''`).MatchString(main) {
		t.Error("consoleTokenStoreSasUrl must be an optional @secure() string")
	}
	if !regexp.MustCompile(`(?s)var consoleTokenStoreSecrets = empty\(consoleTokenStoreSasUrl\) \? \[\] : \[\s*\{\s*name: consoleTokenStoreSecretName\s*value: consoleTokenStoreSasUrl`).MatchString(main) {
		t.Error("the token store's SAS URL must reach the app only as the Container Apps secret consoleTokenStoreSecretName")
	}
	if n := strings.Count(stripBicep(main), "consoleClientSecret"); n != 4 { // the param, the secret, empty() twice
		t.Errorf("consoleClientSecret is used %d times outside strings and comments, want 4 (the param, the secret's value, and empty() in consoleAuthSecrets and the auth config)", n)
	}
}

// The console verifies the token the sign-in forwards against the issuer
// the sign-in uses, for the app registration's client id; the platform's
// probes (which bypass the sign-in) use the health port, never the
// console's, and the ingress never exposes the health port.
func TestConsoleVerifiesTheSignInsToken(t *testing.T) {
	t.Parallel()
	main := read(t, "main.bicep")
	sec := consoleSection(t)
	if !strings.Contains(main, "var consoleIssuer = '${environment().authentication.loginEndpoint}${consoleTenantId}/v2.0'") {
		t.Error("consoleIssuer is not the tenant's v2.0 issuer (the one Entra ID's ID tokens name)")
	}
	if strings.Count(stripBicep(sec), "consoleIssuer") != 2 {
		t.Error("the sign-in's openIdIssuer and the console's SBCLAIM_CONSOLE_OIDC_ISSUER must both be consoleIssuer")
	}
	probes := sec[strings.Index(sec, "probes: ["):]
	probes = probes[:strings.Index(probes, "\n          ]")]
	ports := regexp.MustCompile(`port: (\d+)`).FindAllStringSubmatch(probes, -1)
	if len(ports) != 2 {
		t.Fatalf("want a liveness and a readiness probe, found ports %v", ports)
	}
	for _, p := range ports {
		if p[1] != "8081" {
			t.Errorf("a probe uses port %s: the probes use the health port 8081 (SBCLAIM_HTTP_ADDR), the console's 8082 answers 401", p[1])
		}
	}
	if !strings.Contains(sec, "targetPort: 8082") || strings.Contains(sec, "targetPort: 8081") || strings.Contains(sec, "additionalPortMappings") {
		t.Error("the ingress must expose the console's port 8082 only")
	}
}

// The console's identity reaches its code alone, and gets only the
// reconciler's database role, in sqlStatements when the console is on.
func TestConsoleIdentity(t *testing.T) {
	t.Parallel()
	main := read(t, "main.bicep")
	sec := consoleSection(t)
	app := sec[:strings.Index(sec, "resource consoleAuth ")]
	var on []string
	for _, a := range regexp.MustCompile(`'\$\{(\w+)\.id\}': \{\}`).FindAllStringSubmatch(app, -1) {
		on = append(on, a[1])
	}
	if !slices.Equal(on, []string{"consoleIdentity"}) || !strings.Contains(app, "}, pullIdentities)") || !strings.Contains(app, "], pullIdentitySettings)") {
		t.Errorf("the console's identities are %v (+ the pull identity set to None), want consoleIdentity alone", on)
	}
	if l := lifecycles(t, app); l["consoleIdentity"] != "Main" || len(l) != 1 {
		t.Errorf("the console's identitySettings %v, want consoleIdentity Main (and the pull identity's None)", l)
	}
	if !strings.Contains(app, "{ name: 'AZURE_CLIENT_ID', value: consoleIdentity.properties.clientId }") {
		t.Error("the console's AZURE_CLIENT_ID is not its identity's client id")
	}
	if !regexp.MustCompile(`name: 'id-\$\{namePrefix\}-console'`).MatchString(main) {
		t.Error("the console identity is not id-<prefix>-console")
	}
	out := main[strings.Index(main, "output sqlStatements"):]
	if !strings.Contains(out, "deployConsole ? [\n  usersSql(consoleIdentity.name, consoleIdentity.properties.principalId, 'sbclaim_reconciler')\n] : []") {
		t.Errorf("sqlStatements must add the console's user with the sbclaim_reconciler role when deployConsole is true:\n%s", out)
	}
	if strings.Count(main, "consoleIdentity.properties.principalId, 'sbclaim_") != 1 {
		t.Error("the console identity must get exactly one database role")
	}
	// No Azure role assignment names the console identity.
	for _, g := range grants(t) {
		if g.identity == "id-sbclaim-console" {
			t.Errorf("the console identity has an Azure role: %v", g)
		}
	}
}

// The README's operator console section: the committed screenshot, how to
// open it locally, how to deploy it (parameters and outputs that exist),
// and the audit it records.
func TestReadmeConsoleSection(t *testing.T) {
	t.Parallel()
	section := docSection(t, "docs/console.md", "# Operator console")
	m := regexp.MustCompile(`!\[[^\]]*\]\(([\w.-]+\.png)\)`).FindStringSubmatch(section)
	if m == nil {
		t.Fatal("the console guide shows no screenshot beside it in docs/")
	}
	png, err := os.ReadFile(filepath.Join("..", "docs", m[1]))
	if err != nil || !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
		t.Errorf("the screenshot %s is not a committed PNG: %v", m[1], err)
	}
	for _, want := range []string{"SBCLAIM_CONSOLE_LOCAL_OPERATOR", "localhost:8082", "reconciler console", "deployConsole=true",
		"consoleClientId", "consoleRedirectUri", "X-MS-CLIENT-PRINCIPAL-NAME", "SBCLAIM_TEST_SCREENSHOTS", "401",
		"X-MS-TOKEN-AAD-ID-TOKEN", "SBCLAIM_CONSOLE_OIDC_ISSUER", "SBCLAIM_CONSOLE_OIDC_AUDIENCE", "SBCLAIM_CONSOLE_INSECURE_TRUST_IDENTITY_HEADERS",
		"consoleTokenStoreSasUrl", "SBCLAIM_HTTP_ADDR", "127.0.0.1"} {
		if !strings.Contains(section, want) {
			t.Errorf("the console section does not mention %s", want)
		}
	}
	ps := params(t)
	outputs := map[string]bool{}
	for _, o := range outputDecl.FindAllStringSubmatch(read(t, "main.bicep"), -1) {
		outputs[o[1]] = true
	}
	for _, c := range shellBlocks(section) {
		for _, p := range paramFlag.FindAllStringSubmatch(c, -1) {
			if _, ok := ps[p[1]]; !ok {
				t.Errorf("README console step %q sets parameter %s, which main.bicep does not declare", c, p[1])
			}
		}
		for _, o := range outputRef.FindAllStringSubmatch(c, -1) {
			if !outputs[o[1]] {
				t.Errorf("README console step %q reads output %s, which main.bicep does not declare", c, o[1])
			}
		}
	}
	compose := read(t, "../docker-compose.yml")
	if !strings.Contains(compose, `"127.0.0.1:8082:8082"`) {
		t.Error("docker-compose.yml does not publish the console on 127.0.0.1:8082")
	}
	// Local development mode in compose: published on the loopback only,
	// the health port apart, never unverified headers.
	svc := compose[strings.Index(compose, "\n  console:"):]
	svc = svc[:strings.Index(svc[1:], "\n  demoapi:")+1]
	for _, want := range []string{"SBCLAIM_CONSOLE_LOCAL_OPERATOR: developer", `SBCLAIM_HTTP_ADDR: ":8081"`} {
		if !strings.Contains(svc, want) {
			t.Errorf("the compose console lacks %s", want)
		}
	}
	for _, m := range regexp.MustCompile(`- "([^"]+)"`).FindAllStringSubmatch(svc, -1) {
		if strings.Count(m[1], ":") == 2 && !strings.HasPrefix(m[1], "127.0.0.1:") {
			t.Errorf("the compose console publishes %s beyond the loopback", m[1])
		}
	}
	if strings.Contains(compose, "SBCLAIM_CONSOLE_INSECURE_TRUST_IDENTITY_HEADERS") {
		t.Error("docker-compose.yml trusts identity headers")
	}
}
