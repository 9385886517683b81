package fs1

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/internal/datasets"
	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/zodb"
)

// expectFile is the subset of testdata/NAME.expect.json (made by ZODB/py's own
// APIs on the fixture) that these tests check.
type expectFile struct {
	FileSize        int64  `json:"file_size"`
	LastTransaction string `json:"lastTransaction"`
	GetSize         int64  `json:"getSize"`
	Len             int    `json:"len"`
	MaxOid          string `json:"max_oid"`
	Txns            []struct {
		Tid            string `json:"tid"`
		Time           string `json:"time"`
		Pos            int64  `json:"pos"`
		Len            int64  `json:"len"`
		Status         string `json:"status"`
		UserHex        string `json:"user_hex"`
		DescriptionHex string `json:"description_hex"`
		ExtensionHex   string `json:"extension_hex"`
		Records        []struct {
			Oid         string  `json:"oid"`
			Pos         int64   `json:"pos"`
			Prev        int64   `json:"prev"`
			Backpointer *int64  `json:"backpointer"`
			DataTxn     *string `json:"data_txn"`
			DataTid     *string `json:"data_tid"`
			Data        *string `json:"data"`
		} `json:"records"`
	} `json:"txns"`
	Objects map[string]struct {
		Revisions  []string     `json:"revisions"`
		Load       loadResult   `json:"load"`
		LoadSerial []loadResult `json:"loadSerial"`
		LoadBefore []struct {
			Before string      `json:"before"`
			Result *loadResult `json:"result"`
		} `json:"loadBefore"`
		History []struct {
			Tid      string `json:"tid"`
			UserName string `json:"user_name"`
			Desc     string `json:"description"`
			Size     int    `json:"size"`
		} `json:"history"`
	} `json:"objects"`
}

type loadResult struct {
	Serial   string `json:"serial"`
	DataLen  int    `json:"data_len"`
	DataSha1 string `json:"data_sha1"`
	Error    string `json:"error"`
}

var fixtures = []string{"1", "1packed", "empty", "torn"}

func readExpect(t *testing.T, name string) *expectFile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name+".expect.json"))
	if err != nil {
		t.Fatal(err)
	}
	var e expectFile
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatal(err)
	}
	return &e
}

func mustTid(t *testing.T, s string) zodb.Tid {
	t.Helper()
	tid, err := zodb.ParseTid(s)
	if err != nil {
		t.Fatal(err)
	}
	return tid
}

// openFixture opens a fixture from a private copy, so that no .index file
// next to it is used (the index-file tests cover that path).
func openFixture(t *testing.T, name string) *FileStorage {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("testdata", name+".fs"))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), name+".fs")
	if err := os.WriteFile(path, src, 0o644); err != nil {
		t.Fatal(err)
	}
	var logs []string
	fs, err := Open(path, &Options{Logf: func(f string, a ...interface{}) { logs = append(logs, f) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fs.Close() })
	return fs
}

func sha1hex(b []byte) string {
	h := sha1.Sum(b)
	return hex.EncodeToString(h[:])
}

// checkLoad compares a Load answer with ZODB/py's. A ZODB/py POSKeyError is a
// NoDataError or NoObjectError here; "no revision before" (null) is a
// NoDataError with DeletedAt == 0.
func checkLoad(t *testing.T, what string, data []byte, serial zodb.Tid, err error, want *loadResult) {
	t.Helper()
	switch {
	case want == nil:
		var e *zodb.NoDataError
		if !errors.As(err, &e) || e.DeletedAt != 0 {
			t.Errorf("%s: got (%s, %v), want NoDataError (not yet created)", what, serial, err)
		}
	case want.Error != "":
		if !strings.HasPrefix(want.Error, "POSKeyError") {
			t.Fatalf("%s: unexpected reference error %q", what, want.Error)
		}
		var e *zodb.NoDataError
		var e2 *zodb.NoObjectError
		if !errors.As(err, &e) && !errors.As(err, &e2) {
			t.Errorf("%s: got (%s, %v), want POSKeyError", what, serial, err)
		}
		if e != nil && e.DeletedAt == 0 {
			t.Errorf("%s: got %v, want deleted", what, err)
		}
	default:
		if err != nil {
			t.Errorf("%s: %v", what, err)
			return
		}
		if serial.String() != want.Serial || len(data) != want.DataLen || sha1hex(data) != want.DataSha1 {
			t.Errorf("%s: got serial %s len %d sha1 %s, want %s %d %s", what, serial, len(data), sha1hex(data), want.Serial, want.DataLen, want.DataSha1)
		}
	}
}

