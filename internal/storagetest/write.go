package storagetest

import (
	"bytes"
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zodbd/zodbd/zodb"
)

// commit runs one transaction of ops on s and returns its tid and the oids
// that onCommit reported, checking that onCommit was called once with that
// tid. A Vote or Finish error is returned after an Abort.
func commit(t *testing.T, s zodb.WriteStorage, meta zodb.TxnMeta, ops func(txn zodb.Txn)) (zodb.Tid, []zodb.Oid, error) {
	t.Helper()
	ctx := ctxT(t)
	txn, err := s.Begin(ctx, meta)
	if err != nil {
		t.Fatalf("Begin: %v", err)
	}
	ops(txn)
	if _, err := txn.Vote(ctx); err != nil {
		txn.Abort()
		return 0, nil, err
	}
	var calls int
	var cbTid zodb.Tid
	var cbOids []zodb.Oid
	tid, err := txn.Finish(ctx, func(tid zodb.Tid, oids []zodb.Oid) {
		calls++
		cbTid, cbOids = tid, slices.Clone(oids)
	})
	if err != nil {
		txn.Abort()
		return 0, nil, err
	}
	if calls != 1 || cbTid != tid {
		t.Errorf("Finish returned %s; onCommit called %d times (with %s), want once with it", tid, calls, cbTid)
	}
	slices.Sort(cbOids)
	return tid, cbOids, nil
}

// mustCommit is commit that fails the test on an error.
func mustCommit(t *testing.T, s zodb.WriteStorage, ops func(txn zodb.Txn)) zodb.Tid {
	t.Helper()
	return MustCommit(t, s, zodb.TxnMeta{}, ops)
}

// MustCommit runs one transaction of ops on s with meta and returns its
// tid, failing the test on an error (the suite's commit, for the tests
// beside a storage: ops may fail the test itself).
func MustCommit(t *testing.T, s zodb.WriteStorage, meta zodb.TxnMeta, ops func(txn zodb.Txn)) zodb.Tid {
	t.Helper()
	tid, _, err := commit(t, s, meta, ops)
	if err != nil {
		t.Fatalf("commit: %v", err)
	}
	return tid
}

// Commit runs one transaction of ops on s with meta and returns its tid,
// or the error of its Vote or Finish (after an Abort): a conflict the
// test expects.
func Commit(t *testing.T, s zodb.WriteStorage, meta zodb.TxnMeta, ops func(txn zodb.Txn)) (zodb.Tid, error) {
	t.Helper()
	tid, _, err := commit(t, s, meta, ops)
	return tid, err
}

// store records a store, failing the test on an error.
func store(t *testing.T, txn zodb.Txn, oid zodb.Oid, serial zodb.Tid, data []byte) {
	t.Helper()
	if err := txn.Store(oid, serial, data); err != nil {
		t.Fatalf("Store %s: %v", oid, err)
	}
}

func newOids(t *testing.T, s zodb.WriteStorage, n int) []zodb.Oid {
	t.Helper()
	oids, err := s.NewOids(ctxT(t), n)
	if err != nil || len(oids) != n {
		t.Fatalf("NewOids(%d) = %v, %v", n, oids, err)
	}
	return oids
}

// payload returns distinct object data for a test.
func payload(t *testing.T, n int) []byte {
	return []byte(fmt.Sprintf("%s data %d", t.Name(), n))
}

// mustLoad checks that oid's current revision is data at serial.
func mustLoad(t *testing.T, s zodb.Storage, oid zodb.Oid, at zodb.Tid, data []byte, serial zodb.Tid) {
	t.Helper()
	got, gotSerial, err := s.Load(ctxT(t), zodb.Xid{Oid: oid, At: at})
	if err != nil || !bytes.Equal(got, data) || gotSerial != serial {
		t.Errorf("Load %s@%s = %q, %s, %v; want %q, %s", oid, at, got, gotSerial, err, data, serial)
	}
}

// conflicts returns the *zodb.ConflictError values err holds (a
// ConflictErrors list or one *ConflictError, possibly wrapped).
func conflicts(err error) []*zodb.ConflictError {
	var list zodb.ConflictErrors
	if errors.As(err, &list) {
		return list
	}
	var one *zodb.ConflictError
	if errors.As(err, &one) {
		return []*zodb.ConflictError{one}
	}
	return nil
}

