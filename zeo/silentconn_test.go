package zeo

import (
	"testing"

	"github.com/zodbd/zodbd/internal/leaktest"
)

// TestSilentConnectionMemory: connections that take the announcement and
// send nothing are held until the handshake timeout, with no bound on
// their number; each must cost little. A connection allocated its 64 KiB
// read buffer, a 64 KiB reply buffer and a 64 KiB load buffer at once:
// some 200 KiB for a peer that sent nothing.
func TestSilentConnectionMemory(t *testing.T) {
	addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: openFixture(t)}}})
	per := leaktest.SilentConnHeap(t, addr, 200, 6) // the announcement's frame
	t.Logf("200 silent connections: %d bytes of heap each", per)
	if per > 32<<10 {
		t.Errorf("a connection that sent nothing holds %d bytes of heap (want < 32 KiB)", per)
	}
}
