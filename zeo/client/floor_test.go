package client_test

import (
	"context"
	"testing"

	"github.com/zodbd/zodbd/internal/datasets"
	"github.com/zodbd/zodbd/internal/floortest"
	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/internal/zeotest"
	"github.com/zodbd/zodbd/zeo/client"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// BenchmarkLoadVsFloor is serial loads through the client (cache off) over
// every object of a file served by zodbd serve's server in this process,
// against a bare TCP echo that answers each request with as many bytes as
// the server's reply for that object, in alternating blocks (package
// floortest): load-x-floor is a serial load over the floor, client and
// server costs together. The fixture's objects are 100–400 bytes (and a
// few of ~100 KB); prod1-1024 (~1.4 KiB) and wczblk1-8 (~4 KiB) run when
// `make datasets` has made them.
func BenchmarkLoadVsFloor(b *testing.B) {
	floortest.RunFiles(b, "../..", func(b *testing.B, path string) {
		addr := zeotest.StartZodbd(b, datasets.CopyFile(b, path), false)
		c := dial(b, addr, &client.Options{CacheSize: -1})
		oids, at := storagetest.HeadOids(b, c)
		if len(oids) == 0 {
			b.Skip("no objects")
		}

		// The size of each reply on the wire, and of a request.
		w := dialWire(b, addr)
		sizes := make([]int, len(oids))
		var reqLen int
		for i, oid := range oids {
			w.enc.LoadBeforeRequest(uint64(oid), uint64(at+1))
			reqLen = len(w.enc.Buf)
			if _, err := w.nc.Write(w.enc.Buf); err != nil {
				b.Fatal(err)
			}
			w.enc.Buf = w.enc.Buf[:0]
			f, err := wire.ReadFrame(w.br, w.buf, 1<<30)
			if err != nil {
				b.Fatal(err)
			}
			w.buf = f[:0]
			sizes[i] = 4 + len(f)
		}
		echo := floortest.StartEcho(b, reqLen).Dial(b)

		ctx := context.Background()
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
