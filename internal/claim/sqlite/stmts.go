package sqlite

import (
	"context"
	"database/sql"
	"sync"
)

// Bounds of the statements a store keeps prepared: their number, the size
// of their texts together, and the size of one text. The message path's
// texts are a few hundred at most (a text per kind of write and per batch
// size up to maxCachedRows), of a few KiB each; a bigger batch's text, or
// one seen once the cache is full, is parsed each time it runs, as every
// text was before. (A prepared statement's memory grows with its text.)
const (
	maxPrepared      = 512
	maxPreparedBytes = 2 << 20
	maxPreparedText  = 8 << 10
)

// stmtCache keeps the statements the message path runs prepared on the
// store's connection, so that SQLite parses each text once, not on every
// claim batch and outcome write (parsing was a fifth of the CPU of the
// message path, and it ran while the one connection was held). A text is
// prepared before the next transaction begins, never inside one: on a
// one-connection database, preparing from inside a transaction would wait
// for the connection that transaction holds.
type stmtCache struct {
	mu      sync.Mutex
	ready   map[string]*sql.Stmt
	pending map[string]struct{}
	taken   int // texts taken from pending, being prepared
	bytes   int // of the texts ready, pending and taken
}

// get returns text's prepared statement, or nil: then text is noted, to be
// prepared before the next transaction (prepare).
func (c *stmtCache) get(text string) *sql.Stmt {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st, ok := c.ready[text]; ok {
		return st
	}
	if _, ok := c.pending[text]; ok {
		return nil
	}
	if len(text) <= maxPreparedText && c.bytes+len(text) <= maxPreparedBytes && len(c.ready)+len(c.pending)+c.taken < maxPrepared {
		if c.pending == nil {
			c.pending = make(map[string]struct{})
		}
		c.pending[text] = struct{}{}
		c.bytes += len(text)
	}
	return nil
}

// preparePerTx bounds the texts one transaction prepares before it begins:
// each waits for the store's one connection within the caller's deadline,
// so the first transaction after many new texts (a start under load)
// must not pay for all of them; the rest wait for the next ones.
const preparePerTx = 4

// prepare prepares up to preparePerTx of the texts noted so far, on db. A
// text that fails to prepare (a cancelled ctx, a busy connection) is
// dropped: it runs unprepared, and is noted again the next time it runs.
func (c *stmtCache) prepare(ctx context.Context, db *sql.DB) {
	c.mu.Lock()
	if len(c.pending) == 0 {
		c.mu.Unlock()
		return
	}
	texts := make([]string, 0, min(len(c.pending), preparePerTx))
	for t := range c.pending {
		if len(texts) == preparePerTx {
			break
		}
		texts = append(texts, t)
		delete(c.pending, t)
	}
	c.taken += len(texts)
	c.mu.Unlock()
	for _, t := range texts {
		st, err := db.PrepareContext(ctx, t)
		c.mu.Lock()
		c.taken--
		if err != nil {
			c.bytes -= len(t)
			c.mu.Unlock()
			continue
		}
		if c.ready == nil {
			c.ready = make(map[string]*sql.Stmt)
		}
		if _, ok := c.ready[t]; ok {
			st.Close() // prepared by a concurrent call
			c.bytes -= len(t)
		} else {
			c.ready[t] = st
		}
		c.mu.Unlock()
	}
}

// close closes the prepared statements.
func (c *stmtCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for t, st := range c.ready {
		st.Close()
		delete(c.ready, t)
		c.bytes -= len(t)
	}
}

// stx is a transaction of the store whose statements run prepared when
// their text is (ExecContext and QueryContext); it is the store's
// transaction type inside the package. A caller's own statements (ClaimTx's
// fn) get the plain *sql.Tx.
type stx struct {
	*sql.Tx
	c *stmtCache
}

// begin prepares the texts noted since the last transaction, then begins
// one.
func (s *Store) begin(ctx context.Context) (*stx, error) {
	s.stmts.prepare(ctx, s.db)
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	return &stx{Tx: tx, c: &s.stmts}, nil
}

// ExecContext runs text in the transaction, prepared when it is.
func (t *stx) ExecContext(ctx context.Context, text string, args ...any) (sql.Result, error) {
	if st := t.c.get(text); st != nil {
		return t.Tx.StmtContext(ctx, st).ExecContext(ctx, args...)
	}
	return t.Tx.ExecContext(ctx, text, args...)
}

// QueryContext runs text in the transaction, prepared when it is.
func (t *stx) QueryContext(ctx context.Context, text string, args ...any) (*sql.Rows, error) {
	if st := t.c.get(text); st != nil {
		return t.Tx.StmtContext(ctx, st).QueryContext(ctx, args...)
	}
	return t.Tx.QueryContext(ctx, text, args...)
}

// sdb runs the store's statements outside a transaction, prepared when
// their text is.
type sdb struct {
	db *sql.DB
	c  *stmtCache
}

// QueryContext runs text, prepared when it is.
func (d sdb) QueryContext(ctx context.Context, text string, args ...any) (*sql.Rows, error) {
	if st := d.c.get(text); st != nil {
		return st.QueryContext(ctx, args...)
	}
	return d.db.QueryContext(ctx, text, args...)
}
