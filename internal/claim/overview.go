package claim

import "time"

// Bounds of OverviewParams.
const (
	// DefaultFlaggedHours and MaxFlaggedHours bound how far back
	// Overview.FlaggedPerHour goes.
	DefaultFlaggedHours = 24
	MaxFlaggedHours     = 7 * 24
	// DefaultOverviewConsumers and MaxOverviewConsumers bound
	// Overview.Consumers.
	DefaultOverviewConsumers = 50
	MaxOverviewConsumers     = 500
	// MaxReasonGroups bounds OverviewParams.ReasonPrefixes.
	MaxReasonGroups = 20
)

// AgeBuckets are the thresholds of Overview.UnfinishedOlderThan: for each,
// how many unfinished claims were claimed longer ago than it.
var AgeBuckets = []time.Duration{time.Minute, 5 * time.Minute, 15 * time.Minute, time.Hour, 6 * time.Hour, 24 * time.Hour}

// OverviewParams is the input of Overview.
type OverviewParams struct {
	// FlaggedHours is how many hours FlaggedPerHour covers: the current
	// hour and the FlaggedHours-1 before it (database clock, UTC). 0 means
	// DefaultFlaggedHours; at most MaxFlaggedHours.
	FlaggedHours int
	// ReasonPrefixes group the flagged claims by reason: each counts in the
	// first group whose prefix its FlagReason starts with (compared as
	// ListParams.ReasonPrefix compares), else in OtherReasons. At most
	// MaxReasonGroups, each non-empty.
	ReasonPrefixes []string
	// MaxConsumers bounds Consumers (the consumers with the most open
	// claims first). 0 means DefaultOverviewConsumers; at most
	// MaxOverviewConsumers.
	MaxConsumers int
}

// Overview is the open work of the claims table, by the database clock.
// Processed and resolved claims are not counted: counting them would read
// the whole history the table keeps. Each part is read by its own query,
// so under concurrent change two parts can disagree by the claims that
// moved between them.
type Overview struct {
	Now time.Time

	Claimed, Released, Flagged int64
	// Redriving counts the claimed claims that an operator's redrive holds
	// (taken over by path operator).
	Redriving int64

	OldestUnfinished *time.Time // ClaimedAt of the oldest claimed or released claim
	OldestFlagged    *time.Time // FlaggedAt of the longest-flagged claim

	// Consumers are the consumers with open claims, the most open claims
	// first (then by name), at most MaxConsumers of them; MoreConsumers
	// says that more were left out.
	Consumers     []ConsumerCounts
	MoreConsumers bool

	// Reasons[i] counts the flagged claims in group ReasonPrefixes[i];
	// OtherReasons those in none.
	Reasons      []int64
	OtherReasons int64

	// FlaggedPerHour counts, per UTC hour of FlaggedAt, the claims flagged
	// in the window that are still open: flagged, or claimed or released
	// again (a redrive or recovery holds them). Resolved and processed
	// claims have left it. Only hours with at least one claim, oldest
	// first.
	FlaggedPerHour []HourCount

	// UnfinishedOlderThan[i] counts the claimed and released claims whose
	// ClaimedAt is older than AgeBuckets[i].
	UnfinishedOlderThan []int64
}

// ConsumerCounts are one consumer's open claims.
type ConsumerCounts struct {
	Consumer                   string
	Claimed, Released, Flagged int64
}

// Open is the number of the consumer's open claims.
func (c ConsumerCounts) Open() int64 { return c.Claimed + c.Released + c.Flagged }

// HourCount is a number of claims in one hour.
type HourCount struct {
	Hour  time.Time // the start of the hour, UTC
	Count int64
}
