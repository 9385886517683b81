package zeo

import (
	"encoding/binary"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/leaktest"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// TestConnectionsLeaveNothing opens and ends connections in every way a
// long-running server meets them (closed before the handshake, after it,
// after register, in the middle of a frame, in a transaction before and
// after its vote, with replies unread, after a commit, after a malformed
// frame) many times over, and then checks that the server holds nothing
// for them: no goroutine, no connection in its tables or registered on
// the storage, no frame or queued-reply charge, no transaction memory,
// and the commit lock free (a new commit goes through).
func TestConnectionsLeaveNothing(t *testing.T) {
	for _, m := range []wire.Marshal{wire.Pickle, wire.Msgpack} {
		t.Run(fmt.Sprint(m), func(t *testing.T) { testConnectionsLeaveNothing(t, m) })
	}
}

func testConnectionsLeaveNothing(t *testing.T, m wire.Marshal) {
	stor := openWritable(t)
	srv, addr := startServerOn(t, Config{Storages: []StorageConfig{{Name: "1", Storage: stor}}, Marshal: m}, nil)
	c := dialRawRW(t, addr, m)
	var id int64 = 10
	serial := commitRaw(t, c, &id, 1, 0, []byte("first"))
	c.nc.Close()
	settle := func() {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			srv.mu.Lock()
			n := len(srv.conns)
			srv.mu.Unlock()
			if n == 0 {
				return
			}
		}
	}
	settle()
	base := leaktest.Goroutines()

	kinds := map[string]func(){
		"before handshake": func() {
			nc, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			nc.Close()
		},
		"after handshake": func() { dialRawNoRegister(t, addr, m).nc.Close() },
		"after register":  func() { dialRaw(t, addr, m).nc.Close() },
		"mid-frame": func() {
			c := dialRaw(t, addr, m)
			var hdr [4]byte
			binary.BigEndian.PutUint32(hdr[:], 4<<20)
			c.nc.Write(hdr[:])
			c.nc.Write(make([]byte, 2<<20))
			c.nc.Close()
		},
		"in a transaction": func() {
			c := dialRawRW(t, addr, m)
			beginRaw(c, 5, 2, 0, make([]byte, 100<<10))
			c.flush(t)
			c.nc.Close()
		},
		"voted": func() {
			c := dialRawRW(t, addr, m)
			beginRaw(c, 6, 1, serial, []byte("voted, never finished"))
			c.call(t, 20, "vote", func(e *wire.Encoder) { e.Int(6) }, 1) // holds the commit lock
			c.nc.Close()
		},
		"replies unread": func() {
			c := dialRaw(t, addr, m)
			for range 2000 {
				c.sendLoad(1, zodb.TidMax)
			}
			c.flush(t)
			c.nc.Close()
		},
		"after a commit": func() {
			c := dialRawRW(t, addr, m)
			id := int64(30)
			serial = commitRaw(t, c, &id, 1, serial, []byte("again"))
			c.nc.Close()
		},
		"malformed frame": func() {
			c := dialRaw(t, addr, m)
			c.enc.RawFrame([]byte("\xff\xfe not a message"))
			c.flush(t)
			c.nc.Close()
		},
	}
	for range 20 {
		for _, f := range kinds {
			f()
		}
	}
	settle()
	leaktest.Check(t, base)
	srv.mu.Lock()
	nconns := len(srv.conns)
	srv.mu.Unlock()
	st := srv.storages["1"]
	st.mu.Lock()
	registered := len(st.conns)
	st.mu.Unlock()
	if nconns != 0 || registered != 0 {
		t.Errorf("%d connections in the server's table, %d registered on the storage", nconns, registered)
	}
	if h, q, tm := srv.frameMem.Held(), srv.budget.Charged(), srv.txnMem.Used(); h != 0 || q != 0 || tm != 0 {
		t.Errorf("still charged: frames %d, queued replies %d, transaction memory %d", h, q, tm)
	}
	// The commit lock is free: a commit goes through.
	c = dialRawRW(t, addr, m)
	id = 40
	commitRaw(t, c, &id, 1, serial, []byte("last"))
	c.nc.Close()
}
