package storage_test

import (
	"testing"

	"github.com/zodbd/zodbd/internal/leaktest"
	"github.com/zodbd/zodbd/neo/proto"
)

// TestSilentConnectionMemory: connections that send nothing are held until
// the handshake timeout, with no bound on their number; each must cost
// little: the node allocated a 32 KiB read buffer before the peer's first
// byte (link.Handshake -> proto.Reader.ReadHandshake -> fill).
func TestSilentConnectionMemory(t *testing.T) {
	c := startCluster(t, testFS1(t))
	per := leaktest.SilentConnHeap(t, c.node.Addr().String(), 300, len(proto.Handshake))
	t.Logf("300 silent connections: %d bytes of heap each", per)
	if per > 16<<10 {
		t.Errorf("a connection that sent nothing holds %d bytes of heap (want < 16 KiB): nothing bounds the number of such connections", per)
	}
}
