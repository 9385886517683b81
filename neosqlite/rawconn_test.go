package neosqlite

import (
	"context"
	"crypto/sha1"
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/zodbd/zodbd/zodb"
)

// TestObjectColumnType checks that a column of the wrong SQLite type is
// reported as corruption naming the column, not converted.
func TestObjectColumnType(t *testing.T) {
	ctx := context.Background()
	db := openT(t, copyDB(t, "testdata/storage.sqlite", "UPDATE data SET compression='zlib' WHERE id=6"))
	_, err := db.Object(ctx, 4, 0, 0, nil)
	wantErr(t, err, ErrCorrupt, "oid 0000000000000004", "d.compression", "not an integer")
	if _, err := db.Object(ctx, 1, 0, 0, nil); err != nil {
		t.Errorf("another object: %v", err)
	}
}

// TestRawClose checks that lookups after Close fail with an error (and do
// not touch the closed connections), from the pool and from a new one.
func TestRawClose(t *testing.T) {
	ctx := context.Background()
	for _, exclusive := range []bool{false, true} {
		var db *DB
		if exclusive {
			db = openExclusiveCopy(t, "testdata/storage.sqlite")
		} else {
			db = openT(t, "testdata/storage.sqlite")
		}
		if _, err := db.Object(ctx, 1, 0, 0, nil); err != nil {
			t.Fatal(err)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		// The pooled connection, closed.
		if _, err := db.Object(ctx, 1, 0, 0, nil); !errors.Is(err, errRawClosed) {
			t.Errorf("exclusive=%v: Object after Close: %v", exclusive, err)
		}
		// A new one is not opened.
		if _, err := db.raw.newRef(); !errors.Is(err, errRawClosed) {
			t.Errorf("exclusive=%v: new connection after Close: %v", exclusive, err)
		}
	}
}

// TestRawRecycle checks that the connections whose pool entries the
// garbage collector drops are reused, not leaked nor reopened.
func TestRawRecycle(t *testing.T) {
	ctx := context.Background()
	db := openT(t, "testdata/storage.sqlite")
	// Hold several connections at once so that the pool makes them.
	const n = 4
	refs := make([]*rawRef, n)
	for i := range refs {
		r, err := db.raw.get()
		if err != nil {
			t.Fatal(err)
		}
		refs[i] = r
	}
	for _, r := range refs {
		db.raw.put(r)
	}
	refs = nil
	opened := func() (all, spare int) {
		db.raw.mu.Lock()
		defer db.raw.mu.Unlock()
		return len(db.raw.all), len(db.raw.spare)
	}
	if all, _ := opened(); all != n {
		t.Fatalf("%d connections opened, want %d", all, n)
	}
	// Two collections empty a sync.Pool; the cleanups then run.
	deadline := time.Now().Add(10 * time.Second)
	for {
		runtime.GC()
		if _, spare := opened(); spare == n {
			break
		}
		if time.Now().After(deadline) {
			all, spare := opened()
			t.Fatalf("after GC: %d spare of %d connections, want %d", spare, all, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The next misses of the pool take the spares. (Not through get: under
	// the race detector sync.Pool drops entries at random.)
	for range n {
		r, err := db.raw.newRef()
		if err != nil {
			t.Fatal(err)
		}
		defer runtime.KeepAlive(r)
	}
	if all, spare := opened(); all != n || spare != 0 {
		t.Errorf("%d connections opened, %d spare; want %d and 0", all, spare, n)
	}
	if _, err := db.Object(ctx, 1, 0, 0, nil); err != nil {
		t.Fatal(err)
	}
}

// TestSeesCommits checks that a database opened with Open (not immutable)
// sees what another process commits after it was opened, on the
// connection its lookups already used: the pooled connections keep no
// stale state between lookups.
func TestSeesCommits(t *testing.T) {
	ctx := context.Background()
	path := copyDB(t, "testdata/storage.sqlite")
	db := openT(t, path)
	o, err := db.Object(ctx, 1, 0, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	last := o.Serial
	next := last + 1
	// Another writer commits a new revision of oid 1 (partition 0 of a
	// 1-partition table) reusing data row 3.
	exec(t, path, "INSERT INTO obj (partition, oid, tid, data_id, value_tid) VALUES (0, 1, "+itoa(next)+", 3, NULL)")
	o, err = db.Object(ctx, 1, 0, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.Serial != next || o.NextSerial != 0 {
		t.Errorf("latest after a commit: serial %s next %s, want %s and none", o.Serial, o.NextSerial, next)
	}
	o, err = db.Object(ctx, 1, last, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.NextSerial != next {
		t.Errorf("at %s after a commit: next serial %s, want %s", last, o.NextSerial, next)
	}
}

// TestBigValues checks the lookups of values of every size around
// bigValue (read through the blob handle above it, see objSQLKeep):
// right after each commit (the handle, kept by pooled connections that
// other goroutines use meanwhile, must not keep an old snapshot), by
// serial after all of them (the handle moves between data rows), and
// again with the file reopened read-only.
func TestBigValues(t *testing.T) {
	ctx := context.Background()
	db := openWriterCopy(t, "testdata/storage.sqlite")
	sizes := []int{0, 100, bigValue, bigValue + 1, 4000, 4096, 70000, 3}
	value := func(i int) string {
		b := make([]byte, sizes[i%len(sizes)])
		for j := range b {
			b[j] = byte(i + j*7)
		}
		return string(b)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				db.Object(ctx, 10, 0, 0, nil)
			}
		}()
	}
	var serials []zodb.Tid
	for i := 0; i < 2*len(sizes); i++ {
		ttid := testTid + zodb.Tid(2*i)
		tid := ttid + 1
		data := value(i)
		if err := db.Vote(ctx, votedTxn(ttid, true, data)); err != nil {
			t.Fatal(err)
		}
		if err := db.Lock(ctx, ttid, tid, false); err != nil {
			t.Fatal(err)
		}
		if err := db.Unlock(ctx, ttid, tid); err != nil {
			t.Fatal(err)
		}
		serials = append(serials, tid)
		// Every pooled connection, one after the other.
		for k := 0; k < 8; k++ {
			o, err := db.Object(ctx, 10, 0, 0, nil)
			if err != nil {
				t.Fatalf("revision %d (%d bytes) after unlock: %v", i, len(data), err)
			}
			if o.Serial != tid || string(o.Data) != data {
				t.Fatalf("revision %d (%d bytes) after unlock: serial %s, %d bytes, want %s", i, len(data), o.Serial, len(o.Data), tid)
			}
		}
	}
	close(stop)
	wg.Wait()
	check := func(db *DB, how string) {
		t.Helper()
		for i, s := range serials {
			o, err := db.Object(ctx, 10, s, 0, nil)
			if err != nil {
				t.Fatalf("%s: revision %d (%d bytes) by serial: %v", how, i, len(value(i)), err)
			}
			if o.Serial != s || string(o.Data) != value(i) || o.Checksum != sha1.Sum([]byte(value(i))) {
				t.Fatalf("%s: revision %d (%d bytes) by serial: serial %s, %d bytes, checksum %x", how, i, len(value(i)), o.Serial, len(o.Data), o.Checksum)
			}
		}
	}
	check(db, "writer")
	path := db.Path()
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	for _, exclusive := range []bool{false, true} {
		open, how := Open, "read-only"
		if exclusive {
			open, how = OpenExclusive, "exclusive"
		}
		db, err := open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		check(db, how)
		db.Close()
	}
}
