package fs1

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/zodbd/zodbd/zodb"
)

// TestCheckQuota checks the quota's boundary against ZODB/py's: in a new
// file, a transaction storing two objects of 100 bytes (no user,
// description or extension) has its data records at 4+23 = 27 and
// 27+42+100 = 169. ZODB/py's FileStorage(quota=q) refuses it for q = 26,
// 27 and 168 (the second store fails for 27 and 168) and takes it for
// q = 169, and refuses one object alone for 26 only.
func TestCheckQuota(t *testing.T) {
	for _, c := range []struct {
		quota int64
		objs  int
		ok    bool
	}{
		{0, 2, true}, // no quota
		{26, 1, false},
		{27, 1, true},
		{26, 2, false},
		{27, 2, false},
		{168, 2, false},
		{169, 2, true},
	} {
		fs, err := Open(filepath.Join(t.TempDir(), "Data.fs"), &Options{Create: true, ReadWrite: true, Quota: c.quota})
		if err != nil {
			t.Fatal(err)
		}
		w := fs.w
		e := &txnEncoder{w: w, tid: zodb.NextTid(w.lastTid, w.now()), tpos: w.pos}
		e.begin(&zodb.TxnMeta{})
		for i := 0; i < c.objs; i++ {
			e.add(zodb.Oid(i+1), make([]byte, 100), 0)
		}
		e.finish()
		err = w.checkQuota(e)
		var qe *zodb.QuotaError
		switch {
		case c.ok && err != nil:
			t.Errorf("quota %d, %d objects: %v", c.quota, c.objs, err)
		case !c.ok && !errors.As(err, &qe):
			t.Errorf("quota %d, %d objects: %v, want a *zodb.QuotaError", c.quota, c.objs, err)
		case !c.ok && (qe.Quota != c.quota || qe.Pos != 27+int64(c.objs-1)*142):
			t.Errorf("quota %d, %d objects: %+v", c.quota, c.objs, qe)
		}
		fs.Close()
	}
}
