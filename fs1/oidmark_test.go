package fs1

import (
	"errors"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/zodbd/zodbd/internal/datasets"
	"github.com/zodbd/zodbd/internal/vfs"
	"github.com/zodbd/zodbd/zodb"
)

// logRecorder collects what a storage logs.
type logRecorder struct {
	mu    sync.Mutex
	lines []string
}

func (l *logRecorder) logf(format string, args ...interface{}) {
	l.mu.Lock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
	l.mu.Unlock()
}

func (l *logRecorder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// setOidBlock sets oidBlock for the test.
func setOidBlock(t testing.TB, n zodb.Oid) {
	old := oidBlock
	oidBlock = n
	t.Cleanup(func() { oidBlock = old })
}

// takeOids calls NewOids(n) and adds the oids to seen, failing on a
// duplicate.
func takeOids(t testing.TB, fs *FileStorage, n int, seen map[zodb.Oid]bool) []zodb.Oid {
	t.Helper()
	oids, err := fs.NewOids(bg, n)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range oids {
		if seen[o] {
			t.Fatalf("oid %s handed out twice", o)
		}
		seen[o] = true
	}
	return oids
}

func maxOf(seen map[zodb.Oid]bool) zodb.Oid {
	var m zodb.Oid
	for o := range seen {
		m = max(m, o)
	}
	return m
}

// Oids handed out before Close are not handed out after a reopen, and a
// clean Close leaves no gap.
func TestOidMarkRestart(t *testing.T) {
	setOidBlock(t, 10)
	path := filepath.Join(t.TempDir(), "Data.fs")
	seen := map[zodb.Oid]bool{}
	for round := range 5 {
		fs := openRW(t, path, nil, round == 0)
		got := takeOids(t, fs, 3, seen)
		if round > 0 && got[0] != zodb.Oid(round*30+1) {
			t.Errorf("round %d: first oid %s, want %d (no gap after a clean close)", round, got[0], round*30+1)
		}
		for range 9 {
			takeOids(t, fs, 3, seen)
		}
		if err := fs.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(path + OidMarkSuffix); err != nil {
		t.Fatal(err)
	}
}

// snapshotStorage copies the files of the storage at path into a new
// directory while it is open: what a crash at this moment leaves (minus
// the page cache, which a crash of the process keeps).
func snapshotStorage(t *testing.T, path string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), filepath.Base(path))
	datasets.CopyTo(t, path, dst)
	datasets.CopyTo(t, path+OidMarkSuffix, dst+OidMarkSuffix)
	return dst
}

// After a crash (the files as they are while the storage is open), the
// oids handed out, stored or not, are above the new floor.
func TestOidMarkCrash(t *testing.T) {
	setOidBlock(t, 100)
	path := filepath.Join(t.TempDir(), "Data.fs")
	fs := openRW(t, path, nil, true)
	defer fs.Close()
	seen := map[zodb.Oid]bool{}
	rng := rand.New(rand.NewSource(1))
	for i := range 40 {
		oids := takeOids(t, fs, 1+rng.Intn(60), seen)
		if i%5 == 0 {
			commit(t, fs, nil, map[zodb.Oid]string{oids[0]: "x"})
		}
		fs.w.oids.markMu.Lock() // no write ahead in flight
		crashed := snapshotStorage(t, path)
		fs.w.oids.markMu.Unlock()
		fs2 := openRW(t, crashed, nil, false)
		oids2, err := fs2.NewOids(bg, 1)
		fs2.Close()
		if err != nil {
			t.Fatal(err)
		}
		if m := maxOf(seen); oids2[0] <= m {
			t.Fatalf("step %d: after a crash NewOids = %s, but %s was handed out", i, oids2[0], m)
		}
	}
}

// Without the side file (a file written by ZODB/py or an older zodbd),
// new oids start above the largest stored oid and the file is created.
func TestOidMarkMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "Data.fs")
	fs := openRW(t, path, nil, true)
	commit(t, fs, nil, map[zodb.Oid]string{0: "root", 41: "x"})
	fs.Close()
	if err := os.Remove(path + OidMarkSuffix); err != nil {
		t.Fatal(err)
	}
	var log logRecorder
	fs = openRW(t, path, &Options{Logf: log.logf}, false)
	if !strings.Contains(log.String(), "no oid mark file") {
		t.Errorf("missing side file not logged: %q", log.String())
	}
	if next, ok, err := ReadOidMark(path); err != nil || !ok || next != 42 {
		t.Errorf("created side file: next %s, %v, %v; want 42", next, ok, err)
	}
	if o, _ := fs.NewOids(bg, 1); o[0] != 42 {
		t.Errorf("NewOids = %s, want 42", o[0])
	}
	fs.Close()
	// A new storage logs nothing about it.
	log = logRecorder{}
	fs = openRW(t, filepath.Join(t.TempDir(), "Data.fs"), &Options{Logf: log.logf}, false)
	fs.Close()
	if s := log.String(); s != "" {
		t.Errorf("new storage logged %q", s)
	}
}

