//go:build unix

package fs1

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/internal/vfs/crashfs"
	"github.com/zodbd/zodbd/zodb"
)

// A power loss during the recovery of a torn tail (the read-write
// Open that saves the tail in Data.fs.trN and cuts it off) and during the
// first commit after it. At every operation of that Open and commit the
// power fails; what the disk holds then (exactly, or with unsynced sectors
// torn) is opened again: every transaction committed before the first
// crash is there with its data, the voted transaction is not, the commit
// after the recovery is there if it was acknowledged, and the tail's bytes
// are in a Data.fs.trN, whole.
func TestPowerLossDuringRecovery(t *testing.T) {
	base := t.TempDir()
	// A file with committed transactions and a voted one at its end,
	// copied while the storage is open (the reads see every write).
	orig := filepath.Join(base, "orig", "Data.fs")
	if err := os.MkdirAll(filepath.Dir(orig), 0o755); err != nil {
		t.Fatal(err)
	}
	fs := openRW(t, orig, &Options{Logf: func(string, ...interface{}) {}}, true)
	want := map[zodb.Oid]string{}
	serial := map[zodb.Oid]zodb.Tid{}
	for i := 0; i < 5; i++ {
		data := map[zodb.Oid]string{zodb.Oid(i % 3): strings.Repeat(string(rune('a'+i)), 700), 7: "seven " + string(rune('0'+i))}
		tid := commit(t, fs, serial, data)
		for oid, d := range data {
			want[oid], serial[oid] = d, tid
		}
	}
	end := fs.End()
	tx, err := fs.Begin(bg, zodb.TxnMeta{Description: []byte("voted")})
	if err != nil {
		t.Fatal(err)
	}
	tx.Store(9, 0, bytes.Repeat([]byte("v"), 1500))
	tx.Store(0, serial[0], []byte("never committed"))
	if _, err := tx.Vote(bg); err != nil {
		t.Fatal(err)
	}
	content, err := os.ReadFile(orig)
	if err != nil {
		t.Fatal(err)
	}
	tx.Abort()
	fs.Close()
	tail := content[end:]
	if len(tail) < 100 {
		t.Fatalf("tail of %d bytes", len(tail))
	}

	run := func(crashAt int, torn bool) (nops int) {
		dir, err := os.MkdirTemp(base, "pt")
		if err != nil {
			t.Fatal(err)
		}
		defer os.RemoveAll(dir)
		src := filepath.Join(dir, "src")
		os.Mkdir(src, 0o755)
		if err := os.WriteFile(filepath.Join(src, "Data.fs"), content, 0o644); err != nil {
			t.Fatal(err)
		}
		cfs, err := crashfs.New(src)
		if err != nil {
			t.Fatal(err)
		}
		if crashAt > 0 {
			cfs.CrashAt(crashAt)
		}
		quiet := func(string, ...interface{}) {}
		acked := false
		var ytid zodb.Tid
		fs, err := Open(filepath.Join(src, "Data.fs"), &Options{ReadWrite: true, FS: cfs, Logf: quiet})
		if err == nil {
			tx, err := fs.Begin(bg, zodb.TxnMeta{Description: []byte("after")})
			if err == nil {
				tx.Store(0, serial[0], []byte("after recovery"))
				if _, err = tx.Vote(bg); err == nil {
					ytid = tx.(*txn).Tid()
					_, err = tx.Finish(bg, nil)
					acked = err == nil
				} else {
					tx.Abort()
				}
			}
			fs.Close()
		} else if c, _ := cfs.Crashed(); !c {
			t.Fatalf("open: %v", err)
		}
		nops = cfs.Ops()
		if crashAt <= 0 {
			return nops
		}
		cfs.Crash()
		_, at := cfs.Crashed()
		p := &crashfs.Point{FS: cfs, Dir: dir, Src: src}
		after := p.Materialize(t, int64(crashAt), torn)
		where := "crash at " + at
		if torn {
			where += " (torn)"
		}

		path := filepath.Join(after, "Data.fs")
		fs2, err := Open(path, &Options{ReadWrite: true, Logf: quiet})
		if err != nil {
			t.Fatalf("%s: reopen: %v", where, err)
		}
		defer fs2.Close()
		// The committed transactions are there, the voted one is not.
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[:min(int64(len(got)), end)], content[:end]) || int64(len(got)) < end {
			t.Fatalf("%s: the committed transactions changed (file of %d bytes, they end at %d)", where, len(got), end)
		}
		for oid, d := range want {
			cur := d
			if oid == 0 {
				data, tid, err := fs2.Load(bg, zodb.Xid{Oid: 0, At: zodb.TidMax})
				if err != nil {
					t.Fatalf("%s: load 0: %v", where, err)
				}
				if tid == ytid && string(data) == "after recovery" {
					continue
				}
				if acked {
					t.Fatalf("%s: the acknowledged commit after the recovery is lost (oid 0 at %s)", where, tid)
				}
				if string(data) != cur || tid != serial[0] {
					t.Fatalf("%s: oid 0 = %q at %s", where, data, tid)
				}
				continue
			}
			data, _, err := fs2.Load(bg, zodb.Xid{Oid: oid, At: zodb.TidMax})
			if err != nil || string(data) != cur {
				t.Fatalf("%s: oid %s = %q, %v; want %q", where, oid, data, err, cur)
			}
		}
		if _, _, err := fs2.Load(bg, zodb.Xid{Oid: 9, At: zodb.TidMax}); err == nil || !isNoObject(err) {
			var nd *zodb.NoDataError
			if !errors.As(err, &nd) {
				t.Fatalf("%s: the voted transaction's object 9 is there: %v", where, err)
			}
		}
		// The tail is saved whole in some .trN.
		found := false
		for i := 0; ; i++ {
			b, err := os.ReadFile(path + ".tr" + string(rune('0'+i)))
			if err != nil {
				break
			}
			// (Another .trN may hold the commit after the recovery,
			// voted but not finished.)
			if bytes.Equal(b, tail) {
				found = true
			}
		}
		if !found {
			t.Fatalf("%s: the tail (%d bytes) is in no Data.fs.trN", where, len(tail))
		}
		it := fs2.Iterate(bg, 0, zodb.TidMax)
		for {
			_, di, err := it.NextTxn(bg)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatalf("%s: iterate: %v", where, err)
			}
			for {
				if _, err := di.NextData(bg); err == io.EOF {
					break
				} else if err != nil {
					t.Fatalf("%s: iterate: %v", where, err)
				}
			}
		}
		return nops
	}
	n := run(-1, false)
	if n < 5 {
		t.Fatalf("only %d operations", n)
	}
	for k := 1; k <= n+1; k++ {
		run(k, false)
		run(k, true)
	}
	t.Logf("%d crash points", 2*(n+1))
}

