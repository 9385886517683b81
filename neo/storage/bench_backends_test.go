package storage_test

import (
	"context"
	"crypto/sha1"
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/opstats"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neo/storage/fs1backend"
	"github.com/zodbd/zodbd/neo/storage/sqlitebackend"
	"github.com/zodbd/zodbd/neosqlite"
	"github.com/zodbd/zodbd/zodb"
)

// The backends compared on the same object: one 4 KiB revision (random
// bytes, stored uncompressed) committed on a fresh FileStorage and, through
// the Writer, on a copy of the NEO/py test database (one partition).

const benchObjSize = 4096

func benchData() []byte {
	r := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, benchObjSize)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// benchFS1 returns a FileStorage backend whose oid 0 is the 4 KiB object.
func benchFS1(b *testing.B) (storage.Backend, zodb.Oid) {
	ctx := context.Background()
	path := filepath.Join(b.TempDir(), "Data.fs")
	fs, err := fs1.Open(path, &fs1.Options{Create: true})
	if err != nil {
		b.Fatal(err)
	}
	txn, err := fs.Begin(ctx, zodb.TxnMeta{})
	if err != nil {
		b.Fatal(err)
	}
	if err := txn.Store(0, 0, benchData()); err != nil {
		b.Fatal(err)
	}
	if _, err := txn.Vote(ctx); err != nil {
		b.Fatal(err)
	}
	if _, err := txn.Finish(ctx, nil); err != nil {
		b.Fatal(err)
	}
	if err := fs.Close(); err != nil {
		b.Fatal(err)
	}
	be, err := fs1backend.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { be.Close() })
	return be, 0
}

// benchSQLite returns an SQLite backend (read-write, as zodbd neo-storage
// opens it) whose oid 100 is the 4 KiB object, just written: its pages are
// in the WAL, where the lookups read them until the writer's idle
// checkpoint (neosqlite, a second after the last commit) has copied them
// into the file; a benchmark that runs longer measures mostly reads from
// the file, as sqlite-ckpt does.
func benchSQLite(b *testing.B) (storage.Backend, zodb.Oid) {
	ctx := context.Background()
	be, err := sqlitebackend.Open(ctx, testSQLite(b))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { be.Close() })
	ids, err := be.LastIDs(ctx)
	if err != nil {
		b.Fatal(err)
	}
	data := benchData()
	const oid = 100
	ttid := ids.Tid + 1
	t := &storage.VotedTxn{TTid: ttid, Meta: &storage.TxnMeta{Oids: []zodb.Oid{oid}},
		Objects: []storage.VotedObject{{Oid: oid, Checksum: sha1.Sum(data), Data: data}}}
	if err := be.Vote(ctx, t); err != nil {
		b.Fatal(err)
	}
	if err := be.Lock(ctx, ttid, ttid+1); err != nil {
		b.Fatal(err)
	}
	if err := be.Unlock(ctx, ttid, ttid+1); err != nil {
		b.Fatal(err)
	}
	return be, oid
}

// startCPU resets the timer and returns the CPU time so far; stopCPU
// reports cpu-ns/op, the process's CPU time (user and system, every
// thread) per operation since then: on a shared machine it varies much
// less than the wall time.
func startCPU(b *testing.B) time.Duration {
	b.ResetTimer()
	cpu, _ := opstats.ProcessCPU()
	return cpu
}

func stopCPU(b *testing.B, start time.Duration) {
	b.StopTimer()
	if b.N > 0 {
		cpu, _ := opstats.ProcessCPU()
		b.ReportMetric(float64(cpu-start)/float64(b.N), "cpu-ns/op")
	}
}

// benchSQLiteRO is benchSQLite's database closed and opened again
// read-only as immutable (neosqlite.OpenExclusive), how the node served it
// before it wrote: the reference for the read path's cost.
func benchSQLiteRO(b *testing.B) (storage.Backend, zodb.Oid) {
	be, oid := benchSQLite(b)
	path := be.Path()
	if err := be.Close(); err != nil {
		b.Fatal(err)
	}
	db, err := neosqlite.OpenExclusive(context.Background(), path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	return sqlitebackend.New(db), oid
}

// benchSQLiteCkpt is benchSQLite's database closed (which checkpoints its
// WAL into the file) and opened again read-write: the object's pages are
// read from the file from the start.
func benchSQLiteCkpt(b *testing.B) (storage.Backend, zodb.Oid) {
	be, oid := benchSQLite(b)
	path := be.Path()
	if err := be.Close(); err != nil {
		b.Fatal(err)
	}
	be, err := sqlitebackend.Open(context.Background(), path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { be.Close() })
	return be, oid
}

var benchBackends = []struct {
	name string
	open func(*testing.B) (storage.Backend, zodb.Oid)
}{{"fs1", benchFS1}, {"sqlite", benchSQLite}, {"sqlite-ckpt", benchSQLiteCkpt}, {"sqlite-ro", benchSQLiteRO}}

// BenchmarkBackendObject measures Backend.Object on each backend, for the
// 4 KiB object: its latest revision, and the revision before a tid (what
// NEO's client asks for a load in a snapshot): what the node does per
// AskObject besides the network.
func BenchmarkBackendObject(b *testing.B) {
	for _, bk := range benchBackends {
		b.Run(bk.name, func(b *testing.B) {
			be, oid := bk.open(b)
			ctx := context.Background()
			for _, before := range []bool{false, true} {
				name, bt := "latest", zodb.Tid(0)
				if before {
					ids, err := be.LastIDs(ctx)
					if err != nil {
						b.Fatal(err)
					}
					name, bt = "before", ids.Tid+1
				}
				b.Run(name, func(b *testing.B) {
					var o storage.Object
					o.Data = make([]byte, 0, 2*benchObjSize)
					b.ReportAllocs()
					cpu := startCPU(b)
					for i := 0; i < b.N; i++ {
						if err := be.Object(ctx, oid, 0, bt, &o); err != nil {
							b.Fatal(err)
						}
					}
					stopCPU(b, cpu)
				})
			}
		})
	}
}

// BenchmarkAskObjectBackends is BenchmarkAskObject on each backend, for the
// 4 KiB object.
func BenchmarkAskObjectBackends(b *testing.B) {
	for _, bk := range benchBackends {
		b.Run(bk.name, func(b *testing.B) {
			be, oid := bk.open(b)
			benchAskObject(b, be, oid, true)
		})
	}
}

// BenchmarkBackendObjectParallel is BenchmarkBackendObject's "latest" load
// from GOMAXPROCS×4 goroutines at once (b.RunParallel with parallelism 4,
// as BenchmarkAskObjectBackends): what the node's lookups cost when the
// connections serve many requests at a time, without the network. Its
// cost above BenchmarkBackendObject's is contention in the backend.
func BenchmarkBackendObjectParallel(b *testing.B) {
	for _, bk := range benchBackends {
		b.Run(bk.name, func(b *testing.B) {
			be, oid := bk.open(b)
			ctx := context.Background()
			b.ReportAllocs()
			b.SetParallelism(4)
			cpu := startCPU(b)
			defer stopCPU(b, cpu)
			b.RunParallel(func(pb *testing.PB) {
				var o storage.Object
				o.Data = make([]byte, 0, 2*benchObjSize)
				for pb.Next() {
					if err := be.Object(ctx, oid, 0, 0, &o); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
