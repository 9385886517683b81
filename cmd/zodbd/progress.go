package main

import (
	"fmt"
	"os"
	"time"
)

// progressLine draws a one-line progress report on stderr, at most ten
// times a second and once more when done reaches total, when on (stderr a
// terminal, and not asked to be quiet). pack, backup and restore use it.
type progressLine struct {
	on    bool
	start time.Time
	last  time.Time
	drawn bool
}

func newProgressLine(quiet bool) progressLine {
	return progressLine{on: !quiet && isTerminal(os.Stderr), start: time.Now()}
}

// draw draws the line format returns for pct, done of total in percent,
// unless the last one was drawn less than 100 ms ago.
func (p *progressLine) draw(done, total int64, format func(pct float64) string) {
	if !p.on || time.Since(p.last) < 100*time.Millisecond && done < total {
		return
	}
	p.last = time.Now()
	pct := 100.0
	if total > 0 {
		pct = 100 * float64(done) / float64(total)
	}
	fmt.Fprintf(os.Stderr, "\r%-78s", format(pct))
	p.drawn = true
}

// clear erases the line, if one was drawn, before other output.
func (p *progressLine) clear() {
	if p.drawn {
		fmt.Fprintf(os.Stderr, "\r%78s\r", "")
		p.drawn = false
	}
}
