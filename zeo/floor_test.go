package zeo

import (
	"testing"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/floortest"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// BenchmarkRTTVsFloor is one connection doing loadBefore round trips over
// every oid of a file, against a bare TCP echo that answers each request
// with as many bytes as the server's reply for that oid, in alternating
// blocks (package floortest): server-x-floor is the server's round trip
// over the floor's, the figure of the ZEO issue's target (≤ 1.3×). The
// fixture's objects are 100–400 bytes (and a few of ~100 KB); prod1-1024
// (~1.4 KiB) and wczblk1-8 (~4 KiB) run when `make datasets` has made them.
func BenchmarkRTTVsFloor(b *testing.B) {
	floortest.RunFiles(b, "..", func(b *testing.B, path string) {
		fs, err := fs1.Open(path, nil)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { fs.Close() })
		addr := startServer(b, Config{Storages: []StorageConfig{{Name: "1", Storage: fs, ReadOnly: true}}, Logf: func(string, ...interface{}) {}})
		c := dialRaw(b, addr, wire.Pickle)
		oids := fs.Index().Oids()

		// One pass records each reply's size on the wire.
		var reqLen int
		sizes := make([]int, len(oids))
		var buf []byte
		for i, oid := range oids {
			c.sendLoad(oid, zodb.TidMax)
			reqLen = len(c.enc.Buf)
			c.flush(b)
			f, err := wire.ReadFrame(c.br, buf, 1<<30)
			if err != nil {
				b.Fatal(err)
			}
			buf = f[:0]
			sizes[i] = 4 + len(f)
		}
		echo := floortest.StartEcho(b, reqLen).Dial(b)

		b.ReportAllocs()
		floortest.Compare(b, echo.Floor(b, sizes), floortest.Side{Name: "server", Run: func(i, k int) bool {
			for j := i; j < i+k; j++ {
				c.sendLoad(oids[j%len(oids)], zodb.TidMax)
				c.flush(b)
				f, err := wire.ReadFrame(c.br, buf, 1<<30)
				if err != nil {
					b.Fatal(err)
				}
				buf = f[:0]
			}
			return true
		}})
	})
}
