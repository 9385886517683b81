package zeo

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zodbd/zodbd/blob"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// blobServer serves a new writable FileStorage with a blob directory.
func blobServer(t *testing.T, m wire.Marshal) (addr, blobDir string) {
	t.Helper()
	blobDir = filepath.Join(t.TempDir(), "blobs")
	stor := openWritable(t)
	addr = startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: stor, BlobDir: blobDir}}, Marshal: m})
	return addr, blobDir
}

// oneway queues a one-way call on c (sent at the next flush).
func (c *rawClient) oneway(name string, n int, args func(e *wire.Encoder)) {
	c.enc.BeginCall(name)
	c.enc.BeginTuple(n)
	args(&c.enc)
	c.enc.EndTuple(n)
	c.enc.EndMessage()
}

// readAny returns the next message, whatever it is, copied out of the
// read buffer.
func (c *rawClient) readAny(tb testing.TB) (name string, id int64, flags int64, args wire.Value) {
	tb.Helper()
	f, err := wire.ReadFrame(c.br, nil, 1<<30)
	if err != nil {
		tb.Fatal(err)
	}
	msg, err := c.dec.DecodeMessage(f)
	if err != nil {
		tb.Fatal(err)
	}
	return string(msg.Name), msg.ID.Int, msg.Flags.Int, cloneValue(&msg.Args)
}

func (c *rawClient) tpcBegin(txnID int64) {
	c.oneway("tpc_begin", 6, func(e *wire.Encoder) {
		e.Int(txnID)
		e.Bytes(nil)
		e.Bytes(nil)
		e.BeginDict(0)
		e.EndDict(0)
		e.None()
		e.Str(" ")
	})
}

// storeBlob sends what ClientStorage.storeBlob sends for a new object.
func (c *rawClient) storeBlob(txnID int64, oid zodb.Oid, data, content []byte) {
	c.storeBlobWithSerial(txnID, oid, 0, data, content)
}

// storeBlobWithSerial is storeBlob of a new revision of an object at serial.
func (c *rawClient) storeBlobWithSerial(txnID int64, oid zodb.Oid, serial zodb.Tid, data, content []byte) {
	c.oneway("storea", 4, func(e *wire.Encoder) { e.Oid8(uint64(oid)); e.Oid8(uint64(serial)); e.Bytes(data); e.Int(txnID) })
	c.oneway("storeBlobStart", 0, func(e *wire.Encoder) {})
	for len(content) > 0 {
		n := min(len(content), blobChunk)
		chunk := content[:n]
		c.oneway("storeBlobChunk", 1, func(e *wire.Encoder) { e.Bytes(chunk) })
		content = content[n:]
	}
	c.oneway("storeBlobEnd", 4, func(e *wire.Encoder) { e.Oid8(uint64(oid)); e.Oid8(uint64(serial)); e.Bytes(data); e.Int(txnID) })
}

// sendBlob asks for a blob and collects the receiveBlob* calls; it returns
// the content and the reply (an error reply gives flags 2).
func (c *rawClient) sendBlob(t *testing.T, id int64, oid zodb.Oid, serial zodb.Tid) ([]byte, int64, wire.Value) {
	t.Helper()
	idv := wire.Value{Kind: wire.Int, Int: id}
	c.enc.BeginRequest(&idv, false, "sendBlob")
	c.enc.BeginTuple(2)
	c.enc.Oid8(uint64(oid))
	c.enc.Oid8(uint64(serial))
	c.enc.EndTuple(2)
	c.enc.EndMessage()
	c.flush(t)
	var got []byte
	started, stopped := false, false
	for {
		name, rid, flags, args := c.readAny(t)
		switch name {
		case "receiveBlobStart":
			started = true
		case "receiveBlobChunk":
			if !started || stopped {
				t.Fatal("chunk outside start/stop")
			}
			got = append(got, args.Items[2].B...)
		case "receiveBlobStop":
			stopped = true
		case ".reply":
			if rid != id {
				t.Fatalf("reply to %d, want %d", rid, id)
			}
			if flags == 0 && !stopped {
				t.Fatal("sendBlob replied before receiveBlobStop")
			}
			return got, flags, args
		}
	}
}

