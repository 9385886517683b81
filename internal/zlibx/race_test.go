//go:build race

package zlibx

// raceDetector: the tests run under the race detector, which makes the
// big allocation tests 10 times slower and checks nothing in them (they
// run on one goroutine): those skip.
const raceDetector = true
