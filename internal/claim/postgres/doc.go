// Package postgres is the claim.Store for PostgreSQL, through pgx's
// database/sql driver ("pgx").
//
// The claims unique index ux_claims_message_consumer is the only arbiter of
// duplicates: ClaimBatch sends the whole batch in one statement
// (INSERT ... SELECT FROM unnest(...) ON CONFLICT (message_id, consumer)
// DO NOTHING RETURNING, with a CTE that also finds the existing rows of the
// keys that did not insert). It returns each row's id, key and clock
// columns only: an inserted row is built from the batch's own values
// (sqlstore.Inserted), and the existing rows, when there are any (a
// redelivery), are read whole by a second statement. An insert that
// waited for a concurrent claimer's commit skips the row but cannot see it
// in the statement's snapshot; only then the key is tried again. So a
// batch of new keys costs one round trip, and one with existing keys two.
//
// All times come from now() (transaction start, UTC). Guarded updates keep
// their staleness and state predicates in the UPDATE's own WHERE, so READ
// COMMITTED re-checks them on the latest row version: a claim processed or
// heartbeated while FlagStale waited for its row lock is not flagged.
//
// TryLock uses a session advisory lock (pg_try_advisory_lock) held on a
// dedicated connection until unlock.
package postgres
