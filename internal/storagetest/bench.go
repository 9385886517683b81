package storagetest

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/zodbd/zodbd/zodb"
)

// The load loops of the client benchmarks (zeo/client, neo/client), shared
// so that their numbers compare.

// AppendStorage is a storage that can load without allocating (as the
// clients do).
type AppendStorage interface {
	zodb.Storage
	zodb.AppendLoader
}

// HeadOids returns st's last tid and the oids 0, 1, ... that have data
// there, up to the first that has none.
func HeadOids(tb testing.TB, st zodb.Storage) (oids []zodb.Oid, at zodb.Tid) {
	ctx := context.Background()
	at, _ = st.LastTid(ctx)
	for oid := zodb.Oid(0); ; oid++ {
		if _, _, err := st.Load(ctx, zodb.Xid{Oid: oid, At: at}); err != nil {
			return oids, at
		}
		oids = append(oids, oid)
	}
}

// BenchLoads loads the HeadOids of st in turn, one at a time.
func BenchLoads(b *testing.B, st AppendStorage) {
	oids, at := HeadOids(b, st)
	ctx := context.Background()
	buf := make([]byte, 0, 128<<10)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, _, err := st.LoadAppend(ctx, zodb.Xid{Oid: oids[i%len(oids)], At: at}, buf[:0]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchLoadsParallel loads the HeadOids of st from GOMAXPROCS goroutines
// (b.RunParallel), each going through them in turn at st's last tid.
// With pipelined, the goroutines are 8×GOMAXPROCS, and each loads at its
// own state after the last tid (the same answers), so that no two
// requests in flight collapse into one.
func BenchLoadsParallel(b *testing.B, st AppendStorage, pipelined bool) {
	oids, at := HeadOids(b, st)
	ctx := context.Background()
	b.ReportAllocs()
	if pipelined {
		b.SetParallelism(8)
	}
	b.ResetTimer()
	var seed atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, 0, 128<<10)
		xat, i := at, 0
		if pipelined {
			g := seed.Add(1)
			xat, i = at+zodb.Tid(g), int(g)
		}
		for pb.Next() {
			if _, _, err := st.LoadAppend(ctx, zodb.Xid{Oid: oids[i%len(oids)], At: xat}, buf[:0]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}
