package fs1

import "github.com/zodbd/zodbd/zodb"

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
		return &zodb.QuotaError{URL: w.fs.path, Pos: here, Quota: q}
	}
	return nil
}