// runWrite runs the commit tests on s (a new, empty database when f.New
// is set).
func runWrite(t *testing.T, f Factory, s zodb.Storage, peer func(t *testing.T) zodb.Storage) {
	w, ok := s.(zodb.WriteStorage)
	if !ok {
		t.Skipf("read-only: %T is not a zodb.WriteStorage", s)
	}
	ctx := ctxT(t)
	if txn, err := w.Begin(ctx, zodb.TxnMeta{}); err != nil {
		if !errors.Is(err, zodb.ErrReadOnly) {
			t.Fatalf("Begin: %v (want nil, or zodb.ErrReadOnly for a read-only storage)", err)
		}
		if _, err := w.NewOids(ctx, 1); !errors.Is(err, zodb.ErrReadOnly) {
			t.Errorf("NewOids on a storage whose Begin says read-only: %v, want zodb.ErrReadOnly", err)
		}
		t.Skipf("read-only: Begin returns %v", err)
	} else {
		txn.Abort()
	}
	if f.New != nil {
		sub(t, f, "Empty", func(t *testing.T) { testEmpty(t, s) })
	}
	sub(t, f, "Commit", func(t *testing.T) { testCommit(t, f, w) })
	sub(t, f, "NewOids", func(t *testing.T) { testNewOids(t, w) })
	sub(t, f, "Conflict", func(t *testing.T) { testConflict(t, w) })
	sub(t, f, "ReadConflict", func(t *testing.T) { testReadConflict(t, w) })
	sub(t, f, "Delete", func(t *testing.T) { testDelete(t, f, w) })
	sub(t, f, "Abort", func(t *testing.T) { testAbort(t, w) })
	sub(t, f, "TxnState", func(t *testing.T) { testTxnState(t, w) })
	sub(t, f, "EmptyTxn", func(t *testing.T) { testEmptyTxn(t, f, w) })
	sub(t, f, "Concurrent", func(t *testing.T) { testConcurrent(t, w) })
	sub(t, f, "Undo", func(t *testing.T) {
		if _, ok := s.(zodb.Undoer); !ok {
			t.Skip("not a zodb.Undoer")
		}
		testUndo(t, f, w)
	})
	sub(t, f, "UndoConflict", func(t *testing.T) {
		if _, ok := s.(zodb.Undoer); !ok {
			t.Skip("not a zodb.Undoer")
		}
		testUndoConflict(t, w)
	})
	sub(t, f, "Resolve", func(t *testing.T) { testResolve(t, w) })
	sub(t, f, "Watch", func(t *testing.T) {
		wa, ok := s.(zodb.Watcher)
		if !ok {
			t.Skip("not a zodb.Watcher")
		}
		testWatch(t, w, wa)
	})
	sub(t, f, "Peer", func(t *testing.T) {
		if peer == nil {
			t.Skip("no second storage on the same database (Factory.New gives no peer)")
		}
		p := peer(t)
		defer p.Close()
		testPeer(t, w, p)
	})
}

// testEmpty checks a new database.
func testEmpty(t *testing.T, s zodb.Storage) {
	ctx := ctxT(t)
	if tid, err := s.LastTid(ctx); tid != 0 || err != nil {
		t.Errorf("LastTid = %s, %v; want 0", tid, err)
	}
	_, _, err := s.Load(ctx, zodb.Xid{Oid: 0, At: zodb.TidMax})
	checkNoObject(t, s.URL(), "Load 0 of an empty database", 0, err)
	_, err = s.History(ctx, 0, 1)
	checkNoObject(t, s.URL(), "History 0 of an empty database", 0, err)
	if tids, err := drain(ctx, s.Iterate(ctx, 0, zodb.TidMax)); len(tids) != 0 || err != nil {
		t.Errorf("Iterate of an empty database: %v, %v", tids, err)
	}
}

