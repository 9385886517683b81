package storage_test

import (
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
)

// TestFrameMemory: the packets half received on all connections hold at
// most Config.MaxFramesTotal beyond 1 MiB each. A peer that sent 3 MiB of
// a 16 MiB packet (its identification) holds the reader's 4 MiB, charged
// 3; a second one doing the same passes the bound of 4 MiB and is closed;
// once the first goes, nothing is charged and a client is served.
func TestFrameMemory(t *testing.T) {
	c := startWriteCluster(t, newMemWriter(), nil, func(cfg *storage.Config) { cfg.MaxFramesTotal = 4 << 20 })
	held := func(want int64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for storage.FramesHeld(c.n) != want && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if got := storage.FramesHeld(c.n); got != want {
			t.Fatalf("packets hold %d bytes, want %d", got, want)
		}
	}
	part := func() net.Conn {
		t.Helper()
		nc, err := net.Dial("tcp", c.n.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close() })
		// The handshake, then [1, 1, bin32 of 16 MiB] with 3 MiB of it.
		b := append(proto.Handshake[:], 0x93, 0x01, 0x01, 0xc6, 0, 0, 0, 0)
		binary.BigEndian.PutUint32(b[len(b)-4:], 16<<20)
		nc.Write(append(b, make([]byte, 3<<20)...)) // may fail: closed before it sent it all
		return nc
	}
	a := part()
	held(3 << 20)
	b := part()
	expectClosed(t, b, "the second peer past the bound")
	held(3 << 20)
	a.Close()
	held(0)
	cl := c.client(-536870911)
	if got := cl.storeAnswer(cl.store(10, 1, 0, "x")); got != proto.InvalidTid {
		t.Fatal(got)
	}
}
