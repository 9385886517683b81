// Package floortest measures a server's round trip against its floor: a
// bare TCP echo, in the same process and the same run, that answers each
// request with as many bytes as the server's reply to it. No server can
// answer faster than that echo on the same machine, so the ratio of the two
// times is the server's (and its client's) cost over the network's.
//
// The two are measured in alternating blocks of round trips, the one that
// goes first alternating too, and the ratio reported is the median of the
// per-block ratios: a machine whose speed drifts during the run (a shared
// VM) moves both sides of a block alike.
package floortest

import (
	"encoding/binary"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// Files are the FileStorage files the round-trip benchmarks load, by path
// from the repository's root: the fixture 1.fs (objects of 100–400 bytes
// and a few of ~100 KB) and the datasets of `make datasets`, prod1-1024
// (~1.4 KiB) and wczblk1-8 (~4 KiB).
var Files = []struct{ Name, Path string }{
	{"1.fs", "fs1/testdata/1.fs"},
	{"prod1-1024", "data/datasets/prod1-1024.fs"},
	{"wczblk1-8", "data/datasets/wczblk1-8.fs"},
}

// RunFiles runs f as a sub-benchmark for each of Files, root being the
// repository's root relative to the package; a dataset that `make
// datasets` has not made is skipped.
func RunFiles(b *testing.B, root string, f func(b *testing.B, path string)) {
	for _, file := range Files {
		b.Run(file.Name, func(b *testing.B) {
			path := filepath.Join(root, file.Path)
			if _, err := os.Stat(path); err != nil {
				b.Skipf("no %s (make datasets)", path)
			}
			f(b, path)
		})
	}
}

// Echo is a TCP echo server on 127.0.0.1 for the floor. It reads requests
// of a fixed length; the first 4 bytes of each (big endian) are the length
// of the answer it writes back at once, in one write.
type Echo struct {
	ln     net.Listener
	reqLen int
}

// StartEcho starts an Echo for requests of reqLen bytes (at least 4),
// closed when tb ends.
func StartEcho(tb testing.TB, reqLen int) *Echo {
	tb.Helper()
	if reqLen < 4 {
		reqLen = 4
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	e := &Echo{ln: ln, reqLen: reqLen}
	tb.Cleanup(func() { ln.Close() })
	go e.serve()
	return e
}

func (e *Echo) serve() {
	for {
		nc, err := e.ln.Accept()
		if err != nil {
			return
		}
		go e.serveConn(nc)
	}
}

func (e *Echo) serveConn(nc net.Conn) {
	defer nc.Close()
	nc.(*net.TCPConn).SetNoDelay(true)
	req := make([]byte, e.reqLen)
	var reply []byte
	for {
		if _, err := io.ReadFull(nc, req); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(req))
		if cap(reply) < n {
			reply = make([]byte, n)
		}
		if _, err := nc.Write(reply[:n]); err != nil {
			return
		}
	}
}

// Conn is a client connection to an Echo.
type Conn struct {
	nc    net.Conn
	req   []byte
	reply []byte
}

// Dial connects to e; the connection is closed when tb ends.
func (e *Echo) Dial(tb testing.TB) *Conn {
	tb.Helper()
	nc, err := net.Dial("tcp", e.ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { nc.Close() })
	nc.(*net.TCPConn).SetNoDelay(true)
	return &Conn{nc: nc, req: make([]byte, e.reqLen)}
}

// RoundTrip writes one request and reads an answer of n bytes.
func (c *Conn) RoundTrip(n int) error {
	binary.BigEndian.PutUint32(c.req, uint32(n))
	if _, err := c.nc.Write(c.req); err != nil {
		return err
	}
	if cap(c.reply) < n {
		c.reply = make([]byte, n)
	}
	_, err := io.ReadFull(c.nc, c.reply[:n])
	return err
}

// Floor returns the floor side of Compare on c: round trip i answers
// sizes[i%len(sizes)] bytes.
func (c *Conn) Floor(tb testing.TB, sizes []int) func(i, k int) bool {
	return func(i, k int) bool {
		for j := i; j < i+k; j++ {
			if err := c.RoundTrip(sizes[j%len(sizes)]); err != nil {
				tb.Error(err)
				return false
			}
		}
		return true
	}
}

// Block is the number of round trips of each side in a block.
const Block = 100

// A Side is one way of making round trips: Run(i, k) makes the round trips
// i, i+1, ..., i+k-1 (the caller maps i to an object and its answer size)
// and returns whether they succeeded (on failure it has reported it with
// b.Error or b.Fatal).
type Side struct {
	Name string
	Run  func(i, k int) bool
}

// Compare runs b.N round trips through floor and b.N through each side, in
// blocks of Block round trips of each, the order of the sides in a block
// rotating from one block to the next. It reports floor-ns/op and, for
// each side, NAME-ns/op and NAME-x-floor, the median over the blocks of
// the side's time over the floor's; for each side after the first also
// NAME-x-FIRST, the median of its time over the first side's. ns/op is
// the time of all of them together.
func Compare(b *testing.B, floor func(i, k int) bool, sides ...Side) {
	b.Helper()
	all := append([]Side{{Name: "floor", Run: floor}}, sides...)
	total := make([]time.Duration, len(all))
	ratios := make([][]float64, 2*len(all)) // x-floor, then x-first, by side
	d := make([]time.Duration, len(all))
	b.ResetTimer()
	for blk, i := 0, 0; i < b.N; blk++ {
		k := min(Block, b.N-i)
		for j := range all {
			s := (blk + j) % len(all)
			t0 := time.Now()
			if !all[s].Run(i, k) {
				return
			}
			d[s] = time.Since(t0)
			total[s] += d[s]
		}
		if k == Block && d[0] > 0 && (len(all) < 2 || d[1] > 0) {
			for s := 1; s < len(all); s++ {
				ratios[s] = append(ratios[s], float64(d[s])/float64(d[0]))
				if s > 1 {
					ratios[len(all)+s] = append(ratios[len(all)+s], float64(d[s])/float64(d[1]))
				}
			}
		}
		i += k
	}
	b.StopTimer()
	n := float64(b.N)
	for s, side := range all {
		b.ReportMetric(float64(total[s])/n, side.Name+"-ns/op")
		if r := ratios[s]; len(r) > 0 {
			b.ReportMetric(median(r), side.Name+"-x-floor")
		}
		if r := ratios[len(all)+s]; len(r) > 0 {
			b.ReportMetric(median(r), side.Name+"-x-"+all[1].Name)
		}
	}
}

func median(r []float64) float64 {
	slices.Sort(r)
	return r[len(r)/2]
}