func TestBlobStoreAndSend(t *testing.T) {
	for _, m := range []wire.Marshal{wire.Pickle, wire.Msgpack} {
		addr, dir := blobServer(t, m)
		c := dialRawRW(t, addr, m)
		info := c.call(t, 2, "get_info", func(e *wire.Encoder) {}, 0)
		if !strings.Contains(info.String(), "IBlobStorage") {
			t.Fatalf("get_info does not announce IBlobStorage: %v", info)
		}
		content := bytes.Repeat([]byte("0123456789abcdef"), 20000) // 320000 bytes: 6 chunks
		const txnID = 5
		c.tpcBegin(txnID)
		c.storeBlob(txnID, 7, []byte("pickle of a Blob"), content)
		r := c.call(t, 3, "vote", func(e *wire.Encoder) { e.Int(txnID) }, 1)
		if r.Len() != 0 {
			t.Fatalf("vote: %v", r)
		}
		r = c.call(t, 4, "tpc_finish", func(e *wire.Encoder) { e.Int(txnID) }, 1)
		tid := zodb.Tid(binary.BigEndian.Uint64(r.B))

		d, err := blob.Open(dir, "")
		if err != nil {
			t.Fatal(err)
		}
		path := d.FilePath(7, tid)
		want := filepath.Join(dir, "0x00", "0x00", "0x00", "0x00", "0x00", "0x00", "0x00", "0x07", blob.Repr(uint64(tid))+".blob")
		if path != want {
			t.Fatalf("blob path %s, want %s", path, want)
		}
		b, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(b, content) {
			t.Fatalf("blob file: %v (%d bytes)", err, len(b))
		}
		if fi, _ := os.Stat(path); fi.Mode().Perm()&0o222 != 0 {
			t.Errorf("committed blob is writable: %v", fi.Mode())
		}
		if ents, _ := os.ReadDir(d.TempDir()); len(ents) != 0 {
			t.Errorf("tmp not empty after commit: %v", ents)
		}

		got, flags, _ := c.sendBlob(t, 10, 7, tid)
		if flags != 0 || !bytes.Equal(got, content) {
			t.Fatalf("sendBlob: flags %d, %d bytes", flags, len(got))
		}
		_, flags, args := c.sendBlob(t, 11, 7, tid-1)
		if flags != 2 || !strings.Contains(args.String(), "POSKeyError") {
			t.Fatalf("sendBlob of a missing blob: flags %d %v", flags, args)
		}
	}
}

func TestBlobAbortRemovesFiles(t *testing.T) {
	addr, dir := blobServer(t, wire.Pickle)
	c := dialRawRW(t, addr, wire.Pickle)
	// Abort after vote: the blob was placed, and must go.
	c.tpcBegin(1)
	c.storeBlob(1, 3, []byte("d"), []byte("x"))
	if r := c.call(t, 2, "vote", func(e *wire.Encoder) { e.Int(1) }, 1); r.Len() != 0 {
		t.Fatalf("vote: %v", r)
	}
	c.call(t, 3, "tpc_abort", func(e *wire.Encoder) { e.Int(1) }, 1)
	// Abort before vote, with an upload left open.
	c.tpcBegin(2)
	c.storeBlob(2, 4, []byte("d"), []byte("y"))
	c.oneway("storeBlobStart", 0, func(e *wire.Encoder) {})
	c.oneway("storeBlobChunk", 1, func(e *wire.Encoder) { e.Bytes([]byte("partial")) })
	c.call(t, 4, "tpc_abort", func(e *wire.Encoder) { e.Int(2) }, 1)
	if n := countFiles(t, dir); n != 1 { // .layout
		t.Fatalf("%d files left in the blob directory after aborts", n)
	}
}

func countFiles(t *testing.T, dir string) int {
	n := 0
	filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
		if err == nil && !e.IsDir() {
			n++
		}
		return nil
	})
	return n
}

