package storage_test

import (
	"context"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zodbd/zodbd/neo/neotest"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
)

// secondaryMaster answers every identification as a NEO/py secondary
// master does: NotPrimaryMaster(index of the primary in its own list of
// masters, that list), then closes. It counts the connections.
func secondaryMaster(t *testing.T, known []proto.Address, primary int) (addr string, conns *atomic.Int32) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	conns = new(atomic.Int32)
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer nc.Close()
				nc.Write(proto.Handshake[:])
				r := proto.NewReader(nc)
				if r.ReadHandshake() != nil {
					return
				}
				if _, err := r.ReadPacket(); err != nil { // RequestIdentification
					return
				}
				nc.Write(proto.AppendPacket(nil, 0, &proto.NotPrimaryMaster{Primary: primary, KnownMasters: known}))
				time.Sleep(100 * time.Millisecond)
			}()
		}
	}()
	return ln.Addr().String(), conns
}

func tcpAddr(t *testing.T, s string) proto.Address {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	return proto.Address{Host: host, Port: uint16(p)}
}

// TestNotPrimaryMaster gives the node a secondary master first in its
// list. The secondary names the primary by its index in the secondary's
// own list, in another order than the node's: the node must go to that
// address (once), not to the same index of its own list (the secondary
// again, in a loop).
func TestNotPrimaryMaster(t *testing.T) {
	m, err := neotest.NewMaster(neotest.MasterConfig{Cluster: cluster})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go m.Serve(ctx)
	var secondary string
	var conns *atomic.Int32
	// The secondary's list: [primary, secondary]; index 0 is the primary.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	placeholder := ln.Addr().String()
	ln.Close()
	secondary, conns = secondaryMaster(t, []proto.Address{tcpAddr(t, m.Addr()), tcpAddr(t, placeholder)}, 0)

	be := testFS1(t)
	n, err := storage.New(storage.Config{
		Cluster: cluster, Masters: []string{secondary, m.Addr()}, Bind: "127.0.0.1:0", Backend: be,
		Logger: neotest.Logger(), RetryInterval: 200 * time.Millisecond, IdentifyTimeout: time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- n.Run(ctx) }()
	select {
	case <-m.Running():
	case err := <-done:
		t.Fatalf("node stopped: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatalf("cluster did not start; the secondary saw %d connections", conns.Load())
	}
	if c := conns.Load(); c != 1 {
		t.Errorf("the secondary saw %d connections, want 1", c)
	}
	cancel()
	<-done
}
