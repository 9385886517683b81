package client_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/zodbd/zodbd/neo/client"
	"github.com/zodbd/zodbd/zodb"
)

// The benchmarks mirror zeo/client's (same fixture, fs1's 1.fs, served by
// zodbd's NEO storage node behind the in-test master, over loopback), so
// that their numbers compare:
//
//	go test -run - -bench . -benchmem ./neo/client ./zeo/client

// benchOids returns the oids 0.. of the fixture that have data at the head.
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

func benchClient(b *testing.B, opt client.Options) *client.Client {
	master, _ := fs1Cluster(b)
	opt.Cluster, opt.Masters = "test", []string{master}
	return dialT(b, &opt)
}

// BenchmarkLoadCacheHit is a Load answered by the client cache.
func BenchmarkLoadCacheHit(b *testing.B) {
	c := benchClient(b, client.Options{})
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

// BenchmarkLoadRTT is one load round trip (cache off) at a time: client
// and storage node costs together.
func BenchmarkLoadRTT(b *testing.B) {
	for _, verify := range []bool{true, false} {
		name := "verify"
		if !verify {
			name = "noverify"
		}
		b.Run(name, func(b *testing.B) {
			c := benchClient(b, client.Options{CacheSize: -1, NoVerify: !verify})
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

// BenchmarkLoadPipelined is 8×GOMAXPROCS goroutines loading through one
// storage connection (cache off), each with one request in flight.
func BenchmarkLoadPipelined(b *testing.B) {
	c := benchClient(b, client.Options{CacheSize: -1})
	oids, at := benchOids(b, c)
	ctx := context.Background()
	b.ReportAllocs()
	b.SetParallelism(8)
	b.ResetTimer()
	var seed atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		buf := make([]byte, 0, 128<<10)
		// Each goroutine loads at its own state (after the head: the
		// same answers), so that no two requests collapse into one.
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
}
