package storage_test

import (
	"testing"

	"github.com/zodbd/zodbd/neo/neotest"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
)

// BenchmarkAskObject measures AskObject served over loopback from a
// FileStorage: each parallel goroutine has its own link and keeps 16
// requests in flight.
func BenchmarkAskObject(b *testing.B) {
	be, err := storage.OpenFS1("../../fs1/testdata/1.fs")
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	c := startCluster(b, be)
	req := neotest.AskObjectArgs(0, 0, 0)
	b.ReportAllocs()
	b.SetParallelism(4)
	b.RunParallel(func(pb *testing.PB) {
		l := c.client(b)
		const depth = 16
		inflight := 0
		for pb.Next() {
			if _, err := l.Send(proto.CodeAskObject, req); err != nil {
				b.Error(err)
				return
			}
			inflight++
			if inflight == depth {
				for ; inflight > depth/2; inflight-- {
					if p, err := l.Recv(); err != nil || p.Code != proto.CodeAskObject|proto.AnswerBit {
						b.Errorf("%v %v", p, err)
						return
					}
				}
			}
		}
		for ; inflight > 0; inflight-- {
			if _, err := l.Recv(); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
