package storagetest

import (
	"bytes"
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/zodbd/zodbd/zodb"
)

// runRead runs the read tests on s, a storage over the database m
// describes.
func runRead(t *testing.T, f Factory, s zodb.Storage, m *model) {
	sub(t, f, "LastTid", func(t *testing.T) {
		got, err := s.LastTid(ctxT(t))
		if err != nil || got != m.lastTid {
			t.Errorf("LastTid = %s, %v; want %s", got, err, m.lastTid)
		}
	})
	sub(t, f, "LastOid", func(t *testing.T) {
		got, err := s.LastOid(ctxT(t))
		if err != nil || got != m.lastOid {
			t.Errorf("LastOid = %s, %v; want %s", got, err, m.lastOid)
		}
	})
	sub(t, f, "Load", func(t *testing.T) { testLoad(t, s, m) })
	sub(t, f, "LoadAppend", func(t *testing.T) {
		al, ok := s.(zodb.AppendLoader)
		if !ok {
			t.Skip("not a zodb.AppendLoader")
		}
		testLoadAppend(t, al, s.URL(), m)
	})
	sub(t, f, "LoadBefore", func(t *testing.T) {
		bl, ok := s.(zodb.BeforeLoader)
		if !ok {
			t.Skip("not a zodb.BeforeLoader")
		}
		testLoadBefore(t, bl, s.URL(), m)
	})
	sub(t, f, "History", func(t *testing.T) { testHistory(t, f, s, m, false) })
	sub(t, f, "HistorySize", func(t *testing.T) { testHistory(t, f, s, m, true) })
	sub(t, f, "Iterate", func(t *testing.T) { testIterate(t, f, s, m) })
	sub(t, f, "IterateRange", func(t *testing.T) { testIterateRange(t, f, s, m) })
	sub(t, f, "UndoLog", func(t *testing.T) {
		u, ok := s.(zodb.Undoer)
		if !ok {
			t.Skip("not a zodb.Undoer")
		}
		testUndoLog(t, f, u, m)
	})
}

// missingOids returns oids that have no record in m: one past the last
// and a large one.
func (m *model) missingOids() []zodb.Oid {
	return []zodb.Oid{m.lastOid + 1, m.lastOid + 1000, 1<<63 - 1}
}

// checkLoad compares one load's answer with the model's revision of oid
// at at (what Load at at, or LoadBefore before at+1, must answer).
func checkLoad(t *testing.T, m *model, url, what string, oid zodb.Oid, at zodb.Tid, data []byte, serial zodb.Tid, err error) {
	t.Helper()
	cur, _, known := m.loadAt(oid, at)
	switch {
	case !known:
		checkNoObject(t, url, what, oid, err)
	case cur == nil:
		checkNoData(t, url, what, oid, 0, err)
	case cur.rec.NoData:
		checkNoData(t, url, what, oid, cur.tid, err)
	case err != nil:
		t.Errorf("%s: %v; want serial %s", what, err, cur.tid)
	case serial != cur.tid || len(data) != cur.rec.Len || sha1.Sum(data) != cur.rec.SHA1:
		t.Errorf("%s: serial %s, %d bytes (sha1 %x); want serial %s, %d bytes (sha1 %x)",
			what, serial, len(data), sha1.Sum(data), cur.tid, cur.rec.Len, cur.rec.SHA1)
	}
}

// checkOpError checks that err is a *zodb.OpError naming url.
func checkOpError(t *testing.T, url, what string, err error) {
	t.Helper()
	var op *zodb.OpError
	if !errors.As(err, &op) {
		t.Errorf("%s: error %v (%T) is not a *zodb.OpError", what, err, err)
		return
	}
	if op.URL != url || op.Op == "" {
		t.Errorf("%s: OpError names storage %q, operation %q; want %q and an operation", what, op.URL, op.Op, url)
	}
}

