package deploy

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// Built-in role definitions (the same in every tenant) by name.
var roleNames = map[string]string{
	"4f6d3b9b-027b-4f4c-9142-0e5a2a2247e0": "Azure Service Bus Data Receiver",
	"69a216fc-b8fb-44d8-bc22-1f3c2cd27a39": "Azure Service Bus Data Sender",
	"090c5cfd-751d-490a-894a-3ce6f1109419": "Azure Service Bus Data Owner",
	"7f951dda-4ed3-4680-a7ca-43fe172d538d": "AcrPull",
}

// blockEnd returns the index just past the brace block that opens at
// src[open] ('{' or '['), skipping strings and comments.
func blockEnd(t *testing.T, src string, open int) int {
	t.Helper()
	depth := 0
	for i := open; i < len(src); i++ {
		switch c := src[i]; {
		case c == '\'':
			for i++; i < len(src) && src[i] != '\''; i++ {
				if src[i] == '\\' {
					i++
				}
			}
		case c == '/' && i+1 < len(src) && src[i+1] == '/':
			for i < len(src) && src[i] != '\n' {
				i++
			}
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			depth--
			if depth == 0 {
				return i + 1
			}
		}
	}
	t.Fatalf("unclosed block at offset %d", open)
	return 0
}

// grant is one role assignment: which identity, which role, on what.
type grant struct{ identity, role, scope string }

func (g grant) String() string { return fmt.Sprintf("%s: %s on the %s", g.identity, g.role, g.scope) }

var (
	identityDecl = regexp.MustCompile(`(?m)^resource (\w+) 'Microsoft\.ManagedIdentity/userAssignedIdentities@[^']+' = \{\s*name: 'id-\$\{namePrefix\}-([a-z]+)'`)
	moduleDecl   = regexp.MustCompile(`(?m)^module (\w+) '(modules/[^']+)' = [^{]*\{`)
	roleDecl     = regexp.MustCompile(`(?m)^resource (\w+) 'Microsoft\.Authorization/roleAssignments@[^']+' = (?:\[for (?:\w+|\(\w+, \w+\)) in (\w+): |if \([^{]*\) )?\{`)
	scopeKinds   = map[string]string{
		"Microsoft.ServiceBus/namespaces":                      "namespace",
		"Microsoft.ServiceBus/namespaces/queues":               "queue",
		"Microsoft.ServiceBus/namespaces/topics":               "topic",
		"Microsoft.ServiceBus/namespaces/topics/subscriptions": "subscription",
		"Microsoft.ContainerRegistry/registries":               "registry",
	}
)

// identities maps identity symbols of main.bicep to their names with the
// default prefix (id-sbclaim-processor, ...).
func identities(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, m := range identityDecl.FindAllStringSubmatch(read(t, "main.bicep"), -1) {
		out[m[1]] = "id-sbclaim-" + m[2]
	}
	if len(out) < 3 {
		t.Fatalf("found only %d identities in main.bicep", len(out))
	}
	return out
}

// grants reads every role assignment of the modules and follows the
// principal ids back to main.bicep's identities.
func grants(t *testing.T) []grant {
	t.Helper()
	main := read(t, "main.bicep")
	ids := identities(t)
	var out []grant
	for _, m := range moduleDecl.FindAllStringSubmatchIndex(main, -1) {
		file := main[m[4]:m[5]]
		call := main[m[0]:blockEnd(t, main, m[1]-1)]
		// param name -> identities passed as its principal id(s)
		passed := map[string][]string{}
		for _, p := range regexp.MustCompile(`(?m)^\s+(\w+): (\w+)\.properties\.principalId\s*$`).FindAllStringSubmatch(call, -1) {
			passed[p[1]] = append(passed[p[1]], ids[p[2]])
		}
		for _, arr := range regexp.MustCompile(`(?s)(\w+): \[([^\]]*)\]`).FindAllStringSubmatch(call, -1) {
			for _, p := range regexp.MustCompile(`(\w+)\.properties\.principalId`).FindAllStringSubmatch(arr[2], -1) {
				passed[arr[1]] = append(passed[arr[1]], ids[p[1]])
			}
		}
		mod := read(t, file)
		roleVars := map[string]string{}
		for _, v := range regexp.MustCompile(`(?m)^var (\w+) = '([0-9a-f-]{36})'`).FindAllStringSubmatch(mod, -1) {
			roleVars[v[1]] = v[2]
		}
		scopes := map[string]string{}
		for _, r := range regexp.MustCompile(`(?m)^resource (\w+) '([A-Za-z./]+)@[^']+' existing`).FindAllStringSubmatch(mod, -1) {
			scopes[r[1]] = scopeKinds[r[2]]
		}
		for _, loc := range roleDecl.FindAllStringSubmatchIndex(mod, -1) {
			body := mod[loc[0]:blockEnd(t, mod, loc[1]-1)]
			symbol := mod[loc[2]:loc[3]]
			scope := regexp.MustCompile(`scope: (\w+)`).FindStringSubmatch(body)
			principal := regexp.MustCompile(`principalId: (\w+)`).FindStringSubmatch(body)
			role := regexp.MustCompile(`roleDefinitions', (\w+)\)`).FindStringSubmatch(body)
			if scope == nil || principal == nil || role == nil {
				t.Fatalf("%s: role assignment %s: cannot read its scope, principal or role", file, symbol)
			}
			param := principal[1]
			if loc[4] >= 0 && param == "principalId" { // [for principalId in <param>: ...]
				param = mod[loc[4]:loc[5]]
			}
			who := passed[param]
			if len(who) == 0 {
				t.Fatalf("%s: role assignment %s: main.bicep passes no identity as %s", file, symbol, param)
			}
			name := roleNames[roleVars[role[1]]]
			if name == "" {
				t.Fatalf("%s: role assignment %s: unknown role %s", file, symbol, role[1])
			}
			kind := scopes[scope[1]]
			if kind == "" {
				t.Fatalf("%s: role assignment %s: scope %s is not a known resource", file, symbol, scope[1])
			}
			for _, w := range who {
				out = append(out, grant{identity: w, role: name, scope: kind})
			}
		}
	}
	return out
}

