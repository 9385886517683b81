package client_test

import (
	"context"
	"testing"

	"github.com/zodbd/zodbd/internal/floortest"
	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/neo/client"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage/fs1backend"
	"github.com/zodbd/zodbd/zodb"
)

// BenchmarkLoadVsFloor is serial loads through the client (cache off) over
// every object of a file served by zodbd's node, against a bare TCP echo
// that answers each request with as many bytes as the node's answer for
// that object, in alternating blocks (package floortest): load-x-floor is
// a serial load over the floor, client and node costs together (the NEO
// issue's target: ≤ 1.3×), with the client's sha1 check (verify) and
// without (noverify). The fixture's objects are 100–400 bytes (and a few
// of ~100 KB); prod1-1024 (~1.4 KiB) and wczblk1-8 (~4 KiB) run when
// `make datasets` has made them.
func BenchmarkLoadVsFloor(b *testing.B) {
	floortest.RunFiles(b, "../..", func(b *testing.B, path string) {
		for _, verify := range []bool{true, false} {
			name := "verify"
			if !verify {
				name = "noverify"
			}
			b.Run(name, func(b *testing.B) {
				be, err := fs1backend.Open(path)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { be.Close() })
				master := startNEO(b, "test", be)
				c := dialT(b, &client.Options{Cluster: "test", Masters: []string{master}, CacheSize: -1, NoVerify: !verify})
				oids, at := storagetest.HeadOids(b, c)
				if len(oids) == 0 {
					b.Skip("no objects")
				}
				ctx := context.Background()

				// The size of each answer on the wire, and of a request
				// (with a 5-byte msg_id, as most have here). The data is
				// what the client returns: as stored, for these files
				// (a compressed record would be sent shorter).
				sizes := make([]int, len(oids))
				for i, oid := range oids {
					data, serial, err := c.Load(ctx, zodb.Xid{Oid: oid, At: at})
					if err != nil {
						b.Fatal(err)
					}
					sizes[i] = len(proto.AppendPacket(nil, 1<<20, &proto.AnswerObject{
						Oid: oid, Serial: serial, NextSerial: proto.InvalidTid, Data: data, DataSerial: proto.InvalidTid}))
				}
				reqLen := len(proto.AppendPacket(nil, 1<<20, &proto.AskObject{Oid: 1, At: proto.InvalidTid, Before: at + 1}))
				echo := floortest.StartEcho(b, reqLen).Dial(b)

				buf := make([]byte, 0, 128<<10)
				b.ReportAllocs()
				floortest.Compare(b, echo.Floor(b, sizes), floortest.Side{Name: "load", Run: func(i, k int) bool {
					for j := i; j < i+k; j++ {
						if _, _, err := c.LoadAppend(ctx, zodb.Xid{Oid: oids[j%len(oids)], At: at}, buf[:0]); err != nil {
							b.Fatal(err)
						}
					}
					return true
				}})
			})
		}
	})
}