func checkNoObject(t *testing.T, url, what string, oid zodb.Oid, err error) {
	t.Helper()
	var e *zodb.NoObjectError
	if !errors.As(err, &e) || e.Oid != oid {
		t.Errorf("%s: error %v; want a NoObjectError for %s", what, err, oid)
		return
	}
	checkOpError(t, url, what, err)
}

func checkNoData(t *testing.T, url, what string, oid zodb.Oid, deletedAt zodb.Tid, err error) {
	t.Helper()
	var e *zodb.NoDataError
	if !errors.As(err, &e) || e.Oid != oid || e.DeletedAt != deletedAt {
		t.Errorf("%s: error %v; want a NoDataError for %s, deleted at %s", what, err, oid, deletedAt)
		return
	}
	checkOpError(t, url, what, err)
}

// testLoad loads every oid of m at every state of m, and some oids that
// do not exist.
func testLoad(t *testing.T, s zodb.Storage, m *model) {
	ctx := ctxT(t)
	url := s.URL()
	for _, oid := range m.oids {
		for _, at := range m.states() {
			xid := zodb.Xid{Oid: oid, At: at}
			data, serial, err := s.Load(ctx, xid)
			checkLoad(t, m, url, "Load "+xid.String(), oid, at, data, serial, err)
		}
	}
	for _, oid := range m.missingOids() {
		for _, at := range m.oidStates(oid) {
			xid := zodb.Xid{Oid: oid, At: at}
			data, serial, err := s.Load(ctx, xid)
			checkLoad(t, m, url, "Load "+xid.String(), oid, at, data, serial, err)
		}
	}
}

// testLoadAppend checks that LoadAppend appends to dst what Load returns,
// at the states where each oid's answer changes.
func testLoadAppend(t *testing.T, s zodb.AppendLoader, url string, m *model) {
	ctx := ctxT(t)
	prefix := []byte("prefix")
	for _, oid := range append(append([]zodb.Oid{}, m.oids...), m.missingOids()[0]) {
		for _, at := range m.oidStates(oid) {
			xid := zodb.Xid{Oid: oid, At: at}
			dst := make([]byte, len(prefix), 64)
			copy(dst, prefix)
			got, serial, err := s.LoadAppend(ctx, xid, dst)
			what := "LoadAppend " + xid.String()
			if err == nil {
				if !bytes.HasPrefix(got, prefix) {
					t.Errorf("%s: dst's prefix overwritten: %q", what, got[:min(len(got), 16)])
					continue
				}
				got = got[len(prefix):]
			}
			checkLoad(t, m, url, what, oid, at, got, serial, err)
		}
	}
}

// testLoadBefore checks LoadBefore, and the next serial it reports, for
// the states where each oid's answer changes.
func testLoadBefore(t *testing.T, s zodb.BeforeLoader, url string, m *model) {
	ctx := ctxT(t)
	for _, oid := range append(append([]zodb.Oid{}, m.oids...), m.missingOids()[0]) {
		for _, at := range m.oidStates(oid) {
			before := at + 1 // LoadBefore(before) answers the state before-1
			if at == zodb.TidMax {
				before = at
			}
			data, serial, next, err := s.LoadBefore(ctx, oid, before, nil)
			what := fmt.Sprintf("LoadBefore %s before %s", oid, before)
			checkLoad(t, m, url, what, oid, before-1, data, serial, err)
			if err != nil {
				continue
			}
			var want zodb.Tid
			if _, n, _ := m.loadAt(oid, before-1); n != nil {
				want = n.tid
			}
			if next != want {
				t.Errorf("%s: next serial %s, want %s", what, next, want)
			}
		}
	}
}