func TestBlobMalformed(t *testing.T) {
	addr, dir := blobServer(t, wire.Pickle)
	outside := t.TempDir()

	// A chunk without storeBlobStart (one-way): the connection is closed.
	c := dialRawRW(t, addr, wire.Pickle)
	c.tpcBegin(1)
	c.oneway("storeBlobChunk", 1, func(e *wire.Encoder) { e.Bytes([]byte("x")) })
	c.flush(t)
	c.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := wire.ReadFrame(c.br, nil, 1<<20); err == nil {
		t.Fatal("connection not closed after a chunk without start")
	}

	// Synchronous calls get error replies; the connection stays.
	c = dialRawRW(t, addr, wire.Pickle)
	c.tpcBegin(1)
	call := func(id int64, name string, n int, args func(e *wire.Encoder)) (int64, wire.Value) {
		c.send(t, id, name, args, n)
		msg := c.read(t)
		return msg.Flags.Int, cloneValue(&msg.Args)
	}
	for i, name := range []string{"../../../" + filepath.Base(outside) + "/evil.tmp", "/etc/evil.tmp", "..", "x.blob", "a/b.tmp", ""} {
		flags, args := call(int64(10+i), "storeBlobShared", 5, func(e *wire.Encoder) {
			e.Oid8(1)
			e.Oid8(0)
			e.Bytes([]byte("d"))
			e.Str(name)
			e.Int(1)
		})
		if flags != 2 || !strings.Contains(args.String(), "ValueError") {
			t.Errorf("storeBlobShared(%q): flags %d %v", name, flags, args)
		}
	}
	flags, args := call(20, "storeBlobEnd", 4, func(e *wire.Encoder) { e.Oid8(1); e.Oid8(0); e.Bytes(nil); e.Int(1) })
	if flags != 2 || !strings.Contains(args.String(), "storeBlobStart") {
		t.Errorf("storeBlobEnd without start: flags %d %v", flags, args)
	}
	call(21, "storeBlobStart", 0, func(e *wire.Encoder) {})
	flags, args = call(22, "storeBlobEnd", 4, func(e *wire.Encoder) { e.Oid8(1); e.Oid8(0); e.Bytes(nil); e.Int(99) })
	if flags != 2 || !strings.Contains(args.String(), "StorageTransactionError") {
		t.Errorf("storeBlobEnd with an unknown transaction: flags %d %v", flags, args)
	}
	flags, args = call(23, "sendBlob", 1, func(e *wire.Encoder) { e.Oid8(1) })
	if flags != 2 {
		t.Errorf("sendBlob with one argument: flags %d %v", flags, args)
	}
	if r := c.call(t, 30, "ping", func(e *wire.Encoder) {}, 0); !r.IsNone() {
		t.Fatalf("ping: %v", r)
	}
	c.call(t, 31, "tpc_abort", func(e *wire.Encoder) { e.Int(1) }, 1)
	if ents, _ := os.ReadDir(outside); len(ents) != 0 {
		t.Fatalf("written outside the blob directory: %v", ents)
	}
	if n := countFiles(t, dir); n != 1 {
		t.Fatalf("%d files left in the blob directory", n)
	}
}

func TestBlobUnsupportedWithoutBlobDir(t *testing.T) {
	addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: openWritable(t)}}})
	c := dialRawRW(t, addr, wire.Pickle)
	info := c.call(t, 2, "get_info", func(e *wire.Encoder) {}, 0)
	if strings.Contains(info.String(), "IBlobStorage") {
		t.Fatalf("get_info announces IBlobStorage without a blob directory: %v", info)
	}
	_, flags, args := c.sendBlob(t, 3, 1, 1)
	if flags != 2 || !strings.Contains(args.String(), "Unsupported") {
		t.Fatalf("sendBlob without a blob directory: flags %d %v", flags, args)
	}
}

