// Package settings reads a binary's configuration from SBCLAIM_
// environment variables and the flags that override them — the one
// settings engine of both binaries. Each setting parses and checks its
// own value; -h lists every variable with the value it will take (secrets
// redacted); every bad value is reported at once, as an *Error naming the
// variable and showing the value (redacted when secret) and what is
// wrong.
package settings

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sbclaim/sbclaim/internal/redact"
)

// A Setting is one environment variable and its flag.
type Setting struct {
	Env     string // SBCLAIM_...
	Flag    string
	Default string // the built-in default ("" for none)
	Usage   string
	Secret  bool // never shown: -h and errors show it redacted
	// Parse checks the (trimmed) value and stores it; "" when the
	// variable is unset and has no default.
	Parse func(v string) error
}

// Error is a bad setting: the environment variable (which also names its
// flag), the value as it may be shown, and what is wrong.
type Error struct {
	Field string // the environment variable, e.g. SBCLAIM_RETENTION
	Value string // redacted when the setting is secret
	Err   error
}

func (e *Error) Error() string {
	if e.Value == "" {
		return fmt.Sprintf("%s: %v", e.Field, e.Err)
	}
	return fmt.Sprintf("%s=%q: %v", e.Field, e.Value, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Values are settings bound to a FlagSet (Bind); Load parses them.
type Values struct {
	settings []Setting
	values   map[string]*string // by Env, for the bound settings
}

// Bind adds the settings named in only (all when only is empty) to fs as
// flags. A flag's default is its variable's value when set, else the
// built-in default, so -h shows what will be used; a secret's is shown
// redacted. Settings not bound keep their built-in defaults.
func Bind(fs *flag.FlagSet, getenv func(string) string, all []Setting, only ...string) *Values {
	v := &Values{settings: all, values: make(map[string]*string, len(all))}
	for _, s := range all {
		if len(only) > 0 && !slices.Contains(only, s.Env) {
			continue
		}
		def := s.Default
		if e := getenv(s.Env); e != "" {
			def = e
		}
		usage := s.Usage + " [$" + s.Env + "]"
		if s.Secret {
			// flag prints a string flag's default in -h: never a secret.
			if def != "" {
				usage += " (set: " + redact.Value(def) + ")"
			} else {
				usage += " (secret: never logged)"
			}
			p := fs.String(s.Flag, "", usage)
			*p = def
			v.values[s.Env] = p
			continue
		}
		v.values[s.Env] = fs.String(s.Flag, def, usage)
	}
	return v
}

// Value returns the setting's value as it will be parsed (trimmed).
func (v *Values) Value(env string) string {
	if p, ok := v.values[env]; ok {
		return strings.TrimSpace(*p)
	}
	for _, s := range v.settings {
		if s.Env == env {
			return s.Default
		}
	}
	return ""
}

// Load parses every setting (call it after fs.Parse), reporting every bad
// value as an *Error, joined.
func (v *Values) Load() error {
	var errs []error
	for _, s := range v.settings {
		if err := s.Parse(v.Value(s.Env)); err != nil {
			errs = append(errs, v.errorFor(s, err))
		}
	}
	return errors.Join(errs...)
}

// Errorf returns an *Error about the setting env (a rule between settings
// that its value breaks), with its value.
func (v *Values) Errorf(env, format string, args ...any) error {
	for _, s := range v.settings {
		if s.Env == env {
			return v.errorFor(s, fmt.Errorf(format, args...))
		}
	}
	return &Error{Field: env, Err: fmt.Errorf(format, args...)}
}

func (v *Values) errorFor(s Setting, err error) *Error {
	shown := v.Value(s.Env)
	if s.Secret {
		shown = redact.Value(shown)
	}
	return &Error{Field: s.Env, Value: shown, Err: err}
}

// String is a setting stored as it is.
func String(env, flagName, def, usage string, dst *string) Setting {
	return Setting{Env: env, Flag: flagName, Default: def, Usage: usage, Parse: func(v string) error { *dst = v; return nil }}
}

// Duration is a Go duration (90s, 5m, 168h) of at least min.
func Duration(env, flagName, def, usage string, min time.Duration, dst *time.Duration) Setting {
	return Setting{Env: env, Flag: flagName, Default: def, Usage: usage, Parse: func(v string) error {
		d, err := time.ParseDuration(v)
		if err != nil {
			return errors.New("not a duration (examples: 30s, 5m, 168h)")
		}
		if d < min {
			if min == time.Nanosecond {
				return errors.New("must be positive")
			}
			return fmt.Errorf("must be at least %s", min)
		}
		*dst = d
		return nil
	}}
}

// Int is an integer in [min, max].
func Int(env, flagName, def, usage string, min, max int, dst *int) Setting {
	return Setting{Env: env, Flag: flagName, Default: def, Usage: usage, Parse: func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil {
			return errors.New("not an integer")
		}
		switch {
		case n < min && max == math.MaxInt:
			return fmt.Errorf("must be at least %d", min)
		case n < min || n > max:
			return fmt.Errorf("must be between %d and %d", min, max)
		}
		*dst = n
		return nil
	}}
}

// Bool is true or false.
func Bool(env, flagName, def, usage string, dst *bool) Setting {
	return Setting{Env: env, Flag: flagName, Default: def, Usage: usage, Parse: func(v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return errors.New("want true or false")
		}
		*dst = b
		return nil
	}}
}

// OneOf is one of the given words.
func OneOf(env, flagName, def, usage string, dst *string, words ...string) Setting {
	return Setting{Env: env, Flag: flagName, Default: def, Usage: usage, Parse: func(v string) error {
		if !slices.Contains(words, v) {
			return fmt.Errorf("want %s", orList(words))
		}
		*dst = v
		return nil
	}}
}

func orList(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " or " + words[len(words)-1]
}