// testHistory checks every oid's history, whole and cut to one entry; with
// size, it compares each entry's Size instead of its metadata.
func testHistory(t *testing.T, f Factory, s zodb.Storage, m *model, size bool) {
	ctx := ctxT(t)
	url := s.URL()
	for _, oid := range m.oids {
		revs := m.revs[oid]
		for _, n := range []int{len(revs) + 10, 1} {
			h, err := s.History(ctx, oid, n)
			if err != nil {
				t.Errorf("History(%s, %d): %v", oid, n, err)
				continue
			}
			if want := min(n, len(revs)); len(h) != want {
				t.Errorf("History(%s, %d): %d entries, want %d", oid, n, len(h), want)
				continue
			}
			for i, e := range h {
				r := revs[len(revs)-1-i]
				txn := m.txn[r.tid]
				what := fmt.Sprintf("History(%s, %d)[%d]", oid, n, i)
				switch {
				case e.Tid != r.tid:
					t.Errorf("%s: tid %s, want %s", what, e.Tid, r.tid)
				case size && e.Size != r.rec.HistorySize:
					t.Errorf("%s: size %d, want %d", what, e.Size, r.rec.HistorySize)
				case !size && (!bytes.Equal(e.User, txn.User) || !bytes.Equal(e.Description, txn.Description) || !f.sameExt(t, e.Extension, txn.Extension)):
					t.Errorf("%s: user %q description %q extension %x; want %q %q %x",
						what, e.User, e.Description, e.Extension, txn.User, txn.Description, txn.Extension)
				}
			}
		}
	}
	if size {
		return
	}
	for _, oid := range m.missingOids() {
		_, err := s.History(ctx, oid, 10)
		checkNoObject(t, url, fmt.Sprintf("History(%s)", oid), oid, err)
	}
}

// iterated is one transaction as an iteration returned it.
type iterated struct {
	txn  zodb.TxnInfo
	recs []zodb.DataInfo
}

// iterate reads it to the end, or fails the test.
func iterate(t *testing.T, ctx context.Context, it zodb.Iterator) []iterated {
	t.Helper()
	var got []iterated
	Walk(t, ctx, it, func(txn *zodb.TxnInfo, recs []zodb.DataInfo) {
		c := *txn
		c.User = bytes.Clone(txn.User)
		c.Description = bytes.Clone(txn.Description)
		c.Extension = bytes.Clone(txn.Extension)
		got = append(got, iterated{c, recs})
	})
	return got
}

// compareTxns compares an iteration's transactions with want.
func compareTxns(t *testing.T, f *Factory, what string, got []iterated, want []RefTxn) {
	t.Helper()
	if len(got) != len(want) {
		tids := make([]zodb.Tid, len(got))
		for i, g := range got {
			tids[i] = g.txn.Tid
		}
		t.Errorf("%s: %d transactions %v, want %d", what, len(got), tids, len(want))
		return
	}
	for i, w := range want {
		g := got[i]
		if g.txn.Tid != w.Tid || g.txn.Status != w.Status || !bytes.Equal(g.txn.User, w.User) ||
			!bytes.Equal(g.txn.Description, w.Description) || !f.sameExt(t, g.txn.Extension, w.Extension) {
			t.Errorf("%s: transaction %d: %s %q user %q description %q extension %x; want %s %q %q %q %x", what, i,
				g.txn.Tid, g.txn.Status, g.txn.User, g.txn.Description, g.txn.Extension,
				w.Tid, w.Status, w.User, w.Description, w.Extension)
			continue
		}
		if len(g.recs) != len(w.Records) {
			t.Errorf("%s: transaction %s: %d records, want %d", what, w.Tid, len(g.recs), len(w.Records))
			continue
		}
		for j, r := range w.Records {
			d := g.recs[j]
			ok := d.Oid == r.Oid && d.Tid == w.Tid && d.DataTid == r.DataTid && (d.Data == nil) == r.NoData
			if ok && !r.NoData {
				ok = len(d.Data) == r.Len && sha1.Sum(d.Data) == r.SHA1
			}
			if !ok {
				t.Errorf("%s: transaction %s record %d: oid %s tid %s data tid %s, %d bytes (nil %v, sha1 %x); want %s %s %s, %d bytes (nil %v, sha1 %x)",
					what, w.Tid, j, d.Oid, d.Tid, d.DataTid, len(d.Data), d.Data == nil, sha1.Sum(d.Data),
					r.Oid, w.Tid, r.DataTid, r.Len, r.NoData, r.SHA1)
			}
		}
	}
}

