package zeo

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/zeo/wire"
)

// TestMaxTxnBytes: with Config.MaxTxnBytes, a transaction whose records,
// or whose blob upload, pass the bound fails at its vote with a
// StorageError naming it, and what it sent past the bound is not kept (no
// blob upload file stays); the connection goes on, and its next, small,
// transaction commits. (Without it a client could fill the server's
// $TMPDIR with a transaction that could never commit.)
func TestMaxTxnBytes(t *testing.T) {
	blobDir := filepath.Join(t.TempDir(), "blobs")
	addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: openWritable(t), BlobDir: blobDir}},
		Marshal: wire.Pickle, MaxTxnBytes: 4096})
	c := dialRawRW(t, addr, wire.Pickle)
	refused := func(txnID, id int64) {
		t.Helper()
		c.send(t, id, "vote", func(e *wire.Encoder) { e.Int(txnID) }, 1)
		msg := c.read(t)
		if msg.Flags.Int == 0 {
			t.Fatalf("transaction %d over the limit: vote succeeded: %v", txnID, msg.Args)
		}
		if s := msg.Args.String(); !strings.Contains(s, "StorageError") || !strings.Contains(s, "limit of 4096 bytes") {
			t.Errorf("transaction %d: vote's error %s, want the limit named", txnID, s)
		}
		c.call(t, id+1, "tpc_abort", func(e *wire.Encoder) { e.Int(txnID) }, 1)
	}

	// Records: three of 2000 bytes.
	c.tpcBegin(1)
	for i := range 3 {
		data := make([]byte, 2000)
		c.oneway("storea", 4, func(e *wire.Encoder) { e.Oid8(uint64(10 + i)); e.Oid8(0); e.Bytes(data); e.Int(1) })
	}
	refused(1, 2)

	// A blob of 64 KiB: its upload is dropped once past the bound.
	c.tpcBegin(2)
	c.storeBlob(2, 20, []byte("pickle of a Blob"), make([]byte, 64<<10))
	refused(2, 4)
	if ents, err := os.ReadDir(filepath.Join(blobDir, "tmp")); err != nil || len(ents) != 0 {
		t.Errorf("blob uploads left in tmp/ after the refused transaction: %d (%v)", len(ents), err)
	}

	// The connection goes on.
	c.tpcBegin(3)
	c.oneway("storea", 4, func(e *wire.Encoder) { e.Oid8(30); e.Oid8(0); e.Bytes([]byte("small")); e.Int(3) })
	c.call(t, 6, "vote", func(e *wire.Encoder) { e.Int(3) }, 1)
	if r := c.call(t, 7, "tpc_finish", func(e *wire.Encoder) { e.Int(3) }, 1); len(r.B) != 8 {
		t.Errorf("tpc_finish: %v", r.String())
	}
}
