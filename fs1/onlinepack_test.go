package fs1

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/zodbd/zodbd/internal/datasets"
	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/zodb"
)

// fillHistory commits n transactions that each rewrite a few of 20 objects,
// and returns their tids.
func fillHistory(t *testing.T, fs *FileStorage, n int) []zodb.Tid {
	t.Helper()
	serials := map[zodb.Oid]zodb.Tid{}
	var tids []zodb.Tid
	for i := 0; i < n; i++ {
		data := map[zodb.Oid]string{}
		for k := 0; k < 3; k++ {
			data[zodb.Oid((i*7+k*3)%20)] = fmt.Sprintf("v%d-%d", i, k)
		}
		base := map[zodb.Oid]zodb.Tid{}
		for oid := range data {
			base[oid] = serials[oid]
		}
		tid := commit(t, fs, base, data)
		for oid := range data {
			serials[oid] = tid
		}
		tids = append(tids, tid)
	}
	return tids
}

// An online pack of a storage nobody writes to gives the bytes of the
// offline pack of the same file (itself byte-identical to ZODB/py's).
func TestOnlinePackMatchesOffline(t *testing.T) {
	fs := createStorage(t, nil)
	tids := fillHistory(t, fs, 60)
	at := tids[40]
	offline := filepath.Join(t.TempDir(), "Data.fs")
	datasets.CopyTo(t, fs.path, offline)

	st, err := fs.PackStats(bg, at, &PackOptions{NoGC: true})
	if err != nil {
		t.Fatal(err)
	}
	if !st.Changed {
		t.Fatal("pack changed nothing")
	}
	if _, err := PackFile(bg, offline, at, &PackOptions{NoGC: true}); err != nil {
		t.Fatal(err)
	}
	got, _ := os.ReadFile(fs.path)
	want, _ := os.ReadFile(offline)
	if !bytes.Equal(got, want) {
		t.Fatalf("online pack: %d bytes, offline: %d bytes, contents differ", len(got), len(want))
	}
	if _, err := os.Stat(fs.path + ".old"); err != nil {
		t.Errorf("no .old kept: %v", err)
	}
	if _, err := os.Stat(fs.path + ".pack"); !os.IsNotExist(err) {
		t.Errorf(".pack left: %v", err)
	}
	// The storage goes on on the packed file: loads, history bounded by
	// the pack, new commits, and a reopen from the saved index.
	if d, _ := load(t, fs, 0, zodb.TidMax); d == "" {
		t.Fatal("empty load")
	}
	tid := commit(t, fs, map[zodb.Oid]zodb.Tid{1: mustSerial(t, fs, 1)}, map[zodb.Oid]string{1: "after", 99: "new"})
	if d, s := load(t, fs, 1, zodb.TidMax); d != "after" || s != tid {
		t.Fatalf("after pack: %q@%s", d, s)
	}
	if _, _, _, err := fs.LoadBefore(bg, 1, tids[10], nil); err == nil {
		t.Error("a revision from before the pack time survived")
	}
	path := fs.path
	if err := fs.Close(); err != nil {
		t.Fatal(err)
	}
	checkScan(t, path)
	fs2 := openRW(t, path, nil, false)
	defer fs2.Close()
	if d, _ := load(t, fs2, 99, zodb.TidMax); d != "new" {
		t.Fatalf("reopened: %q", d)
	}
}

func mustSerial(t *testing.T, fs *FileStorage, oid zodb.Oid) zodb.Tid {
	_, s := load(t, fs, oid, zodb.TidMax)
	return s
}