// votedTailFile writes at path a file with five committed
// transactions and a sixth voted but not finished (status 'c': a server
// killed during a vote), and returns the positions of the committed ones.
func votedTailFile(t *testing.T, path string) []int64 {
	t.Helper()
	src := filepath.Join(t.TempDir(), "Data.fs")
	fs := openRW(t, src, &Options{Logf: func(string, ...interface{}) {}}, true)
	var serial zodb.Tid
	var pos []int64
	for i := 0; i < 5; i++ {
		pos = append(pos, fs.End())
		serial = commit(t, fs, map[zodb.Oid]zodb.Tid{0: serial}, map[zodb.Oid]string{0: strings.Repeat("x", 100+i), zodb.Oid(1 + i): "new"})
	}
	tx, err := fs.Begin(bg, zodb.TxnMeta{})
	if err != nil {
		t.Fatal(err)
	}
	tx.Store(0, serial, []byte("voted"))
	if _, err := tx.Vote(bg); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	tx.Abort()
	fs.Close()
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return pos
}

// TestDamagedHeaderVotedTail: a damaged status byte in the header of
// a committed transaction, with committed transactions after it and a
// voted one ('c') at the end. tornTail (scan.go) looked only at the last
// transaction of the file: it did not commit, so the damaged header was
// taken for the start of a torn tail. A read-write Open moved every
// committed transaction from there into Data.fs.tr0 and truncated the
// file (TestOpenRefusesDamagedHeader: damage in the middle must be
// refused with its offset); a read-only one served the older state; the
// offline PackFile wrote a packed file without them.
func TestDamagedHeaderVotedTail(t *testing.T) {
	for _, mode := range []string{"read-write", "read-only", "pack"} {
		t.Run(mode, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "Data.fs")
			pos := votedTailFile(t, path)
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			f.WriteAt([]byte{'x'}, pos[2]+16)
			f.Close()
			before, _ := os.ReadFile(path)
			var logged []string
			logf := func(format string, args ...interface{}) { logged = append(logged, fmt.Sprintf(format, args...)) }
			if mode == "pack" {
				var th TxnHeader
				f, _ := os.Open(path)
				th.Load(f, path, pos[1], int64(len(before)))
				f.Close()
				_, err := PackFile(bg, path, th.Tid, &PackOptions{NoGC: true, Logf: logf})
				after, _ := os.ReadFile(path)
				if err == nil && len(after) < int(pos[4]) {
					t.Fatalf("PackFile put in place a file of %d bytes without the committed transactions from %d on (log %q)", len(after), pos[2], logged)
				}
				return
			}
			fs, err := Open(path, &Options{ReadWrite: mode == "read-write", Logf: logf})
			if err == nil {
				end := fs.End()
				fs.Close()
				after, _ := os.ReadFile(path)
				t.Fatalf("Open accepted the file: it ends at %d (committed transactions up to %d), the file is %d bytes (was %d); log %q",
					end, pos[4], len(after), len(before), logged)
			}
			if !strings.Contains(err.Error(), fmt.Sprintf(":%d:", pos[2])) {
				t.Errorf("error %v does not name offset %d", err, pos[2])
			}
			if after, _ := os.ReadFile(path); !bytes.Equal(after, before) {
				t.Errorf("the refused file was changed")
			}
		})
	}
}

// TestDamagedStatusLastTxn: the status byte of the last transaction
// (committed, acknowledged; the file ends with its redundant length)
// damaged to 'x'. tornTail returned true when the last transaction
// started at the damaged header (`start == pos`), whatever that header
// held, though a crash leaves it 'c' or unwritten (zeros): a read-write
// Open moved the acknowledged transaction into Data.fs.tr0 (ZODB/py only
// warns, "invalid status", and keeps it).
func TestDamagedStatusLastTxn(t *testing.T) {
	path := filepath.Join(t.TempDir(), "Data.fs")
	fs := openRW(t, path, &Options{Logf: func(string, ...interface{}) {}}, true)
	var serial zodb.Tid
	var last int64
	for i := 0; i < 3; i++ {
		last = fs.End()
		serial = commit(t, fs, map[zodb.Oid]zodb.Tid{0: serial}, map[zodb.Oid]string{0: strings.Repeat("y", 50+i)})
	}
	fs.Close()
	os.Remove(path + ".index")
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte{'x'}, last+16)
	f.Close()
	before, _ := os.ReadFile(path)
	fs2, err := Open(path, &Options{ReadWrite: true, Logf: t.Logf})
	if err == nil {
		fs2.Close()
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(after, before) {
		t.Fatalf("Open (err %v) cut the last committed transaction off: the file is %d bytes, was %d", err, len(after), len(before))
	}
}
