package sqlite

import (
	"database/sql/driver"
	"sync/atomic"
	"time"

	msqlite "modernc.org/sqlite"
)

// clockFunc is the SQL function every time expression of this store reads
// first: strftime('%Y-%m-%dT%H:%M:%f', coalesce(sbclaim_now(), 'now')).
//
// It returns NULL — SQLite's own 'now', the machine clock, the same for a
// whole statement, exactly as before — unless UseGoClock switched it to
// the Go caller's time.Now(). A simulation does that: inside a
// testing/synctest bubble time.Now() is the bubble's fake clock, so the
// database's notion of time (take-over windows, stale windows, due
// times, retention) moves with the timers of the code under test, and
// within one statement the fake clock does not move.
const clockFunc = "sbclaim_now"

// clockLayout is the time-value text SQLite's date functions accept; the
// stored text is still formatted by strftime in SQL, so rows are unchanged.
const clockLayout = "2006-01-02 15:04:05.000"

var goClock atomic.Bool

// UseGoClock makes every store of this package read the time from Go's
// time.Now() instead of SQLite's 'now' (on: true), for a deterministic
// simulation under testing/synctest. Never in production: Go's clock may
// move between two reads in one statement, SQLite's 'now' does not.
func UseGoClock(on bool) { goClock.Store(on) }

func init() {
	// Registered on the "sqlite" driver for every connection it opens; not
	// deterministic (its answer depends on UseGoClock and the clock).
	msqlite.MustRegisterScalarFunction(clockFunc, 0, func(*msqlite.FunctionContext, []driver.Value) (driver.Value, error) {
		if !goClock.Load() {
			return nil, nil
		}
		return time.Now().UTC().Truncate(time.Millisecond).Format(clockLayout), nil
	})
}
