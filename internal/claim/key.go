package claim

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
)

// KeyForm is how a claim's idempotency key (the key its effect sends
// downstream) is derived from its dedup key. It is recorded on the claim
// when the claim is taken and never changes: every attempt, take-over,
// recovery and redrive of the claim derives its key the same way.
type KeyForm string

const (
	// KeyFormRaw: the key is the dedup key itself (the MessageId), a new
	// key's revision n appends ":r<n>" and a step appends ":<step>". The
	// form of every claim taken before key forms were recorded, and of
	// the claims of a route that opts out (key: raw in the routes file)
	// for a downstream that needs the raw MessageId. It is ambiguous: dedup
	// keys may contain ':' (message "X:r1" and claim "X" under its first
	// new key send the same key), and two consumers of one message send
	// the same key to one API.
	KeyFormRaw KeyForm = "raw"
	// KeyFormScoped: the key names the consumer and the dedup key, each
	// escaped (EscapeKeyPart) so that the separators cannot occur inside
	// them: "<consumer>/<dedup key>", a new key's revision n appends
	// ":r<n>", a step appends "/<step>". A form longer than MaxKeyLength
	// is replaced by "sha256:" and the hex SHA-256 of that form. The
	// default for new claims.
	KeyFormScoped KeyForm = "scoped"
)

// Valid reports whether f is a known form.
func (f KeyForm) Valid() bool { return f == KeyFormRaw || f == KeyFormScoped }

// MaxKeyLength bounds a scoped key, in bytes: Stripe's idempotency keys
// are at most 255 characters.
const MaxKeyLength = 255

// hashedKeyPrefix starts a scoped key whose full form was longer than
// MaxKeyLength. An unhashed scoped key starts with an escaped consumer,
// which cannot contain ':', followed by '/': the two never meet.
const hashedKeyPrefix = "sha256:"

// EscapeKeyPart escapes one component of a scoped key: '%', '/' and ':'
// (the separators and the escape itself), space and control characters
// become %XX (upper-case hex); everything else is kept. Distinct
// components stay distinct, and no escaped component contains a
// separator, so a scoped key has one reading.
func EscapeKeyPart(s string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if escapeKeyByte(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	const hexDigits = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s) + 2*n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if escapeKeyByte(c) {
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&15])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

func escapeKeyByte(c byte) bool {
	return c == '%' || c == '/' || c == ':' || c <= ' ' || c == 0x7f
}

// boundKey returns full, or its hashed form when it is longer than
// MaxKeyLength.
func boundKey(full string) string {
	if len(full) <= MaxKeyLength {
		return full
	}
	sum := sha256.Sum256([]byte(full))
	return hashedKeyPrefix + hex.EncodeToString(sum[:])
}

// KeyFor is the idempotency key of revision n (0: the original key) of
// a claim of (consumer, messageID) in form f. A form other than scoped is
// raw.
func KeyFor(f KeyForm, consumer, messageID string, n int) string {
	if f != KeyFormScoped {
		if n == 0 {
			return messageID
		}
		return RevisedKey(messageID, n)
	}
	full := EscapeKeyPart(consumer) + "/" + EscapeKeyPart(messageID)
	if n > 0 {
		full += ":r" + strconv.Itoa(n)
	}
	return boundKey(full)
}

// StepKey is the key a step of a multi-step effect sends, from its
// claim's key in form f: raw appends ":<step>" (as before key forms);
// scoped appends "/" and the escaped step name, and hashes the result
// when it is longer than MaxKeyLength.
func StepKey(f KeyForm, key, step string) string {
	if f != KeyFormScoped {
		return key + ":" + step
	}
	return boundKey(key + "/" + EscapeKeyPart(step))
}

// RevisedKey is the raw form's key of revision n of a claim's key
// (n >= 1): "<MessageID>:r<n>" (see KeyFor for every form).
func RevisedKey(messageID string, n int) string {
	return messageID + ":r" + strconv.Itoa(n)
}