// Commits and loads go on while the storage is packed; every commit
// survives with its data, loads never fail, and the file is sound after.
func TestOnlinePackConcurrent(t *testing.T) {
	fs := createStorage(t, nil)
	tids := fillHistory(t, fs, 200)
	at := tids[150]

	const writers = 4
	var stop atomic.Bool
	var ncommit atomic.Int64
	var wg sync.WaitGroup
	errc := make(chan error, 16)
	final := make([]map[zodb.Oid]string, writers)
	for w := 0; w < writers; w++ {
		final[w] = map[zodb.Oid]string{}
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			serials := map[zodb.Oid]zodb.Tid{}
			for i := 0; !stop.Load() || i < 20; i++ {
				oid := zodb.Oid(1000 + w*10 + i%10)
				data := fmt.Sprintf("w%d-%d", w, i)
				_, err := tryCommit(fs, zodb.TxnMeta{}, func(tx zodb.Txn) error {
					return tx.Store(oid, serials[oid], []byte(data))
				})
				if err != nil {
					errc <- fmt.Errorf("writer %d commit %d: %w", w, i, err)
					return
				}
				_, s, err := fs.Load(bg, zodb.Xid{Oid: oid, At: zodb.TidMax})
				if err != nil {
					errc <- err
					return
				}
				serials[oid] = s
				final[w][oid] = data
				ncommit.Add(1)
			}
		}(w)
	}
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				for oid := zodb.Oid(0); oid < 20; oid++ {
					if _, _, err := fs.Load(bg, zodb.Xid{Oid: oid, At: zodb.TidMax}); err != nil {
						errc <- fmt.Errorf("reader: %w", err)
						return
					}
				}
			}
		}()
	}
	current := map[zodb.Oid]string{}
	for oid := zodb.Oid(0); oid < 20; oid++ {
		current[oid], _ = load(t, fs, oid, zodb.TidMax)
	}
	// Hold the pack in its first phase until the writers have committed
	// more transactions, so that the tail copy has work to do.
	var once sync.Once
	hold := func(PackPhase, int64, int64) {
		once.Do(func() {
			for n0 := ncommit.Load(); ncommit.Load() < n0+50; {
				runtime.Gosched()
			}
		})
	}
	st, err := fs.PackStats(bg, at, &PackOptions{NoGC: true, Progress: hold})
	stop.Store(true)
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if err != nil || !st.Changed {
		t.Fatalf("pack: %v, changed %v", err, st.Changed)
	}
	for oid, want := range current {
		if d, _ := load(t, fs, oid, zodb.TidMax); d != want {
			t.Errorf("%s: %q, want %q", oid, d, want)
		}
	}
	for _, m := range final {
		for oid, want := range m {
			if d, _ := load(t, fs, oid, zodb.TidMax); d != want {
				t.Errorf("%s: %q, want %q", oid, d, want)
			}
		}
	}
	path := fs.path
	fs.Close()
	checkScan(t, path)
}

func TestOnlinePackErrors(t *testing.T) {
	fs := createStorage(t, nil)
	tids := fillHistory(t, fs, 30)
	before, _ := os.ReadFile(fs.path)

	// Cancelled: unchanged, no .pack left.
	ctx, cancel := context.WithCancel(bg)
	cancel()
	if err := fs.Pack(ctx, tids[20], false); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled pack: %v", err)
	}
	if after, _ := os.ReadFile(fs.path); !bytes.Equal(before, after) {
		t.Fatal("a cancelled pack changed the file")
	}
	if _, err := os.Stat(fs.path + ".pack"); !os.IsNotExist(err) {
		t.Fatalf(".pack left: %v", err)
	}

	// A second pack while one runs.
	inside := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	done := make(chan error)
	go func() {
		_, err := fs.PackStats(bg, tids[20], &PackOptions{NoGC: true, Progress: func(PackPhase, int64, int64) {
			once.Do(func() { close(inside); <-release })
		}})
		done <- err
	}()
	<-inside
	if err := fs.Pack(bg, tids[20], false); !errors.Is(err, ErrPacking) {
		t.Errorf("concurrent pack: %v", err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := fs.Pack(bg, 0, false); !errors.Is(err, ErrPackTime) {
		t.Errorf("pack at 0: %v", err)
	}
	path := fs.path
	fs.Close()

	ro, err := Open(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if err := ro.Pack(bg, tids[20], false); !errors.Is(err, zodb.ErrReadOnly) {
		t.Errorf("read-only pack: %v", err)
	}
}

// A reader that took its snapshot before the swap reads the old file to
// the end.
func TestOnlinePackIteratorAcrossSwap(t *testing.T) {
	fs := createStorage(t, nil)
	tids := fillHistory(t, fs, 40)
	it := fs.Iterate(bg, 0, zodb.TidMax)
	if err := fs.Pack(bg, tids[30], false); err != nil {
		t.Fatal(err)
	}
	n := 0
	storagetest.Walk(t, bg, it, func(*zodb.TxnInfo, []zodb.DataInfo) { n++ })
	if n != len(tids) {
		t.Fatalf("iterated %d transactions, want %d", n, len(tids))
	}
	fs.Close()
}

func TestOnlinePackDiscardOld(t *testing.T) {
	fs := createStorage(t, &Options{PackDiscardOld: true, PackNoGC: true})
	defer fs.Close()
	tids := fillHistory(t, fs, 30)
	st, err := fs.PackStats(bg, tids[20], nil)
	if err != nil || !st.Changed {
		t.Fatalf("pack: %v %v", err, st.Changed)
	}
	if _, err := os.Stat(fs.path + ".old"); !os.IsNotExist(err) {
		t.Errorf(".old kept: %v", err)
	}
}
