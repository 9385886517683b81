package fs1

import "fmt"

// QuotaError is the error of a vote whose transaction would grow the file
// past Options.Quota: ZODB/py's FileStorageQuotaError. Nothing was
// written; the storage accepts other (smaller) transactions.
type QuotaError struct {
	Path  string
	Pos   int64 // where the data record past the quota would start
	Quota int64
}

func (e *QuotaError) Error() string {
	return fmt.Sprintf("fs1: %s:%d: the storage quota has been exceeded (quota %d bytes)", e.Path, e.Pos, e.Quota)
}

// checkQuota applies Options.Quota to the transaction encoded in e, once
// it is encoded and before it is written. ZODB/py's FileStorage checks at
// every store and deleteObject that the data record being added starts at
// or before the quota (it compares the record's position, not the end of
// the transaction); records start at increasing positions, so that is
// checking the start of the transaction's last data record. Undo and
// restore records are checked too, where ZODB/py does not look (they grow
// the file all the same). A transaction without data records passes.
//
// Call with the commit lock held (vote).
func (w *writer) checkQuota(e *txnEncoder) error {
	q := w.packOpt.Quota
	if q <= 0 || len(e.recs) == 0 {
		return nil
	}
	if here := e.tpos + e.recs[len(e.recs)-1].off; here > q {
		return &QuotaError{Path: w.fs.path, Pos: here, Quota: q}
	}
	return nil
}
