package zeo

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/zodbd/zodbd/blob"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// serverStatusInts returns server_status as a map of its integer figures.
func serverStatusInts(t *testing.T, c *rawClient, id int64) map[string]int64 {
	t.Helper()
	status := c.call(t, id, "server_status", func(e *wire.Encoder) {}, 0)
	stat := map[string]int64{}
	for i := 0; i+1 < len(status.Items); i += 2 {
		stat[string(status.Items[i].B)] = status.Items[i+1].Int
	}
	return stat
}

// TestBlobStoresCountedOnce: the stock client stores a blob with
// storea followed by storeBlobStart/Chunk/End (or storeBlobShared).
// ZEO/py's server counts stats.stores in storea (and deleteObject,
// restorea) only: its storeBlobEnd and storeBlobShared append to
// blob_log without counting. server_status()['stores'] after one blob
// store is 1 with runzeo; zodbd counted 2.
func TestBlobStoresCountedOnce(t *testing.T) {
	addr, dir := blobServer(t, wire.Pickle)
	c := dialRawRW(t, addr, wire.Pickle)
	c.tpcBegin(1)
	c.storeBlob(1, 3, []byte("pickle of a Blob"), []byte("content"))
	c.call(t, 2, "vote", func(e *wire.Encoder) { e.Int(1) }, 1)
	c.call(t, 3, "tpc_finish", func(e *wire.Encoder) { e.Int(1) }, 1)
	if got := serverStatusInts(t, c, 4)["stores"]; got != 1 {
		t.Errorf("server_status stores after one blob store (storea + storeBlobEnd) = %d, want 1 (ZEO/py's count)", got)
	}
	// A shared-directory store: storea + storeBlobShared.
	bd, err := blob.Open(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(bd.OidDir(4), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bd.OidDir(4), "0x00abc.tmp-"), []byte("shared"), 0o600); err != nil {
		t.Fatal(err)
	}
	c.tpcBegin(2)
	c.oneway("storea", 4, func(e *wire.Encoder) { e.Oid8(4); e.Oid8(0); e.Bytes([]byte("d")); e.Int(2) })
	c.oneway("storeBlobShared", 5, func(e *wire.Encoder) {
		e.Oid8(4)
		e.Oid8(0)
		e.Bytes([]byte("d"))
		e.Str("0x00abc.tmp-")
		e.Int(2)
	})
	c.call(t, 5, "vote", func(e *wire.Encoder) { e.Int(2) }, 1)
	c.call(t, 6, "tpc_finish", func(e *wire.Encoder) { e.Int(2) }, 1)
	if got := serverStatusInts(t, c, 7)["stores"]; got != 2 {
		t.Errorf("server_status stores after two blob stores = %d, want 2 (ZEO/py's count)", got)
	}
}

// TestBlobUndoAfterPackOfUndoneRevision: t1 stores blob b1 of the
// root, t2 b2, t3 undoes t2 (its record points back to t1's data; its
// blob is t1's, linked), t4 stores b4. A pack between t3 and t4 drops
// t1 and t2 (and t1's blob file); t3's record and blob stay. Undoing t4
// then brings back t3's revision: its blob must be b1, as ZODB/py's
// FileStorage gives it (the blob of the record before t4, t3's).
func TestBlobUndoAfterPackOfUndoneRevision(t *testing.T) {
	addr, dir := blobServer(t, wire.Pickle)
	c := dialRawRW(t, addr, wire.Pickle)
	var id int64 = 10
	commit := func(txnID int64, ops func()) zodb.Tid {
		c.tpcBegin(txnID)
		ops()
		id++
		c.call(t, id, "vote", func(e *wire.Encoder) { e.Int(txnID) }, 1)
		id++
		r := c.call(t, id, "tpc_finish", func(e *wire.Encoder) { e.Int(txnID) }, 1)
		time.Sleep(20 * time.Millisecond)
		return zodb.Tid(binary.BigEndian.Uint64(r.B))
	}
	t1 := commit(1, func() { c.storeBlobWithSerial(1, 0, 0, []byte("d1"), []byte("b1")) })
	t2 := commit(2, func() { c.storeBlobWithSerial(2, 0, t1, []byte("d2"), []byte("b2")) })
	t3 := commit(3, func() {
		c.oneway("undoa", 2, func(e *wire.Encoder) { e.Bytes(encodeUndoID(t2)); e.Int(3) })
	})
	t4 := commit(4, func() { c.storeBlobWithSerial(4, 0, t3, []byte("d4"), []byte("b4")) })
	pt := float64(t3.Time().UnixNano())/1e9 + 0.005
	c.call(t, 50, "pack", func(e *wire.Encoder) { e.Float(pt); e.Bool(true) }, 2)
	if got, flags, _ := c.sendBlob(t, 51, 0, t3); flags != 0 || string(got) != "b1" {
		t.Fatalf("blob of t3 after the pack: flags %d %q, want b1", flags, got)
	}
	if bd, err := blob.Open(dir, ""); err != nil || bd.Exists(0, t1) || bd.Exists(0, t2) {
		t.Fatalf("the pack kept the blob files of t1 or t2 (%v): the case is not the one meant", err)
	}
	t5 := commit(5, func() {
		c.oneway("undoa", 2, func(e *wire.Encoder) { e.Bytes(encodeUndoID(t4)); e.Int(5) })
	})
	got, flags, args := c.sendBlob(t, 60, 0, t5)
	if flags != 0 || string(got) != "b1" {
		t.Fatalf("blob of the undo of t4 after a pack: flags %d %q %v, want b1", flags, got, args)
	}
}

