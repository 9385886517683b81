package zeo

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// TestHandshakeTimeout: a peer that connects and never answers the
// protocol announcement is disconnected after HandshakeTimeout; a client
// that did the handshake stays connected while idle for longer, and is
// served afterwards.
func TestHandshakeTimeout(t *testing.T) {
	fs := openFixture(t)
	const timeout = 300 * time.Millisecond
	addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: fs}}, HandshakeTimeout: timeout})

	silent, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	idle := dialRaw(t, addr, wire.Pickle) // handshake and register

	start := time.Now()
	silent.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := io.Copy(io.Discard, silent) // the announcement, then EOF when closed
	if err != nil || n == 0 {
		t.Fatalf("silent peer: read %d bytes, %v; want the announcement then the end", n, err)
	}
	if d := time.Since(start); d < timeout/2 || d > 5*time.Second {
		t.Errorf("silent peer closed after %v, want about %v", d, timeout)
	}

	time.Sleep(3 * timeout)
	oid := fs.Index().Oids()[0]
	r := idle.call(t, 2, "loadBefore", func(e *wire.Encoder) { e.Oid8(uint64(oid)); e.Oid8(uint64(zodb.TidMax)) }, 2)
	if r.Kind != wire.Tuple || len(r.Items) != 3 {
		t.Fatalf("a client idle for %v after its handshake: loadBefore answered %v", 3*timeout, r)
	}
}
