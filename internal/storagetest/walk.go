package storagetest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"testing"

	"github.com/zodbd/zodbd/zodb"
)

// Walk reads it to the end and calls fn once for every transaction, in the
// iterator's order, with all the data records of that transaction in the
// order NextData returned them. A transaction without records is reported
// too, with an empty recs.
//
// txn is valid only during the call to fn; recs (and the Data of each
// record) are copies that belong to fn. A nil Data stays nil, so records
// without data can be told from records with empty data.
//
// Any error from NextTxn or NextData other than io.EOF fails the test with
// t.Fatalf, naming where it happened: after which transaction (and how many
// transactions), or in which transaction after how many records. fn is not
// called for a transaction whose records could not all be read. Walk must
// therefore be called from the goroutine running the test, like t.Fatalf.
func Walk(t testing.TB, ctx context.Context, it zodb.Iterator, fn func(txn *zodb.TxnInfo, recs []zodb.DataInfo)) {
	t.Helper()
	var recs []zodb.DataInfo
	err := zodb.Walk(ctx, it, zodb.Visitor{
		Txn:  func(*zodb.TxnInfo) error { recs = []zodb.DataInfo{}; return nil },
		Data: func(_ *zodb.TxnInfo, d *zodb.DataInfo) error { recs = append(recs, clone(d)); return nil },
		TxnEnd: func(txn *zodb.TxnInfo) error {
			fn(txn, recs)
			return nil
		},
	})
	if err != nil {
		t.Fatalf("storagetest.Walk: %v", err)
	}
}

// Records reads dit to the end and returns copies of all its data records,
// in the order NextData returned them (an empty slice, not nil, when there
// are none). A nil Data stays nil.
//
// Any error from NextData other than io.EOF fails the test with t.Fatalf,
// naming how many records were read before it. Records must be called from
// the goroutine running the test.
func Records(t testing.TB, ctx context.Context, dit zodb.DataIterator) []zodb.DataInfo {
	t.Helper()
	recs, err := records(ctx, dit)
	if err != nil {
		t.Fatalf("storagetest.Records: %v", err)
	}
	return recs
}

// records reads dit to the end; its error names the position.
func records(ctx context.Context, dit zodb.DataIterator) ([]zodb.DataInfo, error) {
	recs := []zodb.DataInfo{}
	for {
		d, err := dit.NextData(ctx)
		if err == io.EOF {
			return recs, nil
		}
		if err != nil {
			if len(recs) == 0 {
				return nil, fmt.Errorf("first record: %w", err)
			}
			return nil, fmt.Errorf("record after %s (%d read): %w", recs[len(recs)-1].Oid, len(recs), err)
		}
		recs = append(recs, clone(d))
	}
}

// clone returns a copy of d whose Data belongs to the caller (nil stays nil).
func clone(d *zodb.DataInfo) zodb.DataInfo {
	r := *d
	r.Data = bytes.Clone(d.Data)
	return r
}

// CheckRestAfterCancel checks that after NextData calls of d given up
// (their contexts ended) once the first of want was read, d returns the
// rest of want, in order, then io.EOF, and that it then ends the
// transaction (its next NextTxn returns io.EOF): a given-up NextData
// skips no record.
func CheckRestAfterCancel(t testing.TB, ctx context.Context, it zodb.Iterator, d zodb.DataIterator, want []zodb.Oid) {
	t.Helper()
	var got []zodb.Oid
	for {
		di, err := d.NextData(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, di.Oid)
	}
	if !slices.Equal(got, want[1:]) {
		t.Errorf("records after the cancelled NextData: %v, want %v (the rest of %v)", got, want[1:], want)
	}
	if _, _, err := it.NextTxn(ctx); err != io.EOF {
		t.Errorf("NextTxn after the transaction: %v, want EOF", err)
	}
}
