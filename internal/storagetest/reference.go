package storagetest

import (
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/zodbd/zodbd/internal/datasets"
	"github.com/zodbd/zodbd/zodb"
)

// Reference is what a fixture database holds, as its producer (ZODB/py,
// NEO/py) reports it: every transaction in tid order with its data records
// in iteration order. The read tests of Run derive what every read must
// answer (loads at every state, loadBefore, history, last tid and oid) from
// it alone.
type Reference struct {
	Txns []RefTxn
}

// RefTxn is one transaction of a Reference.
type RefTxn struct {
	Tid         zodb.Tid
	Status      zodb.TxnStatus
	User        []byte
	Description []byte
	Extension   []byte
	Records     []RefRecord
}

// RefRecord is one data record of a RefTxn.
type RefRecord struct {
	Oid zodb.Oid
	// NoData is set for a record without data (undo of a creation,
	// deleteObject).
	NoData bool
	// SHA1 and Len describe the record's data (resolved through undo
	// backpointers, as Load and iteration return it); zero for NoData.
	SHA1 [sha1.Size]byte
	Len  int
	// DataTid is what iteration reports as zodb.DataInfo.DataTid: the
	// record's own tid, the tid a backpointer points to, or 0 for NoData.
	DataTid zodb.Tid
	// HistorySize is what History reports as the revision's Size: the
	// length of the data the record holds itself (ZODB/py's rule: 0 for a
	// backpointer and for no data).
	HistorySize int
}

// revision is one record of an oid, with the tid of its transaction.
type revision struct {
	tid zodb.Tid
	rec *RefRecord
}

// model is the Reference indexed for the read tests.
type model struct {
	ref     *Reference
	revs    map[zodb.Oid][]revision // ascending tid
	oids    []zodb.Oid              // ascending
	lastTid zodb.Tid
	lastOid zodb.Oid
	txn     map[zodb.Tid]*RefTxn
}

func newModel(ref *Reference) (*model, error) {
	m := &model{ref: ref, revs: map[zodb.Oid][]revision{}, txn: map[zodb.Tid]*RefTxn{}}
	for i := range ref.Txns {
		txn := &ref.Txns[i]
		if i > 0 && txn.Tid <= ref.Txns[i-1].Tid {
			return nil, fmt.Errorf("reference: transaction %s after %s", txn.Tid, ref.Txns[i-1].Tid)
		}
		m.txn[txn.Tid] = txn
		m.lastTid = txn.Tid
		for j := range txn.Records {
			r := &txn.Records[j]
			if _, ok := m.revs[r.Oid]; !ok {
				m.oids = append(m.oids, r.Oid)
			}
			m.revs[r.Oid] = append(m.revs[r.Oid], revision{txn.Tid, r})
			if r.Oid > m.lastOid {
				m.lastOid = r.Oid
			}
		}
	}
	sort.Slice(m.oids, func(i, j int) bool { return m.oids[i] < m.oids[j] })
	return m, nil
}

// loadAt returns the revision of oid current in state at: the record with
// the greatest tid <= at, and the one after it (nil when none); known is
// false when oid has no record at all.
func (m *model) loadAt(oid zodb.Oid, at zodb.Tid) (cur, next *revision, known bool) {
	revs, known := m.revs[oid]
	i := sort.Search(len(revs), func(i int) bool { return revs[i].tid > at })
	if i > 0 {
		cur = &revs[i-1]
	}
	if i < len(revs) {
		next = &revs[i]
	}
	return cur, next, known
}

// states returns the database states the read tests load at: before the
// first transaction, every transaction's tid and one less, and TidMax.
func (m *model) states() []zodb.Tid {
	ats := []zodb.Tid{zodb.TidMax}
	for _, txn := range m.ref.Txns {
		ats = append(ats, txn.Tid-1, txn.Tid)
	}
	return ats
}

// oidStates returns the states where oid's answer changes, and one on
// each side: TidMax, before the first transaction, and each revision's tid
// and one less. For an oid without revisions, only the first two.
func (m *model) oidStates(oid zodb.Oid) []zodb.Tid {
	ats := []zodb.Tid{zodb.TidMax}
	if len(m.ref.Txns) > 0 {
		ats = append(ats, m.ref.Txns[0].Tid-1)
	}
	for _, r := range m.revs[oid] {
		ats = append(ats, r.tid-1, r.tid)
	}
	return ats
}