// A side file with no valid slot makes a read-write Open fail with an
// *Error naming the file and offset; one valid slot is used, the damage
// logged, and the next write repairs it.
func TestOidMarkDamaged(t *testing.T) {
	setOidBlock(t, 10)
	dir := t.TempDir()
	path := filepath.Join(dir, "Data.fs")
	mpath := path + OidMarkSuffix
	fs := openRW(t, path, nil, true)
	seen := map[zodb.Oid]bool{}
	takeOids(t, fs, 25, seen) // writes the mark 1+25+10 = 36 in slot 1 (seq 2)
	fs.Close()                // writes the exact mark 26 in slot 0 (seq 3)
	good, err := os.ReadFile(mpath)
	if err != nil || len(good) != oidMarkSize {
		t.Fatalf("side file: %d bytes, %v", len(good), err)
	}

	refuse := []struct {
		name    string
		content []byte
		pos     int64
	}{
		{"empty", nil, 0},
		{"short", good[:10], 0},
		{"garbage", []byte(strings.Repeat("garbage!", oidMarkSize/8+1)), 0},
		{"both slots flipped", flip(flip(good, 12), oidSlotStride+12), 0},
	}
	for _, c := range refuse {
		t.Run(c.name, func(t *testing.T) {
			if err := os.WriteFile(mpath, c.content, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := Open(path, &Options{ReadWrite: true, Logf: t.Logf})
			var fe *Error
			if !errors.As(err, &fe) || fe.Path != mpath || fe.Pos != c.pos {
				t.Fatalf("Open = %v, want an *Error at %s:%d", err, mpath, c.pos)
			}
			if !strings.Contains(err.Error(), "removing it") {
				t.Errorf("error does not say what to do: %v", err)
			}
			if _, _, err := ReadOidMark(path); err == nil {
				t.Error("ReadOidMark: no error")
			}
			// Read-only opens neither read nor write it.
			ro, err := Open(path, &Options{Logf: t.Logf})
			if err != nil {
				t.Fatalf("read-only Open: %v", err)
			}
			ro.Close()
			if b, _ := os.ReadFile(mpath); string(b) != string(c.content) {
				t.Error("read-only Open changed the side file")
			}
		})
	}

	use := []struct {
		name    string
		content []byte
		pos     int64 // of the damaged slot
		want    zodb.Oid
	}{
		// The latest slot (0, the exact mark 26) damaged: the other one.
		{"latest slot damaged", flip(good, 20), 0, 36},
		{"older slot damaged", flip(good, oidSlotStride+3), oidSlotStride, 26},
		{"truncated after slot 0", good[:oidSlotLen], oidSlotStride, 26},
		{"slot 1 short", good[:oidSlotStride+5], oidSlotStride, 26},
	}
	for _, c := range use {
		t.Run(c.name, func(t *testing.T) {
			if err := os.WriteFile(mpath, c.content, 0o644); err != nil {
				t.Fatal(err)
			}
			var log logRecorder
			fs := openRW(t, path, &Options{Logf: log.logf}, false)
			if want := fmt.Sprintf("%s:%d: oid mark", mpath, c.pos); !strings.Contains(log.String(), want) {
				t.Errorf("log %q does not name %s", log.String(), want)
			}
			if o, _ := fs.NewOids(bg, 1); o[0] != c.want {
				t.Errorf("NewOids = %s, want %s", o[0], c.want)
			}
			fs.Close()
			m, err := readOidMark(mpath)
			if err != nil || m.damaged != nil {
				t.Errorf("side file not repaired: %+v, %v", m, err)
			}
		})
	}
}

// flip returns a copy of b with the byte at i changed.
func flip(b []byte, i int) []byte {
	b = append([]byte(nil), b...)
	b[i] ^= 0x55
	return b
}

// A read-only Open neither creates nor reads the side file.
func TestOidMarkReadOnly(t *testing.T) {
	path := copyFixture(t, "1.fs")
	fs, err := Open(path, &Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fs.NewOids(bg, 1); !errors.Is(err, zodb.ErrReadOnly) {
		t.Errorf("NewOids read-only: %v", err)
	}
	if err := fs.SetOidFloor(5); !errors.Is(err, zodb.ErrReadOnly) {
		t.Errorf("SetOidFloor read-only: %v", err)
	}
	fs.Close()
	if _, err := os.Stat(path + OidMarkSuffix); !os.IsNotExist(err) {
		t.Errorf("read-only Open created the side file: %v", err)
	}
}

// A failed write of the mark hands out no oid past the old mark; the next
// call retries.
func TestOidMarkWriteError(t *testing.T) {
	setOidBlock(t, 10)
	path := filepath.Join(t.TempDir(), "Data.fs")
	fs := openRW(t, path, nil, true)
	defer fs.Close()
	seen := map[zodb.Oid]bool{}
	takeOids(t, fs, 3, seen) // reserves up to 14 (a write ahead may follow)
	a := &fs.w.oids
	a.markMu.Lock()
	mf := a.mark
	realWrite, realSync := mf.writeAt, mf.sync
	// A torn write: half the slot, then an error.
	mf.writeAt = func(b []byte, off int64) (int, error) {
		n, _ := realWrite(b[:len(b)/2], off)
		return n, errors.New("injected write error")
	}
	a.markMu.Unlock()
	for {
		_, err := fs.NewOids(bg, 1)
		if err != nil {
			if !strings.Contains(err.Error(), "injected write error") {
				t.Fatalf("NewOids: %v", err)
			}
			break
		}
		if len(seen) > 100 {
			t.Fatal("no write error")
		}
		seen[zodb.Oid(len(seen))] = true
	}
	// On disk: slot 0 torn, slot 1 the mark (14) that covers every oid
	// handed out.
	a.markMu.Lock()
	reserved := a.reserved
	if m, err := readOidMark(path + OidMarkSuffix); err != nil || m.slot.next != reserved || m.cur != 1 || m.damaged == nil {
		t.Errorf("side file after a torn write: %+v, %v; want next %s in slot 1", m, err, reserved)
	}
	mf.writeAt = realWrite
	mf.sync = func() error { return errors.New("injected fsync error") }
	a.markMu.Unlock()
	if _, err := fs.NewOids(bg, 20); err == nil || !strings.Contains(err.Error(), "fsync") {
		t.Fatalf("NewOids with a failing fsync: %v", err)
	}
	// After a failed fsync either slot may be the one on disk: both cover
	// every oid handed out.
	if m, err := readOidMark(path + OidMarkSuffix); err != nil || m.slot.next < reserved {
		t.Fatalf("side file after a failed fsync: %+v, %v; want next >= %s", m, err, reserved)
	}
	if o, err := fs.NewOids(bg, 1); err == nil {
		t.Fatalf("NewOids past the mark with a failing fsync = %s", o[0])
	}
	a.markMu.Lock()
	mf.sync = realSync
	a.markMu.Unlock()
	if _, err := fs.NewOids(bg, 20); err != nil {
		t.Fatalf("NewOids after the errors: %v", err)
	}
}

// Create starts a new storage: oids from 1, whatever the old side file said.
func TestOidMarkCreate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "Data.fs")
	fs := openRW(t, path, nil, true)
	fs.NewOids(bg, 500)
	fs.Close()
	fs = openRW(t, path, nil, true)
	defer fs.Close()
	if o, _ := fs.NewOids(bg, 1); o[0] != 1 {
		t.Errorf("NewOids after Create = %s, want 1", o[0])
	}
}

