package claimdb

import (
	"net/url"
	"regexp"
	"strings"
	"testing"
)

func TestRandomName(t *testing.T) {
	re := regexp.MustCompile(`^[0-9a-f]{12}$`)
	a, b := randomName(), randomName()
	if !re.MatchString(a) || !re.MatchString(b) || a == b {
		t.Fatalf("names %q, %q: want 12 hex digits, different per call", a, b)
	}
}

// A SQL Server scratch URL selects the new database whatever the base URL
// called its database parameter.
func TestWithQueryDatabase(t *testing.T) {
	for _, raw := range []string{
		"sqlserver://sa:p%40ss@db.example:1433?encrypt=true",
		"sqlserver://sa:p%40ss@db.example:1433?database=sbclaim&encrypt=true",
		"sqlserver://sa:p%40ss@db.example:1433?Database=sbclaim&encrypt=true",
		"sqlserver://sa:p%40ss@db.example:1433?initial+catalog=sbclaim&encrypt=true",
	} {
		got, err := withQuery(raw, "database", "sbclaim_chaos_0123456789ab", "initial catalog")
		if err != nil {
			t.Fatal(err)
		}
		u, err := url.Parse(got)
		if err != nil {
			t.Fatal(err)
		}
		q := u.Query()
		var dbKeys []string
		for k := range q {
			if strings.EqualFold(k, "database") || strings.EqualFold(k, "initial catalog") {
				dbKeys = append(dbKeys, k)
			}
		}
		if len(dbKeys) != 1 || q.Get("database") != "sbclaim_chaos_0123456789ab" || q.Get("encrypt") != "true" ||
			u.Host != "db.example:1433" || u.User.String() != "sa:p%40ss" {
			t.Errorf("%s -> %s (database keys %v)", raw, got, dbKeys)
		}
	}
	if _, err := withQuery("sqlserver://%zz", "database", "x"); err == nil || strings.Contains(err.Error(), "%zz") {
		t.Errorf("bad URL: %v", err)
	}
}