// TestBlobUndo: undoing a change of a blob gives the undo record the blob
// of the revision it brings back.
func TestBlobUndo(t *testing.T) {
	addr, dir := blobServer(t, wire.Pickle)
	c := dialRawRW(t, addr, wire.Pickle)
	commit := func(id int64, txnID int64, ops func()) zodb.Tid {
		c.tpcBegin(txnID)
		ops()
		c.call(t, id, "vote", func(e *wire.Encoder) { e.Int(txnID) }, 1) // the undo's vote lists oid 5
		r := c.call(t, id+1, "tpc_finish", func(e *wire.Encoder) { e.Int(txnID) }, 1)
		return zodb.Tid(binary.BigEndian.Uint64(r.B))
	}
	t1 := commit(10, 1, func() { c.storeBlob(1, 5, []byte("d1"), []byte("v1")) })
	t2 := commit(20, 2, func() {
		c.oneway("storea", 4, func(e *wire.Encoder) { e.Oid8(5); e.Oid8(uint64(t1)); e.Bytes([]byte("d2")); e.Int(2) })
		c.oneway("storeBlobStart", 0, func(e *wire.Encoder) {})
		c.oneway("storeBlobChunk", 1, func(e *wire.Encoder) { e.Bytes([]byte("v2")) })
		c.oneway("storeBlobEnd", 4, func(e *wire.Encoder) { e.Oid8(5); e.Oid8(uint64(t1)); e.Bytes([]byte("d2")); e.Int(2) })
	})
	t3 := commit(30, 3, func() {
		c.oneway("undoa", 2, func(e *wire.Encoder) { e.Bytes(encodeUndoID(t2)); e.Int(3) })
	})
	d, _ := blob.Open(dir, "")
	for tid, want := range map[zodb.Tid]string{t1: "v1", t2: "v2", t3: "v1"} {
		b, err := os.ReadFile(d.FilePath(5, tid))
		if err != nil || string(b) != want {
			t.Errorf("blob of %s: %q %v, want %q", tid, b, err, want)
		}
	}
}