// commitPack commits a root that refers to nothing and objects 1..top, so
// that a pack with GC drops all but the root, and returns the last tid.
func commitUnreachable(t *testing.T, fs *FileStorage, top zodb.Oid) zodb.Tid {
	t.Helper()
	data := map[zodb.Oid]string{0: string(packRecord(nil, nil, 0, nil))}
	for oid := zodb.Oid(1); oid <= top; oid++ {
		data[oid] = string(packRecord(nil, nil, 0, nil))
	}
	return commit(t, fs, nil, data)
}

// A pack that drops the objects with the largest oids does not lower the
// floor: online (Pack) and offline (PackFile, also without a side file).
func TestOidMarkPack(t *testing.T) {
	t.Run("online", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "Data.fs")
		fs := openRW(t, path, nil, true)
		tid := commitUnreachable(t, fs, 5000) // explicit oids, above the mark
		if err := fs.Pack(bg, tid+1, true); err != nil {
			t.Fatal(err)
		}
		if fs.Len() != 1 {
			t.Fatalf("pack kept %d objects", fs.Len())
		}
		crashed := snapshotStorage(t, path)
		fs.Close()
		for _, p := range []string{crashed, path} {
			fs := openRW(t, p, nil, false)
			if o, _ := fs.NewOids(bg, 1); o[0] <= 5000 {
				t.Errorf("%s: NewOids after pack = %s, want > 5000", p, o[0])
			}
			fs.Close()
		}
	})
	for _, withMark := range []bool{true, false} {
		t.Run(fmt.Sprintf("offline/mark=%v", withMark), func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "Data.fs")
			fs := openRW(t, path, nil, true)
			tid := commitUnreachable(t, fs, 300)
			fs.Close() // exact mark: 301
			if !withMark {
				os.Remove(path + OidMarkSuffix)
			}
			if _, err := PackFile(bg, path, tid+1, nil); err != nil {
				t.Fatal(err)
			}
			if next, ok, err := ReadOidMark(path); err != nil || !ok || next != 301 {
				t.Errorf("side file after pack: %s, %v, %v; want 301", next, ok, err)
			}
			fs = openRW(t, path, nil, false)
			defer fs.Close()
			if fs.Len() != 1 {
				t.Fatalf("pack kept %d objects", fs.Len())
			}
			if o, _ := fs.NewOids(bg, 1); o[0] != 301 {
				t.Errorf("NewOids after pack = %s, want 301", o[0])
			}
		})
	}
	t.Run("offline/damaged", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "Data.fs")
		fs := openRW(t, path, nil, true)
		tid := commitUnreachable(t, fs, 3)
		fs.Close()
		os.WriteFile(path+OidMarkSuffix, []byte("junk"), 0o644)
		before, _ := os.ReadFile(path)
		if _, err := PackFile(bg, path, tid+1, nil); err == nil {
			t.Fatal("PackFile with a damaged side file: no error")
		}
		if after, _ := os.ReadFile(path); string(after) != string(before) {
			t.Error("failed pack changed the file")
		}
		if _, err := os.Stat(path + ".pack"); !os.IsNotExist(err) {
			t.Errorf("failed pack left %s.pack", path)
		}
	})
}

