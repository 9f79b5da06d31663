package routesyaml

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

type problem struct{ route, field, text string }

func (p *problem) Error() string { return fmt.Sprintf("%s/%s: %s", p.route, p.field, p.text) }

func newProblem(route, field, text string) error { return &problem{route, field, text} }

// Decode hands every schema problem to newProblem, by route and field,
// and joins them; a file that passes is decoded into its form.
func TestDecode(t *testing.T) {
	var into struct {
		Version int `yaml:"version"`
		Routes  []struct {
			Name string `yaml:"name"`
		} `yaml:"routes"`
	}
	err := Decode([]byte("version: 1\nroutes:\n  - name: charge\n    match: {subject: s}\n    url: https://example.com/x\n    timeout: soon\n    colour: blue\n"), &into, newProblem)
	var got []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var p *problem
		if !errors.As(e, &p) {
			t.Fatalf("problem %v (%T) was not made by newProblem", e, e)
		}
		got = append(got, p.route+"/"+p.field)
	}
	if strings.Join(got, " ") != "charge/colour charge/timeout" && strings.Join(got, " ") != "charge/timeout charge/colour" {
		t.Errorf("problems at %q, want charge/timeout and charge/colour", got)
	}
	if into.Version != 0 {
		t.Error("a file with problems was decoded")
	}

	var p *problem
	if err := Decode([]byte(": not yaml"), &into, newProblem); !errors.As(err, &p) || p.route != "" || !strings.HasPrefix(p.text, "not valid YAML") {
		t.Errorf("Decode of a file that is not YAML: %v, want one problem of the file", err)
	}

	if err := Decode([]byte("version: 1\nroutes:\n  - name: charge\n    match: {subject: s}\n    url: https://example.com/x\n"), &into, newProblem); err != nil {
		t.Fatal(err)
	}
	if into.Version != 1 || len(into.Routes) != 1 || into.Routes[0].Name != "charge" {
		t.Errorf("decoded %+v", into)
	}
}