func TestParseBlobConfig(t *testing.T) {
	cfg, err := ParseConfig(strings.NewReader(`
<zeo>
  address 127.0.0.1:0
</zeo>
<blobstorage 1>
  blob-dir blobs
  <filestorage 2>
    path Data.fs
    pack-gc false
  </filestorage>
</blobstorage>
<filestorage other>
  path Other.fs
  blob-dir other-blobs
</filestorage>
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Storages) != 2 {
		t.Fatalf("storages: %+v", cfg.Storages)
	}
	s := cfg.Storages[0]
	if s.Name != "1" || s.Path != "Data.fs" || s.BlobDir != "blobs" || s.PackGC {
		t.Errorf("blobstorage: %+v", s)
	}
	if s := cfg.Storages[1]; s.Name != "other" || s.BlobDir != "other-blobs" {
		t.Errorf("filestorage: %+v", s)
	}
	for _, bad := range []string{
		"<blobstorage>\n<filestorage>\npath x\n</filestorage>\n</blobstorage>",           // no blob-dir
		"<blobstorage>\nblob-dir b\n</blobstorage>",                                      // no filestorage
		"<blobstorage>\nblob-dir b\n<mappingstorage>\n</mappingstorage>\n</blobstorage>", // not a filestorage
	} {
		if _, err := ParseConfig(strings.NewReader("<zeo>\naddress 1\n</zeo>\n" + bad)); err == nil {
			t.Errorf("accepted:\n%s", bad)
		}
	}
}

// A *blob.Storage given as the storage (what zodbd serve passes) serves
// blobs without BlobDir; commits and packs go through it: a pack removes
// the blob file of the revision it dropped and keeps the current one. A wrapper and another BlobDir
// are refused.
func TestBlobWrappedStorage(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "blobs")
	d, err := blob.Open(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	stor := openWritable(t)
	ws := blob.Wrap(stor, d)
	if _, err := NewServer(Config{Storages: []StorageConfig{{Name: "1", Storage: ws, BlobDir: dir + "2"}}}); err == nil {
		t.Fatal("a blob.Storage with another BlobDir was accepted")
	}
	addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: ws}}})
	c := dialRawRW(t, addr, wire.Pickle)
	var tids []zodb.Tid
	for i, content := range []string{"first", "second"} {
		txnID := int64(5 + i)
		c.tpcBegin(txnID)
		serial := zodb.Tid(0)
		if i > 0 {
			serial = tids[0]
		}
		c.storeBlobWithSerial(txnID, 0, serial, []byte("pickle of a Blob"), []byte(content))
		if r := c.call(t, 3, "vote", func(e *wire.Encoder) { e.Int(txnID) }, 1); r.Len() != 0 {
			t.Fatalf("vote: %v", r)
		}
		r := c.call(t, 4, "tpc_finish", func(e *wire.Encoder) { e.Int(txnID) }, 1)
		tids = append(tids, zodb.Tid(binary.BigEndian.Uint64(r.B)))
	}
	for i, content := range []string{"first", "second"} {
		got, flags, _ := c.sendBlob(t, 10, 0, tids[i])
		if flags != 0 || string(got) != content {
			t.Fatalf("sendBlob %d: flags %d, %q", i, flags, got)
		}
	}
	// The blob object is the root; packing after both revisions drops
	// the first.
	c.call(t, 20, "pack", func(e *wire.Encoder) { e.Float(float64(tids[1].Time().UnixNano())/1e9 + 1); e.Bool(true) }, 2)
	if d.Exists(0, tids[0]) {
		t.Errorf("blob of the revision the pack dropped, 0@%s, is left", tids[0])
	}
	if !d.Exists(0, tids[1]) {
		t.Errorf("blob of the current revision 0@%s was removed", tids[1])
	}
}

// TestBlobUploadDiscardedWhenSpoolFails: once a transaction's spool
// failed ($TMPDIR cannot take the data), its vote fails, and the upload
// storeBlobEnd finished goes with the transaction (it stayed in
// BLOBDIR/tmp until the next start: the store was not recorded).
func TestBlobUploadDiscardedWhenSpoolFails(t *testing.T) {
	old := txnSpoolMem
	txnSpoolMem = -1 // every store's data goes to the spool's file
	defer func() { txnSpoolMem = old }()
	addr, dir := blobServer(t, wire.Pickle)
	c := dialRawRW(t, addr, wire.Pickle)
	t.Setenv("TMPDIR", filepath.Join(t.TempDir(), "missing")) // the spool cannot create its file

	c.tpcBegin(1)
	c.storeBlob(1, 3, []byte("pickle of a Blob"), []byte("content"))
	c.send(t, 2, "vote", func(e *wire.Encoder) { e.Int(1) }, 1)
	msg := c.read(t)
	if msg.Flags.Int == 0 {
		t.Fatalf("vote succeeded: %v", msg.Args)
	}
	c.call(t, 3, "tpc_abort", func(e *wire.Encoder) { e.Int(1) }, 1)
	ents, err := os.ReadDir(filepath.Join(dir, "tmp"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 0 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Fatalf("after the failed vote and tpc_abort, %d uploads are left in tmp/: %v", len(ents), names)
	}
}

// TestBlobDisconnectMidUpload: a client that drops the connection in
// the middle of an upload (after storeBlobStart and a chunk), and one
// that drops it after a finished upload before its vote, leave nothing in
// the blob directory.
func TestBlobDisconnectMidUpload(t *testing.T) {
	addr, dir := blobServer(t, wire.Pickle)
	for i := 0; i < 2; i++ {
		c := dialRawRW(t, addr, wire.Pickle)
		c.tpcBegin(1)
		c.storeBlob(1, 3, []byte("d"), []byte("finished upload"))
		if i == 0 {
			c.oneway("storeBlobStart", 0, func(e *wire.Encoder) {})
			c.oneway("storeBlobChunk", 1, func(e *wire.Encoder) { e.Bytes([]byte("partial")) })
		}
		c.call(t, 2, "lastTransaction", func(e *wire.Encoder) {}, 0) // all of it is in
		c.nc.Close()
	}
	deadline := time.Now().Add(5 * time.Second)
	for countFiles(t, dir) != 1 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := countFiles(t, dir); n != 1 { // .layout
		t.Fatalf("%d files left in the blob directory after disconnects", n)
	}
}

// TestBlobWithClientResolvedConflict: a transaction that stores a
// blob (oid 9) and a stale store of another object (oid 1) gets the
// conflict back at its first vote, stores the client's resolution and
// votes again: the blob stored before the first vote is committed with
// the transaction; a transaction that gives up after the conflicts
// (tpc_abort) leaves no file.
func TestBlobWithClientResolvedConflict(t *testing.T) {
	addr, dir := blobServer(t, wire.Pickle)
	a := dialRawRW(t, addr, wire.Pickle)
	b := dialRawRW(t, addr, wire.Pickle)
	var id int64 = 10
	s0 := commitRaw(t, a, &id, 1, 0, []byte("v0"))
	s1 := commitRaw(t, a, &id, 1, s0, []byte("v1"))

	b.tpcBegin(5)
	b.storeBlob(5, 9, []byte("pickle of a Blob"), []byte("blob content"))
	r := storeAndVote(t, b, 20, 5, false, 1, s0, []byte("stale"))
	if r.Len() != 1 || r.Items[0].Kind != wire.Dict {
		t.Fatalf("vote: %v, want one conflict", r)
	}
	r = storeAndVote(t, b, 21, 5, false, 1, s1, []byte("resolved"))
	if r.Len() != 0 {
		t.Fatalf("vote after resolution: %v", r)
	}
	r = b.call(t, 22, "tpc_finish", func(e *wire.Encoder) { e.Int(5) }, 1)
	tid := zodb.Tid(binary.BigEndian.Uint64(r.B))
	got, flags, _ := b.sendBlob(t, 23, 9, tid)
	if flags != 0 || string(got) != "blob content" {
		t.Fatalf("blob of the transaction committed after a conflict: flags %d %q", flags, got)
	}

	b.tpcBegin(6)
	b.storeBlob(6, 10, []byte("pickle of a Blob"), []byte("never committed"))
	r = storeAndVote(t, b, 30, 6, false, 1, s1, []byte("stale again"))
	if r.Len() != 1 {
		t.Fatalf("vote: %v, want one conflict", r)
	}
	b.call(t, 31, "tpc_abort", func(e *wire.Encoder) { e.Int(6) }, 1)
	d, _ := blob.Open(dir, "")
	n := 0
	d.Walk(func(oid zodb.Oid, tid zodb.Tid, path string) error { n++; return nil })
	if ents, _ := os.ReadDir(d.TempDir()); n != 1 || len(ents) != 0 {
		t.Fatalf("%d blob files (want 1), %d uploads left in tmp", n, len(ents))
	}
}

// TestBlobUndoSeveral: one transaction undoes t2 and then t1 (newest
// first, as an undo log lists them), both of which changed a blob object:
// its record is its revision before t1, and so is its blob (it was t1's:
// the first undo that changed the object won, while the storage writes
// the last one's record), as ZODB/py's.
func TestBlobUndoSeveral(t *testing.T) {
	addr, _ := blobServer(t, wire.Pickle)
	c := dialRawRW(t, addr, wire.Pickle)
	commit := func(id int64, txnID int64, ops func()) zodb.Tid {
		c.tpcBegin(txnID)
		ops()
		c.call(t, id, "vote", func(e *wire.Encoder) { e.Int(txnID) }, 1)
		r := c.call(t, id+1, "tpc_finish", func(e *wire.Encoder) { e.Int(txnID) }, 1)
		return zodb.Tid(binary.BigEndian.Uint64(r.B))
	}
	var tids []zodb.Tid
	serial := zodb.Tid(0)
	for i, v := range []string{"v0", "v1", "v2"} {
		txnID := int64(1 + i)
		serial = commit(int64(10*(i+1)), txnID, func() {
			c.storeBlobWithSerial(txnID, 5, serial, []byte("d"+v), []byte(v))
		})
		tids = append(tids, serial)
	}
	t3 := commit(40, 4, func() {
		c.oneway("undoa", 2, func(e *wire.Encoder) { e.Bytes(encodeUndoID(tids[2])); e.Int(4) })
		c.oneway("undoa", 2, func(e *wire.Encoder) { e.Bytes(encodeUndoID(tids[1])); e.Int(4) })
	})
	got, flags, _ := c.sendBlob(t, 50, 5, t3)
	if flags != 0 || string(got) != "v0" {
		t.Fatalf("blob of the undo of t2 and t1: flags %d %q, want %q", flags, got, "v0")
	}
}

// TestMissingBlobMessage: a missing blob is a POSKeyError whose
// message is ZODB/py's BlobStorage.loadBlob's, "No blob file at PATH".
func TestMissingBlobMessage(t *testing.T) {
	addr, _ := blobServer(t, wire.Pickle)
	c := dialRawRW(t, addr, wire.Pickle)
	_, flags, args := c.sendBlob(t, 2, 7, 1)
	if flags != 2 || !strings.Contains(args.String(), "POSKeyError") || !strings.Contains(args.String(), "No blob file at ") {
		t.Fatalf("sendBlob of a missing blob: flags %d %v", flags, args)
	}
}
