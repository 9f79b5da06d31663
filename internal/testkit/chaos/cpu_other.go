//go:build !unix

package chaos

import "time"

// cpuTime is not measured here.
func cpuTime() time.Duration { return 0 }
