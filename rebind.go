package sbclaim

import (
	"strconv"
	"strings"
)

// Rebind rewrites a statement written with ? placeholders into the store's
// dialect, so one statement serves every database a TxHandlerFunc may run
// on: $1, $2, ... on PostgreSQL, @p1, @p2, ... on SQL Server, unchanged on
// SQLite.
//
//	_, err := tx.ExecContext(ctx, store.Rebind(`INSERT INTO orders (claim_id, id) VALUES (?, ?)`), d.ClaimID(), o.ID)
//
// A ? inside a quoted string ('...'), a quoted identifier ("..." or
// [...]) or a comment (-- or /* */) is left alone. PostgreSQL's
// dollar-quoted strings and its ? JSON operators are not recognised:
// write a statement that needs them for PostgreSQL alone.
func (s *Store) Rebind(query string) string {
	switch s.dialect {
	case "postgres":
		return rebind(query, "$")
	case "sqlserver":
		return rebind(query, "@p")
	}
	return query
}

// rebind numbers each placeholder ? outside quotes and comments as
// prefix + n.
func rebind(q, prefix string) string {
	var b strings.Builder
	b.Grow(len(q) + 8)
	n := 0
	for i := 0; i < len(q); i++ {
		c := q[i]
		switch {
		case c == '?':
			n++
			b.WriteString(prefix)
			b.WriteString(strconv.Itoa(n))
			continue
		case c == '\'' || c == '"' || c == '[':
			end := byte(c)
			if c == '[' {
				end = ']'
			}
			j := i + 1
			for j < len(q) {
				if q[j] == end {
					if end != ']' && j+1 < len(q) && q[j+1] == end { // '' or "" escapes the quote
						j += 2
						continue
					}
					break
				}
				j++
			}
			j = min(j, len(q)-1)
			b.WriteString(q[i : j+1])
			i = j
			continue
		case c == '-' && i+1 < len(q) && q[i+1] == '-':
			j := strings.IndexByte(q[i:], '\n')
			if j < 0 {
				j = len(q) - i - 1
			}
			b.WriteString(q[i : i+j+1])
			i += j
			continue
		case c == '/' && i+1 < len(q) && q[i+1] == '*':
			j := strings.Index(q[i+2:], "*/")
			end := len(q) - 1
			if j >= 0 {
				end = i + 2 + j + 1
			}
			b.WriteString(q[i : end+1])
			i = end
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}