// testCommit commits two transactions and reads them back every way.
func testCommit(t *testing.T, f Factory, s zodb.WriteStorage) {
	ctx := ctxT(t)
	before, err := s.LastTid(ctx)
	if err != nil {
		t.Fatal(err)
	}
	oids := newOids(t, s, 2)
	a, b := oids[0], oids[1]
	meta := zodb.TxnMeta{User: []byte("user"), Description: []byte("first commit"), Extension: []byte("\x80\x03}q\x00.")}
	tid1, cbOids, err := commit(t, s, meta, func(txn zodb.Txn) {
		store(t, txn, a, 0, payload(t, 1))
		store(t, txn, b, 0, payload(t, 2))
	})
	if err != nil {
		t.Fatalf("commit: %v", err)
	}
	if tid1 <= before {
		t.Errorf("tid %s not after the last tid %s", tid1, before)
	}
	if !slices.Equal(cbOids, []zodb.Oid{a, b}) {
		t.Errorf("onCommit oids %v, want %v", cbOids, []zodb.Oid{a, b})
	}
	if last, err := s.LastTid(ctx); last != tid1 || err != nil {
		t.Errorf("LastTid after commit = %s, %v; want %s", last, err, tid1)
	}
	if last, err := s.LastOid(ctx); err == nil && last < b {
		t.Errorf("LastOid after storing %s = %s", b, last)
	}
	mustLoad(t, s, a, zodb.TidMax, payload(t, 1), tid1)
	mustLoad(t, s, b, tid1, payload(t, 2), tid1)
	_, _, err = s.Load(ctx, zodb.Xid{Oid: a, At: tid1 - 1})
	checkNoData(t, s.URL(), "Load before the creation", a, 0, err)

	// A second revision of a, based on the first, stored twice (the last
	// store wins); b unchanged.
	tid2 := mustCommit(t, s, func(txn zodb.Txn) {
		store(t, txn, a, tid1, payload(t, 9))
		store(t, txn, a, tid1, payload(t, 3))
	})
	if tid2 <= tid1 {
		t.Errorf("second tid %s not after %s", tid2, tid1)
	}
	mustLoad(t, s, a, zodb.TidMax, payload(t, 3), tid2)
	mustLoad(t, s, a, tid2-1, payload(t, 1), tid1)
	mustLoad(t, s, b, tid2, payload(t, 2), tid1)
	if bl, ok := s.(zodb.BeforeLoader); ok {
		data, serial, next, err := bl.LoadBefore(ctx, a, tid2, nil)
		if err != nil || !bytes.Equal(data, payload(t, 1)) || serial != tid1 || next != tid2 {
			t.Errorf("LoadBefore %s before %s = %q %s %s %v; want %q %s %s", a, tid2, data, serial, next, err, payload(t, 1), tid1, tid2)
		}
	}

	h, err := s.History(ctx, a, 10)
	if err != nil || len(h) != 2 || h[0].Tid != tid2 || h[1].Tid != tid1 ||
		string(h[1].User) != "user" || string(h[1].Description) != "first commit" || !f.sameExt(t, h[1].Extension, meta.Extension) {
		t.Errorf("History(%s) = %+v, %v; want %s then %s with the first commit's metadata", a, h, err, tid2, tid1)
	}

	got := iterate(t, ctx, s.Iterate(ctx, tid1, tid2))
	want := []RefTxn{
		{Tid: tid1, Status: zodb.TxnComplete, User: meta.User, Description: meta.Description, Extension: meta.Extension,
			Records: []RefRecord{refRecord(a, tid1, payload(t, 1)), refRecord(b, tid1, payload(t, 2))}},
		{Tid: tid2, Status: zodb.TxnComplete, Records: []RefRecord{refRecord(a, tid2, payload(t, 3))}},
	}
	// The order of the records within a transaction is the storage's.
	if len(got) == 2 && len(got[0].recs) == 2 && got[0].recs[0].Oid == b {
		want[0].Records[0], want[0].Records[1] = want[0].Records[1], want[0].Records[0]
	}
	// A storage may keep the record of the overridden store (ZODB/py's
	// FileStorage does): only the last record of a counts.
	if len(got) == 2 && len(got[1].recs) == 2 && got[1].recs[0].Oid == a && bytes.Equal(got[1].recs[0].Data, payload(t, 9)) {
		got[1].recs = got[1].recs[1:]
	}
	compareTxns(t, &f, "Iterate over the commits", got, want)
}

func refRecord(oid zodb.Oid, tid zodb.Tid, data []byte) RefRecord {
	return RefRecord{Oid: oid, DataTid: tid, SHA1: sha1.Sum(data), Len: len(data), HistorySize: len(data)}
}

// testNewOids checks that NewOids never repeats and stays above the oids
// stored, explicit ones included.
func testNewOids(t *testing.T, s zodb.WriteStorage) {
	seen := map[zodb.Oid]bool{}
	var last zodb.Oid
	for _, n := range []int{1, 5, 1} {
		for _, oid := range newOids(t, s, n) {
			if seen[oid] {
				t.Errorf("NewOids returned %s twice", oid)
			}
			seen[oid] = true
			last = max(last, oid)
		}
	}
	high := last + 1000
	mustCommit(t, s, func(txn zodb.Txn) { store(t, txn, high, 0, payload(t, 1)) })
	if oid := newOids(t, s, 1)[0]; oid <= high {
		t.Errorf("NewOids after a store of oid %s returned %s", high, oid)
	}
}

