//go:build linux

package zeo

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"net"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// TestSendBlobWaitsForRoom: sendBlob writes the blob in 1 MiB
// steps with conn.flush, which returns at once, writing nothing, while
// another goroutine is writing (the Writer's own, sending an
// invalidation to a client that stopped reading); it did not wait for
// room (WaitRoom) inside the loop, so the whole blob was queued in memory,
// far past MaxQueued, for a client that did not read it.
func TestSendBlobWaitsForRoom(t *testing.T) {
	const maxQueued = 2 << 20
	blobDir := filepath.Join(t.TempDir(), "blobs")
	srv, addr := startServerOn(t, Config{Storages: []StorageConfig{{Name: "1", Storage: openWritable(t), BlobDir: blobDir}}, MaxQueued: maxQueued}, nil)
	w := dialRawRW(t, addr, wire.Pickle)
	content := bytes.Repeat([]byte("0123456789abcdef"), 1<<20) // 16 MiB
	w.tpcBegin(5)
	w.storeBlob(5, 7, []byte("pickle of a Blob"), content)
	if r := w.call(t, 3, "vote", func(e *wire.Encoder) { e.Int(5) }, 1); r.Len() != 0 {
		t.Fatalf("vote: %v", r)
	}
	r := w.call(t, 4, "tpc_finish", func(e *wire.Encoder) { e.Int(5) }, 1)
	tid := zodb.Tid(binary.BigEndian.Uint64(r.B))

	// x: a client with small socket buffers that will stop reading.
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		return rc.Control(func(fd uintptr) { syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	}}
	nc, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	x := &rawClient{nc: nc, br: bufio.NewReader(nc), dec: wire.NewDecoder(wire.Pickle), enc: wire.Encoder{M: wire.Pickle}}
	if _, err := wire.ReadFrame(x.br, nil, 100); err != nil {
		t.Fatal(err)
	}
	x.enc.RawFrame([]byte{byte(wire.Pickle), '5'})
	x.call(t, 1, "register", func(e *wire.Encoder) { e.Str("1"); e.Bool(true) }, 2)
	var xc *conn
	srv.mu.Lock()
	for c := range srv.conns {
		if c.peer == nc.LocalAddr().String() {
			xc = c
		}
	}
	srv.mu.Unlock()
	xc.nc.(*net.TCPConn).SetWriteBuffer(4096)

	// w commits until x's invalidations back up behind a write in
	// progress (the Writer's goroutine, blocked: x does not read).
	var id int64 = 100
	var serial zodb.Tid
	blocked := func() bool { // a write in progress that does not progress, and more queued
		last := xc.out.Written()
		for range 10 {
			time.Sleep(20 * time.Millisecond)
			if xc.out.Written() != last || xc.out.Queued() == 0 {
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(10 * time.Second); !blocked(); {
		if time.Now().After(deadline) {
			t.Fatal("x's invalidations never backed up")
		}
		const txnID = 9
		w.tpcBegin(txnID)
		for oid := zodb.Oid(100); oid < 1100; oid++ {
			w.oneway("storea", 4, func(e *wire.Encoder) { e.Oid8(uint64(oid)); e.Oid8(uint64(serial)); e.Bytes([]byte("v")); e.Int(txnID) })
		}
		id++
		w.call(t, id, "vote", func(e *wire.Encoder) { e.Int(txnID) }, 1)
		id++
		r := w.call(t, id, "tpc_finish", func(e *wire.Encoder) { e.Int(txnID) }, 1)
		serial = zodb.Tid(binary.BigEndian.Uint64(r.B))
	}
	// x asks for the blob and reads nothing.
	idv := wire.Value{Kind: wire.Int, Int: 10}
	x.enc.BeginRequest(&idv, false, "sendBlob")
	x.enc.BeginTuple(2)
	x.enc.Oid8(7)
	x.enc.Oid8(uint64(tid))
	x.enc.EndTuple(2)
	x.enc.EndMessage()
	x.flush(t)
	most := 0
	for deadline := time.Now().Add(1500 * time.Millisecond); time.Now().Before(deadline) && most <= 2*maxQueued; time.Sleep(10 * time.Millisecond) {
		most = max(most, xc.out.Queued())
	}
	if most > 2*maxQueued {
		t.Fatalf("%d bytes queued for a client that does not read, MaxQueued %d (budget charged %d)", most, maxQueued, srv.budget.Charged())
	}
}
