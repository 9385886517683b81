//go:build !race

package zlibx

const raceDetector = false