// TestBlobSharedAbortAfterVote: a shared-directory store
// (storeBlobShared) voted and then aborted leaves nothing in the blob
// directory, as ZEO/py's (BlobStorage.tpc_abort removes the placed file);
// a second transaction storing the same oid from the same kind of file
// then commits it.
func TestBlobSharedAbortAfterVote(t *testing.T) {
	addr, dir := blobServer(t, wire.Pickle)
	c := dialRawRW(t, addr, wire.Pickle)
	bd, err := blob.Open(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	put := func(name, content string) {
		if err := os.MkdirAll(bd.OidDir(6), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(bd.OidDir(6), name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	store := func(txnID int64, name string) {
		c.tpcBegin(txnID)
		c.oneway("storea", 4, func(e *wire.Encoder) { e.Oid8(6); e.Oid8(0); e.Bytes([]byte("d")); e.Int(txnID) })
		c.oneway("storeBlobShared", 5, func(e *wire.Encoder) {
			e.Oid8(6)
			e.Oid8(0)
			e.Bytes([]byte("d"))
			e.Str(name)
			e.Int(txnID)
		})
	}
	put("0x00aaa.tmp-", "aborted")
	store(1, "0x00aaa.tmp-")
	c.call(t, 2, "vote", func(e *wire.Encoder) { e.Int(1) }, 1)
	c.call(t, 3, "tpc_abort", func(e *wire.Encoder) { e.Int(1) }, 1)
	if n := countFiles(t, dir); n != 1 {
		t.Fatalf("%d files left after a shared store voted and aborted", n)
	}
	put("0x00bbb.tmp-", "committed")
	store(2, "0x00bbb.tmp-")
	c.call(t, 4, "vote", func(e *wire.Encoder) { e.Int(2) }, 1)
	r := c.call(t, 5, "tpc_finish", func(e *wire.Encoder) { e.Int(2) }, 1)
	tid := zodb.Tid(binary.BigEndian.Uint64(r.B))
	if b, err := os.ReadFile(bd.FilePath(6, tid)); err != nil || string(b) != "committed" {
		t.Fatalf("committed shared blob: %q %v", b, err)
	}
}

// openFDs counts the process's open file descriptors (Linux).
func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

// TestBlobNoLeaks: uploads aborted before and after the vote, left
// half-sent by a disconnect, failed votes of shared stores whose file is
// missing, and downloads (found and missing) leave no file in tmp/ and no
// open file descriptor behind.
func TestBlobNoLeaks(t *testing.T) {
	addr, dir := blobServer(t, wire.Pickle)
	c0 := dialRawRW(t, addr, wire.Pickle)
	var id int64 = 100
	tid := commitOneBlob(t, c0, &id, 9, "kept")
	base := openFDs(t)
	for i := 0; i < 20; i++ {
		c := dialRawRW(t, addr, wire.Pickle)
		txnID := int64(1000 + i)
		// Aborted after the vote.
		c.tpcBegin(txnID)
		c.storeBlob(txnID, 3, []byte("d"), []byte("x"))
		c.call(t, 2, "vote", func(e *wire.Encoder) { e.Int(txnID) }, 1)
		c.call(t, 3, "tpc_abort", func(e *wire.Encoder) { e.Int(txnID) }, 1)
		// A shared store of a missing file: the vote fails.
		c.tpcBegin(txnID + 1)
		c.oneway("storea", 4, func(e *wire.Encoder) { e.Oid8(4); e.Oid8(0); e.Bytes([]byte("d")); e.Int(txnID + 1) })
		c.oneway("storeBlobShared", 5, func(e *wire.Encoder) {
			e.Oid8(4)
			e.Oid8(0)
			e.Bytes([]byte("d"))
			e.Str("missing.tmp-")
			e.Int(txnID + 1)
		})
		c.send(t, 4, "vote", func(e *wire.Encoder) { e.Int(txnID + 1) }, 1)
		if msg := c.read(t); msg.Flags.Int == 0 {
			t.Fatalf("vote of a shared store of a missing file succeeded: %v", msg.Args)
		}
		c.call(t, 5, "tpc_abort", func(e *wire.Encoder) { e.Int(txnID + 1) }, 1)
		// Downloads.
		if got, flags, _ := c.sendBlob(t, 6, 9, tid); flags != 0 || string(got) != "kept" {
			t.Fatalf("sendBlob: %d %q", flags, got)
		}
		if _, flags, _ := c.sendBlob(t, 7, 9, tid+1); flags != 2 {
			t.Fatalf("sendBlob of a missing blob: flags %d", flags)
		}
		// Half an upload, then the connection drops.
		c.tpcBegin(txnID + 2)
		c.storeBlob(txnID+2, 5, []byte("d"), []byte("finished"))
		c.oneway("storeBlobStart", 0, func(e *wire.Encoder) {})
		c.oneway("storeBlobChunk", 1, func(e *wire.Encoder) { e.Bytes([]byte("partial")) })
		c.call(t, 8, "lastTransaction", func(e *wire.Encoder) {}, 0)
		c.nc.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for (openFDs(t) > base || countFiles(t, dir) != 2) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := openFDs(t); n > base {
		t.Errorf("%d file descriptors open, %d before", n, base)
	}
	if n := countFiles(t, dir); n != 2 { // .layout and 9's blob
		t.Errorf("%d files in the blob directory, want 2", n)
	}
}

// commitOneBlob commits one blob store of a new object and returns its tid.
func commitOneBlob(t *testing.T, c *rawClient, id *int64, oid zodb.Oid, content string) zodb.Tid {
	t.Helper()
	const txnID = 55
	c.tpcBegin(txnID)
	c.storeBlob(txnID, oid, []byte("pickle of a Blob"), []byte(content))
	*id++
	c.call(t, *id, "vote", func(e *wire.Encoder) { e.Int(txnID) }, 1)
	*id++
	r := c.call(t, *id, "tpc_finish", func(e *wire.Encoder) { e.Int(txnID) }, 1)
	return zodb.Tid(binary.BigEndian.Uint64(r.B))
}

// TestBlobSendBlobNotALoad: ZEO/py's server counts stats.loads in
// loadBefore only; sendBlob (a blob download) leaves server_status()
// ['loads'] alone there (zodbd counted it, and loadSerial).
func TestBlobSendBlobNotALoad(t *testing.T) {
	addr, _ := blobServer(t, wire.Pickle)
	c := dialRawRW(t, addr, wire.Pickle)
	var id int64 = 10
	tid := commitOneBlob(t, c, &id, 3, "content")
	before := serverStatusInts(t, c, 20)["loads"]
	for i := int64(0); i < 3; i++ {
		if got, flags, _ := c.sendBlob(t, 21+i, 3, tid); flags != 0 || string(got) != "content" {
			t.Fatalf("sendBlob: %d %q", flags, got)
		}
	}
	if after := serverStatusInts(t, c, 30)["loads"]; after != before {
		t.Errorf("server_status loads went from %d to %d over 3 sendBlob calls; ZEO/py counts loadBefore only", before, after)
	}
}
