package client_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/zodbd/zodbd/internal/zeotest"
	"github.com/zodbd/zodbd/zeo/client"
	"github.com/zodbd/zodbd/zodb"
)

// benchOids returns the oids 0.. of the 1.fs fixture that have data at
// the head.
func benchOids(b *testing.B, c *client.Client) (oids []zodb.Oid, at zodb.Tid) {
	ctx := context.Background()
	at, _ = c.LastTid(ctx)
	for oid := zodb.Oid(0); ; oid++ {
		if _, _, err := c.Load(ctx, zodb.Xid{Oid: oid, At: at}); err != nil {
			return oids, at
		}
		oids = append(oids, oid)
	}
}

// BenchmarkLoadCacheHit is a Load answered by the client cache: the
// client-side cost of a load once the object is cached.
func BenchmarkLoadCacheHit(b *testing.B) {
	addr := zeotest.StartZodbd(b, zeotest.Fixture(b, "1"), false)
	c := dial(b, addr, nil)
	oids, at := benchOids(b, c)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, 0, 128<<10)
		i := 0
		for pb.Next() {
			if _, _, err := c.LoadAppend(ctx, zodb.Xid{Oid: oids[i%len(oids)], At: at}, buf[:0]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}

// BenchmarkLoadRTT is one load round trip (cache off) at a time, against
// each server: client and server costs together.
func BenchmarkLoadRTT(b *testing.B) {
	for _, s := range zeotest.Servers {
		b.Run(s.Name, func(b *testing.B) {
			addr := s.Start(b, zeotest.Fixture(b, "1"), false)
			c := dial(b, addr, &client.Options{CacheSize: -1})
			oids, at := benchOids(b, c)
			ctx := context.Background()
			buf := make([]byte, 0, 128<<10)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, _, err := c.LoadAppend(ctx, zodb.Xid{Oid: oids[i%len(oids)], At: at}, buf[:0]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkLoadPipelined is 16 goroutines loading through one connection
// (cache off), each with one request in flight: requests and replies share
// writes and reads.
func BenchmarkLoadPipelined(b *testing.B) {
	for _, s := range zeotest.Servers {
		b.Run(s.Name, func(b *testing.B) {
			addr := s.Start(b, zeotest.Fixture(b, "1"), false)
			c := dial(b, addr, &client.Options{CacheSize: -1})
			oids, at := benchOids(b, c)
			ctx := context.Background()
			b.ReportAllocs()
			b.SetParallelism(8) // 8 × GOMAXPROCS goroutines
			b.ResetTimer()
			var seed atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				buf := make([]byte, 0, 128<<10)
				// Each goroutine loads at its own state (all after the
				// head, so the answers are the same), so that no two
				// requests collapse into one.
				g := seed.Add(1)
				xat := at + zodb.Tid(g)
				i := int(g)
				for pb.Next() {
					if _, _, err := c.LoadAppend(ctx, zodb.Xid{Oid: oids[i%len(oids)], At: xat}, buf[:0]); err != nil {
						b.Fatal(err)
					}
					i++
				}
			})
		})
	}
}
