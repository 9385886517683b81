package fs1

import (
	"errors"
	"os"
	"testing"

	"github.com/zodbd/zodbd/zodb"
)

func undo(fs *FileStorage, tids ...zodb.Tid) (zodb.Tid, []zodb.Oid, error) {
	tx, err := fs.Begin(bg, zodb.TxnMeta{Description: []byte("undo")})
	if err != nil {
		return 0, nil, err
	}
	for _, tid := range tids {
		tx.Undo(tid)
	}
	oids, err := tx.Vote(bg)
	if err != nil {
		tx.Abort()
		return 0, nil, err
	}
	tid, err := tx.Finish(bg, nil)
	return tid, oids, err
}

func mustUndo(t *testing.T, fs *FileStorage, tids ...zodb.Tid) (zodb.Tid, []zodb.Oid) {
	t.Helper()
	tid, oids, err := undo(fs, tids...)
	if err != nil {
		t.Fatalf("undo %v: %v", tids, err)
	}
	return tid, oids
}

func wantUndoError(t *testing.T, err error, oid zodb.Oid, reason string) {
	t.Helper()
	var ue *zodb.UndoError
	if !errors.As(err, &ue) || ue.Reason != reason || (oid != 0 && (!ue.HasOid || ue.Oid != oid)) {
		t.Fatalf("got %v, want UndoError(%s, %q)", err, oid, reason)
	}
}

// recordAt returns the current data record of oid.
func recordAt(t *testing.T, fs *FileStorage, oid zodb.Oid) DataHeader {
	t.Helper()
	pos, ok := fs.Index().Get(oid)
	if !ok {
		t.Fatalf("%s not in index", oid)
	}
	var dh DataHeader
	if err := dh.Load(fs.file, fs.path, pos, fs.End()); err != nil {
		t.Fatal(err)
	}
	return dh
}

func TestUndo(t *testing.T) {
	fs := createStorage(t, nil)
	t1 := commit(t, fs, nil, map[zodb.Oid]string{1: "a1", 2: "b1"})
	p1, _ := fs.Index().Get(1)
	t2 := commit(t, fs, map[zodb.Oid]zodb.Tid{1: t1}, map[zodb.Oid]string{1: "a2"})
	p2, _ := fs.Index().Get(1)

	// Undo a modification: a backpointer to the previous revision.
	u1, oids := mustUndo(t, fs, t2)
	if len(oids) != 1 || oids[0] != 1 {
		t.Fatalf("undone oids %v", oids)
	}
	if d, s := load(t, fs, 1, zodb.TidMax); d != "a1" || s != u1 {
		t.Fatalf("after undo: %q@%s", d, s)
	}
	if dh := recordAt(t, fs, 1); dh.DataLen != 0 || dh.BackPos != p1 || dh.PrevRevPos != p2 || dh.Tid != u1 {
		t.Fatalf("undo record %+v, want backpointer %d prev %d", dh, p1, p2)
	}
	// Undo the undo (redo).
	u2, _ := mustUndo(t, fs, u1)
	if d, _ := load(t, fs, 1, zodb.TidMax); d != "a2" {
		t.Fatalf("after redo: %q", d)
	}
	// Undo t2 again: its record is not current, but the current record
	// points to it.
	mustUndo(t, fs, t2)
	if d, _ := load(t, fs, 1, zodb.TidMax); d != "a1" {
		t.Fatalf("after undoing t2 again: %q", d)
	}
	_ = u2

	// Undo of a creation: no data.
	u4, _ := mustUndo(t, fs, t1)
	_, _, err := fs.Load(bg, zodb.Xid{Oid: 2, At: zodb.TidMax})
	var nd *zodb.NoDataError
	if !errors.As(err, &nd) || nd.DeletedAt != u4 {
		t.Fatalf("load after undoing the creation: %v", err)
	}
	if dh := recordAt(t, fs, 2); dh.DataLen != 0 || dh.BackPos != 0 {
		t.Fatalf("undo of creation wrote %+v", dh)
	}
	// Oid 1 was created by t1 too, and modified since by data equal to
	// t1's: the creation of 1 is undone as well.
	if _, _, err := fs.Load(bg, zodb.Xid{Oid: 1, At: zodb.TidMax}); !errors.As(err, &nd) {
		t.Fatalf("oid 1 after undoing t1: %v", err)
	}
	fs.Close()
	checkScan(t, fs.path)
}

