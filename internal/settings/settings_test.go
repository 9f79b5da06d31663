package settings_test

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"
	"time"

	"github.com/sbclaim/sbclaim/internal/settings"
)

type cfg struct {
	URL     string
	Every   time.Duration
	N       int
	On      bool
	Format  string
	Comment string
}

func bind(c *cfg, getenv func(string) string, args []string, out *bytes.Buffer) (*settings.Values, error) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(out)
	v := settings.Bind(fs, getenv, []settings.Setting{
		{Env: "SBCLAIM_URL", Flag: "url", Secret: true, Usage: "the database", Parse: func(s string) error {
			if s == "" {
				return errors.New("required")
			}
			c.URL = s
			return nil
		}},
		settings.Duration("SBCLAIM_EVERY", "every", "30s", "how often", time.Second, &c.Every),
		settings.Int("SBCLAIM_N", "n", "4", "how many", 1, 10, &c.N),
		settings.Bool("SBCLAIM_ON", "on", "true", "on or off", &c.On),
		settings.OneOf("SBCLAIM_FORMAT", "format", "json", "output", &c.Format, "json", "text"),
		settings.String("SBCLAIM_COMMENT", "comment", "", "free text", &c.Comment),
	})
	if err := fs.Parse(args); err != nil {
		return v, err
	}
	return v, v.Load()
}

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestDefaultsEnvironmentAndFlags(t *testing.T) {
	var c cfg
	var out bytes.Buffer
	_, err := bind(&c, env(map[string]string{"SBCLAIM_URL": "postgres://u:pw-secret@h/db", "SBCLAIM_N": "7", "SBCLAIM_FORMAT": "xml"}),
		[]string{"-format", "text", "-comment", "  hi  "}, &out)
	if err != nil {
		t.Fatal(err)
	}
	// Defaults, the variable, the flag over the variable; values trimmed.
	if c.Every != 30*time.Second || c.N != 7 || !c.On || c.Format != "text" || c.Comment != "hi" || c.URL != "postgres://u:pw-secret@h/db" {
		t.Errorf("config %+v", c)
	}
}

// Every bad value is reported at once, each naming its variable and value;
// a secret's value is shown redacted.
func TestEveryErrorNamesTheVariable(t *testing.T) {
	var c cfg
	var out bytes.Buffer
	_, err := bind(&c, env(map[string]string{"SBCLAIM_URL": "postgres://u:pw-secret@h/db", "SBCLAIM_EVERY": "soon", "SBCLAIM_N": "11",
		"SBCLAIM_ON": "maybe", "SBCLAIM_FORMAT": "xml"}), nil, &out)
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{`SBCLAIM_EVERY="soon": not a duration`, `SBCLAIM_N="11": must be between 1 and 10`,
		`SBCLAIM_ON="maybe": want true or false`, `SBCLAIM_FORMAT="xml": want json or text`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	var se *settings.Error
	if !errors.As(err, &se) || !strings.HasPrefix(se.Field, "SBCLAIM_") {
		t.Errorf("not a *settings.Error: %v", err)
	}

	_, err = bind(&c, env(map[string]string{"SBCLAIM_EVERY": "100ms"}), nil, &out)
	if err == nil || !strings.Contains(err.Error(), "SBCLAIM_URL: required") || !strings.Contains(err.Error(), "must be at least 1s") {
		t.Errorf("missing and too short: %v", err)
	}
}

func TestHelpListsEveryVariableAndHidesSecrets(t *testing.T) {
	var c cfg
	var out bytes.Buffer
	_, err := bind(&c, env(map[string]string{"SBCLAIM_URL": "postgres://u:pw-secret@h/db"}), []string{"-h"}, &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err %v", err)
	}
	help := out.String()
	for _, want := range []string{"[$SBCLAIM_URL]", "[$SBCLAIM_EVERY]", "[$SBCLAIM_N]", "[$SBCLAIM_ON]", "[$SBCLAIM_FORMAT]", "[$SBCLAIM_COMMENT]",
		`(default "30s")`, "postgres://u:xxxxx@h/db"} {
		if !strings.Contains(help, want) {
			t.Errorf("-h lacks %q:\n%s", want, help)
		}
	}
	if strings.Contains(help, "pw-secret") {
		t.Errorf("-h shows the secret:\n%s", help)
	}
}

func TestSecretErrorIsRedacted(t *testing.T) {
	var out bytes.Buffer
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(&out)
	v := settings.Bind(fs, env(map[string]string{"SBCLAIM_URL": "mysql://root:pw-secret@h/db"}), []settings.Setting{
		{Env: "SBCLAIM_URL", Flag: "url", Secret: true, Parse: func(string) error { return errors.New("unsupported") }},
	})
	err := v.Load()
	if err == nil || strings.Contains(err.Error(), "pw-secret") || !strings.Contains(err.Error(), "xxxxx") {
		t.Errorf("error %v: want the value shown redacted", err)
	}
	if e := v.Errorf("SBCLAIM_URL", "breaks %s", "a rule"); strings.Contains(e.Error(), "pw-secret") || !strings.Contains(e.Error(), "breaks a rule") {
		t.Errorf("Errorf %v", e)
	}
}

// Binding only some settings leaves the others at their defaults.
func TestBindOnly(t *testing.T) {
	var every time.Duration
	var n int
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	v := settings.Bind(fs, env(map[string]string{"SBCLAIM_N": "9"}), []settings.Setting{
		settings.Duration("SBCLAIM_EVERY", "every", "30s", "", time.Second, &every),
		settings.Int("SBCLAIM_N", "n", "4", "", 1, 10, &n),
	}, "SBCLAIM_EVERY")
	if fs.Lookup("n") != nil {
		t.Error("a setting outside only was bound")
	}
	if err := v.Load(); err != nil || every != 30*time.Second || n != 4 {
		t.Errorf("every %s n %d err %v; want 30s, the built-in 4", every, n, err)
	}
}
