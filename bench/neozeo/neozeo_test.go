// Package neozeo compares loads over zeo:// and neo:// with each other and
// with a bare TCP echo, all in one process and one run, in alternating
// blocks (package floortest): the figures of the NEO issue's targets,
// measured so that a shared machine's drift moves every side alike.
//
//	make datasets
//	go test -run - -bench . -benchtime 5000x -count 3 ./bench/neozeo
package neozeo

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/datasets"
	"github.com/zodbd/zodbd/internal/floortest"
	"github.com/zodbd/zodbd/internal/zeotest"
	neoclient "github.com/zodbd/zodbd/neo/client"
	"github.com/zodbd/zodbd/neo/neotest"
	"github.com/zodbd/zodbd/neo/storage/fs1backend"
	zeoclient "github.com/zodbd/zodbd/zeo/client"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// loader is what both clients have.
type loader interface {
	LoadAppend(ctx context.Context, xid zodb.Xid, buf []byte) ([]byte, zodb.Tid, error)
}

// BenchmarkNEOvsZEO is loads (client cache off) over every object of a
// file by c clients at once, each with its own connection and one load at
// a time, through the ZEO client against zodbd serve's server and through
// the NEO client, with its sha1 check (neo) and without (neo-noverify),
// against zodbd's node on the same file; the floor is c connections to a
// bare TCP echo that answers each request with as many bytes as the ZEO
// reply (a NEO answer is some 10 bytes longer). A block is 100 loads per
// client; the ratios are of block times, so with c > 1 they are inverse
// throughput ratios. neo-x-zeo is the NEO issue's "NEO path within 10% of
// the ZEO path", neo-x-floor with c=1 its "serial load within 1.3× of a
// bare TCP ping-pong". prod1-1024 (~1.4 KiB objects) and wczblk1-8
// (~4 KiB) come from `make datasets` (package datasets makes them if
// missing).
func BenchmarkNEOvsZEO(b *testing.B) {
	for _, ds := range []string{"prod1-1024", "wczblk1-8"} {
		b.Run(ds, func(b *testing.B) {
			path := datasets.Path(b, ds)
			zaddr := zeotest.StartZodbd(b, datasets.CopyFile(b, path), false)
			master := startNEO(b, path)
			for _, c := range []int{1, 4, 16} {
				b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
					benchNEOvsZEO(b, zaddr, master, c)
				})
			}
		})
	}
}

func benchNEOvsZEO(b *testing.B, zaddr, master string, nclients int) {
	ctx := context.Background()
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	zc := make([]loader, nclients)
	nc := make([]loader, nclients)
	ncNoVerify := make([]loader, nclients)
	for i := range nclients {
		c, err := zeoclient.Dial(dctx, "tcp", zaddr, &zeoclient.Options{CacheSize: -1})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		zc[i] = c
		for _, noverify := range []bool{false, true} {
			c, err := neoclient.Dial(dctx, &neoclient.Options{Cluster: "bench", Masters: []string{master}, CacheSize: -1, NoVerify: noverify})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { c.Close() })
			if noverify {
				ncNoVerify[i] = c
			} else {
				nc[i] = c
			}
		}
	}
	z0 := zc[0].(*zeoclient.Client)
	at, err := z0.LastTid(ctx)
	if err != nil {
		b.Fatal(err)
	}
	var oids []zodb.Oid
	for oid := zodb.Oid(0); ; oid++ {
		if _, _, err := z0.Load(ctx, zodb.Xid{Oid: oid, At: at}); err != nil {
			break
		}
		oids = append(oids, oid)
	}
	reqLen, sizes := zeoSizes(b, zaddr, oids, at)
	e := floortest.StartEcho(b, reqLen)
	echo := make([]*floortest.Conn, nclients)
	for i := range echo {
		echo[i] = e.Dial(b)
	}
	bufs := make([][]byte, nclients)
	for i := range bufs {
		bufs[i] = make([]byte, 0, 128<<10)
	}

	// each runs f(g, n) for every client g at once, in goroutines but
	// the first, n being the index of g's first object in this block.
	each := func(i, k int, f func(g, n int)) bool {
		var wg sync.WaitGroup
		for g := 1; g < nclients; g++ {
			wg.Add(1)
			go func() { defer wg.Done(); f(g, i*nclients+g*k) }()
		}
		f(0, i*nclients)
		wg.Wait()
		return !b.Failed()
	}
	side := func(name string, cs []loader) floortest.Side {
		return floortest.Side{Name: name, Run: func(i, k int) bool {
			return each(i, k, func(g, n int) {
				for j := n; j < n+k; j++ {
					if _, _, err := cs[g].LoadAppend(ctx, zodb.Xid{Oid: oids[j%len(oids)], At: at}, bufs[g][:0]); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}}
	}
	b.ReportAllocs()
	floortest.Compare(b, func(i, k int) bool {
		return each(i, k, func(g, n int) {
			for j := n; j < n+k; j++ {
				if err := echo[g].RoundTrip(sizes[j%len(sizes)]); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}, side("zeo", zc), side("neo", nc), side("neo-noverify", ncNoVerify))
}

// zeoSizes returns the size of a loadBefore request on the wire and of
// each object's reply, from one pass on a connection of its own.
func zeoSizes(b *testing.B, addr string, oids []zodb.Oid, at zodb.Tid) (int, []int) {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	br := bufio.NewReader(nc)
	ann, err := wire.ReadFrame(br, nil, 64)
	if err != nil {
		b.Fatal(err)
	}
	enc := wire.Encoder{M: wire.Marshal(ann[0])}
	enc.RawFrame(ann)
	id := wire.Value{Kind: wire.Int, Int: 1}
	enc.BeginRequest(&id, false, "register")
	enc.BeginTuple(2)
	enc.Str("1")
	enc.Bool(true)
	enc.EndTuple(2)
	enc.EndMessage()
	var f []byte
	roundTrip := func() int {
		if _, err := nc.Write(enc.Buf); err != nil {
			b.Fatal(err)
		}
		enc.Buf = enc.Buf[:0]
		if f, err = wire.ReadFrame(br, f[:0], 1<<30); err != nil {
			b.Fatal(err)
		}
		return 4 + len(f)
	}
	roundTrip()
	sizes := make([]int, len(oids))
	var reqLen int
	for i, oid := range oids {
		enc.LoadBeforeRequest(uint64(oid), uint64(at+1))
		reqLen = len(enc.Buf)
		sizes[i] = roundTrip()
	}
	return reqLen, sizes
}

// startNEO runs the in-test master and a node on the FileStorage at path
// until the benchmark ends, and returns the master's address.
func startNEO(b *testing.B, path string) string {
	be, err := fs1backend.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { be.Close() })
	m, _, _ := neotest.StartNode(b, "bench", be)
	return m.Addr()
}
