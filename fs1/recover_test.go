package fs1

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/internal/datasets"
	"github.com/zodbd/zodbd/zodb"
)

// A torn tail is left alone read-only, and cut off read-write with the cut
// bytes saved in .tr0, .tr1, ... as ZODB/py does.
func TestRecoverTornFixture(t *testing.T) {
	path := filepath.Join(t.TempDir(), "torn.fs")
	orig := datasets.CopyTo(t, "testdata/torn.fs", path)
	ro, err := Open(path, &Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	torn := ro.TornPos()
	ro.Close()
	if torn == 0 {
		t.Fatal("fixture is not torn")
	}
	if b, _ := os.ReadFile(path); !bytes.Equal(b, orig) {
		t.Fatal("read-only open changed the file")
	}

	var log testLog
	fs := openRW(t, path, &Options{Logf: log.logf}, false)
	if fs.TornPos() != 0 || fs.End() != torn {
		t.Fatalf("after read-write open: torn %d, end %d (want end %d)", fs.TornPos(), fs.End(), torn)
	}
	if !log.has("truncated, possibly due to damaged records at") || !log.has(path+".tr0") {
		t.Errorf("log: %q", log.msgs)
	}
	b, _ := os.ReadFile(path)
	if !bytes.Equal(b, orig[:torn]) {
		t.Fatalf("file is %d bytes, want the %d before the torn tail", len(b), torn)
	}
	tr, _ := os.ReadFile(path + ".tr0")
	if !bytes.Equal(tr, orig[torn:]) {
		t.Fatalf(".tr0 holds %d bytes, want the %d cut", len(tr), len(orig)-int(torn))
	}
	// Commits go on after the cut.
	tid := commit(t, fs, nil, map[zodb.Oid]string{1000: "after recovery"})
	fs.Close()
	checkScan(t, path)

	// A second torn tail goes to .tr1.
	f, _ := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	f.Write(orig[torn:])
	f.Close()
	fs = openRW(t, path, nil, false)
	if d, s := load(t, fs, 1000, zodb.TidMax); d != "after recovery" || s != tid {
		t.Fatalf("load after second recovery: %q@%s", d, s)
	}
	if tr, _ := os.ReadFile(path + ".tr1"); !bytes.Equal(tr, orig[torn:]) {
		t.Fatalf(".tr1 holds %d bytes", len(tr))
	}
}

// Fewer bytes than a transaction header after the last transaction: ZODB/py
// truncates them without saving them.
func TestRecoverPartialHeader(t *testing.T) {
	path := filepath.Join(t.TempDir(), "1.fs")
	orig := datasets.CopyTo(t, "testdata/1.fs", path)
	f, _ := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	f.Write([]byte("0123456789"))
	f.Close()
	var log testLog
	fs := openRW(t, path, &Options{Logf: log.logf}, false)
	fs.Close()
	if b, _ := os.ReadFile(path); !bytes.Equal(b, orig) {
		t.Fatalf("file is %d bytes, want %d", len(b), len(orig))
	}
	if _, err := os.Stat(path + ".tr0"); !os.IsNotExist(err) {
		t.Errorf("a partial header was saved in .tr0")
	}
	if !log.has("truncated at") {
		t.Errorf("log: %q", log.msgs)
	}
}

// A transaction left in the checkpoint state by a crash between Vote and
// Finish is incomplete: a read-write open cuts it off into .tr0.
func TestRecoverCheckpointTxn(t *testing.T) {
	fs := createStorage(t, nil)
	t1 := commit(t, fs, nil, map[zodb.Oid]string{0: "root", 1: "a"})
	good, _ := os.ReadFile(fs.path)
	tx, _ := fs.Begin(bg, zodb.TxnMeta{})
	tx.Store(1, t1, []byte("not finished"))
	if _, err := tx.Vote(bg); err != nil {
		t.Fatal(err)
	}
	crashed := filepath.Join(t.TempDir(), "crashed.fs")
	all := datasets.CopyTo(t, fs.path, crashed) // the file as a crash here leaves it
	tx.Abort()
	if len(all) <= len(good) || all[len(good)+16] != 'c' {
		t.Fatal("no checkpoint transaction at the end")
	}

	ro, err := Open(crashed, &Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if ro.TornPos() != int64(len(good)) {
		t.Errorf("read-only: torn at %d, want %d", ro.TornPos(), len(good))
	}
	ro.Close()

	rw := openRW(t, crashed, nil, false)
	if last, _ := rw.LastTid(bg); last != t1 {
		t.Fatalf("last tid %s, want %s", last, t1)
	}
	if d, _ := load(t, rw, 1, zodb.TidMax); d != "a" {
		t.Fatalf("unfinished transaction visible: %q", d)
	}
	rw.Close()
	if b, _ := os.ReadFile(crashed); !bytes.Equal(b, good) {
		t.Fatal("checkpoint transaction not cut off")
	}
	if tr, _ := os.ReadFile(crashed + ".tr0"); !bytes.Equal(tr, all[len(good):]) {
		t.Fatal(".tr0 does not hold the checkpoint transaction")
	}
}

// An empty file opened read-write becomes an empty storage with the magic.
func TestEmptyFileReadWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "empty.fs")
	os.WriteFile(path, nil, 0o644)
	fs := openRW(t, path, nil, false)
	if fs.End() != HeaderSize {
		t.Fatalf("end %d", fs.End())
	}
	commit(t, fs, nil, map[zodb.Oid]string{0: "x"})
	fs.Close()
	checkScan(t, path)
}

// A damaged length or status in the header of a transaction in the middle
// of the file (committed transactions after it) is damage, not a torn
// tail: Open refuses the file with the offset, read-write too, instead of
// cutting the later transactions off into .tr0 (what ZODB/py does for a
// length that goes past the end of the file).
func TestOpenRefusesDamagedHeader(t *testing.T) {
	for _, field := range []string{"status", "length"} {
		t.Run(field, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "Data.fs")
			fs := openRW(t, path, nil, true)
			t1 := commit(t, fs, nil, map[zodb.Oid]string{0: "root-1"})
			commit(t, fs, map[zodb.Oid]zodb.Tid{0: t1}, map[zodb.Oid]string{1: "x"})
			commit(t, fs, map[zodb.Oid]zodb.Tid{0: t1}, map[zodb.Oid]string{0: "root-3"})
			pos, _ := fs.Index().Get(1)
			var dh DataHeader
			if err := dh.Load(fs.file, path, pos, fs.End()); err != nil {
				t.Fatal(err)
			}
			fs.Close()
			off, b := dh.TxnPos+16, []byte{'x'}
			if field == "length" {
				off, b = dh.TxnPos+8, []byte{0x7f} // the length's high byte
			}
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt(b, off); err != nil {
				t.Fatal(err)
			}
			f.Close()
			os.Remove(path + ".index")
			before, _ := os.ReadFile(path)
			for _, rw := range []bool{false, true} {
				fs2, err := Open(path, &Options{ReadWrite: rw, Logf: t.Logf})
				if err == nil {
					fs2.Close()
					t.Fatalf("damaged %s of a transaction in the middle (read-write %v): Open accepted the file", field, rw)
				}
				if want := fmt.Sprintf("Data.fs:%d: transaction record", dh.TxnPos); !strings.Contains(err.Error(), want) {
					t.Fatalf("Open: %v, want an error at %s", err, want)
				}
			}
			if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
				t.Fatal("the refused file was changed")
			}
			if _, err := os.Stat(path + ".tr0"); err == nil {
				t.Fatal("a .tr0 was written")
			}
		})
	}
}
