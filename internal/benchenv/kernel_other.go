//go:build !linux

package benchenv

import "runtime"

func kernel() string { return runtime.GOOS + " " + runtime.GOARCH }
