package mssql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	mssqldb "github.com/microsoft/go-mssqldb"
	"github.com/microsoft/go-mssqldb/azuread"
	"github.com/pressly/goose/v3"

	"github.com/sbclaim/sbclaim/internal/claim/sqlstore"
	"github.com/sbclaim/sbclaim/internal/redact"
	sqlfiles "github.com/sbclaim/sbclaim/sql"
)

// connMaxIdleTime closes pooled connections idle for longer than this.
// Azure's load balancers drop idle TCP flows after about 4 minutes without
// telling either side; a connection that sat idle longer would fail on its
// next use.
const connMaxIdleTime = 3 * time.Minute

// Open opens a SQL Server claims store from a URL and checks that the
// database answers:
//
//	sqlserver://user:password@host:1433?database=sbclaim
//	sqlserver://host.database.windows.net?database=sbclaim&fedauth=ActiveDirectoryDefault
//	sqlserver://<client-id>@host.database.windows.net?database=sbclaim&fedauth=ActiveDirectoryManagedIdentity
//
// Every go-mssqldb URL parameter works. A URL with fedauth= is opened with
// the azuread driver (azuread.DriverName, "azuresql"), which gets an
// Entra ID token from azidentity: ActiveDirectoryDefault uses
// DefaultAzureCredential, which reads AZURE_CLIENT_ID itself;
// ActiveDirectoryManagedIdentity / ActiveDirectoryMSI take a user-assigned
// identity's client id as the URL's user, and Open fills it from
// AZURE_CLIENT_ID when the URL names none (without it the driver would use
// the system-assigned identity).
//
// Errors never contain the URL's password. Open does not migrate; see
// Migrate.
func Open(ctx context.Context, rawURL string) (*Store, error) {
	connector, err := newConnector(rawURL, os.Getenv("AZURE_CLIENT_ID"))
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(connector)
	sqlstore.LimitPool(db)
	db.SetConnMaxIdleTime(connMaxIdleTime)
	s := New(db)
	if err := s.Ping(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("open %s: %w", redact.URL(rawURL), scrub(err, rawURL))
	}
	return s, nil
}

// newConnector builds the go-mssqldb connector for a URL: the azuread one
// when the URL asks for Entra ID authentication, the plain one otherwise.
func newConnector(rawURL, azureClientID string) (driver.Connector, error) {
	dsn, fedAuth, err := prepareURL(rawURL, azureClientID)
	if err != nil {
		return nil, err
	}
	var c driver.Connector
	if fedAuth {
		c, err = azuread.NewConnector(dsn)
	} else {
		c, err = mssqldb.NewConnector(dsn)
	}
	if err != nil {
		return nil, fmt.Errorf("sql server URL %s: %w", redact.URL(rawURL), scrub(err, rawURL))
	}
	return c, nil
}

// prepareURL checks a sqlserver:// URL and returns the DSN to give the
// driver, and whether it needs the azuread driver (a fedauth parameter).
// It sets "app name" (sbclaim) unless given, and for managed identity
// authentication without a client id it uses azureClientID.
func prepareURL(rawURL, azureClientID string) (dsn string, fedAuth bool, err error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Parse's error quotes the whole URL, password included.
		return "", false, errors.New("sql server URL is not a valid URL (expected sqlserver://user:password@host:1433?database=name)")
	}
	if u.Scheme != "sqlserver" {
		return "", false, fmt.Errorf("sql server URL: scheme %q is not sqlserver", u.Scheme)
	}
	q := u.Query()
	get := func(name string) (string, bool) {
		for k, v := range q {
			if strings.EqualFold(k, name) && len(v) > 0 {
				return v[0], true
			}
		}
		return "", false
	}
	if v, ok := get("guid conversion"); ok {
		if b, _ := strconv.ParseBool(v); b {
			// The store scans uniqueidentifier with mssql.UniqueIdentifier,
			// which expects the driver's default wire byte order.
			return "", false, errors.New(`sql server URL: "guid conversion=true" is not supported`)
		}
	}
	if _, ok := get("app name"); !ok {
		q.Set("app name", "sbclaim")
	}
	method, fedAuth := get("fedauth")
	if fedAuth && azureClientID != "" &&
		(strings.EqualFold(method, azuread.ActiveDirectoryManagedIdentity) || strings.EqualFold(method, azuread.ActiveDirectoryMSI)) {
		_, hasUser := get("user id")
		_, hasResource := get("resource id")
		if (u.User == nil || u.User.Username() == "") && !hasUser && !hasResource {
			u.User = url.User(azureClientID)
		}
	}
	u.RawQuery = q.Encode()
	return u.String(), fedAuth, nil
}

// scrub removes the URL's secrets from an error's text, should a driver
// error ever quote them; errors without them pass through unchanged.
func scrub(err error, rawURL string) error {
	return redact.NewScrubber(redact.Secrets(rawURL)...).Error(err)
}

// migrationLock is the sp_getapplock resource that serialises migrations
// of one database (two replicas starting at once).
const migrationLock = "sbclaim:migrate"

// Migrate applies the embedded SQL Server migrations (sql/sqlserver) to db
// with goose, holding an exclusive application lock so that concurrent
// callers run them one after the other. The identity needs DDL rights
// (see sql/grants/sqlserver.sql).
func Migrate(ctx context.Context, db *sql.DB) error {
	fsys, err := sqlfiles.Dialect("sqlserver")
	if err != nil {
		return fmt.Errorf("migrate sql server: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectMSSQL, db, fsys, goose.WithSessionLocker(appLocker{}))
	if err != nil {
		return fmt.Errorf("migrate sql server: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate sql server: %w", interpretError(err))
	}
	return nil
}

// appLocker is goose's session locker on sp_getapplock.
type appLocker struct{}

// migrationLockWait is the longest a migration waits for another one.
const migrationLockWait = 5 * time.Minute

func (appLocker) SessionLock(ctx context.Context, conn *sql.Conn) error {
	wait := migrationLockWait
	if d, ok := ctx.Deadline(); ok {
		wait = min(wait, max(time.Until(d), 0))
	}
	r, err := getAppLock(ctx, conn, migrationLock, wait)
	if err != nil {
		return fmt.Errorf("migration lock: %w", interpretError(err))
	}
	if r < 0 {
		return fmt.Errorf("migration lock: another migration holds %q (sp_getapplock returned %d)", migrationLock, r)
	}
	return nil
}

func (appLocker) SessionUnlock(ctx context.Context, conn *sql.Conn) error {
	if err := releaseAppLock(ctx, conn, migrationLock); err != nil {
		return fmt.Errorf("migration unlock: %w", interpretError(err))
	}
	return nil
}
