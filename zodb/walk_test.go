package zodb_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/zodb"
)

// sliceIter iterates txns (each a list of oids); NextData fails with err
// at record failAt of transaction failTxn (-1: never), and counts its calls.
type sliceIter struct {
	txns      [][]zodb.Oid
	i         int
	failTxn   int
	failAt    int
	err       error
	nextDatas int
}

type sliceData struct {
	it  *sliceIter
	txn int
	j   int
	d   zodb.DataInfo
}

func (it *sliceIter) NextTxn(context.Context) (*zodb.TxnInfo, zodb.DataIterator, error) {
	if it.i == len(it.txns) {
		return nil, nil, io.EOF
	}
	it.i++
	return &zodb.TxnInfo{Tid: zodb.Tid(it.i)}, &sliceData{it: it, txn: it.i - 1}, nil
}

func (d *sliceData) NextData(context.Context) (*zodb.DataInfo, error) {
	d.it.nextDatas++
	if d.txn == d.it.failTxn && d.j == d.it.failAt {
		return nil, d.it.err
	}
	if d.j == len(d.it.txns[d.txn]) {
		return nil, io.EOF
	}
	d.d = zodb.DataInfo{Oid: d.it.txns[d.txn][d.j], Tid: zodb.Tid(d.txn + 1)}
	d.j++
	return &d.d, nil
}

func TestWalk(t *testing.T) {
	ctx := context.Background()
	txns := [][]zodb.Oid{{1, 2}, {}, {3}}
	var got []string
	v := zodb.Visitor{
		Txn:    func(txn *zodb.TxnInfo) error { got = append(got, "txn "+txn.Tid.String()); return nil },
		Data:   func(txn *zodb.TxnInfo, d *zodb.DataInfo) error { got = append(got, "rec "+d.Oid.String()); return nil },
		TxnEnd: func(txn *zodb.TxnInfo) error { got = append(got, "end"); return nil },
	}
	if err := zodb.Walk(ctx, &sliceIter{txns: txns, failTxn: -1}, v); err != nil {
		t.Fatal(err)
	}
	want := "txn 0000000000000001,rec 0000000000000001,rec 0000000000000002,end,txn 0000000000000002,end,txn 0000000000000003,rec 0000000000000003,end"
	if s := strings.Join(got, ","); s != want {
		t.Errorf("Walk visited\n%s\nwant\n%s", s, want)
	}

	// Without Data the records are not read.
	it := &sliceIter{txns: txns, failTxn: -1}
	n := 0
	if err := zodb.Walk(ctx, it, zodb.Visitor{TxnEnd: func(*zodb.TxnInfo) error { n++; return nil }}); err != nil || n != 3 || it.nextDatas != 0 {
		t.Errorf("Walk without Data: %v, %d TxnEnd calls, %d NextData calls; want nil, 3, 0", err, n, it.nextDatas)
	}

	// An iterator's error is wrapped with its place; TxnEnd is not called
	// for the transaction it interrupted.
	errDisk := errors.New("disk on fire")
	got = nil
	err := zodb.Walk(ctx, &sliceIter{txns: txns, failTxn: 2, failAt: 1, err: errDisk}, v)
	if !errors.Is(err, errDisk) || !strings.Contains(err.Error(), "transaction 0000000000000003: record after 0000000000000003 (1 read)") {
		t.Errorf("Walk with a failing NextData = %v", err)
	}
	if s := strings.Join(got, ","); strings.HasSuffix(s, "rec 0000000000000003,end") {
		t.Errorf("TxnEnd called for the interrupted transaction: %s", s)
	}

	// A visitor's error is returned as it is, and stops the walk.
	errStop := errors.New("stop")
	calls := 0
	err = zodb.Walk(ctx, &sliceIter{txns: txns, failTxn: -1}, zodb.Visitor{Data: func(*zodb.TxnInfo, *zodb.DataInfo) error { calls++; return errStop }})
	if err != errStop || calls != 1 {
		t.Errorf("Walk with a failing visitor = %v after %d calls, want %v after 1", err, calls, errStop)
	}
}
