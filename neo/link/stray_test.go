package link

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zodbd/zodbd/neo/proto"
)

// TestUnexpectedAnswersLogBounded: answers that match no request are
// dropped (an Ask abandoned gets its answer late), and were logged one
// line each: a peer sent 4-byte packets that each cost a log line,
// without bound. 20000 of them must not make 20000 log lines.
func TestUnexpectedAnswersLogBounded(t *testing.T) {
	const n = 20000
	addr := rawServer(t, func(nc net.Conn) {
		var b []byte
		b = append(b, proto.Handshake[:]...)
		for i := 0; i < n; i++ {
			b = proto.AppendPacket(b, uint32(1000+i), &proto.Pong{})
		}
		b = proto.AppendPacket(b, 7, &proto.Ping{}) // then a request: all before it was read
		nc.Write(b)
		time.Sleep(2 * time.Second)
	})
	var lines atomic.Int64
	c, err := DialOptions(context.Background(), "tcp", addr, &Options{Logf: func(string, ...any) { lines.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if r, err := c.Recv(); err == nil {
			r.Release()
		}
	}()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("nothing within 10 s")
	}
	if c.Err() == nil && lines.Load() > 100 {
		t.Errorf("%d unexpected answers: %d log lines and the connection still open", n, lines.Load())
	}
}