// testConflict checks that stores based on a stale serial fail at Vote
// with a ConflictError and write nothing.
func testConflict(t *testing.T, s zodb.WriteStorage) {
	ctx := ctxT(t)
	oids := newOids(t, s, 2)
	a, b := oids[0], oids[1]
	tid1 := mustCommit(t, s, func(txn zodb.Txn) {
		store(t, txn, a, 0, payload(t, 1))
		store(t, txn, b, 0, payload(t, 2))
	})
	tid2 := mustCommit(t, s, func(txn zodb.Txn) { store(t, txn, a, tid1, payload(t, 3)) })

	for _, c := range []struct {
		name   string
		serial zodb.Tid
	}{{"stale serial", tid1}, {"serial 0 for an existing object", 0}, {"future serial", tid2 + 1}} {
		_, _, err := commit(t, s, zodb.TxnMeta{}, func(txn zodb.Txn) {
			store(t, txn, b, tid1, payload(t, 4)) // not in conflict
			store(t, txn, a, c.serial, payload(t, 5))
		})
		cs := conflicts(err)
		if len(cs) != 1 || cs[0].Oid != a || cs[0].Serial != c.serial || cs[0].Committed != tid2 || cs[0].Read {
			t.Errorf("%s: Vote error %v (%T); want one ConflictError for %s, serial %s, committed %s", c.name, err, err, a, c.serial, tid2)
		}
		if last, err := s.LastTid(ctx); last != tid2 || err != nil {
			t.Errorf("%s: LastTid after the conflict = %s, %v; want %s", c.name, last, err, tid2)
		}
		mustLoad(t, s, a, zodb.TidMax, payload(t, 3), tid2)
		mustLoad(t, s, b, zodb.TidMax, payload(t, 2), tid1)
	}
	// A commit after the conflicts works.
	mustCommit(t, s, func(txn zodb.Txn) { store(t, txn, a, tid2, payload(t, 6)) })
}

// testReadConflict checks CheckCurrentSerial.
func testReadConflict(t *testing.T, s zodb.WriteStorage) {
	oids := newOids(t, s, 2)
	a, b := oids[0], oids[1]
	tid1 := mustCommit(t, s, func(txn zodb.Txn) {
		store(t, txn, a, 0, payload(t, 1))
		store(t, txn, b, 0, payload(t, 2))
	})
	// Current: commits.
	mustCommit(t, s, func(txn zodb.Txn) {
		if err := txn.CheckCurrentSerial(a, tid1); err != nil {
			t.Fatal(err)
		}
		store(t, txn, b, tid1, payload(t, 3))
	})
	tid3 := mustCommit(t, s, func(txn zodb.Txn) { store(t, txn, a, tid1, payload(t, 4)) })
	_, _, err := commit(t, s, zodb.TxnMeta{}, func(txn zodb.Txn) {
		if err := txn.CheckCurrentSerial(a, tid1); err != nil {
			t.Fatal(err)
		}
		store(t, txn, oids[1], 0, payload(t, 5))
	})
	cs := conflicts(err)
	if len(cs) == 0 || cs[0].Oid != a || cs[0].Serial != tid1 || cs[0].Committed != tid3 || !cs[0].Read {
		t.Errorf("Vote after a stale CheckCurrentSerial: %v; want a read ConflictError for %s, serial %s, committed %s", err, a, tid1, tid3)
	}
}

// testDelete checks Delete (ZODB's deleteObject).
func testDelete(t *testing.T, f Factory, s zodb.WriteStorage) {
	ctx := ctxT(t)
	a := newOids(t, s, 1)[0]
	tid1 := mustCommit(t, s, func(txn zodb.Txn) { store(t, txn, a, 0, payload(t, 1)) })
	tid2, cbOids, err := commit(t, s, zodb.TxnMeta{}, func(txn zodb.Txn) {
		if err := txn.Delete(a, tid1); err != nil {
			t.Fatal(err)
		}
	})
	if err != nil {
		t.Fatalf("commit of Delete: %v", err)
	}
	if !slices.Equal(cbOids, []zodb.Oid{a}) {
		t.Errorf("onCommit oids %v, want [%s]", cbOids, a)
	}
	_, _, err = s.Load(ctx, zodb.Xid{Oid: a, At: zodb.TidMax})
	checkNoData(t, s.URL(), "Load of a deleted object", a, tid2, err)
	mustLoad(t, s, a, tid2-1, payload(t, 1), tid1)
	h, err := s.History(ctx, a, 10)
	if err != nil || len(h) != 2 || h[0].Tid != tid2 || h[0].Size != 0 || h[1].Tid != tid1 {
		t.Errorf("History of a deleted object = %+v, %v; want %s (size 0) then %s", h, err, tid2, tid1)
	}
	got := iterate(t, ctx, s.Iterate(ctx, tid2, tid2))
	compareTxns(t, &f, "Iterate over the deletion", got, []RefTxn{{Tid: tid2, Status: zodb.TxnComplete, Records: []RefRecord{{Oid: a, NoData: true}}}})
	// A deletion based on a stale serial conflicts.
	_, _, err = commit(t, s, zodb.TxnMeta{}, func(txn zodb.Txn) {
		if err := txn.Delete(a, tid1); err != nil {
			t.Fatal(err)
		}
	})
	if cs := conflicts(err); len(cs) != 1 || cs[0].Oid != a || cs[0].Committed != tid2 {
		t.Errorf("Delete based on a stale serial: %v; want a ConflictError for %s, committed %s", err, a, tid2)
	}
}

