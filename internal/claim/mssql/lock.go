package mssql

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"time"
)

// maxLockName is sp_getapplock's @Resource length (nvarchar(255)).
const maxLockName = 255

// TryLock takes the database-wide application lock name without waiting:
// sp_getapplock, exclusive, owned by the session of a connection held out
// of the pool until unlock. ok is false when another session holds it.
//
// The lock lives as long as that session: if the connection breaks (or the
// process dies) SQL Server releases it, and the holder is not told. Use it
// for "one reconciler per tick", whose work is guarded row by row anyway,
// not for mutual exclusion that correctness depends on.
func (s *Store) TryLock(ctx context.Context, name string) (unlock func(context.Context) error, ok bool, err error) {
	if name == "" || utf16Len(name) > maxLockName {
		return nil, false, fmt.Errorf("try lock: name must be 1..%d characters", maxLockName)
	}
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("try lock %q: %w", name, interpretError(err))
	}
	r, err := getAppLock(ctx, conn, name, 0)
	if err != nil {
		// The lock may have been granted before the error (a timeout on
		// the way back): never pool a session that may hold it.
		discard(conn)
		return nil, false, fmt.Errorf("try lock %q: %w", name, interpretError(err))
	}
	switch {
	case r == -1: // timeout: held by another session
		conn.Close()
		return nil, false, nil
	case r < 0:
		conn.Close()
		return nil, false, fmt.Errorf("try lock %q: sp_getapplock returned %d", name, r)
	}
	var once sync.Once
	var uerr error
	unlock = func(ctx context.Context) error {
		once.Do(func() {
			if err := releaseAppLock(ctx, conn, name); err != nil {
				// The session may still hold the lock: discard the
				// connection instead of pooling it, which ends the
				// session and so releases the lock.
				discard(conn)
				uerr = fmt.Errorf("unlock %q: %w", name, interpretError(err))
				return
			}
			if err := conn.Close(); err != nil && !errors.Is(err, sql.ErrConnDone) && uerr == nil {
				uerr = fmt.Errorf("unlock %q: %w", name, interpretError(err))
			}
		})
		return uerr
	}
	return unlock, true, nil
}

// getAppLock runs sp_getapplock for an exclusive session lock on conn and
// returns its result: >= 0 granted, -1 timed out, -2 cancelled, -3
// deadlock victim, -999 bad call.
func getAppLock(ctx context.Context, conn *sql.Conn, name string, wait time.Duration) (int, error) {
	r := -999
	got := false
	err := query(ctx, conn, `DECLARE @result int;
EXEC @result = sp_getapplock @Resource = @p1, @LockMode = 'Exclusive', @LockOwner = 'Session', @LockTimeout = @p2;
SELECT @result;`, args{{text(name), declLockName}, {int32(wait.Milliseconds()), declInt}}, func(rows *sql.Rows) error {
		got = true
		return rows.Scan(&r)
	})
	if err != nil {
		return 0, err
	}
	if !got {
		return 0, errors.New("sp_getapplock returned no result")
	}
	return r, nil
}

// releaseAppLock releases a session lock taken by getAppLock on conn.
func releaseAppLock(ctx context.Context, conn *sql.Conn, name string) error {
	r := -999
	err := query(ctx, conn, `DECLARE @result int;
EXEC @result = sp_releaseapplock @Resource = @p1, @LockOwner = 'Session';
SELECT @result;`, args{{text(name), declLockName}}, func(rows *sql.Rows) error { return rows.Scan(&r) })
	if err != nil {
		return err
	}
	if r != 0 {
		return fmt.Errorf("sp_releaseapplock returned %d", r)
	}
	return nil
}

// discard ends conn's session instead of returning it to the pool.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}
