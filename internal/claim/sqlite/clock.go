package sqlite

import (
	"database/sql/driver"
	"time"

	msqlite "modernc.org/sqlite"
)

// clockFunc is the SQL function every time expression of this store reads
// instead of SQLite's 'now': strftime('%Y-%m-%dT%H:%M:%f', sbclaim_now()).
//
// It returns time.Now() of the Go goroutine running the statement, in UTC
// at millisecond precision, as the text SQLite's own 'now' would give. In
// production this is the same clock as before: SQLite is embedded, so its
// 'now' was always this machine's clock read by this process. Inside a
// testing/synctest bubble it is the bubble's fake clock, which lets a
// deterministic simulation move the database's notion of time (take-over
// windows, stale windows, due times, retention) together with the timers
// of the code under test.
const clockFunc = "sbclaim_now"

// clockLayout is the time-value text SQLite's date functions accept; the
// stored text is still formatted by strftime in SQL, so rows are unchanged.
const clockLayout = "2006-01-02 15:04:05.000"

func init() {
	// Registered on the "sqlite" driver for every connection it opens. Not
	// deterministic: two calls in one statement may differ, as 'now' may
	// between statements.
	msqlite.MustRegisterScalarFunction(clockFunc, 0, func(*msqlite.FunctionContext, []driver.Value) (driver.Value, error) {
		return time.Now().UTC().Truncate(time.Millisecond).Format(clockLayout), nil
	})
}
