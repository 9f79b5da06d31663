package sbclaim

import "testing"

func TestRebindSkipsQuotesAndComments(t *testing.T) {
	cases := []struct{ in, pg, ms string }{
		{`SELECT 1`, `SELECT 1`, `SELECT 1`},
		{`INSERT INTO t (a, b) VALUES (?, ?)`, `INSERT INTO t (a, b) VALUES ($1, $2)`, `INSERT INTO t (a, b) VALUES (@p1, @p2)`},
		{`SELECT '?', 'it''s ?', "a?b", [c?] FROM t WHERE x = ?`, `SELECT '?', 'it''s ?', "a?b", [c?] FROM t WHERE x = $1`, `SELECT '?', 'it''s ?', "a?b", [c?] FROM t WHERE x = @p1`},
		{"SELECT ? -- why?\n, ? /* what? */ , ?", "SELECT $1 -- why?\n, $2 /* what? */ , $3", "SELECT @p1 -- why?\n, @p2 /* what? */ , @p3"},
		{`SELECT 'unterminated ?`, `SELECT 'unterminated ?`, `SELECT 'unterminated ?`},
		{`SELECT ? /* open ?`, `SELECT $1 /* open ?`, `SELECT @p1 /* open ?`},
		{`SELECT ? -- end ?`, `SELECT $1 -- end ?`, `SELECT @p1 -- end ?`},
		{`a-b/c ?`, `a-b/c $1`, `a-b/c @p1`},
	}
	for _, c := range cases {
		for _, d := range []struct{ dialect, want string }{{"postgres", c.pg}, {"sqlserver", c.ms}, {"sqlite", c.in}, {"", c.in}} {
			if got := (&Store{dialect: d.dialect}).Rebind(c.in); got != d.want {
				t.Errorf("%s: Rebind(%q) = %q, want %q", d.dialect, c.in, got, d.want)
			}
		}
	}
}
