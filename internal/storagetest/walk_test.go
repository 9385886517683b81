package storagetest_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/zodb"
)

// expect is the part of fs1/testdata/NAME.expect.json (written by ZODB/py's
// iterator over the fixture) that these tests compare with.
type expect struct {
	Txns []struct {
		Tid     string `json:"tid"`
		Status  string `json:"status"`
		Records []struct {
			Oid         string  `json:"oid"`
			Backpointer *int64  `json:"backpointer"`
			DataTxn     *string `json:"data_txn"`
			Data        *string `json:"data"` // hex; null for no data
		} `json:"records"`
	} `json:"txns"`
}

// walked is one transaction as Walk reported it, kept past the call.
type walked struct {
	tid    zodb.Tid
	status zodb.TxnStatus
	recs   []zodb.DataInfo
}

// TestWalkFileStorage walks the fs1 fixtures and compares every transaction
// and record with what ZODB/py's iterator reported. The records are kept
// until the end, so they must be copies.
func TestWalkFileStorage(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{"1", "1packed", "empty", "torn"} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("..", "..", "fs1", "testdata")
			var e expect
			b, err := os.ReadFile(filepath.Join(dir, name+".expect.json"))
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(b, &e); err != nil {
				t.Fatal(err)
			}
			src, err := os.ReadFile(filepath.Join(dir, name+".fs"))
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), name+".fs")
			if err := os.WriteFile(path, src, 0o644); err != nil {
				t.Fatal(err)
			}
			fs, err := fs1.Open(path, &fs1.Options{Logf: func(string, ...interface{}) {}})
			if err != nil {
				t.Fatal(err)
			}
			defer fs.Close()

			var got []walked
			storagetest.Walk(t, ctx, fs.Iterate(ctx, 0, zodb.TidMax), func(txn *zodb.TxnInfo, recs []zodb.DataInfo) {
				got = append(got, walked{txn.Tid, txn.Status, recs})
			})

			if len(got) != len(e.Txns) {
				t.Fatalf("%d transactions, want %d", len(got), len(e.Txns))
			}
			empty := 0
			for i, w := range e.Txns {
				g := got[i]
				if g.tid.String() != w.Tid || string(g.status) != w.Status {
					t.Errorf("txn %d: %s %q, want %s %q", i, g.tid, g.status, w.Tid, w.Status)
				}
				if g.recs == nil {
					t.Errorf("txn %s: nil recs, want a slice", g.tid)
				}
				if len(w.Records) == 0 {
					empty++
				}
				if len(g.recs) != len(w.Records) {
					t.Errorf("txn %s: %d records, want %d", w.Tid, len(g.recs), len(w.Records))
					continue
				}
				for j, r := range w.Records {
					d := g.recs[j]
					wantDataTid := w.Tid
					if r.Backpointer != nil {
						wantDataTid = "0000000000000000"
						if r.DataTxn != nil {
							wantDataTid = *r.DataTxn
						}
					}
					if d.Oid.String() != r.Oid || d.Tid.String() != w.Tid || d.DataTid.String() != wantDataTid {
						t.Errorf("txn %s rec %d: oid %s tid %s data tid %s, want %s %s %s", w.Tid, j, d.Oid, d.Tid, d.DataTid, r.Oid, w.Tid, wantDataTid)
					}
					wantData := "<nil>"
					if r.Data != nil {
						wantData = *r.Data
					}
					if (d.Data == nil) != (r.Data == nil) || (r.Data != nil && hex.EncodeToString(d.Data) != wantData) {
						t.Errorf("txn %s rec %d: data %x (nil %v), want %s", w.Tid, j, d.Data, d.Data == nil, wantData)
					}
				}
			}
			// The fixtures "1" and "torn" have a transaction without
			// records: it must be reported too.
			if (name == "1" || name == "torn") && empty == 0 {
				t.Errorf("fixture %s: no transaction without records", name)
			}
		})
	}
}

// fakeIter is an Iterator that reuses its TxnInfo, DataInfo and data
// buffer between calls, as a real one may, and that can fail.
type fakeIter struct {
	txns    [][][]byte // data of each record of each transaction (nil: no data)
	txnErr  int        // NextTxn fails when asked for transaction txnErr (-1: never)
	dataErr [2]int     // NextData fails in transaction [0] at record [1]
	i, j    int
	txn     zodb.TxnInfo
	d       zodb.DataInfo
	buf     []byte
}

var errFake = errors.New("fake failure")

func (it *fakeIter) NextTxn(context.Context) (*zodb.TxnInfo, zodb.DataIterator, error) {
	if it.i == it.txnErr {
		return nil, nil, errFake
	}
	if it.i >= len(it.txns) {
		return nil, nil, io.EOF
	}
	it.i++
	it.j = 0
	it.txn.Tid = zodb.Tid(it.i)
	return &it.txn, it, nil
}

