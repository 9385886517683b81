package client_test

import (
	"testing"

	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/neo/client"
)

// The benchmarks mirror zeo/client's (same fixture, fs1's 1.fs, served by
// zodbd's NEO storage node behind the in-test master, over loopback), so
// that their numbers compare:
//
//	go test -run - -bench . -benchmem ./neo/client ./zeo/client

func benchClient(b *testing.B, opt client.Options) *client.Client {
	master, _ := fs1Cluster(b)
	opt.Cluster, opt.Masters = "test", []string{master}
	return dialT(b, &opt)
}

// BenchmarkLoadCacheHit is a Load answered by the client cache.
func BenchmarkLoadCacheHit(b *testing.B) {
	storagetest.BenchLoadsParallel(b, benchClient(b, client.Options{}), false)
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
			storagetest.BenchLoads(b, benchClient(b, client.Options{CacheSize: -1, NoVerify: !verify}))
		})
	}
}

// BenchmarkLoadPipelined is 8×GOMAXPROCS goroutines loading through one
// storage connection (cache off), each with one request in flight.
func BenchmarkLoadPipelined(b *testing.B) {
	storagetest.BenchLoadsParallel(b, benchClient(b, client.Options{CacheSize: -1}), true)
}
