//go:build linux

package zeo

import (
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/zodbd/zodbd/zeo/wire"
)

// cork sets TCP_CORK on the client's socket: what it writes next is
// held back and leaves with the FIN of a Close or CloseWrite, in one
// segment, so that the request and the end of the stream reach the
// server in one readiness (deterministically, without a gated handler).
func cork(t *testing.T, nc net.Conn) {
	t.Helper()
	rc, err := nc.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_CORK, 1)
	}); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatal(serr)
	}
}

func connCount(srv *Server) int {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return len(srv.conns)
}

// TestEdgeReadVoteWaiterGoneWithFIN: a client votes while another holds
// the commit lock, and closes; its vote and its FIN arrive together (one
// segment). The edge-triggered loop waited for the poller after a call
// (awaited), counting on the reply to draw a reset from a gone client;
// but vote replies from its own goroutine only once it has the lock. The
// gone client's connection, goroutines and transaction stayed for as long
// as the holder kept the lock (for ever without TransactionTimeout).
func TestEdgeReadVoteWaiterGoneWithFIN(t *testing.T) {
	stor := openWritable(t)
	srv, addr := startServerOn(t, Config{Storages: []StorageConfig{{Name: "1", Storage: stor}}}, nil)
	a := dialRawRW(t, addr, wire.Pickle)
	if r := storeAndVote(t, a, 20, 5, true, 1, 0, []byte("a")); r.Len() != 0 {
		t.Fatalf("a's vote: %v", r)
	}
	// a holds the commit lock.
	b := dialRawRW(t, addr, wire.Pickle)
	b.tpcBegin(9)
	b.oneway("storea", 4, func(e *wire.Encoder) { e.Oid8(2); e.Oid8(0); e.Bytes([]byte("b")); e.Int(9) })
	// A call answered: the server has read everything before the vote.
	b.call(t, 29, "lastTransaction", func(e *wire.Encoder) {}, 0)
	cork(t, b.nc)
	b.send(t, 30, "vote", func(e *wire.Encoder) { e.Int(9) }, 1)
	b.nc.Close() // vote + FIN in one segment

	for deadline := time.Now().Add(10 * time.Second); connCount(srv) > 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the connection of a client that closed while its vote waited for the commit lock is still open after 10 s (%d connections, %v waiting for the lock)", connCount(srv), srv.status(srv.storages["1"])["waiting"])
		}
	}
}
