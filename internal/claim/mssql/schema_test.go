package mssql

import (
	"io/fs"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sbclaim/sbclaim/internal/claim"
	schema "github.com/sbclaim/sbclaim/sql"
)

// The migration cannot be run here (no SQL Server); these tests pin the
// shape the design requires and the agreement between the migration and
// the Go code that queries it.

func migration(t *testing.T) (up, down string) {
	t.Helper()
	return migrationFile(t, "00001_claims.sql")
}

func migrationFile(t *testing.T, name string) (up, down string) {
	t.Helper()
	fsys, err := schema.Dialect("sqlserver")
	if err != nil {
		t.Fatal(err)
	}
	b, err := fs.ReadFile(fsys, name)
	if err != nil {
		t.Fatal(err)
	}
	src := string(b)
	i, j := strings.Index(src, "-- +goose Up"), strings.Index(src, "-- +goose Down")
	if i < 0 || j < i {
		t.Fatalf("migration lacks -- +goose Up before -- +goose Down")
	}
	return src[i:j], src[j:]
}

// stripComments removes -- comments.
func stripComments(sql string) string {
	var b strings.Builder
	for _, line := range strings.Split(sql, "\n") {
		if i := strings.Index(line, "--"); i >= 0 {
			line = line[:i]
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	return b.String()
}

var spaces = regexp.MustCompile(`\s+`)

func norm(s string) string { return strings.TrimSpace(spaces.ReplaceAllString(s, " ")) }

func TestMigrationShape(t *testing.T) {
	up, down := migration(t)
	code := norm(stripComments(up))
	for _, want := range []string{
		"CREATE TABLE dbo.Claims (",
		"Id bigint IDENTITY(1,1) NOT NULL CONSTRAINT PK_Claims PRIMARY KEY CLUSTERED,",
		"MessageId nvarchar(128) COLLATE Latin1_General_100_BIN2 NOT NULL,",
		"Consumer nvarchar(200) COLLATE Latin1_General_100_BIN2 NOT NULL,",
		"Owner uniqueidentifier NOT NULL,",
		"PayloadHash varbinary(32) NOT NULL,",
		"Payload varbinary(max) NULL,",
		"ClaimedUtc datetime2(7) NOT NULL CONSTRAINT DF_Claims_ClaimedUtc DEFAULT (SYSUTCDATETIME()),",
		"CREATE UNIQUE NONCLUSTERED INDEX UX_Claims_MessageId_Consumer ON dbo.Claims (MessageId, Consumer);",
		"CREATE NONCLUSTERED INDEX IX_Claims_Unfinished ON dbo.Claims (HeartbeatUtc) INCLUDE (State, ClaimedUtc, ProcessedUtc, FlaggedUtc) WHERE ProcessedUtc IS NULL AND FlaggedUtc IS NULL;",
		"CREATE NONCLUSTERED INDEX IX_Claims_Processed ON dbo.Claims (ProcessedUtc) WHERE State = 'processed';",
		"CREATE NONCLUSTERED INDEX IX_Claims_Resolved ON dbo.Claims (ResolvedUtc) WHERE State = 'resolved';",
	} {
		if !strings.Contains(code, want) {
			t.Errorf("migration lacks %q", want)
		}
	}
	for _, banned := range []string{"IGNORE_DUP_KEY", "MERGE"} {
		if strings.Contains(strings.ToUpper(code), banned) {
			t.Errorf("migration uses %s", banned)
		}
	}
	// The index name the store matches in 2601/2627 messages.
	if !strings.Contains(code, "INDEX "+claimsIndex+" ") {
		t.Errorf("the claims index is not named %s", claimsIndex)
	}
	if !strings.Contains(norm(stripComments(down)), "DROP TABLE dbo.Claims;") {
		t.Errorf("Down does not drop dbo.Claims")
	}
	// Every state and resolution the Go code writes passes the CHECKs.
	for _, s := range claim.States {
		if !regexp.MustCompile(`CHECK \(State IN \([^)]*'` + string(s) + `'`).MatchString(code) {
			t.Errorf("state %q is not allowed by CK_Claims_State", s)
		}
	}
	for _, r := range []claim.Resolution{claim.ResolutionRedriven, claim.ResolutionDone, claim.ResolutionDiscarded} {
		if !regexp.MustCompile(`CHECK \(Resolution IN \([^)]*'` + string(r) + `'`).MatchString(code) {
			t.Errorf("resolution %q is not allowed by CK_Claims_Resolution", r)
		}
	}
}

// TestTakeOverMigrationShape pins 00002: the columns it adds and the
// unfinished index rebuilt on State, with the filter the queries repeat.
func TestTakeOverMigrationShape(t *testing.T) {
	up, down := migrationFile(t, "00002_takeover.sql")
	code := norm(stripComments(up))
	for _, want := range []string{
		"ALTER TABLE dbo.Claims ADD",
		"PreviousOwner uniqueidentifier NULL,",
		"NextAttemptUtc datetime2(7) NULL,",
		"DROP INDEX IX_Claims_Unfinished ON dbo.Claims;",
		"CREATE NONCLUSTERED INDEX IX_Claims_Unfinished ON dbo.Claims (HeartbeatUtc) INCLUDE (State, ClaimedUtc, NextAttemptUtc) WHERE " + unfinished + ";",
	} {
		if !strings.Contains(code, want) {
			t.Errorf("00002 lacks %q", want)
		}
	}
	for _, p := range []claim.TakeOverPath{claim.PathRedelivery, claim.PathReconciler, claim.PathOperator} {
		if !regexp.MustCompile(`CHECK \(TakeOverPath IN \([^)]*'` + string(p) + `'`).MatchString(code) {
			t.Errorf("path %q is not allowed by CK_Claims_TakeOverPath", p)
		}
	}
	d := norm(stripComments(down))
	for _, want := range []string{"DROP INDEX IX_Claims_Unfinished ON dbo.Claims;", "DROP CONSTRAINT CK_Claims_TakeOverPath", "DROP COLUMN Route"} {
		if !strings.Contains(d, want) {
			t.Errorf("00002 Down lacks %q", want)
		}
	}
	if got := statementKinds(t, up); got != "ALTER TABLE,DROP INDEX,CREATE NONCLUSTERED" {
		t.Errorf("00002 statements %s", got)
	}
}

// TestMigrationSplitsLikeGoose checks the statement boundaries goose will
// see: outside StatementBegin/End, goose ends a statement at a line whose
// last word (before any comment) ends with ";".
func TestMigrationSplitsLikeGoose(t *testing.T) {
	up, _ := migration(t)
	want := "CREATE TABLE,CREATE UNIQUE,CREATE NONCLUSTERED,CREATE NONCLUSTERED,CREATE NONCLUSTERED,CREATE NONCLUSTERED"
	if got := statementKinds(t, up); got != want {
		t.Fatalf("statements %s, want %s", got, want)
	}
}

// statementKinds splits a migration's Up as goose does and returns the
// first two words of each statement, comma-separated.
func statementKinds(t *testing.T, up string) string {
	t.Helper()
	var stmts []string
	var cur strings.Builder
	inBlock := false
	for _, line := range strings.Split(up, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(trimmed, "-- +goose StatementBegin"):
			inBlock = true
			continue
		case strings.HasPrefix(trimmed, "-- +goose StatementEnd"):
			inBlock = false
			stmts = append(stmts, cur.String())
			cur.Reset()
			continue
		case strings.HasPrefix(trimmed, "--") || trimmed == "":
			continue
		}
		cur.WriteString(line + "\n")
		code := strings.TrimSpace(stripComments(line))
		if !inBlock && strings.HasSuffix(code, ";") {
			stmts = append(stmts, cur.String())
			cur.Reset()
		}
	}
	if inBlock {
		t.Fatal("StatementBegin without StatementEnd")
	}
	if strings.TrimSpace(cur.String()) != "" {
		t.Fatalf("text after the last statement: %q", cur.String())
	}
	var kinds []string
	for _, s := range stmts {
		f := strings.Fields(norm(stripComments(s)))
		if len(f) < 2 {
			t.Fatalf("empty statement %q", s)
		}
		kinds = append(kinds, f[0]+" "+f[1])
	}
	return strings.Join(kinds, ",")
}

// column is a column definition of the CREATE TABLE.
type column struct{ name, typ string }

func tableColumns(t *testing.T) map[string]column {
	t.Helper()
	up, _ := migration(t)
	code := stripComments(up)
	start := strings.Index(code, "CREATE TABLE dbo.Claims (")
	end := strings.Index(code[start:], "\n);")
	if start < 0 || end < 0 {
		t.Fatal("no CREATE TABLE dbo.Claims ( ... );")
	}
	def := regexp.MustCompile(`^\s{4}([A-Z][A-Za-z]+)\s+([a-z0-9]+(?:\([0-9a-z, ]+\))?)`)
	cols := map[string]column{}
	for _, line := range strings.Split(code[start:start+end], "\n") {
		if m := def.FindStringSubmatch(line); m != nil && m[1] != "CONSTRAINT" {
			cols[m[1]] = column{m[1], m[2]}
		}
	}
	// And the columns later migrations add (ALTER TABLE dbo.Claims ADD,
	// one per line, indented like the CREATE TABLE's).
	up2, _ := migrationFile(t, "00002_takeover.sql")
	code = stripComments(up2)
	start = strings.Index(code, "ALTER TABLE dbo.Claims ADD")
	end = strings.Index(code[start:], ";")
	for _, line := range strings.Split(code[start:start+end], "\n") {
		if m := def.FindStringSubmatch(line); m != nil && m[1] != "CONSTRAINT" {
			cols[m[1]] = column{m[1], m[2]}
		}
	}
	return cols
}

func TestGoColumnsMatchTheTable(t *testing.T) {
	cols := tableColumns(t)
	if len(cols) != len(columnNames) {
		t.Errorf("table has %d columns, the store scans %d", len(cols), len(columnNames))
	}
	for _, c := range columnNames {
		if _, ok := cols[c]; !ok {
			t.Errorf("the store scans %s, the table has no such column", c)
		}
	}
	for _, c := range strings.Split(insertColumns, ",") {
		if _, ok := cols[strings.TrimSpace(c)]; !ok {
			t.Errorf("the store inserts %s, the table has no such column", c)
		}
	}
	// The widths the Go code checks or truncates to are the columns'.
	for name, width := range map[string]int{
		"MessageId":      claim.MaxMessageIDLength,
		"Entity":         maxEntity,
		"ClaimedBy":      maxClaimedBy,
		"LastError":      maxLastError,
		"FlagReason":     maxFlagReason,
		"ResolvedBy":     maxResolvedBy,
		"ResolutionNote": maxNote,
		"TakeOverReason": maxFlagReason,
		"PreviousHolder": maxClaimedBy,
		"LateSuccessBy":  maxClaimedBy,
	} {
		if want := "nvarchar(" + strconv.Itoa(width) + ")"; cols[name].typ != want {
			t.Errorf("%s is %s, the store assumes %s", name, cols[name].typ, want)
		}
	}
}
