package storage_test

import (
	"crypto/sha1"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neo/storage/fs1backend"
	"github.com/zodbd/zodbd/zodb"
)

// BenchmarkAskObject measures AskObject served over loopback from a
// FileStorage: each parallel goroutine has its own link and keeps 16
// requests in flight.
func BenchmarkAskObject(b *testing.B) {
	be := testFS1(b)
	benchAskObject(b, be, 0, false)
}

// BenchmarkAskObjectWritable is BenchmarkAskObject on a node that takes
// commits (none in flight): the read path's cost of the transaction
// manager.
func BenchmarkAskObjectWritable(b *testing.B) {
	data, err := os.ReadFile("../../fs1/testdata/1.fs")
	if err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(b.TempDir(), "Data.fs")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		b.Fatal(err)
	}
	be, err := fs1backend.OpenWriter(path, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer be.Close()
	benchAskObject(b, be, 0, false)
}

// benchAskObject asks for the latest revision of oid from GOMAXPROCS×4
// connections at once, 16 requests in flight on each; with cpu, it also
// reports the process's CPU time per request (cpu-ns/op).
func benchAskObject(b *testing.B, be storage.Backend, oid zodb.Oid, cpu bool) {
	c := startCluster(b, be)
	req := &proto.AskObject{Oid: oid, At: proto.InvalidTid, Before: proto.InvalidTid}
	b.ReportAllocs()
	b.SetParallelism(4)
	if cpu {
		t := startCPU(b)
		defer stopCPU(b, t)
	}
	b.RunParallel(func(pb *testing.PB) {
		l := c.client(b)
		const depth = 16
		inflight := 0
		for pb.Next() {
			if _, err := l.Send(req); err != nil {
				b.Error(err)
				return
			}
			inflight++
			if inflight == depth {
				for ; inflight > depth/2; inflight-- {
					if p, err := l.Recv(); err != nil || p.Code != proto.CodeAnswerObject {
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

// BenchmarkChecksum is the sha1 a FileStorage-backed node computes for
// every object it serves (NEO sends sha1(data); a FileStorage does not
// store it), and the client verifies: for the mean object sizes of the
// benchmark datasets (prod1 ~1.4 KiB, wczblk1 ~4 KiB) and a bigger one.
func BenchmarkChecksum(b *testing.B) {
	for _, n := range []int{1430, 4015, 65536} {
		b.Run(fmt.Sprintf("size=%d", n), func(b *testing.B) {
			data := make([]byte, n)
			b.SetBytes(int64(n))
			for i := 0; i < b.N; i++ {
				sha1.Sum(data)
			}
		})
	}
}
