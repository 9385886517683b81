package storage_test

import (
	"testing"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/floortest"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage/fs1backend"
)

// BenchmarkAskObjectVsFloor is one client link doing AskObject round trips
// (load current) over every oid of a file served by a node, against a bare
// TCP echo that answers each request with as many bytes as the node's
// answer for that oid, in alternating blocks (package floortest):
// server-x-floor is the node's round trip over the floor's (the NEO
// issue's target for a serial load: ≤ 1.3×). The fixture's objects are
// 100–400 bytes (and a few of ~100 KB); prod1-1024 (~1.4 KiB) and
// wczblk1-8 (~4 KiB) run when `make datasets` has made them. The node
// computes each record's sha1 once (its checksum cache); this client does
// not check it.
func BenchmarkAskObjectVsFloor(b *testing.B) {
	floortest.RunFiles(b, "../..", func(b *testing.B, path string) {
		fs, err := fs1.Open(path, nil)
		if err != nil {
			b.Fatal(err)
		}
		oids := fs.Index().Oids()
		fs.Close()
		be, err := fs1backend.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { be.Close() })
		l := startCluster(b, be).client(b)

		req := &proto.AskObject{At: proto.InvalidTid, Before: proto.InvalidTid}
		roundTrip := func(i int) (int, bool) {
			req.Oid = oids[i%len(oids)]
			if _, err := l.Send(req); err != nil {
				b.Fatal(err)
			}
			off := l.Received()
			p, err := l.RecvShared()
			if err != nil {
				b.Fatal(err)
			}
			if p.Code != proto.CodeAnswerObject {
				b.Errorf("oid %v: %s", oids[i%len(oids)], proto.CodeName(p.Code))
				return 0, false
			}
			return int(l.Received() - off), true
		}
		// One pass records each answer's size on the wire.
		sizes := make([]int, len(oids))
		for i := range oids {
			n, ok := roundTrip(i)
			if !ok {
				return
			}
			sizes[i] = n
		}
		// A request's size with a 5-byte msg_id, as most have here.
		reqLen := len(proto.AppendPacket(nil, 1<<20, req))
		echo := floortest.StartEcho(b, reqLen).Dial(b)

		b.ReportAllocs()
		floortest.Compare(b, echo.Floor(b, sizes), floortest.Side{Name: "server", Run: func(i, k int) bool {
			for j := i; j < i+k; j++ {
				if _, ok := roundTrip(j); !ok {
					return false
				}
			}
			return true
		}})
	})
}
