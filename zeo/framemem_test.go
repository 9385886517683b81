package zeo

import (
	"encoding/binary"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/zodbd/zodbd/zeo/wire"
)

// TestFrameMemory: the frames half received on all connections hold at
// most Config.MaxFramesTotal beyond 1 MiB each. A connection that sent 3
// MiB of a 16 MiB frame holds its buffer's 4 MiB, charged 3; a second one
// doing the same passes the bound of 4 MiB and is closed; once the first
// ends, nothing is charged and a new client is served. Over TCP
// (edgeread.go) and a Unix socket (the buffered loop).
func TestFrameMemory(t *testing.T) {
	for _, network := range []string{"tcp", "unix"} {
		t.Run(network, func(t *testing.T) {
			addr := "127.0.0.1:0"
			if network == "unix" {
				addr = filepath.Join(t.TempDir(), "zeo.sock")
			}
			ln, err := net.Listen(network, addr)
			if err != nil {
				t.Fatal(err)
			}
			srv, addr := serveListener(t, Config{Storages: []StorageConfig{{Name: "1", Storage: openFixture(t)}}, MaxFramesTotal: 4 << 20},
				func(ln net.Listener) net.Listener { return ln }, ln)
			held := func(want int64) {
				t.Helper()
				deadline := time.Now().Add(5 * time.Second)
				for srv.frameMem.Held() != want && time.Now().Before(deadline) {
					time.Sleep(5 * time.Millisecond)
				}
				if got := srv.frameMem.Held(); got != want {
					t.Fatalf("frames hold %d bytes, want %d", got, want)
				}
			}
			part := func(c *rawClient) error {
				t.Helper()
				c.flush(t) // the handshake's answer
				b := make([]byte, 4+3<<20)
				binary.BigEndian.PutUint32(b, 16<<20)
				_, err := c.nc.Write(b)
				return err
			}
			a := dialRawNoRegister(t, addr, wire.Pickle)
			if err := part(a); err != nil {
				t.Fatal(err)
			}
			held(3 << 20)
			b := dialRawNoRegister(t, addr, wire.Pickle)
			part(b) // may fail: closed before it sent it all
			b.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := b.br.ReadByte(); err == nil {
				t.Fatal("the second connection past the bound is still open")
			} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("the second connection past the bound is still open")
			}
			held(3 << 20)
			a.nc.Close()
			held(0)
			c := dialRaw(t, addr, wire.Pickle)
			c.call(t, 2, "lastTransaction", func(e *wire.Encoder) {}, 0)
		})
	}
}