func (it *fakeIter) NextData(context.Context) (*zodb.DataInfo, error) {
	if it.dataErr == [2]int{it.i - 1, it.j} {
		return nil, errFake
	}
	recs := it.txns[it.i-1]
	if it.j >= len(recs) {
		return nil, io.EOF
	}
	it.j++
	it.d.Oid = zodb.Oid(10*it.i + it.j)
	it.d.Tid = it.txn.Tid
	it.d.Data = nil
	if data := recs[it.j-1]; data != nil {
		it.buf = append(it.buf[:0], data...)
		it.d.Data = it.buf
	}
	return &it.d, nil
}

func fakeTxns() [][][]byte {
	return [][][]byte{
		{[]byte("one"), nil, {}},
		{},
		{[]byte("two"), []byte("three")},
	}
}

// TestWalkCopies checks that Walk reports every transaction, the empty one
// included, and that the records it gives stay intact while the iterator
// reuses its buffers, with nil and empty data kept apart.
func TestWalkCopies(t *testing.T) {
	ctx := context.Background()
	want := fakeTxns()
	it := &fakeIter{txns: fakeTxns(), txnErr: -1, dataErr: [2]int{-1, -1}}
	var got [][]zodb.DataInfo
	var tids []zodb.Tid
	storagetest.Walk(t, ctx, it, func(txn *zodb.TxnInfo, recs []zodb.DataInfo) {
		tids = append(tids, txn.Tid)
		got = append(got, recs)
	})
	if fmt.Sprint(tids) != fmt.Sprint([]zodb.Tid{1, 2, 3}) {
		t.Fatalf("transactions %v, want 1 2 3", tids)
	}
	for i, recs := range want {
		if len(got[i]) != len(recs) {
			t.Errorf("txn %d: %d records, want %d", i+1, len(got[i]), len(recs))
			continue
		}
		for j, data := range recs {
			d := got[i][j]
			if d.Oid != zodb.Oid(10*(i+1)+j+1) || d.Tid != zodb.Tid(i+1) || !bytes.Equal(d.Data, data) || (d.Data == nil) != (data == nil) {
				t.Errorf("txn %d rec %d: %s %s %q (nil %v), want data %q (nil %v)", i+1, j, d.Oid, d.Tid, d.Data, d.Data == nil, data, data == nil)
			}
		}
	}

	it = &fakeIter{txns: fakeTxns(), txnErr: -1, dataErr: [2]int{-1, -1}}
	if _, _, err := it.NextTxn(ctx); err != nil {
		t.Fatal(err)
	}
	recs := storagetest.Records(t, ctx, it)
	if len(recs) != 3 || string(recs[0].Data) != "one" || recs[1].Data != nil || recs[2].Data == nil || len(recs[2].Data) != 0 {
		t.Errorf("Records: %+v", recs)
	}
}

// fatalTB records the first Fatalf and ends the goroutine, as t.Fatalf does.
type fatalTB struct {
	testing.TB
	msg string
}

func (tb *fatalTB) Helper() {}

func (tb *fatalTB) Fatalf(format string, args ...interface{}) {
	tb.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// fails runs f with a fatalTB in its own goroutine and returns the message
// it failed with ("" if it did not).
func fails(t *testing.T, f func(tb testing.TB)) string {
	tb := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(tb)
	}()
	<-done
	return tb.msg
}

// TestWalkErrors checks that an iteration error fails the test with a
// message naming where it happened, and that fn never sees the transaction
// whose records could not all be read.
func TestWalkErrors(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		txnErr  int
		dataErr [2]int
		calls   int    // fn calls before the failure
		where   string // in the message
	}{
		{txnErr: 0, dataErr: [2]int{-1, -1}, calls: 0, where: "first transaction"},
		{txnErr: 2, dataErr: [2]int{-1, -1}, calls: 2, where: "transaction after 0000000000000002 (2 read)"},
		{txnErr: -1, dataErr: [2]int{0, 0}, calls: 0, where: "transaction 0000000000000001: first record"},
		{txnErr: -1, dataErr: [2]int{2, 1}, calls: 2, where: "transaction 0000000000000003: record after 000000000000001f (1 read)"},
	} {
		it := &fakeIter{txns: fakeTxns(), txnErr: c.txnErr, dataErr: c.dataErr}
		calls := 0
		msg := fails(t, func(tb testing.TB) {
			storagetest.Walk(tb, ctx, it, func(*zodb.TxnInfo, []zodb.DataInfo) { calls++ })
		})
		if !strings.Contains(msg, c.where) || !strings.Contains(msg, errFake.Error()) || calls != c.calls {
			t.Errorf("txnErr %d dataErr %v: %d calls, failed with %q; want %d calls and a failure naming %q and %q",
				c.txnErr, c.dataErr, calls, msg, c.calls, c.where, errFake)
		}
	}

	it := &fakeIter{txns: fakeTxns(), txnErr: -1, dataErr: [2]int{0, 2}}
	if _, _, err := it.NextTxn(ctx); err != nil {
		t.Fatal(err)
	}
	msg := fails(t, func(tb testing.TB) { storagetest.Records(tb, ctx, it) })
	if want := "record after 000000000000000c (2 read)"; !strings.Contains(msg, want) || !strings.Contains(msg, errFake.Error()) {
		t.Errorf("Records failed with %q, want one naming %q and %q", msg, want, errFake)
	}
}