// FixtureFS1 is the FileStorage fixture the conformance tests of the
// FileStorage-based implementations serve: fs1/testdata/1.fs, written by
// ZODB/py (every kind of record: undo backpointers, undone creations,
// deletions, an empty transaction, extensions, a 100 KB object).
const FixtureFS1 = "1"

// FixturePath returns the path of fs1/testdata/NAME.fs. The file is the
// checked-in fixture: copy it before opening it for writing.
func FixturePath(tb testing.TB, name string) string {
	tb.Helper()
	return filepath.Join(datasets.RepoRoot(tb), "fs1", "testdata", name+".fs")
}

// CopyFixture copies fs1/testdata/NAME.fs into a new temporary directory
// of the test and returns the copy's path.
func CopyFixture(tb testing.TB, name string) string {
	tb.Helper()
	b, err := os.ReadFile(FixturePath(tb, name))
	if err != nil {
		tb.Fatal(err)
	}
	dst := filepath.Join(tb.TempDir(), name+".fs")
	if err := os.WriteFile(dst, b, 0o644); err != nil {
		tb.Fatal(err)
	}
	return dst
}

// expectJSON is the part of fs1/testdata/NAME.expect.json (what ZODB/py's
// FileStorage iterator reported about the fixture) that a Reference needs.
type expectJSON struct {
	Txns []struct {
		Tid         string `json:"tid"`
		Status      string `json:"status"`
		User        string `json:"user_hex"`
		Description string `json:"description_hex"`
		Extension   string `json:"extension_hex"`
		Records     []struct {
			Oid         string  `json:"oid"`
			Backpointer *int64  `json:"backpointer"`
			DataTxn     *string `json:"data_txn"`
			Data        *string `json:"data"` // hex; null for no data
		} `json:"records"`
	} `json:"txns"`
}

// FS1Reference reads the Reference of fs1/testdata/NAME.fs from
// fs1/testdata/NAME.expect.json, which ZODB/py's iterator wrote.
func FS1Reference(tb testing.TB, name string) *Reference {
	tb.Helper()
	path := filepath.Join(datasets.RepoRoot(tb), "fs1", "testdata", name+".expect.json")
	ref, err := readExpect(path)
	if err != nil {
		tb.Fatal(err)
	}
	return ref
}

func readExpect(path string) (*Reference, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var e expectJSON
	if err := json.Unmarshal(b, &e); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	bad := func(what string, err error) (*Reference, error) {
		return nil, fmt.Errorf("%s: %s: %v", path, what, err)
	}
	ref := &Reference{}
	for _, t := range e.Txns {
		tid, err := zodb.ParseTid(t.Tid)
		if err != nil {
			return bad("tid", err)
		}
		if len(t.Status) != 1 {
			return bad(t.Tid, fmt.Errorf("status %q", t.Status))
		}
		txn := RefTxn{Tid: tid, Status: zodb.TxnStatus(t.Status[0]), Records: []RefRecord{}}
		for _, f := range []struct {
			dst *[]byte
			hex string
		}{{&txn.User, t.User}, {&txn.Description, t.Description}, {&txn.Extension, t.Extension}} {
			if *f.dst, err = hex.DecodeString(f.hex); err != nil {
				return bad(t.Tid, err)
			}
		}
		for _, r := range t.Records {
			oid, err := zodb.ParseOid(r.Oid)
			if err != nil {
				return bad(t.Tid, err)
			}
			rec := RefRecord{Oid: oid, DataTid: tid, NoData: r.Data == nil}
			if r.Backpointer != nil {
				rec.DataTid = 0
				if r.DataTxn != nil {
					if rec.DataTid, err = zodb.ParseTid(*r.DataTxn); err != nil {
						return bad(t.Tid, err)
					}
				}
			}
			if r.Data != nil {
				data, err := hex.DecodeString(*r.Data)
				if err != nil {
					return bad(t.Tid+" "+r.Oid, err)
				}
				rec.SHA1, rec.Len = sha1.Sum(data), len(data)
				if r.Backpointer == nil {
					rec.HistorySize = len(data)
				}
			}
			txn.Records = append(txn.Records, rec)
		}
		ref.Txns = append(ref.Txns, txn)
	}
	return ref, nil
}