func TestRoleAssignmentScopes(t *testing.T) {
	t.Parallel()
	want := []grant{
		{"id-sbclaim-processor", "Azure Service Bus Data Receiver", "queue"},
		{"id-sbclaim-processor", "Azure Service Bus Data Receiver", "subscription"},
		{"id-sbclaim-processor", "Azure Service Bus Data Sender", "queue"},
		{"id-sbclaim-processor", "Azure Service Bus Data Sender", "topic"},
		{"id-sbclaim-scaler", "Azure Service Bus Data Owner", "queue"},
		{"id-sbclaim-scaler", "Azure Service Bus Data Owner", "topic"},
		{"id-sbclaim-pull", "AcrPull", "registry"},
	}
	got := grants(t)
	for _, g := range got {
		if g.scope == "namespace" {
			t.Errorf("%v: scope it to the entity", g)
		}
	}
	key := func(gs []grant) []string {
		var out []string
		for _, g := range gs {
			out = append(out, g.String())
		}
		slices.Sort(out)
		return out
	}
	if !slices.Equal(key(got), key(want)) {
		t.Errorf("role assignments:\n  %s\nwant:\n  %s", strings.Join(key(got), "\n  "), strings.Join(key(want), "\n  "))
	}
}

// lifecycles reads identitySettings entries: identity symbol -> lifecycle.
var lifecycleEntry = regexp.MustCompile(`\{ identity: (\w+)\.id, lifecycle: '(\w+)' \}`)

func lifecycles(t *testing.T, src string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, m := range lifecycleEntry.FindAllStringSubmatch(src, -1) {
		out[m[1]] = m[2]
	}
	return out
}

// Only an app's own identity reaches its code: every other identity on
// the app has identitySettings lifecycle 'None'.
func TestIdentitySettings(t *testing.T) {
	t.Parallel()
	main := read(t, "main.bicep")
	pull := lifecycles(t, regexp.MustCompile(`(?s)var pullIdentitySettings = .*?\n\]`).FindString(main))
	if pull["pullIdentity"] != "None" {
		t.Errorf("the pull identity's lifecycle is %q, want None", pull["pullIdentity"])
	}
	proc, rec := sections(t)
	for _, app := range []struct {
		name, section, own string
		others             []string
	}{
		{"processor", proc, "processorIdentity", []string{"scalerIdentity"}},
		{"reconciler job", rec, "reconcilerIdentity", nil},
	} {
		assigned := regexp.MustCompile(`'\$\{(\w+)\.id\}': \{\}`).FindAllStringSubmatch(app.section, -1)
		var on []string
		for _, a := range assigned {
			on = append(on, a[1])
		}
		if !strings.Contains(app.section, "}, pullIdentities)") || !strings.Contains(app.section, "], pullIdentitySettings)") {
			t.Errorf("%s: the pull identity must be assigned (pullIdentities) and set to None (pullIdentitySettings) together", app.name)
		}
		settings := lifecycles(t, app.section)
		maps.Copy(settings, pull)
		if got := slices.Sorted(slices.Values(on)); !slices.Equal(got, slices.Sorted(slices.Values(append([]string{app.own}, app.others...)))) {
			t.Errorf("%s: identities %v, want %s and %v", app.name, got, app.own, app.others)
		}
		for _, id := range append(on, "pullIdentity") {
			l, ok := settings[id]
			switch {
			case !ok:
				t.Errorf("%s: identity %s has no identitySettings entry: its tokens would reach the code (default All)", app.name, id)
			case id == app.own && l != "Main":
				t.Errorf("%s: its own identity %s has lifecycle %q, want Main", app.name, id, l)
			case id != app.own && l != "None":
				t.Errorf("%s: identity %s has lifecycle %q: only %s may reach the code", app.name, id, l, app.own)
			}
		}
		if !strings.Contains(app.section, "{ name: 'AZURE_CLIENT_ID', value: "+app.own+".properties.clientId }") {
			t.Errorf("%s: AZURE_CLIENT_ID is not %s's client id", app.name, app.own)
		}
	}
	if !strings.Contains(proc, "identity: scalerIdentity.id") {
		t.Error("the scale rule does not authenticate with the scaler identity")
	}
}