func TestUndoErrors(t *testing.T) {
	fs := createStorage(t, nil)
	t1 := commit(t, fs, nil, map[zodb.Oid]string{1: "a1", 3: "c1"})
	t2 := commit(t, fs, map[zodb.Oid]zodb.Tid{1: t1}, map[zodb.Oid]string{1: "a2", 2: "b1"})
	t3 := commit(t, fs, map[zodb.Oid]zodb.Tid{1: t2, 2: t2}, map[zodb.Oid]string{1: "a3", 2: "b2"})
	end := fs.End()

	// A later transaction changed the data: no conflict resolution.
	_, _, err := undo(fs, t2)
	wantUndoError(t, err, 0, "Some data were modified by a later transaction")
	// oid 2 was created by t2 and changed by t3 (and oid 1 fails too; one
	// of the two is reported).
	var ue *zodb.UndoError
	errors.As(err, &ue)
	if ue.Tid != t2 || !ue.HasOid || (ue.Oid != 1 && ue.Oid != 2) {
		t.Fatalf("undo error %+v", ue)
	}
	t4 := commit(t, fs, map[zodb.Oid]zodb.Tid{3: t1}, map[zodb.Oid]string{3: "c2"})
	_, _, err = undo(fs, t1)
	wantUndoError(t, err, 0, "Can't undo an add transaction followed by conflicting transactions.")

	// Unknown transaction.
	_, _, err = undo(fs, t4+12345)
	wantUndoError(t, err, 0, "Invalid transaction id")
	if fs.End() != end+(fs.End()-end) || fs.w.pos != fs.End() {
		t.Fatal("failed undo left bytes")
	}
	_ = t3

	// Undo after delete: the current record has no data.
	t5, err := tryCommit(fs, zodb.TxnMeta{}, func(tx zodb.Txn) error { return tx.Delete(3, t4) })
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = undo(fs, t4)
	wantUndoError(t, err, 3, "_loadBack() failed")
	// Undoing the delete brings c2 back.
	mustUndo(t, fs, t5)
	if d, _ := load(t, fs, 3, zodb.TidMax); d != "c2" {
		t.Fatalf("after undoing the delete: %q", d)
	}
}

// Undo accepts the current data when it equals the undone data by value
// (another transaction stored the same bytes), as ZODB/py does.
func TestUndoSameData(t *testing.T) {
	fs := createStorage(t, nil)
	t1 := commit(t, fs, nil, map[zodb.Oid]string{1: "x"})
	t2 := commit(t, fs, map[zodb.Oid]zodb.Tid{1: t1}, map[zodb.Oid]string{1: "y"})
	commit(t, fs, map[zodb.Oid]zodb.Tid{1: t2}, map[zodb.Oid]string{1: "y"})
	mustUndo(t, fs, t2)
	if d, _ := load(t, fs, 1, zodb.TidMax); d != "x" {
		t.Fatalf("after undo: %q", d)
	}
}

// Several undos and stores in one transaction; the records of the same
// transaction see each other.
func TestUndoMulti(t *testing.T) {
	fs := createStorage(t, nil)
	t1 := commit(t, fs, nil, map[zodb.Oid]string{1: "a1", 2: "b1"})
	t2 := commit(t, fs, map[zodb.Oid]zodb.Tid{1: t1}, map[zodb.Oid]string{1: "a2"})
	t3 := commit(t, fs, map[zodb.Oid]zodb.Tid{2: t1}, map[zodb.Oid]string{2: "b2"})
	tx, _ := fs.Begin(bg, zodb.TxnMeta{})
	tx.Undo(t3)
	tx.Undo(t2)
	tx.Store(5, 0, []byte("new"))
	oids, err := tx.Vote(bg)
	if err != nil {
		t.Fatal(err)
	}
	if len(oids) != 2 || oids[0] != 2 || oids[1] != 1 {
		t.Fatalf("undone oids %v", oids)
	}
	tx.Finish(bg, nil)
	for oid, want := range map[zodb.Oid]string{1: "a1", 2: "b1", 5: "new"} {
		if d, _ := load(t, fs, oid, zodb.TidMax); d != want {
			t.Errorf("%s = %q, want %q", oid, d, want)
		}
	}
	// Undo t2 and then redo it in the same transaction is not possible:
	// the second undo's record is not current.
	t4 := commit(t, fs, nil, map[zodb.Oid]string{7: "g1"})
	t5 := commit(t, fs, map[zodb.Oid]zodb.Tid{7: t4}, map[zodb.Oid]string{7: "g2"})
	tx, _ = fs.Begin(bg, zodb.TxnMeta{})
	tx.Undo(t5)
	tx.Undo(t5)
	if _, err := tx.Vote(bg); err == nil {
		// ZODB/py: the second undo finds the first one's record current,
		// which points to t4's data, not t5's: a conflict.
		t.Fatal("undoing the same transaction twice in one transaction succeeded")
	}
	tx.Abort()
}

