package fs1backend

import (
	"bytes"
	"compress/zlib"
	"context"
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/zodbd/zodbd/internal/datasets"
	"hash/crc32"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/zodb"
)

// The Writer contract on a FileStorage: tests on a temporary copy of
// fs1/testdata/1.fs (a Data.fs written by ZODB/py), whose result ZODB/py
// reads back.

// fs1Copy copies fs1/testdata/1.fs into a temporary directory and returns
// the copy's path.
func fs1Copy(t testing.TB) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "Data.fs")
	datasets.CopyTo(t, "../../../fs1/testdata/1.fs", path)
	return path
}

// crashCopy copies what is on disk of the backend at path (Data.fs and
// its final-tid log, not the .index) to a new directory: the state a
// crash at this instant leaves (the page cache survives a process crash).
func crashCopy(t testing.TB, path string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "Data.fs")
	datasets.CopyTo(t, path, dst)
	datasets.CopyTo(t, path+".neo", dst+".neo")
	return dst
}

func openWriter(t testing.TB, path string) *Backend {
	t.Helper()
	b, err := OpenWriter(path, &fs1.Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// tids hands out increasing tids after the database's last one.
type tids struct{ last zodb.Tid }

func newTids(t testing.TB, b *Backend) *tids {
	ids, err := b.LastIDs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return &tids{ids.Tid}
}

func (g *tids) next() zodb.Tid { g.last += 0x1000; return g.last }

func raw(oid zodb.Oid, data string) storage.VotedObject {
	return storage.VotedObject{Oid: oid, Data: []byte(data), Checksum: sha1.Sum([]byte(data))}
}

func compressed(t testing.TB, oid zodb.Oid, data string) storage.VotedObject {
	var buf bytes.Buffer
	zw := zlib.NewWriter(&buf)
	zw.Write([]byte(data))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return storage.VotedObject{Oid: oid, Compression: 1, Data: buf.Bytes(), Checksum: sha1.Sum(buf.Bytes())}
}

// commit runs one transaction through Vote, Lock and Unlock and returns
// its tid.
func commit(t testing.TB, b *Backend, g *tids, desc string, objs ...storage.VotedObject) zodb.Tid {
	t.Helper()
	ctx := context.Background()
	ttid := g.next()
	tid := g.next()
	if err := b.Vote(ctx, &storage.VotedTxn{TTid: ttid, Meta: &storage.TxnMeta{User: []byte("neo"), Description: []byte(desc)}, Objects: objs}); err != nil {
		t.Fatal(err)
	}
	if err := b.Lock(ctx, ttid, tid); err != nil {
		t.Fatal(err)
	}
	if err := b.Unlock(ctx, ttid, tid); err != nil {
		t.Fatal(err)
	}
	return tid
}

// load reads oid's newest revision through the backend, decompressed.
func load(t testing.TB, b *Backend, oid zodb.Oid) (storage.Object, string) {
	t.Helper()
	var o storage.Object
	if err := b.Object(context.Background(), oid, 0, 0, &o); err != nil {
		t.Fatalf("oid %s: %v", oid, err)
	}
	if o.NoData {
		return o, ""
	}
	if !o.NoData && o.Checksum != sha1.Sum(o.Data) {
		t.Fatalf("oid %s: checksum %x of data %q", oid, o.Checksum, o.Data)
	}
	if o.Compression == 0 {
		return o, string(o.Data)
	}
	zr, err := zlib.NewReader(bytes.NewReader(o.Data))
	if err != nil {
		t.Fatalf("oid %s: %v", oid, err)
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("oid %s: %v", oid, err)
	}
	return o, string(data)
}

// pyState runs ZODB/py on the closed file at path: fstest, then a load of
// each oid through zc.zlibstorage (as runzeo serves a Data.fs written by
// NEO's compressing clients). It returns oid -> "serial:data" ("deleted"
// for an object without data). Without the venv it skips, unless $CI is
// set.
func pyState(t *testing.T, path string, oids []zodb.Oid) map[zodb.Oid]string {
	t.Helper()
	py := datasets.Python(t)
	if out, err := exec.Command(py, "-m", "ZODB.scripts.fstest", path).CombinedOutput(); err != nil || len(out) != 0 {
		t.Fatalf("fstest %s: %v\n%s", path, err, out)
	}
	var hexOids []string
	for _, oid := range oids {
		hexOids = append(hexOids, fmt.Sprintf("%016x", uint64(oid)))
	}
	script := `
import sys, json
from ZODB.FileStorage import FileStorage
from ZODB.POSException import POSKeyError
from zc.zlibstorage import ZlibStorage
s = ZlibStorage(FileStorage(sys.argv[1], read_only=True))
r = {}
for h in sys.argv[2:]:
    try:
        data, serial = s.load(bytes.fromhex(h))
        r[h] = serial.hex() + ":" + data.hex()
    except POSKeyError:
        r[h] = "deleted"
s.close()
print(json.dumps(r))
`
	out, err := exec.Command(py, append([]string{"-c", script, path}, hexOids...)...).Output()
	if err != nil {
		t.Fatalf("ZODB/py: %v\n%s", err, out)
	}
	var r map[string]string
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("ZODB/py: %v\n%s", err, out)
	}
	m := map[zodb.Oid]string{}
	for i, oid := range oids {
		m[oid] = r[hexOids[i]]
	}
	return m
}

func pyRev(serial zodb.Tid, data string) string {
	return fmt.Sprintf("%016x:%s", uint64(serial), hex.EncodeToString([]byte(data)))
}

// TestFS1WriterCommit follows one transaction through Vote, Lock and
// Unlock: invisible until Unlock, durable at Lock, then what ZODB/py reads.
func TestFS1WriterCommit(t *testing.T) {
	ctx := context.Background()
	path := fs1Copy(t)
	b := openWriter(t, path)
	defer b.Close()
	g := newTids(t, b)
	before, err := b.LastIDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	o0, data0 := load(t, b, 0)
	newOid := before.Oid + 1
	big := strings.Repeat("compressible state ", 40)

	ttid, tid := g.next(), g.next()
	vt := &storage.VotedTxn{TTid: ttid, Meta: &storage.TxnMeta{User: []byte("u"), Description: []byte("d"), Extension: []byte("}q\x00.")},
		Objects: []storage.VotedObject{compressed(t, 0, big), raw(newOid, "new object")}}
	if err := b.Vote(ctx, vt); err != nil {
		t.Fatal(err)
	}
	vt.Objects[0].Data[0] ^= 0xff // Vote copied
	check := func(stage string, wantLocked map[zodb.Tid]zodb.Tid, wantFinal zodb.Tid) {
		t.Helper()
		locked, err := b.LockedTransactions(ctx)
		if err != nil || fmt.Sprint(locked) != fmt.Sprint(wantLocked) {
			t.Errorf("%s: LockedTransactions = %v %v, want %v", stage, locked, err, wantLocked)
		}
		if f, err := b.FinalTID(ctx, ttid); err != nil || f != wantFinal {
			t.Errorf("%s: FinalTID = %s %v, want %s", stage, f, err, wantFinal)
		}
	}
	invisible := func(stage string) {
		t.Helper()
		if o, data := load(t, b, 0); o.Serial != o0.Serial || data != data0 {
			t.Errorf("%s: oid 0 serial %s, want %s", stage, o.Serial, o0.Serial)
		}
		var o storage.Object
		var no *zodb.NoObjectError
		if err := b.Object(ctx, newOid, 0, 0, &o); !errors.As(err, &no) {
			t.Errorf("%s: new oid: %v, want *zodb.NoObjectError", stage, err)
		}
		if s, err := b.LastSerial(ctx, 0); err != nil || s != o0.Serial {
			t.Errorf("%s: LastSerial(0) = %s %v", stage, s, err)
		}
		if s, err := b.LastSerial(ctx, newOid); err != nil || s != 0 {
			t.Errorf("%s: LastSerial(new) = %s %v", stage, s, err)
		}
		if ids, _ := b.LastIDs(ctx); ids.Tid != before.Tid {
			t.Errorf("%s: LastIDs.Tid = %s, want %s", stage, ids.Tid, before.Tid)
		}
		if _, err := b.TransactionInformation(ctx, tid); !errors.Is(err, storage.ErrTidNotFound) {
			t.Errorf("%s: TransactionInformation: %v", stage, err)
		}
		if h, err := b.ObjectHistory(ctx, 0, 0, 1); err != nil || h[0].Serial != o0.Serial {
			t.Errorf("%s: ObjectHistory = %v %v", stage, h, err)
		}
	}
	check("voted", map[zodb.Tid]zodb.Tid{ttid: 0}, 0)
	invisible("voted")

	if err := b.Lock(ctx, ttid, tid); err != nil {
		t.Fatal(err)
	}
	check("locked", map[zodb.Tid]zodb.Tid{ttid: tid}, tid)
	invisible("locked")
	if err := b.Lock(ctx, ttid, tid); err != nil { // ValidateTransaction
		t.Errorf("Lock again: %v", err)
	}

	if err := b.Unlock(ctx, ttid, tid); err != nil {
		t.Fatal(err)
	}
	check("unlocked", map[zodb.Tid]zodb.Tid{}, tid)
	o, data := load(t, b, 0)
	if o.Serial != tid || data != big || o.Compression != 1 || o.DataSerial != 0 {
		t.Errorf("oid 0: serial %s compression %d data %q", o.Serial, o.Compression, data)
	}
	if _, data := load(t, b, newOid); data != "new object" {
		t.Errorf("new oid: %q", data)
	}
	var prev storage.Object
	if err := b.Object(ctx, 0, 0, tid, &prev); err != nil || prev.Serial != o0.Serial || prev.NextSerial != tid {
		t.Errorf("oid 0 before %s: %+v %v", tid, prev, err)
	}
	if s, err := b.LastSerial(ctx, newOid); err != nil || s != tid {
		t.Errorf("LastSerial(new) = %s %v", s, err)
	}
	ids, _ := b.LastIDs(ctx)
	if ids.Tid != tid || ids.Oid != newOid {
		t.Errorf("LastIDs = %+v", ids)
	}
	ti, err := b.TransactionInformation(ctx, tid)
	if err != nil || string(ti.User) != "u" || string(ti.Description) != "d" || string(ti.Extension) != "}q\x00." || fmt.Sprint(ti.Oids) != fmt.Sprint([]zodb.Oid{0, newOid}) {
		t.Errorf("TransactionInformation = %+v %v", ti, err)
	}
	if got, _ := b.TIDs(ctx, 0, 1, nil); len(got) != 1 || got[0] != tid {
		t.Errorf("TIDs = %v", got)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	py := pyState(t, path, []zodb.Oid{0, newOid})
	if py[0] != pyRev(tid, big) || py[newOid] != pyRev(tid, "new object") {
		t.Errorf("ZODB/py reads %v", py)
	}

	// Reopened: the same, and the ttid still known.
	b = openWriter(t, path)
	defer b.Close()
	if _, data := load(t, b, 0); data != big {
		t.Errorf("reopened: oid 0 %q", data)
	}
	check("reopened", map[zodb.Tid]zodb.Tid{}, tid)
}

// TestFS1WriterAbort checks Abort and DropUnfinished: nothing reaches the
// file.
func TestFS1WriterAbort(t *testing.T) {
	ctx := context.Background()
	path := fs1Copy(t)
	b := openWriter(t, path)
	defer b.Close()
	g := newTids(t, b)
	size := b.fs.End()
	t1, t2, t3 := g.next(), g.next(), g.next()
	for _, ttid := range []zodb.Tid{t1, t2, t3} {
		if err := b.Vote(ctx, &storage.VotedTxn{TTid: ttid, Meta: &storage.TxnMeta{}, Objects: []storage.VotedObject{raw(1, "x")}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Abort(ctx, t1); err != nil {
		t.Fatal(err)
	}
	if err := b.Abort(ctx, t1); err != nil { // nothing stored: a no-op
		t.Fatal(err)
	}
	if err := b.Lock(ctx, t1, g.next()); err == nil {
		t.Error("Lock of an aborted transaction succeeded")
	}
	tid3 := g.next()
	if err := b.Lock(ctx, t3, tid3); err != nil {
		t.Fatal(err)
	}
	if err := b.Abort(ctx, t3); err == nil {
		t.Error("Abort of a locked transaction succeeded")
	}
	if err := b.DropUnfinished(ctx); err != nil {
		t.Fatal(err)
	}
	locked, _ := b.LockedTransactions(ctx)
	if fmt.Sprint(locked) != fmt.Sprint(map[zodb.Tid]zodb.Tid{t3: tid3}) {
		t.Errorf("LockedTransactions = %v", locked)
	}
	if err := b.Unlock(ctx, t3, tid3); err != nil {
		t.Fatal(err)
	}
	// A tid not above the last locked one is refused.
	if err := b.Vote(ctx, &storage.VotedTxn{TTid: t2, Meta: &storage.TxnMeta{}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Lock(ctx, t2, tid3); err == nil {
		t.Error("Lock with a stale tid succeeded")
	}
	if got := b.fs.End(); got <= size {
		t.Errorf("file end %d, want past %d (one transaction)", got, size)
	}
}

// TestFS1WriterCrash reopens the files as a crash leaves them after Lock
// (before Unlock), and between Lock's two steps.
func TestFS1WriterCrash(t *testing.T) {
	ctx := context.Background()
	path := fs1Copy(t)
	b := openWriter(t, path)
	defer b.Close()
	g := newTids(t, b)
	base := commit(t, b, g, "first", raw(1, "committed"))

	// A crash between the log record and Data.fs: Data.fs before Lock.
	dataBefore, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ttid, tid := g.next(), g.next()
	if err := b.Vote(ctx, &storage.VotedTxn{TTid: ttid, Meta: &storage.TxnMeta{Description: []byte("locked")}, Objects: []storage.VotedObject{raw(1, "locked"), raw(2, "two")}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Lock(ctx, ttid, tid); err != nil {
		t.Fatal(err)
	}
	half := crashCopy(t, path)
	if err := os.WriteFile(half, dataBefore, 0o666); err != nil {
		t.Fatal(err)
	}
	hb := openWriter(t, half)
	if locked, _ := hb.LockedTransactions(ctx); len(locked) != 0 {
		t.Errorf("half-locked: LockedTransactions = %v", locked)
	}
	if f, _ := hb.FinalTID(ctx, ttid); f != 0 {
		t.Errorf("half-locked: FinalTID = %s", f)
	}
	if _, data := load(t, hb, 1); data != "committed" {
		t.Errorf("half-locked: oid 1 %q", data)
	}
	hb.Close()

	// A crash after Lock.
	crashed := crashCopy(t, path)
	for round := 0; round < 2; round++ {
		// (round 1: the Unlock of round 0 was not synced, and is lost.)
		cb := openWriter(t, crashed)
		locked, err := cb.LockedTransactions(ctx)
		if err != nil || fmt.Sprint(locked) != fmt.Sprint(map[zodb.Tid]zodb.Tid{ttid: tid}) {
			t.Fatalf("round %d: LockedTransactions = %v %v", round, locked, err)
		}
		if f, _ := cb.FinalTID(ctx, ttid); f != tid {
			t.Errorf("round %d: FinalTID = %s", round, f)
		}
		if o, data := load(t, cb, 1); data != "committed" || o.Serial != base {
			t.Errorf("round %d: locked transaction visible: oid 1 %q", round, data)
		}
		if ids, _ := cb.LastIDs(ctx); ids.Tid != base {
			t.Errorf("round %d: LastIDs.Tid = %s", round, ids.Tid)
		}
		// The master's ValidateTransaction.
		if err := cb.Lock(ctx, ttid, tid); err != nil {
			t.Fatal(err)
		}
		if err := cb.Unlock(ctx, ttid, tid); err != nil {
			t.Fatal(err)
		}
		if o, data := load(t, cb, 1); data != "locked" || o.Serial != tid {
			t.Errorf("round %d: after validation: oid 1 %q", round, data)
		}
		if round == 0 {
			// The crash loses the Unlock's record, which was not
			// synced (a copy from the page cache has it: cut it).
			crashed2 := crashCopy(t, crashed)
			dropLastRecord(t, crashed2+".neo")
			cb.Close()
			crashed = crashed2
		} else {
			cb.Close()
		}
	}
	// Closed cleanly: unlocked for good.
	cb := openWriter(t, crashed)
	if locked, _ := cb.LockedTransactions(ctx); len(locked) != 0 {
		t.Errorf("after close: LockedTransactions = %v", locked)
	}
	if f, _ := cb.FinalTID(ctx, ttid); f != tid {
		t.Errorf("after close: FinalTID = %s", f)
	}
	cb.Close()
	py := pyState(t, crashed, []zodb.Oid{1, 2})
	if py[1] != pyRev(tid, "locked") || py[2] != pyRev(tid, "two") {
		t.Errorf("ZODB/py reads %v", py)
	}

	// A locked transaction followed by one committed outside NEO is
	// unlocked when the backend opens.
	outside := crashCopy(t, path)
	fs, err := fs1.Open(outside, &fs1.Options{ReadWrite: true, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	txn, _ := fs.Begin(ctx, zodb.TxnMeta{})
	txn.Store(1000, 0, []byte("zeo"))
	if _, err := txn.Vote(ctx); err != nil {
		t.Fatal(err)
	}
	zeoTid, err := txn.Finish(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	fs.Close()
	ob := openWriter(t, outside)
	defer ob.Close()
	if locked, _ := ob.LockedTransactions(ctx); len(locked) != 0 {
		t.Errorf("outside: LockedTransactions = %v", locked)
	}
	if f, _ := ob.FinalTID(ctx, ttid); f != tid {
		t.Errorf("outside: FinalTID = %s", f)
	}
	if ids, _ := ob.LastIDs(ctx); ids.Tid != zeoTid {
		t.Errorf("outside: LastIDs.Tid = %s, want %s", ids.Tid, zeoTid)
	}
	if _, data := load(t, ob, 1); data != "locked" {
		t.Errorf("outside: oid 1 %q", data)
	}
}

// TestFS1WriterUndo checks UndoSerial and undo records (backpointers).
func TestFS1WriterUndo(t *testing.T) {
	ctx := context.Background()
	path := fs1Copy(t)
	b := openWriter(t, path)
	defer b.Close()
	g := newTids(t, b)
	ids, _ := b.LastIDs(ctx)
	oidA, oidB := ids.Oid+1, ids.Oid+2
	tA := commit(t, b, g, "A", raw(oidA, "a1"), raw(oidB, "b1"))
	tB := commit(t, b, g, "B", raw(oidA, "a2"))
	ltid := tB + 1

	// Undo of B for oidA: brings back A's revision, still current.
	cur, undo, isCur, ok, err := b.UndoSerial(ctx, oidA, ltid, tB, 0)
	if err != nil || !ok || cur != tB || undo != tA || !isCur {
		t.Fatalf("UndoSerial(A, B) = %s %s %v %v %v", cur, undo, isCur, ok, err)
	}
	// B did not change oidB.
	if _, _, _, ok, err := b.UndoSerial(ctx, oidB, ltid, tB, 0); ok || err != nil {
		t.Errorf("UndoSerial(oidB, B): ok %v %v", ok, err)
	}
	// Undo of A for oidB: its creation (nothing to bring back).
	cur, undo, isCur, ok, err = b.UndoSerial(ctx, oidB, ltid, tA, 0)
	if err != nil || !ok || cur != tA || undo != 0 || !isCur {
		t.Errorf("UndoSerial(oidB, A) = %s %s %v %v %v", cur, undo, isCur, ok, err)
	}
	// Undo of A for oidA: not current (B changed it since).
	cur, undo, isCur, ok, err = b.UndoSerial(ctx, oidA, ltid, tA, 0)
	if err != nil || !ok || cur != tB || undo != 0 || isCur {
		t.Errorf("UndoSerial(oidA, A) = %s %s %v %v %v", cur, undo, isCur, ok, err)
	}

	// The undo transaction: a backpointer to A's record of oidA, and the
	// undone creation of oidB.
	tU := commit(t, b, g, "undo", storage.VotedObject{Oid: oidA, DataSerial: tA}, storage.VotedObject{Oid: oidB, NoData: true})
	o, data := load(t, b, oidA)
	if o.Serial != tU || data != "a1" || o.DataSerial != tA {
		t.Errorf("oidA after undo: serial %s data %q data serial %s", o.Serial, data, o.DataSerial)
	}
	if o, _ := load(t, b, oidB); !o.NoData || o.Serial != tU {
		t.Errorf("oidB after undo: %+v", o)
	}
	if h, err := b.ObjectHistory(ctx, oidA, 0, 5); err != nil || len(h) != 3 || h[0].Size != 2 {
		t.Errorf("ObjectHistory(oidA) = %v %v", h, err)
	}
	// Undoing B again now: the undo points to the newest record that
	// reuses A's data, and B's revision is not current (NEO's rule).
	cur, undo, isCur, ok, err = b.UndoSerial(ctx, oidA, tU+1, tB, 0)
	if err != nil || !ok || cur != tU || undo != tU || isCur {
		t.Errorf("UndoSerial(oidA, B) after the undo = %s %s %v %v %v", cur, undo, isCur, ok, err)
	}
	// An undo record must point to a revision of its oid.
	if err := b.Vote(ctx, &storage.VotedTxn{TTid: g.next(), Meta: &storage.TxnMeta{}, Objects: []storage.VotedObject{{Oid: oidA, DataSerial: tA + 1}}}); err == nil {
		t.Error("Vote of a backpointer to nothing succeeded")
	}
	b.Close()
	py := pyState(t, path, []zodb.Oid{oidA, oidB})
	if py[oidA] != pyRev(tU, "a1") || py[oidB] != "deleted" {
		t.Errorf("ZODB/py reads %v", py)
	}
}

// TestFS1WriterPack packs online: old revisions go, the current ones and
// the transaction table stay right, commits carry on.
func TestFS1WriterPack(t *testing.T) {
	ctx := context.Background()
	path := fs1Copy(t)
	b := openWriter(t, path)
	defer b.Close()
	g := newTids(t, b)
	ids, _ := b.LastIDs(ctx)
	oid := ids.Oid + 1
	var revs []zodb.Tid
	for i := 0; i < 5; i++ {
		revs = append(revs, commit(t, b, g, "rev", raw(oid, fmt.Sprintf("rev %d", i))))
	}
	for i := 0; i < 2; i++ { // fill the checksum cache
		load(t, b, oid)
		load(t, b, 0)
	}
	if err := b.Pack(ctx, revs[4], []zodb.Oid{oid}); !errors.Is(err, ErrPartialPack) {
		t.Errorf("partial pack: %v", err)
	}
	// A transaction locked, not unlocked, across the pack.
	ttid, tid := g.next(), g.next()
	if err := b.Vote(ctx, &storage.VotedTxn{TTid: ttid, Meta: &storage.TxnMeta{}, Objects: []storage.VotedObject{raw(oid, "after pack")}}); err != nil {
		t.Fatal(err)
	}
	if err := b.Lock(ctx, ttid, tid); err != nil {
		t.Fatal(err)
	}
	size := b.fs.End()
	// (A pack tid past the locked transaction packs as of the last
	// unlocked one: the locked revision does not replace rev 4.)
	if err := b.Pack(ctx, tid+1, nil); err != nil {
		t.Fatal(err)
	}
	if b.fs.End() >= size {
		t.Errorf("pack freed nothing: %d -> %d", size, b.fs.End())
	}
	var o storage.Object
	if err := b.Object(ctx, oid, revs[1], 0, &o); !errors.Is(err, storage.ErrOidNotFound) {
		t.Errorf("packed revision: %v", err)
	}
	if o, data := load(t, b, oid); data != "rev 4" || o.Serial != revs[4] {
		t.Errorf("after pack: %q %s", data, o.Serial)
	}
	load(t, b, 0) // its checksum, right at its new position
	if ti, err := b.TransactionInformation(ctx, revs[4]); err != nil || fmt.Sprint(ti.Oids) != fmt.Sprint([]zodb.Oid{oid}) {
		t.Errorf("TransactionInformation after pack = %+v %v", ti, err)
	}
	if err := b.Unlock(ctx, ttid, tid); err != nil {
		t.Fatal(err)
	}
	if o, data := load(t, b, oid); data != "after pack" || o.Serial != tid {
		t.Errorf("unlocked after pack: %q %s", data, o.Serial)
	}
	last := commit(t, b, g, "more", raw(oid, "more"))
	if ti, err := b.TransactionInformation(ctx, last); err != nil || string(ti.Description) != "more" {
		t.Errorf("TransactionInformation after pack = %+v %v", ti, err)
	}
	b.Close()
	py := pyState(t, path, []zodb.Oid{0, oid})
	if py[oid] != pyRev(last, "more") {
		t.Errorf("ZODB/py reads %v", py)
	}
}

// TestTTIDLogRewrite fills the final-tid log past its size limit: it is
// rewritten, and keeps the locked transactions and the recent unlocked.
func TestTTIDLogRewrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "Data.fs.neo")
	l, err := createTTIDLog(path, map[zodb.Tid]zodb.Tid{1: 2}, nil, fs1Cluster{})
	if err != nil {
		t.Fatal(err)
	}
	n := ttidLogMax/ttidRecSize + 10
	for i := 0; i < n; i++ {
		ttid := zodb.Tid(10 + 2*i)
		off, gen, err := l.add('L', ttid, ttid+1)
		if err == nil {
			_, _, err = l.add('U', ttid, ttid+1)
		}
		if err == nil && i%1000 == 0 {
			err = l.sync(off, gen)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if l.gen < 2 {
		t.Errorf("never rewritten (generation %d)", l.gen)
	}
	l.add('L', 5, 6)
	if err := l.close(); err != nil {
		t.Fatal(err)
	}
	if crc32.Checksum(make([]byte, 28), crc32c) == 0 {
		t.Fatal("a zero record passes its checksum: zeros would not end the log")
	}
	if st, _ := os.Stat(path); st.Size() > ttidLogMax+ttidRecSize {
		t.Errorf("log of %d bytes", st.Size())
	}
	locked, unlocked, _, err := readTTIDLog(path)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(locked) != fmt.Sprint(map[zodb.Tid]zodb.Tid{1: 2, 5: 6}) {
		t.Errorf("locked = %v", locked)
	}
	lastTtid := zodb.Tid(10 + 2*(n-1))
	if len(unlocked) < ttidRecent || unlocked[len(unlocked)-1] != (ttidPair{lastTtid, lastTtid + 1}) {
		t.Errorf("%d unlocked, the last %v", len(unlocked), unlocked[len(unlocked)-1])
	}
	// A torn record at the end is ignored.
	f, _ := os.OpenFile(path, os.O_WRONLY, 0)
	f.WriteAt([]byte("torn"), l.end)
	f.Close()
	if locked2, _, _, err := readTTIDLog(path); err != nil || len(locked2) != 2 {
		t.Errorf("torn tail: %v %v", locked2, err)
	}
}

// TestFS1WriterReadersDuringCommits runs readers while transactions are
// committed and the file packed: a reader never sees a revision newer than
// the last tid LastIDs reported after its read, nor an error.
func TestFS1WriterReadersDuringCommits(t *testing.T) {
	ctx := context.Background()
	path := fs1Copy(t)
	b := openWriter(t, path)
	defer b.Close()
	g := newTids(t, b)
	ids, _ := b.LastIDs(ctx)
	oid := ids.Oid + 1
	commit(t, b, g, "first", raw(oid, "0"))
	stop := make(chan struct{})
	errs := make(chan error, 4)
	for r := 0; r < 2; r++ {
		go func() {
			o := storage.Object{Data: make([]byte, 0, 4096)}
			for {
				select {
				case <-stop:
					errs <- nil
					return
				default:
				}
				if err := b.Object(ctx, oid, 0, 0, &o); err != nil {
					errs <- err
					return
				}
				ids, err := b.LastIDs(ctx)
				if err != nil || o.Serial > ids.Tid {
					errs <- fmt.Errorf("serial %s after last tid %s (%v)", o.Serial, ids.Tid, err)
					return
				}
				if o.Checksum != sha1.Sum(o.Data) {
					errs <- fmt.Errorf("serial %s: bad checksum", o.Serial)
					return
				}
				if _, err := b.TransactionInformation(ctx, o.Serial); err != nil {
					errs <- err
					return
				}
				if _, err := b.ObjectHistory(ctx, oid, 0, 3); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var tids []zodb.Tid
	for i := 1; i <= 60; i++ {
		tids = append(tids, commit(t, b, g, "more", raw(oid, fmt.Sprint(i))))
		if i%20 == 0 {
			if err := b.Pack(ctx, tids[len(tids)-5], nil); err != nil {
				t.Error(err)
			}
		}
	}
	close(stop)
	for r := 0; r < 2; r++ {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// dropLastRecord zeroes the last record of the final-tid log at path.
func dropLastRecord(t testing.TB, path string) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	last := -1
	for off := ttidRecSize; off+ttidRecSize <= len(b); off += ttidRecSize {
		r := b[off : off+ttidRecSize]
		if crc32.Checksum(r[:28], crc32c) != binary.BigEndian.Uint32(r[28:]) {
			break
		}
		last = off
	}
	if last < 0 {
		t.Fatalf("%s: no record", path)
	}
	if r := b[last : last+ttidRecSize]; r[16] != 'U' {
		t.Fatalf("%s: last record %q, not an unlock", path, r[16])
	}
	clear(b[last : last+ttidRecSize])
	if err := os.WriteFile(path, b, 0o666); err != nil {
		t.Fatal(err)
	}
}

// TestFS1WriterHistorySizeCompressed: the size ObjectHistory gives a
// record stored as compression 1 (".z" + its zlib data in the Data.fs) is
// the zlib data's, as NEO/py reports it, for the record and for an undo
// that reuses it; it counted the 2 bytes of ".z".
func TestFS1WriterHistorySizeCompressed(t *testing.T) {
	ctx := context.Background()
	b := openWriter(t, fs1Copy(t))
	defer b.Close()
	g := newTids(t, b)
	ids, _ := b.LastIDs(ctx)
	oid := ids.Oid + 1
	var z bytes.Buffer
	w := zlib.NewWriter(&z)
	w.Write(bytes.Repeat([]byte("compressible state "), 40))
	w.Close()
	zdata := z.Bytes()
	tA := commit(t, b, g, "A", storage.VotedObject{Oid: oid, Compression: 1, Checksum: sha1.Sum(zdata), Data: zdata})
	commit(t, b, g, "B", raw(oid, "b"))
	commit(t, b, g, "undo", storage.VotedObject{Oid: oid, DataSerial: tA})
	h, err := b.ObjectHistory(ctx, oid, 0, 5)
	if err != nil || len(h) != 3 {
		t.Fatalf("ObjectHistory = %v %v", h, err)
	}
	if want := uint64(len(zdata)); h[0].Size != want || h[1].Size != 1 || h[2].Size != want {
		t.Errorf("sizes %d %d %d, want %d 1 %d", h[0].Size, h[1].Size, h[2].Size, want, want)
	}
}
