// Package groupcommit writes the claim outcomes of concurrently finishing
// messages together: MarkProcessed, Release, Heartbeat and RecordAttempt
// calls that arrive while a write is running are collected (bounded by
// count) and written in one guarded statement per kind, in one
// transaction, by the store's WriteOutcomes; each caller gets its own
// result. A lone call is written at once.
package groupcommit
