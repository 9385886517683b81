package zodb

import (
	"context"
	"fmt"
	"io"
)

// A Visitor says what Walk does with the transactions and records of an
// iteration. A nil field is skipped. The *TxnInfo and *DataInfo passed are
// the iterator's: valid only during the call (copy what must outlive it).
type Visitor struct {
	// Txn is called for each transaction, before its records.
	Txn func(txn *TxnInfo) error
	// Data is called for each record of txn, in the iterator's order.
	// When Data is nil the records are not read.
	Data func(txn *TxnInfo, d *DataInfo) error
	// TxnEnd is called for each transaction after its last record; it is
	// not called for a transaction whose records could not all be read.
	TxnEnd func(txn *TxnInfo) error
}

// Walk reads it to the end, calling v's functions for every transaction and
// record, and returns nil at the end of the iteration. It stops at the
// first error: one returned by v is returned as it is; one from the iterator
// is returned wrapped with where it happened (after which transaction and
// how many were read, or in which transaction after which record), so that
// errors.Is and errors.As still see it.
func Walk(ctx context.Context, it Iterator, v Visitor) error {
	var last Tid
	for n := 0; ; n++ {
		txn, dit, err := it.NextTxn(ctx)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			if n == 0 {
				return fmt.Errorf("first transaction: %w", err)
			}
			return fmt.Errorf("transaction after %s (%d read): %w", last, n, err)
		}
		last = txn.Tid
		if v.Txn != nil {
			if err := v.Txn(txn); err != nil {
				return err
			}
		}
		var lastOid Oid
		for i := 0; v.Data != nil; i++ {
			d, err := dit.NextData(ctx)
			if err == io.EOF {
				break
			}
			if err != nil {
				if i == 0 {
					return fmt.Errorf("transaction %s: first record: %w", txn.Tid, err)
				}
				return fmt.Errorf("transaction %s: record after %s (%d read): %w", txn.Tid, lastOid, i, err)
			}
			lastOid = d.Oid
			if err := v.Data(txn, d); err != nil {
				return err
			}
		}
		if v.TxnEnd != nil {
			if err := v.TxnEnd(txn); err != nil {
				return err
			}
		}
	}
}
