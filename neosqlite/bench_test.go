package neosqlite

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/zodbd/zodbd/internal/datasets"
	"github.com/zodbd/zodbd/zodb"
)

// BenchmarkObject measures the raw Object call (NEO's AskObject) on
// storage.sqlite: the latest revision of a small object (oid 1, 69 bytes
// stored), an exact serial, and the 100 KiB object (oid 3).
// "shared" opens the file as Open does (SQLite locks and checks the file
// on every statement), "exclusive" as OpenExclusive does, which is how
// `zodbd neo-storage` opens it (immutable).
func BenchmarkObject(b *testing.B) {
	b.Run("shared", func(b *testing.B) { benchObject(b, openT(b, "testdata/storage.sqlite")) })
	b.Run("exclusive", func(b *testing.B) { benchObject(b, openExclusiveCopy(b, "testdata/storage.sqlite")) })
	b.Run("writer", func(b *testing.B) { benchObject(b, openWriterCopy(b, "testdata/storage.sqlite")) })
}

// openWriterCopy opens a copy of the database at path with OpenWriter.
func openWriterCopy(t testing.TB, path string) *DB {
	t.Helper()
	cp := filepath.Join(t.TempDir(), filepath.Base(path))
	datasets.CopyTo(t, path, cp)
	db, err := OpenWriter(context.Background(), cp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// openExclusiveCopy opens a copy of the database at path with
// OpenExclusive (a copy: the NEO/py storage lock is per file).
func openExclusiveCopy(t testing.TB, path string) *DB {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cp := filepath.Join(t.TempDir(), filepath.Base(path))
	if err := os.WriteFile(cp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	db, err := OpenExclusive(context.Background(), cp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func benchObject(b *testing.B, db *DB) {
	ctx := context.Background()
	for _, c := range []struct {
		name       string
		oid        zodb.Oid
		at, before zodb.Tid
	}{
		{"small/latest", 1, 0, 0},
		{"small/at", 1, 0x040d2ea007d0e588, 0},
		{"small/before", 1, 0, 0x040d2ea007e6b700},
		{"100KiB/latest", 3, 0, 0},
	} {
		b.Run(c.name, func(b *testing.B) {
			var o Object
			buf := make([]byte, 0, 128<<10)
			b.ReportAllocs()
			for b.Loop() {
				if err := db.ObjectInto(ctx, c.oid, c.at, c.before, buf[:0], &o); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkLoad measures Load through the zodb.Storage view (sha1 check
// and zlib decompression included).
func BenchmarkLoad(b *testing.B) {
	ctx := context.Background()
	db := openT(b, "testdata/storage.sqlite")
	for _, c := range []struct {
		name string
		oid  zodb.Oid
	}{{"small-zlib", 1}, {"67KB-zlib", 4}, {"100KiB-raw", 3}} {
		b.Run(c.name, func(b *testing.B) {
			buf := make([]byte, 0, 128<<10)
			b.ReportAllocs()
			for b.Loop() {
				if _, _, err := db.LoadAppend(ctx, zodb.Xid{Oid: c.oid, At: zodb.TidMax}, buf[:0]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkObjectParallel measures concurrent raw reads (one SQLite
// connection per goroutine from the pool).
func BenchmarkObjectParallel(b *testing.B) {
	ctx := context.Background()
	db := openT(b, "testdata/storage.sqlite")
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var o Object
		buf := make([]byte, 0, 4096)
		for pb.Next() {
			if err := db.ObjectInto(ctx, 1, 0, 0, buf[:0], &o); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkCommit measures a transaction of 10 objects of 1 KiB through
// the writer (Vote, Lock, Unlock), from several goroutines at once, on a
// copy of storage.sqlite: the durable commits of concurrent votes and
// locks are grouped. allocs/op are per transaction.
func BenchmarkCommit(b *testing.B) {
	ctx := context.Background()
	db := openWriterCopy(b, "testdata/storage.sqlite")
	var next atomic.Uint64
	next.Store(uint64(testTid))
	data := make([]byte, 1024)
	b.ReportAllocs()
	b.SetParallelism(8)
	b.RunParallel(func(pb *testing.PB) {
		t := &VotedTxn{Meta: &TxnMeta{}}
		for i := 0; i < 10; i++ {
			t.Objects = append(t.Objects, VotedObject{Data: data})
		}
		for pb.Next() {
			ttid := zodb.Tid(next.Add(2))
			t.TTid = ttid
			t.Meta.Oids = t.Meta.Oids[:0]
			for i := range t.Objects {
				o := &t.Objects[i]
				o.Oid = zodb.Oid(uint64(ttid)&0xffff*16 + uint64(i))
				t.Meta.Oids = append(t.Meta.Oids, o.Oid)
			}
			if err := db.Vote(ctx, t); err != nil {
				b.Error(err)
				return
			}
			if err := db.Lock(ctx, ttid, ttid, false); err != nil {
				b.Error(err)
				return
			}
			if err := db.Unlock(ctx, ttid, ttid); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "txn/s")
	b.ReportMetric(float64(db.w.syncCommits.Load())/float64(b.N), "fsyncs/txn")
}
