package netconn

import (
	"errors"
	"net"
	"time"
)

// The delays of Accept: the first after an error, and the most while
// errors follow each other.
const (
	acceptMinDelay = 5 * time.Millisecond
	acceptMaxDelay = time.Second
)

// Accept returns the next connection of ln. An error of ln.Accept does
// not end a listener that is still open: the process or the system may be
// out of file descriptors or kernel memory for a while (EMFILE, ENFILE,
// ENOBUFS, ENOMEM: the connections wait in the listen queue until some
// are closed), and Linux reports the network errors of one connection
// still in the queue (EPROTO, ENETUNREACH, EPERM from a firewall rule, ...)
// as an error of accept that a server must not take for its own end. So
// after an error, Accept calls retry(err, delay) and, if it returns true,
// waits delay (5 ms, doubling up to 1 s while errors follow each other)
// and accepts again. It returns the error when ln is closed
// (net.ErrClosed) or retry returns false: retry is where the caller logs
// the error and says whether it is still serving.
func Accept(ln net.Listener, retry func(err error, delay time.Duration) bool) (net.Conn, error) {
	var delay time.Duration
	for {
		nc, err := ln.Accept()
		if err == nil || errors.Is(err, net.ErrClosed) {
			return nc, err
		}
		delay = min(max(2*delay, acceptMinDelay), acceptMaxDelay)
		if !retry(err, delay) {
			return nil, err
		}
		time.Sleep(delay)
	}
}

// Listener returns ln with an Accept that is Accept's: through errors
// that do not end a listener, each given to logf with the delay before
// the next try (for servers whose accept loop is not ours: net/http's
// stops at the first error it does not take for temporary).
func Listener(ln net.Listener, logf func(err error, delay time.Duration)) net.Listener {
	return retryListener{ln, logf}
}

type retryListener struct {
	net.Listener
	logf func(err error, delay time.Duration)
}

func (l retryListener) Accept() (net.Conn, error) {
	return Accept(l.Listener, func(err error, delay time.Duration) bool {
		l.logf(err, delay)
		return true
	})
}
