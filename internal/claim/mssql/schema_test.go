package mssql

import (
	"io/fs"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sbclaim/sbclaim/internal/claim"
	sqlfiles "github.com/sbclaim/sbclaim/sql"
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
	fsys, err := sqlfiles.Dialect("sqlserver")
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
	// Every state and resolution the Go code writes passes the CHECKs
	// (the failed state came with 00003: TestFailedMigrationShape).
	for _, s := range claim.States {
		if s == claim.StateFailed {
			continue
		}
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

// TestFailedMigrationShape pins 00003: CK_Claims_State dropped and added
// again (trusted: WITH CHECK) allowing every state the Go code writes; the
// columns it adds; the filtered index the purge of failed claims and Stats
// seek, with the filter the queries repeat; and a Down that turns failed
// claims into flagged ones before the old CHECK comes back.
func TestFailedMigrationShape(t *testing.T) {
	up, down := migrationFile(t, "00003_failed.sql")
	code := norm(stripComments(up))
	for _, want := range []string{
		"ALTER TABLE dbo.Claims DROP CONSTRAINT CK_Claims_State;",
		"ALTER TABLE dbo.Claims WITH CHECK ADD CONSTRAINT CK_Claims_State CHECK (State IN (",
		"ALTER TABLE dbo.Claims ADD FailedUtc datetime2(7) NULL,",
		"DeadLetterSeq bigint NULL,",
		"Answer nvarchar(max) NULL,",
		"EffectKey nvarchar(160) COLLATE Latin1_General_100_BIN2 NOT NULL",
		"CREATE NONCLUSTERED INDEX IX_Claims_Failed ON dbo.Claims (FailedUtc) WHERE State = 'failed';",
	} {
		if !strings.Contains(code, want) {
			t.Errorf("00003 lacks %q", want)
		}
	}
	check := regexp.MustCompile(`ADD CONSTRAINT CK_Claims_State CHECK \(State IN \(([^)]*)\)\)`).FindStringSubmatch(code)
	if check == nil {
		t.Fatal("00003 does not add CK_Claims_State")
	}
	for _, s := range claim.States {
		if !strings.Contains(check[1], "'"+string(s)+"'") {
			t.Errorf("state %q is not allowed by 00003's CK_Claims_State (%s)", s, check[1])
		}
	}
	if got := statementKinds(t, up); got != "ALTER TABLE,ALTER TABLE,ALTER TABLE,CREATE NONCLUSTERED" {
		t.Errorf("00003 statements %s", got)
	}
	d := norm(stripComments(down))
	steps := []string{
		"UPDATE dbo.Claims SET State = 'flagged'",
		"DROP INDEX IX_Claims_Failed ON dbo.Claims;",
		"ALTER TABLE dbo.Claims DROP CONSTRAINT CK_Claims_State;",
		"ALTER TABLE dbo.Claims WITH CHECK ADD CONSTRAINT CK_Claims_State CHECK (State IN ('claimed', 'processed', 'released', 'flagged', 'resolved'));",
		"DROP CONSTRAINT DF_Claims_FailReason",
		"DROP COLUMN FailedUtc",
	}
	at := 0
	for _, want := range steps {
		i := strings.Index(d[at:], want)
		if i < 0 {
			t.Errorf("00003 Down lacks %q (in this order: %q)", want, steps)
			continue
		}
		at += i
	}
	if got := statementKinds(t, down); got != "UPDATE dbo.Claims,DROP INDEX,ALTER TABLE,ALTER TABLE,ALTER TABLE,ALTER TABLE" {
		t.Errorf("00003 Down statements %s", got)
	}
	// Every column 00003 adds is dropped again.
	for name := range addedColumns(t, "00003_failed.sql") {
		if !strings.Contains(d, name) {
			t.Errorf("00003 Down does not drop %s", name)
		}
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
	// And the columns later migrations add.
	for _, name := range []string{"00002_takeover.sql", "00003_failed.sql", "00004_history.sql", "00005_deferral.sql", "00008_sessions.sql"} {
		for k, v := range addedColumns(t, name) {
			cols[k] = v
		}
		// And the columns they alter.
		up, _ := migrationFile(t, name)
		alter := regexp.MustCompile(`(?m)^ALTER TABLE dbo\.Claims ALTER COLUMN ([A-Z][A-Za-z]+) ([a-z0-9]+(?:\([0-9a-z, ]+\))?)`)
		for _, m := range alter.FindAllStringSubmatch(stripComments(up), -1) {
			cols[m[1]] = column{m[1], m[2]}
		}
	}
	return cols
}

// addedColumns are the columns a migration adds (ALTER TABLE dbo.Claims
// ADD, one per line, indented like the CREATE TABLE's).
func addedColumns(t *testing.T, name string) map[string]column {
	t.Helper()
	up, _ := migrationFile(t, name)
	code := stripComments(up)
	start := strings.Index(code, "ALTER TABLE dbo.Claims ADD\n")
	if start < 0 {
		t.Fatalf("%s adds no columns", name)
	}
	end := strings.Index(code[start:], ";")
	def := regexp.MustCompile(`^\s{4}([A-Z][A-Za-z]+)\s+([a-z0-9]+(?:\([0-9a-z, ]+\))?)`)
	cols := map[string]column{}
	for _, line := range strings.Split(code[start:start+end], "\n") {
		if m := def.FindStringSubmatch(line); m != nil && m[1] != "CONSTRAINT" {
			cols[m[1]] = column{m[1], m[2]}
		}
	}
	return cols
}

func TestGoColumnsMatchTheTable(t *testing.T) {
	cols := tableColumns(t)
	// TakenOverFrom and FlaggedFrom are written, never read: the history
	// rows read DELETED.State.
	for _, internal := range []string{"TakenOverFrom", "FlaggedFrom"} {
		if _, ok := cols[internal]; !ok {
			t.Errorf("the table has no %s", internal)
		}
		delete(cols, internal)
	}
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
		"MessageId":       claim.MaxMessageIDLength,
		"Entity":          maxEntity,
		"ClaimedBy":       maxClaimedBy,
		"LastError":       maxLastError,
		"FlagReason":      maxFlagReason,
		"ResolvedBy":      maxResolvedBy,
		"ResolutionNote":  maxNote,
		"TakeOverReason":  maxFlagReason,
		"PreviousHolder":  maxClaimedBy,
		"LateSuccessBy":   maxClaimedBy,
		"FailReason":      claim.MaxFailReasonLength,
		"KeyRevisedBy":    maxClaimedBy,  // the take-over's By
		"KeyRevisionNote": maxFlagReason, // the take-over's Reason
	} {
		if want := "nvarchar(" + strconv.Itoa(width) + ")"; cols[name].typ != want {
			t.Errorf("%s is %s, the store assumes %s", name, cols[name].typ, want)
		}
	}
	// EffectKey holds "<MessageId>:r<n>" for any int n, and any scoped
	// key (at most claim.MaxKeyLength: longer forms are hashed).
	if want := claim.MaxMessageIDLength + len(":r") + len("2147483647"); cols["EffectKey"].typ != "nvarchar(255)" || claim.MaxKeyLength < want {
		t.Errorf("EffectKey is %s; it must hold %d characters", cols["EffectKey"].typ, want)
	}
	if cols["Answer"].typ != "nvarchar(max)" || cols["DeadLetterSeq"].typ != "bigint" {
		t.Errorf("Answer %s, DeadLetterSeq %s", cols["Answer"].typ, cols["DeadLetterSeq"].typ)
	}
}

// TestPurgeMigrationShape pins 00007: the purge's three filtered indexes
// are built again with the filter its DELETEs now repeat (a finished
// claim that still names a deferred message is never purged), and Down
// restores them as 00001 and 00003 built them.
func TestPurgeMigrationShape(t *testing.T) {
	up, down := migrationFile(t, "00007_purge.sql")
	code := norm(stripComments(up))
	for _, want := range []string{
		"CREATE NONCLUSTERED INDEX IX_Claims_Processed ON dbo.Claims (ProcessedUtc) WHERE State = 'processed' AND DeferredSeq IS NULL;",
		"CREATE NONCLUSTERED INDEX IX_Claims_Failed ON dbo.Claims (FailedUtc) WHERE State = 'failed' AND DeferredSeq IS NULL;",
		"CREATE NONCLUSTERED INDEX IX_Claims_Resolved ON dbo.Claims (ResolvedUtc) WHERE State = 'resolved' AND DeferredSeq IS NULL;",
	} {
		if !strings.Contains(code, want) {
			t.Errorf("00007 lacks %q", want)
		}
	}
	d := norm(stripComments(down))
	for _, want := range []string{
		"CREATE NONCLUSTERED INDEX IX_Claims_Processed ON dbo.Claims (ProcessedUtc) WHERE State = 'processed';",
		"CREATE NONCLUSTERED INDEX IX_Claims_Failed ON dbo.Claims (FailedUtc) WHERE State = 'failed';",
		"CREATE NONCLUSTERED INDEX IX_Claims_Resolved ON dbo.Claims (ResolvedUtc) WHERE State = 'resolved';",
	} {
		if !strings.Contains(d, want) {
			t.Errorf("00007 Down lacks %q", want)
		}
	}
	if got := statementKinds(t, up); got != "DROP INDEX,CREATE NONCLUSTERED,DROP INDEX,CREATE NONCLUSTERED,DROP INDEX,CREATE NONCLUSTERED" {
		t.Errorf("00007 statements %s", got)
	}
}
