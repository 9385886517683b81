package zeo

import (
	"bytes"
	"testing"

	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// TestSpooledTransactions runs the tests of commits, conflicts, undo and
// blobs with every transaction's data in its spool's file (none kept in
// memory): the server reads it back for the vote, the conflict replies and
// the conflict figures.
func TestSpooledTransactions(t *testing.T) {
	old := txnSpoolMem
	txnSpoolMem = -1
	defer func() { txnSpoolMem = old }()
	for name, f := range map[string]func(*testing.T){
		"VoteConflicts":             TestVoteConflicts,
		"VoteResolvedInServer":      TestVoteResolvedInServer,
		"InvalidationBeforeCurrent": TestInvalidationBeforeCurrentData,
		"BlobStoreAndSend":          TestBlobStoreAndSend,
		"BlobAbortRemovesFiles":     TestBlobAbortRemovesFiles,
		"BlobUndo":                  TestBlobUndo,
		"BlobWrappedStorage":        TestBlobWrappedStorage,
	} {
		t.Run(name, f)
	}
}

// TestTxnMemoryBudget: the transactions of all connections keep at most
// txnMemory of data in memory together; past it, in their spools' files.
// The data commits the same, and the memory is given back.
func TestTxnMemoryBudget(t *testing.T) {
	old := txnMemory
	txnMemory = 1 << 20
	defer func() { txnMemory = old }()
	stor := openWritable(t)
	srv, addr := startServerOn(t, Config{Storages: []StorageConfig{{Name: "1", Storage: stor}}}, nil)
	clients := []*rawClient{dialRawRW(t, addr, wire.Pickle), dialRawRW(t, addr, wire.Pickle)}
	data := func(i int) []byte { return bytes.Repeat([]byte{byte('a' + i)}, 700<<10) }
	for i, c := range clients {
		c.tpcBegin(int64(10 + i))
		c.oneway("storea", 4, func(e *wire.Encoder) {
			e.Oid8(uint64(100 + i))
			e.Oid8(0)
			e.Bytes(data(i))
			e.Int(int64(10 + i))
		})
		c.call(t, 2, "lastTransaction", func(e *wire.Encoder) {}, 0) // the store is in
	}
	if used := srv.txnMem.Used(); used == 0 || used > txnMemory {
		t.Fatalf("transactions hold %d bytes in memory, want 0 < used <= %d", used, txnMemory)
	}
	for i, c := range clients {
		c.call(t, 3, "vote", func(e *wire.Encoder) { e.Int(int64(10 + i)) }, 1)
		c.call(t, 4, "tpc_finish", func(e *wire.Encoder) { e.Int(int64(10 + i)) }, 1)
	}
	for i := range clients {
		if got := loadCurrent(t, stor, zodb.Oid(100+i)); got != string(data(i)) {
			t.Fatalf("oid %d: %d bytes back, want %d of %q", 100+i, len(got), len(data(i)), data(i)[:1])
		}
	}
	if used := srv.txnMem.Used(); used != 0 {
		t.Fatalf("%d bytes still held after the commits", used)
	}
}