// testAbort checks that an aborted transaction leaves nothing, before and
// after Vote, and that Abort releases the commit lock.
func testAbort(t *testing.T, s zodb.WriteStorage) {
	ctx := ctxT(t)
	a := newOids(t, s, 1)[0]
	tid1 := mustCommit(t, s, func(txn zodb.Txn) { store(t, txn, a, 0, payload(t, 1)) })
	for _, vote := range []bool{false, true} {
		txn, err := s.Begin(ctx, zodb.TxnMeta{})
		if err != nil {
			t.Fatal(err)
		}
		store(t, txn, a, tid1, payload(t, 2))
		if vote {
			if _, err := txn.Vote(ctx); err != nil {
				t.Fatalf("Vote: %v", err)
			}
		}
		txn.Abort()
		txn.Abort() // a no-op
		if last, err := s.LastTid(ctx); last != tid1 || err != nil {
			t.Errorf("LastTid after Abort (voted %v) = %s, %v; want %s", vote, last, err, tid1)
		}
		mustLoad(t, s, a, zodb.TidMax, payload(t, 1), tid1)
	}
	// The commit lock was released: the next transaction commits.
	txn, err := s.Begin(ctx, zodb.TxnMeta{})
	if err != nil {
		t.Fatal(err)
	}
	store(t, txn, a, tid1, payload(t, 3))
	if _, err := txn.Vote(ctx); err != nil {
		t.Fatalf("Vote after an aborted vote: %v", err)
	}
	tid, err := txn.Finish(ctx, nil)
	if err != nil {
		t.Fatalf("Finish: %v", err)
	}
	txn.Abort() // after Finish: a no-op
	mustLoad(t, s, a, zodb.TidMax, payload(t, 3), tid)
}

// testTxnState checks that a Txn refuses calls out of order.
func testTxnState(t *testing.T, s zodb.WriteStorage) {
	ctx := ctxT(t)
	a := newOids(t, s, 1)[0]
	txn, err := s.Begin(ctx, zodb.TxnMeta{})
	if err != nil {
		t.Fatal(err)
	}
	store(t, txn, a, 0, payload(t, 1))
	if _, err := txn.Finish(ctx, nil); !errors.Is(err, zodb.ErrTxnState) {
		t.Errorf("Finish without Vote: %v, want ErrTxnState", err)
	}
	txn.Abort()

	txn, err = s.Begin(ctx, zodb.TxnMeta{})
	if err != nil {
		t.Fatal(err)
	}
	store(t, txn, a, 0, payload(t, 1))
	if _, err := txn.Vote(ctx); err != nil {
		t.Fatalf("Vote: %v", err)
	}
	if err := txn.Store(a, 0, payload(t, 2)); !errors.Is(err, zodb.ErrTxnState) {
		t.Errorf("Store after Vote: %v, want ErrTxnState", err)
	}
	tid, err := txn.Finish(ctx, nil)
	if err != nil {
		t.Fatalf("Finish: %v", err)
	}
	mustLoad(t, s, a, zodb.TidMax, payload(t, 1), tid)
}

// testEmptyTxn commits a transaction without records.
func testEmptyTxn(t *testing.T, f Factory, s zodb.WriteStorage) {
	ctx := ctxT(t)
	before, err := s.LastTid(ctx)
	if err != nil {
		t.Fatal(err)
	}
	meta := zodb.TxnMeta{Description: []byte("nothing")}
	tid, oids, err := commit(t, s, meta, func(zodb.Txn) {})
	if err != nil {
		t.Fatalf("commit: %v", err)
	}
	if tid <= before || len(oids) != 0 {
		t.Errorf("empty transaction: tid %s (last %s), onCommit oids %v", tid, before, oids)
	}
	if last, err := s.LastTid(ctx); last != tid || err != nil {
		t.Errorf("LastTid = %s, %v; want %s", last, err, tid)
	}
	got := iterate(t, ctx, s.Iterate(ctx, tid, tid))
	compareTxns(t, &f, "Iterate over the empty transaction", got, []RefTxn{{Tid: tid, Status: zodb.TxnComplete, Description: meta.Description, Records: nil}})
}