func TestUndoLog(t *testing.T) {
	fs := createStorage(t, nil)
	var tids []zodb.Tid
	for i := 0; i < 5; i++ {
		tids = append(tids, commit(t, fs, nil, map[zodb.Oid]string{zodb.Oid(i): "x"}))
	}
	log, err := fs.UndoLog(bg, 0, -20)
	if err != nil || len(log) != 5 {
		t.Fatalf("UndoLog: %d entries, %v", len(log), err)
	}
	for i, e := range log {
		if e.Tid != tids[4-i] || string(e.User) != "u" || string(e.Description) != "d" {
			t.Fatalf("entry %d: %+v", i, e)
		}
	}
	// Size is the transaction length.
	var th TxnHeader
	if err := th.LoadPrev(fs.file, fs.path, fs.End(), fs.End()); err != nil || log[0].Size != th.Len {
		t.Fatalf("size %d, want %d", log[0].Size, th.Len)
	}
	if l, _ := fs.UndoLog(bg, 1, 3); len(l) != 2 || l[0].Tid != tids[3] || l[1].Tid != tids[2] {
		t.Fatalf("UndoLog(1, 3) = %+v", l)
	}
	if l, _ := fs.UndoLog(bg, 2, -2); len(l) != 2 || l[0].Tid != tids[2] {
		t.Fatalf("UndoLog(2, -2) = %+v", l)
	}
	// A packed transaction ends the log; it and what precedes it cannot
	// be undone.
	pt := tids[4] + 10
	if _, err := tryCommit(fs, zodb.TxnMeta{Tid: pt, Status: zodb.TxnPacked}, func(tx zodb.Txn) error {
		return tx.Restore(9, []byte("p"), 0)
	}); err != nil {
		t.Fatal(err)
	}
	after := commit(t, fs, nil, map[zodb.Oid]string{10: "y"})
	if l, _ := fs.UndoLog(bg, 0, 100); len(l) != 1 || l[0].Tid != after {
		t.Fatalf("UndoLog after a packed transaction = %+v", l)
	}
	_, _, err = undo(fs, pt)
	wantUndoError(t, err, 0, "non-undoable transaction")
	_, _, err = undo(fs, tids[0])
	wantUndoError(t, err, 0, "Invalid transaction id")
	// A read-only storage lists the same.
	fs.Close()
	ro, err := Open(fs.path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if l, _ := ro.UndoLog(bg, 0, 100); len(l) != 1 || l[0].Tid != after {
		t.Fatalf("read-only UndoLog = %+v", l)
	}
}

func TestRestoreBackpointers(t *testing.T) {
	fs := createStorage(t, nil)
	t1 := commit(t, fs, nil, map[zodb.Oid]string{1: "a1", 2: "b1"})
	p1, _ := fs.Index().Get(1)
	last := t1
	restore := func(oid zodb.Oid, data []byte, prev zodb.Tid) DataHeader {
		t.Helper()
		last++
		if _, err := tryCommit(fs, zodb.TxnMeta{Tid: last}, func(tx zodb.Txn) error { return tx.Restore(oid, data, prev) }); err != nil {
			t.Fatal(err)
		}
		return recordAt(t, fs, oid)
	}
	// Same data as the record of prevTid: a backpointer.
	if dh := restore(1, []byte("a1"), t1); dh.DataLen != 0 || dh.BackPos != p1 || dh.Tid != last {
		t.Fatalf("restore with equal data: %+v", dh)
	}
	if d, s := load(t, fs, 1, zodb.TidMax); d != "a1" || s != last {
		t.Fatalf("load: %q@%s", d, s)
	}
	// Different data: written.
	if dh := restore(1, []byte("other"), t1); dh.DataLen != 5 {
		t.Fatalf("restore with other data: %+v", dh)
	}
	// nil data and prevTid: backpointer; nil without prevTid: no data.
	if dh := restore(1, nil, t1); dh.BackPos != p1 {
		t.Fatalf("restore nil with prevTid: %+v", dh)
	}
	if dh := restore(2, nil, 0); dh.DataLen != 0 || dh.BackPos != 0 {
		t.Fatalf("restore nil: %+v", dh)
	}
	// prevTid not in the storage: ignored.
	if dh := restore(1, []byte("a1"), 0x0123); dh.DataLen != 2 {
		t.Fatalf("restore with unknown prevTid: %+v", dh)
	}
	// A backpointer record in prevTid is pointed to as is.
	bpTid := last - 2 // the "nil with prevTid" restore
	bpPos, _ := fs.Index().Get(1)
	_ = bpPos
	var bpRec int64
	{
		tpos, ok, _ := fs.w.findTxn(bpTid, false)
		if !ok {
			t.Fatal("findTxn")
		}
		var th TxnHeader
		th.Load(fs.file, fs.path, tpos, fs.End())
		bpRec = th.DataPos()
	}
	if dh := restore(1, []byte("a1"), bpTid); dh.BackPos != bpRec {
		t.Fatalf("restore pointing to a backpointer record: %+v, want back %d", dh, bpRec)
	}
	fs.Close()
	checkScan(t, fs.path)
	os.Remove(fs.path + ".index")
}

// LoadRevision describes the record: an undo record's backpointer, a
// revision without data, the next serial.
func TestLoadRevision(t *testing.T) {
	fs := createStorage(t, nil)
	defer fs.Close()
	t1 := commit(t, fs, nil, map[zodb.Oid]string{1: "a1", 2: "b1"})
	p1, _ := fs.Index().Get(1)
	t2 := commit(t, fs, map[zodb.Oid]zodb.Tid{1: t1}, map[zodb.Oid]string{1: "a2"})
	u, _ := mustUndo(t, fs, t2)
	u2, _ := mustUndo(t, fs, t1) // undoes the creation of 2 (and of 1)

	data, rev, err := fs.LoadRevision(bg, 1, u2, nil)
	if err != nil || string(data) != "a1" || rev.Serial != u || rev.Next != u2 || rev.BackPos != p1 || rev.BackTid != t1 || rev.NoData {
		t.Fatalf("undo record: %q %+v %v (backpointer want %d, of %s)", data, rev, err, p1, t1)
	}
	data, rev, err = fs.LoadRevision(bg, 1, u, nil)
	if err != nil || string(data) != "a2" || rev.Serial != t2 || rev.Next != u || rev.BackPos != 0 || rev.BackTid != 0 {
		t.Fatalf("own data: %q %+v %v", data, rev, err)
	}
	if v := fs.View(); v.LastTid != u2 || v.End != fs.End() || v.File != fs.File() || v.Index != fs.Index() {
		t.Fatalf("View = %+v, want last tid %s, end %d", v, u2, fs.End())
	}
	data, rev, err = fs.LoadRevision(bg, 2, zodb.TidMax, []byte("x"))
	if err != nil || string(data) != "x" || !rev.NoData || rev.Serial != u2 || rev.Next != 0 {
		t.Fatalf("no data: %q %+v %v", data, rev, err)
	}
	var nd *zodb.NoDataError
	if _, _, err := fs.LoadRevision(bg, 1, t1, nil); !errors.As(err, &nd) || nd.DeletedAt != 0 {
		t.Fatalf("before the first revision: %v", err)
	}
	var no *zodb.NoObjectError
	if _, _, err := fs.LoadRevision(bg, 9, zodb.TidMax, nil); !errors.As(err, &no) {
		t.Fatalf("unknown oid: %v", err)
	}
}
