// Package testissuer is an OpenID Connect issuer for tests: an RSA key the
// test generates, its discovery document and JWKS served by an httptest
// server on 127.0.0.1:0, and ID tokens signed with that key (or with
// another, for the refusals). It stands in for Microsoft Entra ID in the
// console's tests; nothing here ships.
package testissuer

import (
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"github.com/coreos/go-oidc/v3/oidc/oidctest"
)

// Audience is the client id the tokens are issued to by default.
const Audience = "6a3f0c2e-0000-4000-8000-00000000c0de"

const keyID = "test-key-1"

// Issuer is a running test issuer.
type Issuer struct {
	// URL is the issuer (http://127.0.0.1:<port>): the discovery document
	// is at URL/.well-known/openid-configuration.
	URL string
	key *rsa.PrivateKey
	// Other is a key the issuer does not publish, for a bad signature.
	other *rsa.PrivateKey
}

// New starts an issuer, stopped when t ends.
func New(t testing.TB) *Issuer {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	other, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	s := &oidctest.Server{PublicKeys: []oidctest.PublicKey{{PublicKey: key.Public(), KeyID: keyID, Algorithm: oidc.RS256}}}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	s.SetIssuer(srv.URL)
	return &Issuer{URL: srv.URL, key: key, other: other}
}

// Claims are the claims of a token; Token fills iss, aud, iat and exp
// when they are absent.
type Claims map[string]any

// Token returns an ID token for the user name (preferred_username) with
// object id oid, valid for an hour, with the extra claims (which may
// override the defaults: "aud", "iss", "exp").
func (i *Issuer) Token(name, oid string, extra Claims) string {
	c := Claims{"iss": i.URL, "aud": Audience, "sub": "sub-" + oid, "oid": oid, "preferred_username": name,
		"name": name, "iat": time.Now().Add(-time.Minute).Unix(), "exp": time.Now().Add(time.Hour).Unix()}
	for k, v := range extra {
		if v == nil {
			delete(c, k)
			continue
		}
		c[k] = v
	}
	return i.sign(i.key, c)
}

// Forged returns a token like Token's but signed with a key the issuer
// does not publish (under the published key's id).
func (i *Issuer) Forged(name, oid string) string {
	c := Claims{"iss": i.URL, "aud": Audience, "sub": "sub-" + oid, "oid": oid, "preferred_username": name,
		"iat": time.Now().Unix(), "exp": time.Now().Add(time.Hour).Unix()}
	return i.sign(i.other, c)
}

func (i *Issuer) sign(key *rsa.PrivateKey, c Claims) string {
	b, err := json.Marshal(c)
	if err != nil {
		panic(err)
	}
	return oidctest.SignIDToken(key, keyID, oidc.RS256, string(b))
}
