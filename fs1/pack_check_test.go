package fs1_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/fs1/fs1tools"
	"github.com/zodbd/zodbd/internal/datasets"
	"github.com/zodbd/zodbd/zodb"
	"github.com/zodbd/zodbd/zodb/serialize"
)

func quiet(string, ...interface{}) {}

func openRO(t testing.TB, path string) *fs1.FileStorage {
	t.Helper()
	st, err := fs1.Open(path, &fs1.Options{Logf: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// txnTids returns the tids of a storage's transactions.
func txnTids(t testing.TB, st *fs1.FileStorage) []zodb.Tid {
	t.Helper()
	ctx := context.Background()
	it := st.Iterate(ctx, 0, zodb.TidMax)
	var tids []zodb.Tid
	for {
		ti, _, err := it.NextTxn(ctx)
		if err == io.EOF {
			return tids
		}
		if err != nil {
			t.Fatal(err)
		}
		tids = append(tids, ti.Tid)
	}
}

type loadResult struct {
	data   []byte
	serial zodb.Tid
	absent bool // NoObjectError or NoDataError
}

func load(t testing.TB, st *fs1.FileStorage, oid zodb.Oid, at zodb.Tid) loadResult {
	t.Helper()
	data, serial, err := st.Load(context.Background(), zodb.Xid{Oid: oid, At: at})
	var noObj *zodb.NoObjectError
	var noData *zodb.NoDataError
	if errors.As(err, &noObj) || errors.As(err, &noData) {
		return loadResult{absent: true}
	}
	if err != nil {
		t.Fatalf("load %s@%s: %v", oid, at, err)
	}
	return loadResult{data: data, serial: serial}
}

// reachable returns the objects reachable from the root in state at of st,
// with their loads.
func reachable(t testing.TB, st *fs1.FileStorage, at zodb.Tid) map[zodb.Oid]loadResult {
	t.Helper()
	seen := map[zodb.Oid]loadResult{}
	todo := []zodb.Oid{0}
	for len(todo) > 0 {
		oid := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		if _, ok := seen[oid]; ok {
			continue
		}
		r := load(t, st, oid, at)
		seen[oid] = r
		if r.absent {
			continue
		}
		refs, err := serialize.References(r.data)
		if err != nil {
			t.Fatalf("references of %s@%s: %v", oid, at, err)
		}
		todo = append(todo, refs...)
	}
	return seen
}

// checkPacked checks a file packed at `at` against the original: fstest
// passes, the transactions after `at` are all there with the same
// metadata, the ones before have status 'p', and in every state from `at`
// on every object reachable from the root (with gc) or every object (without)
// loads the same. It also checks that the .index saved equals a scan.
func checkPacked(t *testing.T, origPath, packedPath string, at zodb.Tid, gc bool) {
	t.Helper()
	var out bytes.Buffer
	if err := fs1tools.Verify(&out, packedPath, 0); err != nil || out.Len() != 0 {
		t.Fatalf("fstest %s: %v\n%s", packedPath, err, out.String())
	}
	orig, packed := openRO(t, origPath), openRO(t, packedPath)
	ctx := context.Background()

	// Transactions.
	pit := packed.Iterate(ctx, 0, zodb.TidMax)
	oit := orig.Iterate(ctx, at+1, zodb.TidMax)
	for {
		pt, _, err := pit.NextTxn(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if pt.Tid <= at {
			if pt.Status != zodb.TxnPacked {
				t.Errorf("transaction %s before the pack time has status %q", pt.Tid, pt.Status)
			}
			continue
		}
		ot, _, err := oit.NextTxn(ctx)
		if err != nil {
			t.Fatalf("packed file has transaction %s, original: %v", pt.Tid, err)
		}
		if ot.Tid != pt.Tid || ot.Status != pt.Status || !bytes.Equal(ot.User, pt.User) ||
			!bytes.Equal(ot.Description, pt.Description) || !bytes.Equal(ot.Extension, pt.Extension) {
			t.Errorf("transaction after the pack time: packed %+v, original %+v", pt, ot)
		}
	}
	if ot, _, err := oit.NextTxn(ctx); err != io.EOF {
		t.Errorf("transaction %s missing from the packed file (%v)", ot.Tid, err)
	}

	// Loads in every state from the pack time on.
	states := []zodb.Tid{at}
	for _, tid := range txnTids(t, orig) {
		if tid > at {
			states = append(states, tid)
		}
	}
	for _, s := range states {
		var oids map[zodb.Oid]loadResult
		if gc {
			oids = reachable(t, orig, s)
		} else {
			oids = map[zodb.Oid]loadResult{}
			for _, oid := range orig.Index().Oids() {
				oids[oid] = load(t, orig, oid, s)
			}
		}
		for oid, want := range oids {
			got := load(t, packed, oid, s)
			if got.absent != want.absent || got.serial != want.serial || !bytes.Equal(got.data, want.data) {
				t.Errorf("load %s@%s: packed (absent %v, serial %s, %d bytes), original (absent %v, serial %s, %d bytes)",
					oid, s, got.absent, got.serial, len(got.data), want.absent, want.serial, len(want.data))
			}
		}
	}

	// The saved index is the index of the packed file.
	top, idx, err := fs1.LoadIndexFile(packedPath + ".index")
	if err != nil {
		t.Fatal(err)
	}
	if top != packed.End() || !idx.Equal(packed.Index()) {
		t.Errorf("saved index (covers %d) differs from a scan (end %d)", top, packed.End())
	}
}

// TestPackFixtureEveryTime packs 1.fs (many revisions, undo backpointers,
// chains of them, an undone creation, a deleted object, a BTree) at every
// transaction's tid and between transactions, with and without GC, and
// checks each result; then packs each result again at the same time, which
// must change nothing.
func TestPackFixtureEveryTime(t *testing.T) {
	orig := openRO(t, "testdata/1.fs")
	var ats []zodb.Tid
	for _, tid := range txnTids(t, orig) {
		ats = append(ats, tid-1, tid)
	}
	ats = append(ats, zodb.TidMax)
	ctx := context.Background()
	for _, gc := range []bool{true, false} {
		for _, at := range ats {
			t.Run(fmt.Sprintf("gc=%v/%s", gc, at), func(t *testing.T) {
				path := datasets.CopyFile(t, "testdata/1.fs")
				st, err := fs1.PackFile(ctx, path, at, &fs1.PackOptions{NoGC: !gc, Logf: quiet})
				if err != nil {
					t.Fatal(err)
				}
				if !st.Changed {
					if _, err := os.Stat(path + ".old"); err == nil {
						t.Fatal("unchanged, but .old exists")
					}
					b, _ := os.ReadFile(path)
					o, _ := os.ReadFile("testdata/1.fs")
					if !bytes.Equal(b, o) {
						t.Fatal("unchanged, but the file differs")
					}
					return
				}
				if st.GC != gc || st.BadRecords != 0 {
					t.Fatalf("stats %+v", st)
				}
				checkPacked(t, "testdata/1.fs", path, at, gc)
				packed, _ := os.ReadFile(path)
				st2, err := fs1.PackFile(ctx, path, at, &fs1.PackOptions{NoGC: !gc, Logf: quiet})
				if err != nil {
					t.Fatal(err)
				}
				again, _ := os.ReadFile(path)
				if st2.Changed || !bytes.Equal(again, packed) {
					t.Fatalf("packing again at the same time changed the file (%+v)", st2)
				}
			})
		}
	}
}

// TestPackEmptyAndTorn: an empty storage is left alone; a torn tail is
// left out of the packed file.
func TestPackEmptyAndTorn(t *testing.T) {
	ctx := context.Background()
	path := datasets.CopyFile(t, "testdata/empty.fs")
	st, err := fs1.PackFile(ctx, path, zodb.TidMax, nil)
	if err != nil || st.Changed {
		t.Fatalf("empty.fs: %+v, %v", st, err)
	}
	if _, err := os.Stat(path + ".pack"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("%s.pack left behind", path)
	}
	empty := filepath.Join(t.TempDir(), "zero.fs")
	os.WriteFile(empty, nil, 0o644)
	if st, err := fs1.PackFile(ctx, empty, zodb.TidMax, nil); err != nil || st.Changed {
		t.Fatalf("empty file: %+v, %v", st, err)
	}

	path = datasets.CopyFile(t, "testdata/torn.fs")
	at := zodb.Tid(0x03f58e5ca2acd9dd)
	var warned bool
	st, err = fs1.PackFile(ctx, path, at, &fs1.PackOptions{Logf: func(string, ...interface{}) { warned = true }})
	if err != nil {
		t.Fatal(err)
	}
	if !st.Changed || st.Torn == 0 || !warned {
		t.Fatalf("torn.fs: %+v, warned %v", st, warned)
	}
	// The torn transaction is 1.fs's last one: the result is 1.fs packed
	// at the same time, less that transaction.
	full := datasets.CopyFile(t, "testdata/1.fs")
	if _, err := fs1.PackFile(ctx, full, at, nil); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(path)
	b, _ := os.ReadFile(full)
	if len(a) >= len(b) || !bytes.Equal(a, b[:len(a)]) {
		t.Fatalf("packed torn.fs (%d bytes) is not a prefix of packed 1.fs (%d bytes)", len(a), len(b))
	}
	var out bytes.Buffer
	if err := fs1tools.Verify(&out, path, 0); err != nil {
		t.Fatalf("fstest: %v %s", err, out.String())
	}
}

// TestPackDatasets packs the benchmark datasets at a few times and checks the
// results as TestPackFixtureEveryTime does (loads in the first and last
// state).
func TestPackDatasets(t *testing.T) {
	paths := datasetPaths(t)
	ctx := context.Background()
	for _, src := range paths {
		orig := openRO(t, src)
		tids := txnTids(t, orig)
		for _, frac := range []int{1, 2, 4} {
			at := tids[len(tids)*frac/5]
			for _, gc := range []bool{true, false} {
				t.Run(fmt.Sprintf("%s/%d/gc=%v", filepath.Base(src), frac, gc), func(t *testing.T) {
					path := datasets.CopyFile(t, src)
					st, err := fs1.PackFile(ctx, path, at, &fs1.PackOptions{NoGC: !gc})
					if err != nil {
						t.Fatal(err)
					}
					t.Logf("%+v", st)
					if !st.Changed {
						return
					}
					var out bytes.Buffer
					if err := fs1tools.Verify(&out, path, 0); err != nil || out.Len() != 0 {
						t.Fatalf("fstest: %v\n%s", err, out.String())
					}
					packed := openRO(t, path)
					for _, s := range []zodb.Tid{at, tids[len(tids)-1]} {
						want := reachable(t, orig, s)
						if !gc {
							for _, oid := range orig.Index().Oids() {
								want[oid] = load(t, orig, oid, s)
							}
						}
						for oid, w := range want {
							g := load(t, packed, oid, s)
							if g.absent != w.absent || g.serial != w.serial || !bytes.Equal(g.data, w.data) {
								t.Fatalf("load %s@%s differs", oid, s)
							}
						}
					}
				})
			}
		}
	}
}

// datasetPaths returns the benchmark datasets (package datasets makes
// them when missing); they are shared, not to be written.
func datasetPaths(t testing.TB) []string {
	t.Helper()
	var paths []string
	for _, name := range datasets.Names {
		paths = append(paths, datasets.Path(t, name))
	}
	return paths
}

// TestPackCopyTail packs a prefix of 1.fs and copies the rest with
// CopyTail, as the online pack does for the transactions committed while
// it ran. When no transaction of the tail points to a dropped record the
// result is what packing the whole file gives; when one does (the undo of
// T18 in T26, packed between T25 and T26), its backpointer becomes a copy
// of the data, and the loads are still those of the original.
func TestPackCopyTail(t *testing.T) {
	ctx := context.Background()
	src := "testdata/1.fs"
	orig := openRO(t, src)
	tids := txnTids(t, orig)
	positions := txnPositions(t, src)
	for _, at := range []zodb.Tid{0x03f58e5ca2acd9dd, tids[25], tids[3]} {
		whole := datasets.CopyFile(t, src)
		if _, err := fs1.PackFile(ctx, whole, at, &fs1.PackOptions{Logf: quiet}); err != nil {
			t.Fatal(err)
		}
		wholeBytes, _ := os.ReadFile(whole)
		for i, split := range positions {
			if tids[i] <= at {
				continue
			}
			name := fmt.Sprintf("at=%s/split=%d", at, split)
			f, err := os.Open(src)
			if err != nil {
				t.Fatal(err)
			}
			dstPath := filepath.Join(t.TempDir(), "Data.fs")
			dst, err := os.Create(dstPath)
			if err != nil {
				t.Fatal(err)
			}
			p := fs1.NewPacker(f, src, dst, at, &fs1.PackOptions{Logf: quiet})
			if err := p.Pack(ctx, split); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if !p.Changed() {
				t.Fatalf("%s: nothing packed", name)
			}
			end := orig.End()
			// In two steps, as commits keep coming.
			mid := positions[(i+len(positions))/2]
			if mid <= split {
				mid = split
			}
			if err := p.CopyTail(ctx, split, mid); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if err := p.CopyTail(ctx, mid, end); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if err := p.Index().SaveFile(dstPath+".index", p.Size()); err != nil {
				t.Fatal(err)
			}
			dst.Close()
			f.Close()
			got, _ := os.ReadFile(dstPath)
			if at == tids[25] && split <= positions[26] {
				if bytes.Equal(got, wholeBytes) {
					t.Errorf("%s: the backpointer to a dropped record was kept", name)
				}
			} else if !bytes.Equal(got, wholeBytes) {
				t.Errorf("%s: differs from packing the whole file", name)
			}
			checkPacked(t, src, dstPath, at, true)
		}
	}
}

// txnPositions returns the positions of the transactions of a file.
func txnPositions(t testing.TB, path string) []int64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	var th fs1.TxnHeader
	var pos []int64
	for p := int64(fs1.HeaderSize); p < st.Size(); p = th.Next() {
		if err := th.Load(f, path, p, st.Size()); err != nil {
			t.Fatal(err)
		}
		pos = append(pos, p)
	}
	return pos
}

// TestPackCancel cancels a pack in each phase: the original is untouched,
// and neither FILE.pack nor FILE.old is left.
func TestPackCancel(t *testing.T) {
	for _, phase := range []fs1.PackPhase{fs1.PackScan, fs1.PackGC, fs1.PackCopy} {
		t.Run(phase.String(), func(t *testing.T) {
			path := datasets.CopyFile(t, "testdata/1.fs")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			seen := false
			opt := &fs1.PackOptions{Logf: quiet, Progress: func(ph fs1.PackPhase, done, total int64) {
				if ph == phase {
					seen = true
					cancel()
				}
			}}
			_, err := fs1.PackFile(ctx, path, 0x03f58e5ca2acd9dd, opt)
			if !seen {
				t.Fatalf("no progress report in phase %s", phase)
			}
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("PackFile = %v, want context.Canceled", err)
			}
			got, _ := os.ReadFile(path)
			want, _ := os.ReadFile("testdata/1.fs")
			if !bytes.Equal(got, want) {
				t.Fatal("the original changed")
			}
			for _, ext := range []string{".pack", ".old", ".index"} {
				if _, err := os.Stat(path + ext); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s%s left behind", path, ext)
				}
			}
		})
	}
}

// TestPackLocked: a storage open for writing is not packed.
func TestPackLocked(t *testing.T) {
	path := datasets.CopyFile(t, "testdata/1.fs")
	st, err := fs1.Open(path, &fs1.Options{ReadWrite: true, Logf: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	_, err = fs1.PackFile(context.Background(), path, zodb.TidMax, nil)
	if !errors.Is(err, fs1.ErrLocked) {
		t.Fatalf("PackFile = %v, want ErrLocked", err)
	}
	if _, err := os.Stat(path + ".pack"); !errors.Is(err, os.ErrNotExist) {
		t.Fatal(".pack left behind")
	}
	if _, err := fs1.PackFile(context.Background(), path, 0, nil); !errors.Is(err, fs1.ErrPackTime) {
		t.Fatalf("pack time 0: %v", err)
	}
}

// record returns a ZODB object record (protocol 3, as ZODB/py writes it)
// of a persistent mapping whose state refers to refs, with a payload.
func record(payload string, refs ...zodb.Oid) []byte {
	b := []byte("\x80\x03cpersistent.mapping\nPersistentMapping\nq\x00.\x80\x03}q\x01(")
	for i, r := range refs {
		b = append(b, 'X', 4, 0, 0, 0)
		b = append(b, fmt.Sprintf("r%03d", i%1000)...)
		b = append(b, 'C', 8)
		var o [8]byte
		for j := range o {
			o[j] = byte(r >> (56 - 8*j))
		}
		b = append(b, o[:]...)
		b = append(b, 'h', 0, 0x86, 'Q')
	}
	b = append(b, 'X')
	b = append(b, byte(len(payload)), byte(len(payload)>>8), byte(len(payload)>>16), byte(len(payload)>>24))
	b = append(b, payload...)
	b = append(b, 'X', 1, 0, 0, 0, 'p', 'u', '.')
	return b
}

// commit stores the records of one transaction with zodbd's writer.
func commit(t testing.TB, st *fs1.FileStorage, recs map[zodb.Oid][]byte) zodb.Tid {
	t.Helper()
	ctx := context.Background()
	txn, err := st.Begin(ctx, zodb.TxnMeta{Description: []byte("test")})
	if err != nil {
		t.Fatal(err)
	}
	for oid, data := range recs {
		_, serial, err := st.Load(ctx, zodb.Xid{Oid: oid, At: zodb.TidMax})
		var noData *zodb.NoDataError
		if errors.As(err, &noData) {
			serial = noData.DeletedAt
		} else if err != nil {
			serial = 0
		}
		if data == nil {
			err = txn.Delete(oid, serial)
		} else {
			err = txn.Store(oid, serial, data)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := txn.Vote(ctx); err != nil {
		t.Fatal(err)
	}
	tid, err := txn.Finish(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	return tid
}

// TestPackGCEdges: references to oids that do not exist are ignored; a
// reachable record whose references cannot be read makes the pack keep
// every object; a root missing at the pack time while other objects exist
// is an error.
func TestPackGCEdges(t *testing.T) {
	ctx := context.Background()
	build := func(t *testing.T, txns ...map[zodb.Oid][]byte) (string, []zodb.Tid) {
		path := filepath.Join(t.TempDir(), "Data.fs")
		st, err := fs1.Open(path, &fs1.Options{Create: true, Logf: quiet})
		if err != nil {
			t.Fatal(err)
		}
		var tids []zodb.Tid
		for _, recs := range txns {
			tids = append(tids, commit(t, st, recs))
		}
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		return path, tids
	}

	t.Run("dangling", func(t *testing.T) {
		path, tids := build(t,
			map[zodb.Oid][]byte{0: record("root", 1, 99), 1: record("one"), 2: record("garbage")},
			map[zodb.Oid][]byte{1: record("one v2")})
		st, err := fs1.PackFile(ctx, path, tids[1], &fs1.PackOptions{Logf: quiet})
		if err != nil {
			t.Fatal(err)
		}
		if !st.GC || st.DanglingRefs != 1 || st.Reachable != 2 || st.Objects != 2 {
			t.Fatalf("%+v", st)
		}
		checkPacked(t, path+".old", path, tids[1], true)
	})
	t.Run("bad record", func(t *testing.T) {
		path, tids := build(t,
			map[zodb.Oid][]byte{0: record("root", 1), 1: []byte("not a pickle"), 2: record("garbage")},
			map[zodb.Oid][]byte{2: record("garbage v2")})
		var warning string
		st, err := fs1.PackFile(ctx, path, tids[1], &fs1.PackOptions{Logf: func(f string, a ...interface{}) { warning += fmt.Sprintf(f, a...) }})
		if err != nil {
			t.Fatal(err)
		}
		if st.GC || st.BadRecords != 1 || st.Objects != 3 || warning == "" {
			t.Fatalf("%+v %q", st, warning)
		}
		checkPacked(t, path+".old", path, tids[1], false)
	})
	t.Run("no root", func(t *testing.T) {
		path, tids := build(t,
			map[zodb.Oid][]byte{1: record("one")},
			map[zodb.Oid][]byte{1: record("one v2")})
		if _, err := fs1.PackFile(ctx, path, tids[1], &fs1.PackOptions{Logf: quiet}); err == nil {
			t.Fatal("pack without a root object succeeded")
		}
		if _, err := os.Stat(path + ".pack"); !errors.Is(err, os.ErrNotExist) {
			t.Fatal(".pack left behind")
		}
		st, err := fs1.PackFile(ctx, path, tids[1], &fs1.PackOptions{NoGC: true, Logf: quiet})
		if err != nil || !st.Changed {
			t.Fatalf("without GC: %+v %v", st, err)
		}
	})
	t.Run("deleted", func(t *testing.T) {
		path, tids := build(t,
			map[zodb.Oid][]byte{0: record("root", 1, 2), 1: record("one"), 2: record("two")},
			map[zodb.Oid][]byte{0: record("root v2", 1)},
			map[zodb.Oid][]byte{2: nil},
			map[zodb.Oid][]byte{1: record("one v2")})
		for _, at := range tids {
			for _, gc := range []bool{true, false} {
				p := datasets.CopyFile(t, path)
				st, err := fs1.PackFile(ctx, p, at, &fs1.PackOptions{NoGC: !gc, Logf: quiet})
				if err != nil {
					t.Fatal(err)
				}
				if st.Changed {
					checkPacked(t, path, p, at, gc)
				}
			}
		}
	})
}
