// Package sim is a deterministic simulation of sbclaim: the real
// processor replicas, reconciler and SQLite store run inside a
// testing/synctest bubble (fake time, the store's clock included) against
// the in-memory broker and a downstream in the same process, while a seed
// decides the messages, the faults of the broker, the store and the
// downstream, and the crashes and freezes of the replicas. TestSimulation
// runs many seeds and checks the exactly-once invariants from the
// simulated world's own ledger; -sim.seed=N replays one seed.
package sim