func TestLoadMatchesZODBpy(t *testing.T) {
	ctx := context.Background()
	for _, name := range fixtures {
		t.Run(name, func(t *testing.T) {
			e := readExpect(t, name)
			fs := openFixture(t, name)
			if fs.End() != e.GetSize {
				t.Errorf("End = %d, want getSize %d", fs.End(), e.GetSize)
			}
			if fs.Len() != e.Len {
				t.Errorf("Len = %d, want %d", fs.Len(), e.Len)
			}
			if oid, _ := fs.LastOid(ctx); oid.String() != e.MaxOid {
				t.Errorf("LastOid = %s, want %s", oid, e.MaxOid)
			}
			// ZODB/py reports the torn transaction's tid as
			// lastTransaction(); zodbd reports the last complete one.
			wantLast := zodb.Tid(0)
			if n := len(e.Txns); n > 0 {
				wantLast = mustTid(t, e.Txns[n-1].Tid)
			}
			if name != "torn" && e.LastTransaction != wantLast.String() {
				t.Fatalf("fixture: lastTransaction %s != last txn %s", e.LastTransaction, wantLast)
			}
			if last, _ := fs.LastTid(ctx); last != wantLast {
				t.Errorf("LastTid = %s, want %s", last, wantLast)
			}
			if name == "torn" && fs.TornPos() != 229576 {
				t.Errorf("TornPos = %d, want 229576", fs.TornPos())
			}
			for oidS, obj := range e.Objects {
				oid, _ := zodb.ParseOid(oidS)
				data, serial, err := fs.Load(ctx, zodb.Xid{Oid: oid, At: zodb.TidMax})
				checkLoad(t, "load "+oidS, data, serial, err, &obj.Load)
				for i, rev := range obj.Revisions {
					data, serial, err := fs.Load(ctx, zodb.Xid{Oid: oid, At: mustTid(t, rev)})
					checkLoad(t, "loadSerial "+oidS+"@"+rev, data, serial, err, &obj.LoadSerial[i])
				}
				for _, lb := range obj.LoadBefore {
					at := mustTid(t, lb.Before) - 1
					data, serial, err := fs.LoadAppend(ctx, zodb.Xid{Oid: oid, At: at}, make([]byte, 0, 16))
					checkLoad(t, "loadBefore "+oidS+" "+lb.Before, data, serial, err, lb.Result)
				}
				hist, err := fs.History(ctx, oid, 10000)
				if err != nil {
					t.Errorf("history %s: %v", oidS, err)
					continue
				}
				if len(hist) != len(obj.History) {
					t.Errorf("history %s: %d entries, want %d", oidS, len(hist), len(obj.History))
					continue
				}
				for i, h := range obj.History {
					g := hist[i]
					if g.Tid.String() != h.Tid || string(g.User) != h.UserName || string(g.Description) != h.Desc || g.Size != h.Size {
						t.Errorf("history %s[%d]: got %s %q %q %d, want %s %q %q %d", oidS, i, g.Tid, g.User, g.Description, g.Size, h.Tid, h.UserName, h.Desc, h.Size)
					}
				}
			}
			// An oid never stored.
			_, _, err := fs.Load(ctx, zodb.Xid{Oid: 0x7777, At: zodb.TidMax})
			var noObj *zodb.NoObjectError
			if !errors.As(err, &noObj) || noObj.Oid != 0x7777 {
				t.Errorf("load of unknown oid: %v, want NoObjectError", err)
			}
			if _, err := fs.History(ctx, 0x7777, 10); !errors.As(err, &noObj) {
				t.Errorf("history of unknown oid: %v, want NoObjectError", err)
			}
		})
	}
}