// testConcurrent commits from several goroutines at once, each on its own
// objects: every commit succeeds with its own tid, and each transaction is
// iterated with its own records.
func testConcurrent(t *testing.T, s zodb.WriteStorage) {
	const workers, commits = 4, 3
	oids := newOids(t, s, workers)
	tids := make([][]zodb.Tid, workers)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx := ctxT(t)
			var serial zodb.Tid
			for i := range commits {
				txn, err := s.Begin(ctx, zodb.TxnMeta{})
				if err == nil {
					err = txn.Store(oids[w], serial, []byte(fmt.Sprintf("worker %d commit %d", w, i)))
				}
				if err == nil {
					_, err = txn.Vote(ctx)
				}
				if err == nil {
					serial, err = txn.Finish(ctx, nil)
				}
				if err != nil {
					if txn != nil {
						txn.Abort()
					}
					errs[w] = fmt.Errorf("worker %d commit %d: %w", w, i, err)
					return
				}
				tids[w] = append(tids[w], serial)
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	owner := map[zodb.Tid]int{}
	var lo zodb.Tid = zodb.TidMax
	var hi zodb.Tid
	for w, ts := range tids {
		for _, tid := range ts {
			if _, dup := owner[tid]; dup {
				t.Errorf("tid %s given to two commits", tid)
			}
			owner[tid] = w
			lo, hi = min(lo, tid), max(hi, tid)
		}
		mustLoad(t, s, oids[w], zodb.TidMax, []byte(fmt.Sprintf("worker %d commit %d", w, commits-1)), ts[commits-1])
	}
	n := 0
	for _, it := range iterate(t, ctx, s.Iterate(ctx, lo, hi)) {
		w, ok := owner[it.txn.Tid]
		if !ok {
			continue
		}
		n++
		if len(it.recs) != 1 || it.recs[0].Oid != oids[w] {
			t.Errorf("transaction %s of worker %d: records %+v", it.txn.Tid, w, it.recs)
		}
	}
	if n != workers*commits {
		t.Errorf("iterated %d of the %d concurrent commits", n, workers*commits)
	}
}

// testUndo checks undo of a change and of a creation, and the undo log.
func testUndo(t *testing.T, f Factory, s zodb.WriteStorage) {
	ctx := ctxT(t)
	oids := newOids(t, s, 2)
	a, b := oids[0], oids[1]
	tid1 := mustCommit(t, s, func(txn zodb.Txn) { store(t, txn, a, 0, payload(t, 1)) })
	tid2 := mustCommit(t, s, func(txn zodb.Txn) { store(t, txn, a, tid1, payload(t, 3)) })

	undo := func(tid zodb.Tid) (zodb.Tid, []zodb.Oid, error) { return undoTxn(t, s, tid) }

	// Undo of a change brings the previous revision back (a backpointer).
	utid, undone, err := undo(tid2)
	if err != nil {
		t.Fatalf("undo of %s: %v", tid2, err)
	}
	if !slices.Equal(undone, []zodb.Oid{a}) {
		t.Errorf("undo of %s: Vote's undone oids %v, want [%s]", tid2, undone, a)
	}
	mustLoad(t, s, a, zodb.TidMax, payload(t, 1), utid)
	got := iterate(t, ctx, s.Iterate(ctx, utid, utid))
	rec := refRecord(a, tid1, payload(t, 1))
	rec.HistorySize = 0
	compareTxns(t, &f, "Iterate over the undo", got, []RefTxn{{Tid: utid, Status: zodb.TxnComplete, Description: []byte("undo"), Records: []RefRecord{rec}}})

	// Undo of a creation leaves the object without data.
	tid3 := mustCommit(t, s, func(txn zodb.Txn) { store(t, txn, b, 0, payload(t, 4)) })
	utid2, _, err := undo(tid3)
	if err != nil {
		t.Fatalf("undo of the creation %s: %v", tid3, err)
	}
	_, _, err = s.Load(ctx, zodb.Xid{Oid: b, At: zodb.TidMax})
	checkNoData(t, s.URL(), "Load after the undo of its creation", b, utid2, err)

	log, err := s.(zodb.Undoer).UndoLog(ctx, 0, -20)
	if err != nil {
		t.Fatalf("UndoLog: %v", err)
	}
	last, _ := s.LastTid(ctx)
	if len(log) == 0 || log[0].Tid != last || !slices.ContainsFunc(log, func(e zodb.UndoEntry) bool { return e.Tid == utid }) {
		t.Errorf("UndoLog(0, -20) does not start with the last tid %s and hold the undo %s: %+v", last, utid, log)
	}
}

// undoTxn commits the undo of tid and returns the undo's tid and the
// undone oids (sorted) that Vote reported.
func undoTxn(t *testing.T, s zodb.WriteStorage, tid zodb.Tid) (zodb.Tid, []zodb.Oid, error) {
	t.Helper()
	ctx := ctxT(t)
	txn, err := s.Begin(ctx, zodb.TxnMeta{Description: []byte("undo")})
	if err != nil {
		t.Fatal(err)
	}
	if err := txn.Undo(tid); err != nil {
		txn.Abort()
		return 0, nil, err
	}
	undone, err := txn.Vote(ctx)
	if err != nil {
		txn.Abort()
		return 0, nil, err
	}
	slices.Sort(undone)
	utid, err := txn.Finish(ctx, nil)
	return utid, undone, err
}

// testUndoConflict checks that the undo of a revision that a later
// transaction changed again fails with an UndoError and writes nothing.
func testUndoConflict(t *testing.T, s zodb.WriteStorage) {
	ctx := ctxT(t)
	c := newOids(t, s, 1)[0]
	tid1 := mustCommit(t, s, func(txn zodb.Txn) { store(t, txn, c, 0, payload(t, 1)) })
	tid2 := mustCommit(t, s, func(txn zodb.Txn) { store(t, txn, c, tid1, payload(t, 2)) })
	tid3 := mustCommit(t, s, func(txn zodb.Txn) { store(t, txn, c, tid2, payload(t, 3)) })
	_, _, err := undoTxn(t, s, tid2)
	var ue *zodb.UndoError
	if !errors.As(err, &ue) {
		t.Errorf("undo of %s, changed again since: %v (%T), want an UndoError", tid2, err, err)
	} else if ue.Reason == "" || strings.Contains(ue.Reason, "POSException") {
		// A network client rebuilds the reason from the server's
		// exception, not its representation.
		t.Errorf("undo of %s, changed again since: reason %q", tid2, ue.Reason)
	}
	if last, err := s.LastTid(ctx); last != tid3 || err != nil {
		t.Errorf("LastTid after the failed undo = %s, %v; want %s", last, err, tid3)
	}
	mustLoad(t, s, c, zodb.TidMax, payload(t, 3), tid3)
}

// testResolve checks VoteResolving, where the Txn supports it.
func testResolve(t *testing.T, s zodb.WriteStorage) {
	ctx := ctxT(t)
	oids := newOids(t, s, 2)
	a, b := oids[0], oids[1]
	tid1 := mustCommit(t, s, func(txn zodb.Txn) {
		store(t, txn, a, 0, []byte("base"))
		store(t, txn, b, 0, []byte("base"))
	})
	tid2 := mustCommit(t, s, func(txn zodb.Txn) {
		store(t, txn, a, tid1, []byte("base+other"))
		store(t, txn, b, tid1, []byte("base+other"))
	})
	txn, err := s.Begin(ctx, zodb.TxnMeta{})
	if err != nil {
		t.Fatal(err)
	}
	rt, ok := txn.(zodb.ResolvingTxn)
	if !ok {
		txn.Abort()
		t.Skip("the Txn is not a zodb.ResolvingTxn")
	}
	defer rt.Abort()
	store(t, rt, a, tid1, []byte("mine a"))
	store(t, rt, b, tid1, []byte("mine b"))
	// a merges; the resolver cannot tell for b, which comes back as a
	// conflict with its data for the caller to resolve.
	resolve := func(old, committed, new []byte) ([]byte, error) {
		if string(old) != "base" || string(committed) != "base+other" {
			return nil, fmt.Errorf("resolver given old %q, committed %q", old, committed)
		}
		if string(new) == "mine b" {
			return nil, errors.New("cannot tell")
		}
		if string(new) == "final" {
			return nil, fmt.Errorf("refused: %w", zodb.ErrNotResolvable)
		}
		return append(committed, "+"+string(new)...), nil
	}
	resolved, err := rt.VoteResolving(ctx, resolve)
	cs := conflicts(err)
	if len(cs) != 1 || cs[0].Oid != b || string(cs[0].Data) != "mine b" || cs[0].Committed != tid2 || cs[0].Serial != tid1 {
		t.Fatalf("VoteResolving with one merge left to the caller: %v, %v; want one ConflictError for %s carrying its data", resolved, err, b)
	}
	// The caller resolves the rest and votes again.
	store(t, rt, b, tid2, []byte("base+other+mine b, by the caller"))
	resolved2, err := rt.VoteResolving(ctx, nil)
	if err != nil {
		t.Fatalf("second VoteResolving: %v", err)
	}
	// The merged oid is reported by one of the votes (the storage's data,
	// which the client must not cache its own copy for).
	if !slices.Contains(resolved, a) && !slices.Contains(resolved2, a) {
		t.Errorf("VoteResolving: resolved %v then %v, want %s among them", resolved, resolved2, a)
	}
	tid, err := rt.Finish(ctx, nil)
	if err != nil {
		t.Fatalf("Finish: %v", err)
	}
	mustLoad(t, s, a, zodb.TidMax, []byte("base+other+mine a"), tid)
	mustLoad(t, s, b, zodb.TidMax, []byte("base+other+mine b, by the caller"), tid)

	// A refusal (ErrNotResolvable) is final: the vote fails with the
	// conflict and writes nothing.
	txn, err = s.Begin(ctx, zodb.TxnMeta{})
	if err != nil {
		t.Fatal(err)
	}
	rt = txn.(zodb.ResolvingTxn)
	defer rt.Abort()
	store(t, rt, a, tid1, []byte("final"))
	_, err = rt.VoteResolving(ctx, resolve)
	if cs := conflicts(err); len(cs) != 1 || cs[0].Oid != a || cs[0].Committed != tid {
		t.Errorf("VoteResolving with a refused merge: %v; want a ConflictError for %s, committed %s", err, a, tid)
	}
	rt.Abort()
	mustLoad(t, s, a, zodb.TidMax, []byte("base+other+mine a"), tid)
	mustCommit(t, s, func(txn zodb.Txn) { store(t, txn, a, tid, []byte("after")) })
}

// recvEvent waits (boundedly) for the next event of ch.
func recvEvent(t *testing.T, ch <-chan zodb.CommitEvent) zodb.CommitEvent {
	t.Helper()
	select {
	case ev, ok := <-ch:
		if !ok {
			t.Fatal("watch channel closed")
		}
		return ev
	case <-time.After(Timeout):
		t.Fatal("no commit event")
	}
	panic("unreachable")
}

// checkEvent checks that ev reports tid and oids.
func checkEvent(t *testing.T, ev zodb.CommitEvent, tid zodb.Tid, oids []zodb.Oid) {
	t.Helper()
	got := slices.Clone(ev.Oids)
	slices.Sort(got)
	if ev.Tid != tid || !slices.Equal(got, oids) {
		t.Errorf("commit event %s %v, want %s %v", ev.Tid, got, tid, oids)
	}
}

// testWatch checks that a storage reports its own commits to its watchers,
// in order, and closes the channel when the watch's context is done.
func testWatch(t *testing.T, s zodb.WriteStorage, w zodb.Watcher) {
	ctx := ctxT(t)
	wctx, cancel := context.WithCancel(ctx)
	ch, err := w.Watch(wctx)
	if err != nil {
		cancel()
		t.Fatalf("Watch: %v", err)
	}
	oids := newOids(t, s, 2)
	tid1 := mustCommit(t, s, func(txn zodb.Txn) { store(t, txn, oids[0], 0, payload(t, 1)) })
	tid2 := mustCommit(t, s, func(txn zodb.Txn) {
		store(t, txn, oids[0], tid1, payload(t, 2))
		store(t, txn, oids[1], 0, payload(t, 3))
	})
	checkEvent(t, recvEvent(t, ch), tid1, oids[:1])
	checkEvent(t, recvEvent(t, ch), tid2, oids)
	cancel()
	deadline := time.After(Timeout)
	for {
		select {
		case _, ok := <-ch:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("the watch channel stays open after its context is done")
		}
	}
}

// testPeer checks what a second storage on the same database sees of the
// first one's commits: its watchers get them, Sync and Load see them, and
// its stores based on what it read before conflict.
func testPeer(t *testing.T, s zodb.WriteStorage, p zodb.Storage) {
	ctx := ctxT(t)
	a := newOids(t, s, 1)[0]
	tid1 := mustCommit(t, s, func(txn zodb.Txn) { store(t, txn, a, 0, payload(t, 1)) })
	if sy, ok := p.(zodb.Syncer); ok {
		if last, err := sy.Sync(ctx); last < tid1 || err != nil {
			t.Errorf("peer's Sync = %s, %v; want >= %s", last, err, tid1)
		}
	}
	mustLoad(t, p, a, zodb.TidMax, payload(t, 1), tid1) // now cached by a client

	var ch <-chan zodb.CommitEvent
	if w, ok := p.(zodb.Watcher); ok {
		var err error
		if ch, err = w.Watch(ctx); err != nil {
			t.Fatalf("peer's Watch: %v", err)
		}
	}
	tid2 := mustCommit(t, s, func(txn zodb.Txn) { store(t, txn, a, tid1, payload(t, 2)) })
	if ch != nil {
		checkEvent(t, recvEvent(t, ch), tid2, []zodb.Oid{a})
	}
	if sy, ok := p.(zodb.Syncer); ok {
		if last, err := sy.Sync(ctx); last < tid2 || err != nil {
			t.Errorf("peer's Sync = %s, %v; want >= %s", last, err, tid2)
		}
	}
	if last, err := p.LastTid(ctx); last != tid2 || err != nil {
		t.Errorf("peer's LastTid = %s, %v; want %s", last, err, tid2)
	}
	mustLoad(t, p, a, zodb.TidMax, payload(t, 2), tid2)
	mustLoad(t, p, a, tid1, payload(t, 1), tid1)

	// The peer commits based on what it read before: a conflict.
	if pw, ok := p.(zodb.WriteStorage); ok {
		_, _, err := commit(t, pw, zodb.TxnMeta{}, func(txn zodb.Txn) { store(t, txn, a, tid1, payload(t, 3)) })
		if cs := conflicts(err); len(cs) != 1 || cs[0].Oid != a || cs[0].Committed != tid2 {
			t.Errorf("peer's store based on a stale serial: %v; want a ConflictError, committed %s", err, tid2)
		}
	}
}
