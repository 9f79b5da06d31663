package claim

import (
	"errors"
	"fmt"
)

// Class is a kind of store failure (see the table in the package doc).
type Class uint8

// The failure classes. ClassNone is "not a classified store failure".
const (
	ClassNone Class = iota
	ClassConnection
	ClassBusy
	ClassFailover
	ClassTimeout
	ClassDeadlock
	ClassLockTimeout
	ClassReadOnly
	ClassNoSpace
	ClassPermission
)

// Classes lists every class but ClassNone, in table order (for metrics
// that want every label up front).
var Classes = []Class{ClassConnection, ClassBusy, ClassFailover, ClassTimeout,
	ClassDeadlock, ClassLockTimeout, ClassReadOnly, ClassNoSpace, ClassPermission}

var classInfo = [...]struct {
	name      string
	sentinel  error
	storeWide bool
	transient bool
}{
	ClassNone:        {"none", nil, false, false},
	ClassConnection:  {"connection", ErrUnavailable, true, true},
	ClassBusy:        {"busy", ErrUnavailable, true, true},
	ClassFailover:    {"failover", ErrUnavailable, true, true},
	ClassTimeout:     {"timeout", ErrUnavailable, true, true},
	ClassDeadlock:    {"deadlock", ErrAborted, false, true},
	ClassLockTimeout: {"lock_timeout", ErrAborted, false, true},
	ClassReadOnly:    {"read_only", ErrRefused, true, false},
	ClassNoSpace:     {"no_space", ErrRefused, true, false},
	ClassPermission:  {"permission", ErrRefused, true, false},
}

func (c Class) valid() bool { return int(c) < len(classInfo) }

// String returns the class's name as in the table ("read_only"), or
// "class(N)" for an unknown value.
func (c Class) String() string {
	if !c.valid() {
		return fmt.Sprintf("class(%d)", uint8(c))
	}
	return classInfo[c].name
}

// MarshalText implements encoding.TextMarshaler (log/slog, JSON).
func (c Class) MarshalText() ([]byte, error) {
	if !c.valid() {
		return nil, fmt.Errorf("claim: unknown error class %d", uint8(c))
	}
	return []byte(c.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (c *Class) UnmarshalText(b []byte) error {
	for i := range classInfo {
		if classInfo[i].name == string(b) {
			*c = Class(i)
			return nil
		}
	}
	return fmt.Errorf("claim: unknown error class %q", b)
}

// Sentinel returns the sentinel errors of the class wrap (nil for
// ClassNone).
func (c Class) Sentinel() error {
	if !c.valid() {
		return nil
	}
	return classInfo[c].sentinel
}

// StoreWide reports whether the class concerns the whole store (every call
// fails alike) rather than one call.
func (c Class) StoreWide() bool { return c.valid() && classInfo[c].storeWide }

// Transient reports whether the class is expected to clear by itself.
func (c Class) Transient() bool { return c.valid() && classInfo[c].transient }

// Error is a classified store failure: its Class, and the driver error it
// was translated from. errors.Is(err, c.Sentinel()) holds, and errors.As
// finds the driver's error.
type Error struct {
	Class Class
	Err   error // the driver's error; may be nil
}

// NewError classifies err. It returns err unchanged when class is
// ClassNone or err is already classified, and nil for a nil err.
func NewError(class Class, err error) error {
	if err == nil || class == ClassNone || !class.valid() {
		return err
	}
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	return &Error{Class: class, Err: err}
}

func (e *Error) Error() string {
	msg := "claim store error"
	if s := e.Class.Sentinel(); s != nil {
		msg = s.Error()
	}
	msg += " (" + e.Class.String() + ")"
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Unwrap returns the class's sentinel and the driver's error.
func (e *Error) Unwrap() []error {
	out := make([]error, 0, 2)
	if s := e.Class.Sentinel(); s != nil {
		out = append(out, s)
	}
	if e.Err != nil {
		out = append(out, e.Err)
	}
	return out
}

// ClassOf returns the class of err: the Class of the first *Error in its
// chain; for an error that wraps a sentinel without one (a test fake, a
// wrapper), the sentinel's representative class (ErrUnavailable:
// connection, ErrAborted: deadlock, ErrRefused: read_only); otherwise
// ClassNone.
func ClassOf(err error) Class {
	if err == nil {
		return ClassNone
	}
	var e *Error
	if errors.As(err, &e) && e.Class.valid() {
		return e.Class
	}
	switch {
	case errors.Is(err, ErrUnavailable):
		return ClassConnection
	case errors.Is(err, ErrAborted):
		return ClassDeadlock
	case errors.Is(err, ErrRefused):
		return ClassReadOnly
	}
	return ClassNone
}

// StoreWide reports whether err concerns the whole store: ErrUnavailable
// or ErrRefused. A caller stops taking new work and probes.
func StoreWide(err error) bool {
	return errors.Is(err, ErrUnavailable) || errors.Is(err, ErrRefused)
}

// Transient reports whether err is expected to clear by itself:
// ErrUnavailable (the store) or ErrAborted (this call).
func Transient(err error) bool {
	return errors.Is(err, ErrUnavailable) || errors.Is(err, ErrAborted)
}
