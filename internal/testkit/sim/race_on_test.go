//go:build race

package sim

// raceOn: the race detector slows every seed several times over.
const raceOn = true