// SetOidFloor raises the floor durably and never lowers it.
func TestSetOidFloor(t *testing.T) {
	path := filepath.Join(t.TempDir(), "Data.fs")
	fs := openRW(t, path, nil, true)
	if err := fs.SetOidFloor(1000); err != nil {
		t.Fatal(err)
	}
	if next, _, _ := ReadOidMark(path); next != 1000 {
		t.Errorf("mark after SetOidFloor(1000) = %s", next)
	}
	if err := fs.SetOidFloor(10); err != nil {
		t.Fatal(err)
	}
	if o, _ := fs.NewOids(bg, 1); o[0] != 1000 {
		t.Errorf("NewOids = %s, want 1000", o[0])
	}
	fs.Close()
	if _, err := fs.NewOids(bg, 1); !errors.Is(err, ErrClosed) {
		t.Errorf("NewOids after Close: %v", err)
	}
}

// NewOids from several goroutines, concurrent with commits of explicit
// oids that raise the floor, with a block small enough that most calls
// write the mark: no oid is handed out twice, none is at or below an
// explicit oid whose commit finished before the call, and after a crash
// and after a reopen every new oid is above all of them.
func TestOidMarkConcurrent(t *testing.T) {
	setOidBlock(t, 16)
	path := filepath.Join(t.TempDir(), "Data.fs")
	fs := openRW(t, path, nil, true)
	var mu sync.Mutex
	seen := map[zodb.Oid]bool{}     // handed out by NewOids
	explicit := map[zodb.Oid]bool{} // stored explicitly (a NewOids call begun before the commit finished may return one: the floor rises at the commit)
	var committed zodb.Oid          // largest explicit oid whose commit finished
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	for g := range 4 {
		wg.Add(1)
		go func(rng *rand.Rand) {
			defer wg.Done()
			for range 300 {
				mu.Lock()
				floor := committed
				mu.Unlock()
				oids, err := fs.NewOids(bg, 1+rng.Intn(40))
				if err != nil {
					errc <- err
					return
				}
				mu.Lock()
				for _, o := range oids {
					if seen[o] || o <= floor {
						mu.Unlock()
						errc <- fmt.Errorf("oid %s handed out twice or at/below the floor %s", o, floor)
						return
					}
					seen[o] = true
				}
				mu.Unlock()
			}
		}(rand.New(rand.NewSource(int64(g))))
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 30 {
			mu.Lock()
			oid := max(maxOf(seen), maxOf(explicit)) + 1 + zodb.Oid(i*7)
			mu.Unlock()
			tx, _ := fs.Begin(bg, zodb.TxnMeta{})
			tx.Store(oid, 0, []byte("explicit"))
			if _, err := tx.Vote(bg); err != nil {
				tx.Abort()
				errc <- err
				return
			}
			if _, err := tx.Finish(bg, nil); err != nil {
				errc <- err
				return
			}
			mu.Lock()
			committed = max(committed, oid)
			explicit[oid] = true
			mu.Unlock()
		}
	}()
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	fs.w.oids.markMu.Lock()
	crashed := snapshotStorage(t, path)
	fs.w.oids.markMu.Unlock()
	fs.Close()
	m := max(maxOf(seen), maxOf(explicit))
	for _, p := range []string{crashed, path} {
		fs := openRW(t, p, nil, false)
		if o, _ := fs.NewOids(bg, 1); o[0] <= m {
			t.Errorf("%s: NewOids = %s after reopen, but %s was handed out", p, o[0], m)
		}
		fs.Close()
	}
}

