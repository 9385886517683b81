package storage_test

import (
	"testing"

	"github.com/zodbd/zodbd/neo/neotest"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
)

// TestSecondStorageLinkRefused: a storage node that the master announced
// with an id timestamp is already connected; a second peer identifies
// with the same node id, the same address and no id timestamp. It was
// accepted (identify: no id timestamp matches any; nothing refused a
// second link of a node, as NEO/py's "uuid conflict: retry later"), and
// storagePeerAt(addr) then picked either link at random for the reverse
// replication requests (revask.go). A peer that gives the node's own id
// is refused too (NEO/py: "uuid conflict or loopback connection").
func TestSecondStorageLinkRefused(t *testing.T) {
	c := startWriteCluster(t, newMemWriter(), nil)
	addr := proto.Address{Host: "127.0.0.1", Port: 1}
	c.notifyNodes(proto.NodeInfo{Type: proto.Storage, NID: 5, Addr: addr, State: proto.NodeRunning, IdTime: 7.5})
	c.sync()
	identify := func(ts float64) uint16 {
		l, err := neotest.Dial(c.n.Addr().String(), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		p, err := l.Ask(&proto.RequestIdentification{NodeType: proto.Storage, NID: 5, ClusterName: cluster, Addr: addr, IdTime: ts})
		if err != nil {
			t.Fatal(err)
		}
		return p.Code
	}
	if code := identify(7.5); code != proto.CodeAcceptIdentification {
		t.Fatalf("the real node: %s", proto.CodeName(code))
	}
	if code := identify(proto.NoIdTime); code == proto.CodeAcceptIdentification {
		t.Errorf("a second link identifying as connected storage node 5 (no id timestamp, same address) is accepted: %d storage links of node 5", storage.Peers(c.n))
	}
	l, err := neotest.Dial(c.n.Addr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if p, err := l.Ask(&proto.RequestIdentification{NodeType: proto.Storage, NID: c.n.NID(), ClusterName: cluster, IdTime: proto.NoIdTime}); err != nil || p.Code == proto.CodeAcceptIdentification {
		t.Errorf("a peer giving the node's own id (%d): %v %v, want refused", c.n.NID(), p.Code, err)
	}
}

