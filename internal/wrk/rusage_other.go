//go:build !unix

package wrk

import "time"

// processCPU is not available here: the CPU time is reported as 0.
func processCPU() time.Duration { return 0 }
