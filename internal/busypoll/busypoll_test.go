package busypoll

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// pair returns both ends of a TCP connection on 127.0.0.1.
func pair(t *testing.T) (server, client net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			t.Error(err)
		}
		ch <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-ch
	t.Cleanup(func() { server.Close(); client.Close() })
	return server, client
}

func TestNoPollerIsTheConn(t *testing.T) {
	s, _ := pair(t)
	if r := NewReader(s, nil); r != io.Reader(s) {
		t.Fatalf("NewReader(conn, nil) = %T, want the conn itself", r)
	}
	if New(0, 4) != nil {
		t.Fatal("New(0, …) is not nil: a zero spin must mean no busy-polling")
	}
	tc := tls.Server(s, &tls.Config{})
	if r := NewReader(tc, New(DefaultSpin, 1)); r != io.Reader(tc) {
		t.Fatalf("NewReader(tls conn) = %T, want the conn itself", r)
	}
}

// The reader reads what the connection would: data, EOF, deadlines.
func TestReadSemantics(t *testing.T) {
	s, c := pair(t)
	r := NewReader(s, New(time.Millisecond, 1))
	if _, ok := r.(*Reader); !ok {
		t.Fatalf("NewReader(tcp conn) = %T, want *Reader", r)
	}
	go func() {
		c.Write([]byte("hello"))
		time.Sleep(5 * time.Millisecond) // past the spin: the reader parks, then wakes
		c.Write([]byte(" world"))
		c.(*net.TCPConn).CloseWrite()
	}()
	got, err := io.ReadAll(r)
	if err != nil || string(got) != "hello world" {
		t.Fatalf("ReadAll = %q, %v; want \"hello world\", nil", got, err)
	}

	s2, _ := pair(t)
	r2 := NewReader(s2, New(time.Millisecond, 1))
	s2.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	buf := make([]byte, 10)
	if n, err := r2.Read(buf); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read past the deadline = %d, %v; want 0, deadline exceeded", n, err)
	}
	s2.Close()
	if _, err := r2.Read(buf); err == nil {
		t.Fatal("Read of a closed conn returned no error")
	}
}

// A client that sends its next request as soon as it has the reply is
// caught by the spin; the slots are never exceeded; an idle client stops
// costing spins.
func TestSpinCatchesActiveClientAndBacksOff(t *testing.T) {
	p := New(2*time.Millisecond, 1)
	const conns, rounds = 3, 300
	var maxSeen atomic.Int32
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if n := p.spinning.Load(); n > maxSeen.Load() {
				maxSeen.Store(n)
			}
		}
	}()
	var wg sync.WaitGroup
	for i := 0; i < conns; i++ {
		s, c := pair(t)
		wg.Add(2)
		go func() { // server: echo through the busy-polling reader
			defer wg.Done()
			r := NewReader(s, p)
			buf := make([]byte, 64)
			for {
				n, err := r.Read(buf)
				if err != nil {
					return
				}
				s.Write(buf[:n])
			}
		}()
		go func() { // client: ping-pong
			defer wg.Done()
			defer c.Close()
			buf := make([]byte, 64)
			for j := 0; j < rounds; j++ {
				if _, err := c.Write([]byte("ping")); err != nil {
					t.Error(err)
					return
				}
				if _, err := io.ReadFull(c, buf[:4]); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	spins, hits := p.Stats()
	// How many spins find data depends on the CPUs free for the clients
	// (a loaded 2-CPU machine leaves them few): only require that some do.
	t.Logf("ping-pong clients: %d spins, %d found data", spins, hits)
	if hits == 0 {
		t.Errorf("ping-pong clients: %d spins, none found the next request", spins)
	}
	if m := maxSeen.Load(); m > 1 {
		t.Errorf("%d readers spun at once; the poller allows 1", m)
	}
	if n := p.spinning.Load(); n != 0 {
		t.Errorf("%d slots still taken after every reader returned", n)
	}

	// An idle client: requests 10 ms apart, 5 times the spin. After a few
	// empty spins the connection spins no more.
	p2 := New(2*time.Millisecond, 1)
	s, c := pair(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		r := NewReader(s, p2)
		buf := make([]byte, 64)
		for {
			if _, err := r.Read(buf); err != nil {
				return
			}
		}
	}()
	for j := 0; j < 20; j++ {
		c.Write([]byte("x"))
		time.Sleep(10 * time.Millisecond)
	}
	c.Close()
	<-done
	if spins, _ := p2.Stats(); spins > 12 {
		t.Errorf("idle client: %d spins over 20 requests; want the spins to stop after a few empty ones", spins)
	}
}
