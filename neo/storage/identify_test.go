package storage_test

import (
	"testing"

	"github.com/zodbd/zodbd/neo/neotest"
	"github.com/zodbd/zodbd/neo/proto"
)

// TestOwnNodeIDRefused: a storage peer that gives the node's own id (a
// loopback, or a node started with another's identity) was accepted; it
// is refused now (NEO/py: "uuid conflict or loopback connection").
func TestOwnNodeIDRefused(t *testing.T) {
	c := startWriteCluster(t, newMemWriter(), nil)
	l, err := neotest.Dial(c.n.Addr().String(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if p, err := l.Ask(&proto.RequestIdentification{NodeType: proto.Storage, NID: c.n.NID(), ClusterName: cluster, IdTime: proto.NoIdTime}); err != nil || p.Code == proto.CodeAcceptIdentification {
		t.Errorf("a peer giving the node's own id (%d): %v %v, want refused", c.n.NID(), p.Code, err)
	}
}