// testIterate iterates over the whole storage.
func testIterate(t *testing.T, f Factory, s zodb.Storage, m *model) {
	ctx := ctxT(t)
	compareTxns(t, &f, "Iterate(0, TidMax)", iterate(t, ctx, s.Iterate(ctx, 0, zodb.TidMax)), m.ref.Txns)
}

// testIterateRange checks that Iterate's bounds are inclusive and that
// bounds between or beyond the transactions select the right ones.
func testIterateRange(t *testing.T, f Factory, s zodb.Storage, m *model) {
	ctx := ctxT(t)
	txns := m.ref.Txns
	n := len(txns)
	if n < 3 {
		t.Skip("the fixture has fewer than 3 transactions")
	}
	check := func(lo, hi zodb.Tid, want []RefTxn) {
		compareTxns(t, &f, fmt.Sprintf("Iterate(%s, %s)", lo, hi), iterate(t, ctx, s.Iterate(ctx, lo, hi)), want)
	}
	check(txns[1].Tid, txns[n-2].Tid, txns[1:n-1])
	check(txns[1].Tid+1, txns[n-2].Tid-1, txns[2:n-2])
	check(txns[n/2].Tid, txns[n/2].Tid, txns[n/2:n/2+1])
	check(txns[n-1].Tid, zodb.TidMax, txns[n-1:])
	check(txns[n-1].Tid+1, zodb.TidMax, nil)
	check(0, txns[0].Tid-1, nil)
	check(txns[2].Tid, txns[1].Tid, nil)
}

// testUndoLog checks the undo log of a storage none of whose transactions
// were packed: every transaction, newest first, and windows of it.
func testUndoLog(t *testing.T, f Factory, u zodb.Undoer, m *model) {
	ctx := ctxT(t)
	var want []RefTxn
	for i := len(m.ref.Txns) - 1; i >= 0 && m.ref.Txns[i].Status != zodb.TxnPacked; i-- {
		want = append(want, m.ref.Txns[i])
	}
	check := func(first, last int, want []RefTxn) {
		t.Helper()
		got, err := u.UndoLog(ctx, first, last)
		if err != nil {
			t.Errorf("UndoLog(%d, %d): %v", first, last, err)
			return
		}
		if len(got) != len(want) {
			t.Errorf("UndoLog(%d, %d): %d entries, want %d", first, last, len(got), len(want))
			return
		}
		for i, e := range got {
			w := want[i]
			if e.Tid != w.Tid || !bytes.Equal(e.User, w.User) || !bytes.Equal(e.Description, w.Description) || !f.sameExt(t, e.Extension, w.Extension) {
				t.Errorf("UndoLog(%d, %d)[%d]: %s %q %q %x; want %s %q %q %x", first, last, i,
					e.Tid, e.User, e.Description, e.Extension, w.Tid, w.User, w.Description, w.Extension)
			}
		}
	}
	check(0, len(want)+5, want)
	check(0, -3, want[:min(3, len(want))])
	if len(want) >= 5 {
		check(2, 5, want[2:5])
	}
}

// drain reads it to io.EOF and returns the tids it gave.
func drain(ctx context.Context, it zodb.Iterator) ([]zodb.Tid, error) {
	var tids []zodb.Tid
	for {
		txn, _, err := it.NextTxn(ctx)
		if err == io.EOF {
			return tids, nil
		}
		if err != nil {
			return tids, err
		}
		tids = append(tids, txn.Tid)
	}
}
