// Package busypoll lets a server's connection readers spin on their sockets
// for a bounded time before parking, so that the next request of an active
// client finds its reader running instead of paying for the wake-up of an
// idle CPU (tens of µs on a VM whose idle vCPUs halt; see
// docs/scheduling.md). It is what the kernel's SO_BUSY_POLL does for NIC
// queues and what Erlang's schedulers do before sleeping, applied to the
// goroutine that reads a connection.
//
// A Poller holds the budget shared by the readers of one server: at most
// Max readers spin at a time (the CPUs they burn are the cost); a reader
// that cannot get a slot parks at once, as without busy-polling. Each
// Reader adapts on its own: a spin that ends without data halves the next
// spin of that connection (down to nothing: an idle client costs no CPU
// after a few requests), a spin that finds data restores the full
// duration. Only a reader about to spin touches the shared slot count; a
// reader that finds data waiting never does.
package busypoll

import (
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// DefaultSpin is the spin of `--busy-poll on`: longer than the round trip
// of a client that sends its next request as soon as it has the reply
// (10–60 µs on loopback), shorter than the pause of a client that does
// anything else.
const DefaultSpin = 50 * time.Microsecond

// ParseSpin parses a busy-poll setting (--busy-poll, zeo.conf's busy-poll):
// "off" (0: no spinning), "on" (DefaultSpin) or a duration up to 10ms.
func ParseSpin(s string) (time.Duration, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "off", "false", "no", "0":
		return 0, nil
	case "on", "true", "yes":
		return DefaultSpin, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("want off, on or a duration such as 50us, not %q", s)
	}
	if d > 10*time.Millisecond {
		return 0, fmt.Errorf("%s: a spin longer than 10ms burns a CPU for nothing: the wake-up it saves is tens of µs", d)
	}
	return d, nil
}

// minSpin is the spin below which a reader stops spinning altogether,
// until data arrives quickly again.
const minSpin = 2 * time.Microsecond

// A Poller is the spinning budget of one server. The zero Poller and a nil
// *Poller never spin.
type Poller struct {
	spin     time.Duration // the longest spin of one read
	max      int32         // readers spinning at once, at most
	spinning atomic.Int32  // readers spinning now

	// Statistics, for tests and reports.
	spins atomic.Uint64 // spins started
	hits  atomic.Uint64 // spins that found data
}

// New returns a Poller whose readers spin for at most spin per read, at
// most maxSpinners of them at once; maxSpinners <= 0 means
// max(1, GOMAXPROCS/4): a spinner holds a CPU, and with many connections
// busy the CPUs are not idle anyway, while spinners would take them from
// the work (and, in a benchmark, from the clients on the same machine:
// with GOMAXPROCS/2 spinners the p99 of 16 connections on 16 CPUs went
// from 0.24 to 0.97 ms). A spin <= 0 returns nil: no busy-polling.
func New(spin time.Duration, maxSpinners int) *Poller {
	if spin <= 0 {
		return nil
	}
	if maxSpinners <= 0 {
		maxSpinners = max(1, runtime.GOMAXPROCS(0)/4)
	}
	return &Poller{spin: spin, max: int32(maxSpinners)}
}

// Spin returns the longest spin of one read; 0 for a nil Poller.
func (p *Poller) Spin() time.Duration {
	if p == nil {
		return 0
	}
	return p.spin
}

// MaxSpinners returns how many readers may spin at once.
func (p *Poller) MaxSpinners() int {
	if p == nil {
		return 0
	}
	return int(p.max)
}

// Stats returns the spins started and those that found data.
func (p *Poller) Stats() (spins, hits uint64) {
	if p == nil {
		return 0, 0
	}
	return p.spins.Load(), p.hits.Load()
}

func (p *Poller) acquire() bool {
	for {
		n := p.spinning.Load()
		if n >= p.max {
			return false
		}
		if p.spinning.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

func (p *Poller) release() { p.spinning.Add(-1) }

// Reader reads a connection, spinning before it parks. Like the connection,
// it is for one reading goroutine.
type Reader struct {
	c    net.Conn
	rc   syscall.RawConn
	p    *Poller
	next time.Duration // this connection's next spin
}

// NewReader returns a reader of c that busy-polls with p's budget. Where
// there is nothing to spin on — p is nil, or c is not a plain socket (a
// TLS connection reads through its record layer) — it returns c itself.
func NewReader(c net.Conn, p *Poller) io.Reader {
	if p == nil {
		return c
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return c
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return c
	}
	return &Reader{c: c, rc: rc, p: p, next: p.spin}
}

// Read reads into b as the connection's Read does (deadlines included): it
// returns what is waiting; when nothing is, it spins (if this connection's
// spin is not spent and a slot is free) re-reading the socket, and parks in
// the runtime's poller when the spin ends empty.
func (r *Reader) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	var (
		n        int
		rerr     error
		spinning bool
		deadline time.Time
		parked   time.Time // when the reader parked; zero before
		tries    int
	)
	err := r.rc.Read(func(fd uintptr) bool {
		for {
			n, rerr = syscall.Read(int(fd), b)
			if rerr == syscall.EINTR {
				continue
			}
			if rerr != syscall.EAGAIN {
				switch {
				case spinning: // data came while spinning: spin fully next time
					r.p.release()
					spinning = false
					r.p.hits.Add(1)
					r.next = r.p.spin
				case !parked.IsZero() && r.next < r.p.spin && time.Since(parked) < r.p.spin:
					// The client came back within a spin of parking: it
					// is active again, spinning would have caught it.
					r.next = r.p.spin
				}
				return true
			}
			if tries == 0 && parked.IsZero() && r.next >= minSpin && r.p.acquire() {
				spinning = true
				deadline = time.Now().Add(r.next)
				r.p.spins.Add(1)
			}
			tries++
			if spinning && time.Now().After(deadline) {
				r.p.release()
				spinning = false
				r.next /= 2 // an idle client: spin less, then not at all
			}
			if !spinning {
				parked = time.Now()
				return false // park until the socket is readable
			}
			if tries&63 == 0 {
				runtime.Gosched() // let the goroutines this P holds run
			}
		}
	})
	if spinning { // rc.Read failed (deadline, close) before the slot was released
		r.p.release()
	}
	if err != nil {
		return 0, err
	}
	if rerr != nil {
		return 0, &net.OpError{Op: "read", Net: r.c.LocalAddr().Network(), Source: r.c.LocalAddr(),
			Addr: r.c.RemoteAddr(), Err: rerr}
	}
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}
