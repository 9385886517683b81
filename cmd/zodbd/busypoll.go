package main

import (
	"time"

	"github.com/zodbd/zodbd/internal/busypoll"
)

// busyPollFlag is the value of --busy-poll (serve, neo-storage): "off"
// (the default), "on" (busypoll.DefaultSpin) or a duration ("30us").
type busyPollFlag struct{ spin time.Duration }

func (f *busyPollFlag) String() string {
	if f == nil || f.spin <= 0 {
		return "off"
	}
	return f.spin.String()
}

func (f *busyPollFlag) Set(s string) error {
	d, err := busypoll.ParseSpin(s)
	if err != nil {
		return err
	}
	f.spin = d
	return nil
}

// poller returns the server's busy-poller; nil when off.
func (f *busyPollFlag) poller() *busypoll.Poller { return busypoll.New(f.spin, 0) }

const busyPollUsage = "spin on a connection's socket for up to this long after answering before parking, " +
	"so that an active client's next request does not wait for an idle CPU to wake up: off, on (" +
	"50µs) or a duration; at most GOMAXPROCS/4 connections spin at once, a connection that finds " +
	"nothing spins less (docs/scheduling.md)"