func TestIterateMatchesZODBpy(t *testing.T) {
	ctx := context.Background()
	for _, name := range fixtures {
		t.Run(name, func(t *testing.T) {
			e := readExpect(t, name)
			fs := openFixture(t, name)
			i := 0
			storagetest.Walk(t, ctx, fs.Iterate(ctx, 0, zodb.TidMax), func(txn *zodb.TxnInfo, recs []zodb.DataInfo) {
				if i >= len(e.Txns) {
					t.Fatalf("extra transaction %s", txn.Tid)
				}
				w := e.Txns[i]
				if txn.Tid.String() != w.Tid || string(txn.Status) != w.Status ||
					hex.EncodeToString(txn.User) != w.UserHex ||
					hex.EncodeToString(txn.Description) != w.DescriptionHex ||
					hex.EncodeToString(txn.Extension) != w.ExtensionHex {
					t.Errorf("txn %d: got %s %q %q %q %x, want %+v", i, txn.Tid, txn.Status, txn.User, txn.Description, txn.Extension, w)
				}
				if got := txn.Tid.TimeStamp().String(); got != w.Time {
					t.Errorf("txn %s: time %q, want %q", txn.Tid, got, w.Time)
				}
				if len(recs) != len(w.Records) {
					t.Errorf("txn %s: %d records, want %d", w.Tid, len(recs), len(w.Records))
				}
				for j := range min(len(recs), len(w.Records)) {
					d, r := recs[j], w.Records[j]
					if d.Oid.String() != r.Oid || d.Tid.String() != w.Tid {
						t.Errorf("txn %s rec %d: oid %s tid %s, want %s", w.Tid, j, d.Oid, d.Tid, r.Oid)
					}
					wantData := ""
					if r.Data != nil {
						wantData = *r.Data
					}
					if (d.Data == nil) != (r.Data == nil) || hex.EncodeToString(d.Data) != wantData {
						t.Errorf("txn %s rec %d: data %x, want %v", w.Tid, j, d.Data, wantData)
					}
					wantDataTid := w.Tid
					if r.Backpointer != nil {
						wantDataTid = "0000000000000000"
						if r.DataTxn != nil {
							wantDataTid = *r.DataTxn
						}
					}
					if d.DataTid.String() != wantDataTid {
						t.Errorf("txn %s rec %d: DataTid %s, want %s", w.Tid, j, d.DataTid, wantDataTid)
					}
				}
				i++
			})
			if i != len(e.Txns) {
				t.Errorf("iteration ended after %d transactions, want %d", i, len(e.Txns))
			}
		})
	}
}

func TestTimeStampParse(t *testing.T) {
	e := readExpect(t, "1")
	for _, txn := range e.Txns {
		tid := mustTid(t, txn.Tid)
		ts := tid.TimeStamp()
		if got := ts.Tid(); got != tid {
			t.Errorf("TimeStamp(%s).Tid() = %s", tid, got)
		}
	}
}

// TestOpenWithIndexFile checks that Open uses the .index file ZODB/py wrote
// beside each fixture (no full scan: NumTxn is unknown), that the result
// equals a scan, and that an index that does not belong to the file is
// ignored with a log line rather than trusted.
func TestOpenWithIndexFile(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		fs, index string
		used      bool
	}{
		{"1", "1", true},
		{"1packed", "1packed", true},
		{"torn", "torn", true},
		{"1", "1packed", false},   // foreign index: positions do not match
		{"1", "torn", true},       // older index of the same file: the rest is scanned
		{"empty", "empty", false}, // ZODB/py ignores an index with pos < 100 too
	} {
		t.Run(tc.fs+"+"+tc.index, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "Data.fs")
			datasets.CopyTo(t, filepath.Join("testdata", tc.fs+".fs"), path)
			datasets.CopyTo(t, filepath.Join("testdata", tc.index+".fs.index"), path+".index")
			var logs []string
			fs, err := Open(path, &Options{Logf: func(f string, a ...interface{}) { logs = append(logs, f) }})
			if err != nil {
				t.Fatal(err)
			}
			defer fs.Close()
			if used := fs.NumTxn() < 0; used != tc.used {
				t.Errorf("index used = %v, want %v (log: %q)", used, tc.used, logs)
			}
			ignored := false
			for _, l := range logs {
				if strings.Contains(l, "ignoring index") {
					ignored = true
				}
			}
			if ignored == tc.used {
				t.Errorf("log %q: ignored=%v, want %v", logs, ignored, !tc.used)
			}
			ref := openFixture(t, tc.fs)
			if !fs.Index().Equal(ref.Index()) || fs.End() != ref.End() || fs.TornPos() != ref.TornPos() {
				t.Errorf("index/end/torn differ from a full scan")
			}
			l1, _ := fs.LastTid(ctx)
			l2, _ := ref.LastTid(ctx)
			if l1 != l2 {
				t.Errorf("LastTid %s, scan says %s", l1, l2)
			}
			if n, err := fs.CountTxn(ctx); err != nil || n != ref.NumTxn() {
				t.Errorf("CountTxn = %d, %v; scan counted %d", n, err, ref.NumTxn())
			}
		})
	}
}

