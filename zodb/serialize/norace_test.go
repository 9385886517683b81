//go:build !race

package serialize_test

const raceDetector = false
