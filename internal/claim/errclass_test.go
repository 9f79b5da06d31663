package claim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
)

func TestClassContract(t *testing.T) {
	want := map[Class]struct {
		sentinel             error
		storeWide, transient bool
	}{
		ClassConnection:  {ErrUnavailable, true, true},
		ClassBusy:        {ErrUnavailable, true, true},
		ClassFailover:    {ErrUnavailable, true, true},
		ClassTimeout:     {ErrUnavailable, true, true},
		ClassDeadlock:    {ErrAborted, false, true},
		ClassLockTimeout: {ErrAborted, false, true},
		ClassReadOnly:    {ErrRefused, true, false},
		ClassNoSpace:     {ErrRefused, true, false},
		ClassPermission:  {ErrRefused, true, false},
	}
	if len(Classes) != len(want) {
		t.Fatalf("Classes has %d entries, want %d", len(Classes), len(want))
	}
	for _, c := range Classes {
		w := want[c]
		if c.Sentinel() != w.sentinel || c.StoreWide() != w.storeWide || c.Transient() != w.transient {
			t.Errorf("%s: sentinel %v, store-wide %v, transient %v; want %v, %v, %v",
				c, c.Sentinel(), c.StoreWide(), c.Transient(), w.sentinel, w.storeWide, w.transient)
		}
		err := NewError(c, io.EOF)
		if !errors.Is(err, w.sentinel) || !errors.Is(err, io.EOF) || ClassOf(err) != c ||
			StoreWide(err) != w.storeWide || Transient(err) != w.transient {
			t.Errorf("%s: NewError(%v) = %v: Is sentinel %v, Is EOF %v, ClassOf %s, StoreWide %v, Transient %v",
				c, io.EOF, err, errors.Is(err, w.sentinel), errors.Is(err, io.EOF), ClassOf(err), StoreWide(err), Transient(err))
		}
		for _, other := range []error{ErrUnavailable, ErrAborted, ErrRefused, ErrDuplicate, ErrStateChanged} {
			if other != w.sentinel && errors.Is(err, other) {
				t.Errorf("%s wraps %v too", c, other)
			}
		}
		// Wrapped with context, the class survives.
		if got := ClassOf(fmt.Errorf("mark processed claim 7: %w", err)); got != c {
			t.Errorf("ClassOf(wrapped %s) = %s", c, got)
		}
		var txt Class
		b, err := c.MarshalText()
		if err != nil || txt.UnmarshalText(b) != nil || txt != c {
			t.Errorf("%s: text round trip: %q %v -> %s", c, b, err, txt)
		}
	}
	if ClassNone.Sentinel() != nil || ClassNone.StoreWide() || ClassNone.Transient() || ClassNone.String() != "none" {
		t.Errorf("ClassNone: %v %v %v %q", ClassNone.Sentinel(), ClassNone.StoreWide(), ClassNone.Transient(), ClassNone)
	}
	if s := Class(200).String(); s != "class(200)" {
		t.Errorf("unknown class prints %q", s)
	}
	if _, err := Class(200).MarshalText(); err == nil {
		t.Error("MarshalText of an unknown class succeeded")
	}
	var c Class
	if err := c.UnmarshalText([]byte("bogus")); err == nil {
		t.Error("UnmarshalText(bogus) succeeded")
	}
	b, err := json.Marshal(map[string]Class{"class": ClassNoSpace})
	if err != nil || string(b) != `{"class":"no_space"}` {
		t.Errorf("JSON: %s %v", b, err)
	}
}

func TestNewErrorAndClassOf(t *testing.T) {
	if NewError(ClassBusy, nil) != nil {
		t.Error("NewError(nil) != nil")
	}
	if err := NewError(ClassNone, io.EOF); err != io.EOF {
		t.Errorf("NewError(ClassNone) wrapped: %v", err)
	}
	once := NewError(ClassDeadlock, io.EOF)
	if twice := NewError(ClassConnection, fmt.Errorf("x: %w", once)); ClassOf(twice) != ClassDeadlock {
		t.Errorf("classifying twice changed the class: %v", twice)
	}
	if msg := once.Error(); msg != "claim store call aborted, nothing written (deadlock): EOF" {
		t.Errorf("message %q", msg)
	}
	for err, want := range map[error]Class{
		nil:                             ClassNone,
		io.EOF:                          ClassNone,
		ErrStateChanged:                 ClassNone,
		ErrDuplicate:                    ClassNone,
		ErrUnavailable:                  ClassConnection,
		fmt.Errorf("x: %w", ErrAborted): ClassDeadlock,
		ErrRefused:                      ClassReadOnly,
	} {
		if got := ClassOf(err); got != want {
			t.Errorf("ClassOf(%v) = %s, want %s", err, got, want)
		}
	}
	if StoreWide(ErrAborted) || !StoreWide(ErrRefused) || !StoreWide(ErrUnavailable) || StoreWide(io.EOF) {
		t.Error("StoreWide on bare sentinels")
	}
	if !Transient(ErrAborted) || Transient(ErrRefused) || !Transient(ErrUnavailable) || Transient(ErrStateChanged) {
		t.Error("Transient on bare sentinels")
	}
}

// TestDocTableListsEveryClass keeps the table in the package doc in step
// with the code: one row per class, naming its sentinel, scope and
// whether it is transient.
func TestDocTableListsEveryClass(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{}
	for _, line := range strings.Split(string(src), "\n") {
		line = strings.TrimSpace(strings.TrimPrefix(line, "//"))
		if !strings.HasPrefix(line, "|") {
			continue
		}
		var cells []string
		for _, c := range strings.Split(strings.Trim(line, "|"), "|") {
			cells = append(cells, strings.TrimSpace(c))
		}
		rows[cells[0]] = cells
	}
	names := map[error]string{ErrUnavailable: "ErrUnavailable", ErrAborted: "ErrAborted", ErrRefused: "ErrRefused"}
	for _, c := range Classes {
		r, ok := rows[c.String()]
		if !ok {
			t.Errorf("doc.go's table has no row for %s", c)
			continue
		}
		scope := map[bool]string{true: "store", false: "call"}[c.StoreWide()]
		transient := map[bool]string{true: "yes", false: "no"}[c.Transient()]
		if len(r) < 4 || r[1] != names[c.Sentinel()] || r[2] != scope || r[3] != transient {
			t.Errorf("doc.go's row for %s is %q; want sentinel %s, scope %s, transient %s", c, r, names[c.Sentinel()], scope, transient)
		}
	}
}
