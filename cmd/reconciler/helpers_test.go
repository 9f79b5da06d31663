package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"flag"
	"io"
	"net/http"
	"net/url"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/sbclaim/sbclaim/internal/testkit"
)

func newFlagSet() *flag.FlagSet {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// freshPostgres creates an empty database for one test (advisory locks are
// per database, so tests in parallel packages cannot take each other's
// reconciler lock) and drops it afterwards. It skips, naming the variable,
// when SBCLAIM_TEST_POSTGRES_URL is unset.
func freshPostgres(t *testing.T) string {
	t.Helper()
	base := testkit.PostgresURL(t)
	admin, err := sql.Open("pgx", base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close() })
	name := "sbclaim_cli_" + randomHex(6)
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)"); err != nil {
			t.Logf("drop database %s: %v", name, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	return u.String()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// postEffect performs the effect the way the processor's first attempt
// did: one POST with the message id as the idempotency key.
func postEffect(t *testing.T, endpoint, key string, body []byte) {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("original effect: %s", resp.Status)
	}
}