// TestConcurrentLoad runs loads of every revision of every object from many
// goroutines at once on one FileStorage (run under -race by make test) and
// checks each answer against a single-goroutine pass.
func TestConcurrentLoad(t *testing.T) {
	ctx := context.Background()
	fs := openFixture(t, "1")
	e := readExpect(t, "1")
	type answer struct {
		sum    string
		serial zodb.Tid
		err    bool
	}
	var xids []zodb.Xid
	for oidS, obj := range e.Objects {
		oid, _ := zodb.ParseOid(oidS)
		xids = append(xids, zodb.Xid{Oid: oid, At: zodb.TidMax})
		for _, rev := range obj.Revisions {
			at := mustTid(t, rev)
			xids = append(xids, zodb.Xid{Oid: oid, At: at}, zodb.Xid{Oid: oid, At: at - 1})
		}
	}
	want := make([]answer, len(xids))
	for i, xid := range xids {
		data, serial, err := fs.Load(ctx, xid)
		want[i] = answer{sha1hex(data), serial, err != nil}
	}
	const workers = 8
	errc := make(chan error, workers)
	for w := 0; w < workers; w++ {
		go func(w int) {
			buf := make([]byte, 0, 512)
			for round := 0; round < 20; round++ {
				for k := range xids {
					i := (k*7 + w*13 + round) % len(xids)
					data, serial, err := fs.LoadAppend(ctx, xids[i], buf[:0])
					if got := (answer{sha1hex(data), serial, err != nil}); got != want[i] {
						errc <- fmt.Errorf("worker %d: %s: got %+v, want %+v", w, xids[i], got, want[i])
						return
					}
					if err == nil {
						buf = data
					}
				}
			}
			errc <- nil
		}(w)
	}
	for w := 0; w < workers; w++ {
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}
}

// TestIterateFrom: Iterate(min, max) gives the transactions a full
// iteration gives between min and max, for every bound at, between and
// beside the file's tids: the start is found from the file's start or,
// for a min closer to the last transaction, backwards from its end.
func TestIterateFrom(t *testing.T) {
	fs := openFixture(t, "1")
	ctx := context.Background()
	tids := func(min, max zodb.Tid) []zodb.Tid {
		var out []zodb.Tid
		it := fs.Iterate(ctx, min, max)
		for {
			ti, _, err := it.NextTxn(ctx)
			if err == io.EOF {
				return out
			}
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, ti.Tid)
		}
	}
	all := tids(0, zodb.TidMax)
	if len(all) < 10 {
		t.Fatalf("fixture has %d transactions", len(all))
	}
	for i, tid := range all {
		for _, min := range []zodb.Tid{tid - 1, tid, tid + 1} {
			var want []zodb.Tid
			for _, x := range all {
				if x >= min {
					want = append(want, x)
				}
			}
			if got := tids(min, zodb.TidMax); !slices.Equal(got, want) {
				t.Fatalf("Iterate(%s, max) (tid %d of %d): %d transactions, want %d", min, i, len(all), len(got), len(want))
			}
			if got := tids(min, min); len(got) > 1 || (len(got) == 1) != (min == tid) {
				t.Fatalf("Iterate(%s, %s): %v", min, min, got)
			}
		}
	}
	if got := tids(all[len(all)-1]+1, zodb.TidMax); len(got) != 0 {
		t.Errorf("Iterate past the last tid: %v", got)
	}
}
