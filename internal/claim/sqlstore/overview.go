package sqlstore

import (
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/sbclaim/sbclaim/internal/claim"
)

// ValidateListFilters checks List's Route and ReasonPrefix (ValidateList
// checks the rest).
func ValidateListFilters(p *claim.ListParams) error {
	if n := utf8.RuneCountInString(p.Route); n > MaxRouteLength {
		return fmt.Errorf("list: Route must be at most %d characters, got %d", MaxRouteLength, n)
	}
	if n := utf8.RuneCountInString(p.SessionID); n > claim.MaxMessageIDLength {
		return fmt.Errorf("list: SessionID must be at most %d characters, got %d", claim.MaxMessageIDLength, n)
	}
	return validatePrefix("list: ReasonPrefix", p.ReasonPrefix)
}

func validatePrefix(what, prefix string) error {
	if n := utf8.RuneCountInString(prefix); n > MaxReasonLength {
		return fmt.Errorf("%s must be at most %d characters, got %d", what, MaxReasonLength, n)
	}
	if !utf8.ValidString(prefix) || strings.IndexByte(prefix, 0) >= 0 {
		return fmt.Errorf("%s must be valid UTF-8 without NUL", what)
	}
	return nil
}

// LikePrefix returns the LIKE pattern that matches exactly the strings
// starting with prefix: every character the dialect's LIKE treats as
// special (specials, plus the escape character \) is escaped with \, so a
// reason with % or _ in it matches itself only. Use it with ESCAPE '\'.
func LikePrefix(prefix, specials string) string {
	var b strings.Builder
	for _, r := range prefix {
		if r == '\\' || strings.ContainsRune(specials, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	b.WriteByte('%')
	return b.String()
}

// Overview are OverviewParams with the defaults applied.
type Overview struct {
	Hours, Consumers int
	Prefixes         []string
}

// ValidateOverview checks Overview's params and fills the defaults.
func ValidateOverview(p *claim.OverviewParams) (Overview, error) {
	o := Overview{Hours: Limit(p.FlaggedHours, claim.DefaultFlaggedHours), Consumers: Limit(p.MaxConsumers, claim.DefaultOverviewConsumers), Prefixes: p.ReasonPrefixes}
	var errs []error
	if p.FlaggedHours < 0 || o.Hours > claim.MaxFlaggedHours {
		errs = append(errs, fmt.Errorf("overview: FlaggedHours must be 1..%d, got %d", claim.MaxFlaggedHours, p.FlaggedHours))
	}
	if p.MaxConsumers < 0 || o.Consumers > claim.MaxOverviewConsumers {
		errs = append(errs, fmt.Errorf("overview: MaxConsumers must be 1..%d, got %d", claim.MaxOverviewConsumers, p.MaxConsumers))
	}
	if len(p.ReasonPrefixes) > claim.MaxReasonGroups {
		errs = append(errs, fmt.Errorf("overview: at most %d ReasonPrefixes, got %d", claim.MaxReasonGroups, len(p.ReasonPrefixes)))
	}
	for i, prefix := range p.ReasonPrefixes {
		if prefix == "" {
			errs = append(errs, fmt.Errorf("overview: ReasonPrefixes[%d] is empty", i))
		}
		if err := validatePrefix(fmt.Sprintf("overview: ReasonPrefixes[%d]", i), prefix); err != nil {
			errs = append(errs, err)
		}
	}
	return o, errors.Join(errs...)
}

// GroupReasons turns rows of (group index, count) into Overview.Reasons
// and OtherReasons; group -1 (or any index out of range) is "other".
func GroupReasons(o *claim.Overview, groups int, rows map[int]int64) {
	o.Reasons = make([]int64, groups)
	for g, n := range rows {
		if g >= 0 && g < groups {
			o.Reasons[g] += n
		} else {
			o.OtherReasons += n
		}
	}
}

// The Overview's result sets that every dialect returns alike, after its
// first (counts and oldest times, whose time types differ by driver):

// ScanAges scans the row of unfinished claims per age bucket.
func ScanAges(o *claim.Overview) func(*sql.Rows) error {
	return func(r *sql.Rows) error {
		dest := make([]any, len(o.UnfinishedOlderThan))
		for i := range dest {
			dest[i] = &o.UnfinishedOlderThan[i]
		}
		return r.Scan(dest...)
	}
}

// ScanConsumer scans one consumer's counts.
func ScanConsumer(o *claim.Overview) func(*sql.Rows) error {
	return func(r *sql.Rows) error {
		var c claim.ConsumerCounts
		if err := r.Scan(&c.Consumer, &c.Claimed, &c.Released, &c.Flagged); err != nil {
			return err
		}
		o.Consumers = append(o.Consumers, c)
		return nil
	}
}

// ScanReasonGroup scans one (reason group, count) row into reasons (see
// GroupReasons).
func ScanReasonGroup(reasons map[int]int64) func(*sql.Rows) error {
	return func(r *sql.Rows) error {
		var (
			g int
			n int64
		)
		if err := r.Scan(&g, &n); err != nil {
			return err
		}
		reasons[g] = n
		return nil
	}
}
