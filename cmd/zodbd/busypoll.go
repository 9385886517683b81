package main

import (
	"fmt"
	"strings"
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
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "off", "false", "no", "0":
		f.spin = 0
		return nil
	case "on", "true", "yes":
		f.spin = busypoll.DefaultSpin
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return fmt.Errorf("want off, on or a duration such as 50us, not %q", s)
	}
	if d > 10*time.Millisecond {
		return fmt.Errorf("%s: a spin longer than 10ms burns a CPU for nothing: the wake-up it saves is tens of µs", d)
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
