//go:build !unix

package opstats

import "time"

// ProcessCPU returns the CPU time this process has used so far, and
// whether the system tells it: not here.
func ProcessCPU() (time.Duration, bool) { return 0, false }
