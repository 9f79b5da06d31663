package mssql

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	mssqldb "github.com/microsoft/go-mssqldb"
	"github.com/microsoft/go-mssqldb/msdsn"

	"github.com/sbclaim/sbclaim/internal/claim"
	"github.com/sbclaim/sbclaim/internal/redact"
)

const secret = "S3cr3t!pw"

func TestPrepareURL(t *testing.T) {
	const clientID = "11111111-2222-3333-4444-555555555555"
	tests := []struct {
		name          string
		url           string
		azureClientID string
		fedAuth       bool
		wantUser      string // "user id" the driver will see
		wantApp       string
	}{
		{
			name: "sql login", url: "sqlserver://sa:" + secret + "@localhost:1433?database=sbclaim",
			wantUser: "sa", wantApp: "sbclaim",
		},
		{
			name: "sql login keeps its app name", url: "sqlserver://sa:" + secret + "@localhost?database=sbclaim&app+name=billing",
			wantUser: "sa", wantApp: "billing",
		},
		{
			name: "default credential reads AZURE_CLIENT_ID itself", url: "sqlserver://srv.database.windows.net?database=sbclaim&fedauth=ActiveDirectoryDefault",
			azureClientID: clientID, fedAuth: true, wantUser: "", wantApp: "sbclaim",
		},
		{
			name: "managed identity gets AZURE_CLIENT_ID", url: "sqlserver://srv.database.windows.net?database=sbclaim&fedauth=ActiveDirectoryManagedIdentity",
			azureClientID: clientID, fedAuth: true, wantUser: clientID, wantApp: "sbclaim",
		},
		{
			name: "MSI synonym, any case", url: "sqlserver://srv.database.windows.net?database=sbclaim&FedAuth=activedirectorymsi",
			azureClientID: clientID, fedAuth: true, wantUser: clientID, wantApp: "sbclaim",
		},
		{
			name: "managed identity keeps the URL's client id", url: "sqlserver://aaaa-bbbb@srv.database.windows.net?database=sbclaim&fedauth=ActiveDirectoryManagedIdentity",
			azureClientID: clientID, fedAuth: true, wantUser: "aaaa-bbbb", wantApp: "sbclaim",
		},
		{
			name: "managed identity keeps a user id parameter", url: "sqlserver://srv.database.windows.net?database=sbclaim&fedauth=ActiveDirectoryManagedIdentity&user+id=cccc",
			azureClientID: clientID, fedAuth: true, wantUser: "cccc", wantApp: "sbclaim",
		},
		{
			name: "managed identity by resource id", url: "sqlserver://srv.database.windows.net?database=sbclaim&fedauth=ActiveDirectoryManagedIdentity&resource+id=/subscriptions/x",
			azureClientID: clientID, fedAuth: true, wantUser: "", wantApp: "sbclaim",
		},
		{
			name: "system-assigned identity without AZURE_CLIENT_ID", url: "sqlserver://srv.database.windows.net?database=sbclaim&fedauth=ActiveDirectoryManagedIdentity",
			fedAuth: true, wantUser: "", wantApp: "sbclaim",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dsn, fedAuth, err := prepareURL(tc.url, tc.azureClientID)
			if err != nil {
				t.Fatal(err)
			}
			if fedAuth != tc.fedAuth {
				t.Errorf("fedAuth = %v, want %v", fedAuth, tc.fedAuth)
			}
			// Parse the DSN the way the driver will.
			cfg, err := msdsn.Parse(dsn)
			if err != nil {
				t.Fatalf("driver cannot parse %q: %v", dsn, err)
			}
			if got := cfg.User; got != tc.wantUser {
				t.Errorf("user id = %q, want %q", got, tc.wantUser)
			}
			if got := cfg.AppName; got != tc.wantApp {
				t.Errorf("app name = %q, want %q", got, tc.wantApp)
			}
			if cfg.Database != "sbclaim" {
				t.Errorf("database = %q", cfg.Database)
			}
			if strings.Contains(tc.url, secret) && cfg.Password != secret {
				t.Errorf("password did not survive: %q", cfg.Password)
			}
			// The connector the store would use accepts it.
			c, err := newConnector(tc.url, tc.azureClientID)
			if err != nil {
				t.Fatalf("newConnector: %v", err)
			}
			if _, ok := c.(*mssqldb.Connector); !ok {
				t.Fatalf("connector is %T", c)
			}
		})
	}
}

func TestBadURLsDoNotLeakTheSecret(t *testing.T) {
	for name, u := range map[string]string{
		"not a URL":             "sqlserver://sa:" + secret + "@host:port:bad/%zz",
		"wrong scheme":          "postgres://sa:" + secret + "@host/db",
		"guid conversion":       "sqlserver://sa:" + secret + "@host?guid+conversion=true",
		"bad fedauth":           "sqlserver://sa:" + secret + "@host?fedauth=Bogus",
		"duplicate user id":     "sqlserver://sa:" + secret + "@host?user+id=x",
		"bad port":              "sqlserver://sa:" + secret + "@host:99999999",
		"password in parameter": "sqlserver://host?password=" + secret + "&encrypt=maybe",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := newConnector(u, "")
			if err == nil {
				t.Skipf("driver accepted %s", redact.URL(u)) // not every case is an error; none may leak
			}
			if strings.Contains(err.Error(), secret) {
				t.Fatalf("error leaks the password: %v", err)
			}
		})
	}
}

func TestOpenUnreachableIsUnavailableAndRedacted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Port 1 on loopback: nothing listens, the dial is refused at once.
	_, err := Open(ctx, "sqlserver://sa:"+secret+"@127.0.0.1:1?database=sbclaim&dial+timeout=5")
	if err == nil {
		t.Fatal("Open of an unreachable server succeeded")
	}
	if !errors.Is(err, claim.ErrUnavailable) {
		t.Errorf("error is not ErrUnavailable: %v", err)
	}
	if strings.Contains(err.Error(), secret) {
		t.Errorf("error leaks the password: %v", err)
	}
	if !strings.Contains(err.Error(), "sqlserver://sa:xxxxx@127.0.0.1:1") {
		t.Errorf("error does not name the (redacted) server: %v", err)
	}
}

func TestScrub(t *testing.T) {
	u := "sqlserver://sa:" + secret + "@host"
	err := scrub(errors.New("bad value '"+secret+"'"), u)
	if strings.Contains(err.Error(), secret) {
		t.Fatalf("scrub left the password: %v", err)
	}
	plain := errors.New("plain")
	if scrub(plain, u) != plain {
		t.Fatal("scrub replaced an error without secrets")
	}
}