// Once the largest oid is stored, no oid is above it: NewOids fails
// (ZODB/py's new_oid too) rather than wrap to 0 and hand out the root and
// the other stored oids, also after a restart.
func TestNewOidsAfterLargestOid(t *testing.T) {
	path := filepath.Join(t.TempDir(), "Data.fs")
	fs := openRW(t, path, nil, true)
	commit(t, fs, nil, map[zodb.Oid]string{0: "root"})
	before, err := fs.NewOids(bg, 2)
	if err != nil {
		t.Fatal(err)
	}
	commit(t, fs, nil, map[zodb.Oid]string{1<<64 - 1: "last"})
	for i := 0; i < 2; i++ {
		if oids, err := fs.NewOids(bg, 1); err == nil || !strings.Contains(err.Error(), "no oids left") {
			t.Fatalf("NewOids after the largest oid is stored (open %d): %v, %v; want no oids left", i, oids, err)
		}
		fs.Close()
		fs = openRW(t, path, nil, false)
	}
	fs.Close()
	if _, err := os.Stat(path + OidMarkSuffix); err != nil {
		t.Fatal(err)
	}
	m, err := readOidMark(path + OidMarkSuffix)
	if err != nil || m.slot.next <= before[1] {
		t.Fatalf("oid mark: %+v, %v; want above %s", m.slot, err, before[1])
	}
}

// noNewFileFS refuses to create files whose names end in suffix, as a
// directory does where the storage's files may be written but no file
// created (owned by another user).
type noNewFileFS struct {
	vfs.FS
	suffix string
}

func (n noNewFileFS) OpenFile(name string, flag int, perm os.FileMode) (*os.File, error) {
	if flag&os.O_CREATE != 0 && strings.HasSuffix(name, n.suffix) {
		if _, err := os.Stat(name); err != nil {
			return nil, &os.PathError{Op: "open", Path: name, Err: syscall.EACCES}
		}
	}
	return n.FS.OpenFile(name, flag, perm)
}

// TestOidMarkNotCreatable: where the mark file cannot be made (no new
// file in the directory), a read-write Open failed ("oid mark: open
// Data.fs.oid.tmp: permission denied") where runzeo serves; it warns now
// and keeps the mark in memory: oids are handed out past many blocks,
// never twice, and Close leaves no mark file.
func TestOidMarkNotCreatable(t *testing.T) {
	setOidBlock(t, 4)
	path := filepath.Join(t.TempDir(), "Data.fs")
	fs := openRW(t, path, nil, true)
	commit(t, fs, nil, map[zodb.Oid]string{0: "root", 41: "x"})
	fs.Close()
	if err := os.Remove(path + OidMarkSuffix); err != nil {
		t.Fatal(err)
	}
	var log logRecorder
	fs = openRW(t, path, &Options{Logf: log.logf, FS: noNewFileFS{vfs.OS, OidMarkSuffix + ".tmp"}}, false)
	if !strings.Contains(log.String(), "no oid mark is kept") {
		t.Errorf("the mark kept in memory was not logged: %q", log.String())
	}
	seen := map[zodb.Oid]bool{}
	for range 5 {
		takeOids(t, fs, 3, seen)
	}
	if min := 42; !seen[zodb.Oid(min)] || maxOf(seen) != 42+14 {
		t.Errorf("oids handed out: %d up to %s, want 42 to 56", len(seen), maxOf(seen))
	}
	if err := fs.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	if _, err := os.Stat(path + OidMarkSuffix); !os.IsNotExist(err) {
		t.Errorf("a mark file was made: %v", err)
	}
}
