package netconn

import (
	"errors"
	"net"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"
)

// errListener returns its errors in turn, then its connection, then
// net.ErrClosed.
type errListener struct {
	net.Listener
	errs []error
	nc   net.Conn
}

func (l *errListener) Accept() (net.Conn, error) {
	if len(l.errs) > 0 {
		err := l.errs[0]
		l.errs = l.errs[1:]
		return nil, err
	}
	if l.nc != nil {
		nc := l.nc
		l.nc = nil
		return nc, nil
	}
	return nil, net.ErrClosed
}

func opErr(errno syscall.Errno) error {
	return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept", errno)}
}

func TestAccept(t *testing.T) {
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	errs := []error{opErr(syscall.EMFILE), opErr(syscall.ENFILE), opErr(syscall.ENOBUFS), opErr(syscall.ENOMEM), opErr(syscall.EPROTO), opErr(syscall.EPERM)}
	ln := &errListener{errs: slices.Clone(errs), nc: c1}
	var got []error
	var delays []time.Duration
	nc, err := Accept(ln, func(err error, d time.Duration) bool {
		got, delays = append(got, err), append(delays, d)
		return true
	})
	if nc != c1 || err != nil {
		t.Fatalf("Accept = %v, %v; want the connection", nc, err)
	}
	if !slices.Equal(got, errs) {
		t.Errorf("retry saw %v, want %v", got, errs)
	}
	want := []time.Duration{5, 10, 20, 40, 80, 160}
	for i := range want {
		want[i] *= time.Millisecond
	}
	if !slices.Equal(delays, want) {
		t.Errorf("delays %v, want %v", delays, want)
	}

	// A closed listener ends Accept without a retry.
	if _, err := Accept(ln, func(error, time.Duration) bool { t.Error("retry after close"); return true }); !errors.Is(err, net.ErrClosed) {
		t.Errorf("closed: %v", err)
	}

	// retry's false ends it with the error; the delay grows to 1 s at most.
	var last time.Duration
	n := 0
	ln = &errListener{errs: slices.Repeat([]error{opErr(syscall.EMFILE)}, 20)}
	_, err = Accept(ln, func(err error, d time.Duration) bool {
		n++
		last = d
		return d < time.Second
	})
	if !errors.Is(err, syscall.EMFILE) || last != time.Second || n != 9 {
		t.Errorf("Accept = %v after %d retries, last delay %v; want EMFILE after 9, 1s", err, n, last)
	}
}

func TestListener(t *testing.T) {
	c1, c2 := net.Pipe()
	defer c1.Close()
	defer c2.Close()
	var logged []error
	ln := Listener(&errListener{errs: []error{opErr(syscall.ENOBUFS), opErr(syscall.EPROTO)}, nc: c1}, func(err error, d time.Duration) {
		logged = append(logged, err)
	})
	if nc, err := ln.Accept(); nc != c1 || err != nil || len(logged) != 2 {
		t.Fatalf("Accept = %v, %v after logging %v; want the connection after 2 errors", nc, err, logged)
	}
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("closed: %v", err)
	}
}
