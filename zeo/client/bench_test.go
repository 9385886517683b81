package client_test

import (
	"bufio"
	"context"
	"net"
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/datasets"
	"github.com/zodbd/zodbd/internal/opstats"
	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/internal/zeotest"
	"github.com/zodbd/zodbd/zeo/client"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// BenchmarkLoadCacheHit is a Load answered by the client cache: the
// client-side cost of a load once the object is cached.
func BenchmarkLoadCacheHit(b *testing.B) {
	addr := zeotest.StartZodbd(b, zeotest.Fixture(b, "1"), false)
	storagetest.BenchLoadsParallel(b, dial(b, addr, nil), false)
}

// BenchmarkLoadRTT is one load round trip (cache off) at a time, against
// each server: client and server costs together.
func BenchmarkLoadRTT(b *testing.B) {
	for _, s := range zeotest.Servers {
		b.Run(s.Name, func(b *testing.B) {
			addr := s.Start(b, zeotest.Fixture(b, "1"), false)
			storagetest.BenchLoads(b, dial(b, addr, &client.Options{CacheSize: -1}))
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
			storagetest.BenchLoadsParallel(b, dial(b, addr, &client.Options{CacheSize: -1}), true)
		})
	}
}

// wireConn is the least a ZEO client can do for a load: encode the
// loadBefore frame, write it, read the reply frame and decode it, on the
// calling goroutine, with one request in flight. BenchmarkClientOverhead
// measures the client against it.
type wireConn struct {
	nc  net.Conn
	br  *bufio.Reader
	enc wire.Encoder
	dec *wire.Decoder
	buf []byte
}

func dialWire(b *testing.B, addr string) *wireConn {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { nc.Close() })
	w := &wireConn{nc: nc, br: bufio.NewReaderSize(nc, 64<<10)}
	ann, err := wire.ReadFrame(w.br, nil, 64)
	if err != nil || len(ann) != 2 || ann[1] != '5' {
		b.Fatalf("handshake: %q %v", ann, err)
	}
	m := wire.Marshal(ann[0])
	w.enc, w.dec = wire.Encoder{M: m}, wire.NewDecoder(m)
	w.enc.RawFrame(ann)
	id := wire.Value{Kind: wire.Int, Int: 1}
	w.enc.BeginRequest(&id, false, "register")
	w.enc.BeginTuple(2)
	w.enc.Str("1")
	w.enc.Bool(true)
	w.enc.EndTuple(2)
	w.enc.EndMessage()
	w.roundTrip(b)
	return w
}

// roundTrip writes what is encoded and returns the next reply.
func (w *wireConn) roundTrip(b *testing.B) wire.Message {
	if _, err := w.nc.Write(w.enc.Buf); err != nil {
		b.Fatal(err)
	}
	w.enc.Buf = w.enc.Buf[:0]
	for {
		f, err := wire.ReadFrame(w.br, w.buf, 1<<30)
		if err != nil {
			b.Fatal(err)
		}
		w.buf = f[:0]
		msg, err := w.dec.DecodeMessage(f)
		if err != nil {
			b.Fatal(err)
		}
		if string(msg.Name) == ".reply" {
			return msg
		}
	}
}

// BenchmarkClientOverhead is the client's own cost per load: serial loads
// (cache off) through the Client and through a bare wireConn against the
// same zodbd server, alternating blocks of 200 loads so that both see the
// same machine. It reports the time per load of each (client-ns/load,
// wire-ns/load), their difference (overhead-ns/load) and this process's
// CPU time per load of each (client-cpu-ns/load, wire-cpu-ns/load; the
// server runs in another process). ns/op is meaningless here.
func BenchmarkClientOverhead(b *testing.B) {
	for _, ds := range []string{"1", "prod1-1024"} {
		b.Run(ds, func(b *testing.B) {
			path := zeotest.Fixture(b, "1")
			if ds != "1" {
				path, _ = zeotest.Dataset(b, ds)
				path = datasets.CopyFile(b, path)
			}
			addr := zeotest.StartZodbdProcess(b, path, false)
			c := dial(b, addr, &client.Options{CacheSize: -1})
			w := dialWire(b, addr)
			oids, at := storagetest.HeadOids(b, c)
			if len(oids) == 0 {
				b.Skip("no objects")
			}
			ctx := context.Background()
			buf := make([]byte, 0, 128<<10)
			const block = 200
			var tClient, tWire, cpuClient, cpuWire time.Duration
			n := 0
			b.ReportAllocs()
			b.ResetTimer()
			loadClient := func(n, k int) {
				for i := 0; i < k; i++ {
					if _, _, err := c.LoadAppend(ctx, zodb.Xid{Oid: oids[(n+i)%len(oids)], At: at}, buf[:0]); err != nil {
						b.Fatal(err)
					}
				}
			}
			loadWire := func(n, k int) {
				for i := 0; i < k; i++ {
					w.enc.LoadBeforeRequest(uint64(oids[(n+i)%len(oids)]), uint64(at+1))
					if msg := w.roundTrip(b); msg.Flags.Int != 0 {
						b.Fatalf("loadBefore: %v", msg.Args)
					}
				}
			}
			// Each block of k loads is made through both, the one that
			// goes first alternating, so that neither always follows the
			// other (the second of a pair was seen to be slower).
			for blk := 0; n < b.N; blk++ {
				k := min(block, b.N-n)
				first, second := loadClient, loadWire
				if blk%2 == 1 {
					first, second = loadWire, loadClient
				}
				t0, c0 := time.Now(), cpuTime()
				first(n, k)
				t1, c1 := time.Now(), cpuTime()
				second(n, k)
				t2, c2 := time.Now(), cpuTime()
				d1, d2, u1, u2 := t1.Sub(t0), t2.Sub(t1), c1-c0, c2-c1
				if blk%2 == 1 {
					d1, d2, u1, u2 = d2, d1, u2, u1
				}
				tClient += d1
				tWire += d2
				cpuClient += u1
				cpuWire += u2
				n += k
			}
			N := float64(b.N)
			b.ReportMetric(float64(tClient)/N, "client-ns/load")
			b.ReportMetric(float64(tWire)/N, "wire-ns/load")
			b.ReportMetric(float64(tClient-tWire)/N, "overhead-ns/load")
			b.ReportMetric(float64(cpuClient)/N, "client-cpu-ns/load")
			b.ReportMetric(float64(cpuWire)/N, "wire-cpu-ns/load")
		})
	}
}

// cpuTime is the CPU time (user and system) this process has used.
func cpuTime() time.Duration {
	d, _ := opstats.ProcessCPU()
	return d
}
