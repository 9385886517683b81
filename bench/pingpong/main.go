// Command pingpong is the floor of the ZEO benchmarks in `make bench`: a
// bare TCP echo of frames of the sizes a ZEO loadBefore exchanges, with no
// storage, no encoding and no protocol behind it. No ZEO server can answer
// faster than this on the same machine, so server results are reported as
// "× the floor".
//
//	pingpong serve [-a 127.0.0.1:0]
//	pingpong load [-c N] [-d DUR | -n OPS] [-sizes FILE] [-warmup DUR] ADDR
//
// An address with a "/" is a Unix socket path (the floor of servers that
// listen on one), any other a TCP HOST:PORT.
//
// serve prints "listening ADDR" and answers every request frame (4-byte
// big-endian length, then the payload) with a frame whose payload length is
// the first 4 bytes of the request's payload (big-endian). Each connection
// is served by its own goroutine, as zodbd serve does.
//
// load opens N connections; each sends a 70-byte request (the size of a
// pickled loadBefore call) and waits for the reply, in a loop, for DUR
// (after -warmup) or for OPS round trips per connection. Reply sizes cycle
// through -sizes (one object size in bytes per line, in oid order; 50 bytes
// of reply envelope are added), connection i starting at i*len/N. It
// prints one JSON object: ops, ops/s, latency percentiles in ns and a
// log-linear histogram (16 buckets per power of two).
package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/bits"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

const (
	requestSize   = 70 // payload of a pickled loadBefore request
	replyEnvelope = 50 // a loadBefore reply's bytes beside the object data
	maxFrame      = 256 << 20
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:])
	case "load":
		err = load(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "pingpong:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: pingpong serve [-a ADDR] | pingpong load [-c N] [-d DUR | -n OPS] [-sizes FILE] ADDR")
	os.Exit(2)
}

func serve(args []string) error {
	fl := flag.NewFlagSet("serve", flag.ExitOnError)
	addr := fl.String("a", "127.0.0.1:0", "address to listen on")
	fl.Parse(args)
	ln, err := net.Listen(network(*addr), *addr)
	if err != nil {
		return err
	}
	fmt.Printf("listening %s\n", ln.Addr())
	os.Stdout.Sync()
	for {
		nc, err := ln.Accept()
		if err != nil {
			return err
		}
		go echo(nc)
	}
}

// network is "unix" for an address with a "/" (a socket path), else "tcp".
func network(addr string) string {
	if strings.Contains(addr, "/") {
		return "unix"
	}
	return "tcp"
}

func echo(nc net.Conn) {
	defer nc.Close()
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	br := bufio.NewReaderSize(nc, 64<<10)
	var req, reply []byte
	for {
		f, err := readFrame(br, req)
		if err != nil {
			return
		}
		req = f[:0]
		n := 0
		if len(f) >= 4 {
			n = int(binary.BigEndian.Uint32(f))
		}
		if n > maxFrame {
			return
		}
		if cap(reply) < 4+n {
			reply = make([]byte, 4+n)
		}
		reply = reply[:4+n]
		binary.BigEndian.PutUint32(reply, uint32(n))
		if _, err := nc.Write(reply); err != nil {
			return
		}
	}
}

func readFrame(r *bufio.Reader, buf []byte) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > maxFrame {
		return nil, fmt.Errorf("frame of %d bytes", n)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	_, err := io.ReadFull(r, buf)
	return buf, err
}

// result is what load prints (the schema bench/run.py reads).
type result struct {
	Tool      string             `json:"tool"`
	Clients   int                `json:"clients"`
	DurationS float64            `json:"duration_s"`
	Ops       int64              `json:"ops"`
	OpsPerS   float64            `json:"ops_per_s"`
	LatencyNs map[string]float64 `json:"latency_ns"`
	// HistogramNs: [lower, upper, count] of each non-empty bucket.
	HistogramNs [][3]int64 `json:"histogram_ns"`
}

func load(args []string) error {
	fl := flag.NewFlagSet("load", flag.ExitOnError)
	clients := fl.Int("c", 1, "connections, each with one request in flight")
	dur := fl.Duration("d", time.Second, "measured duration")
	nops := fl.Int("n", 0, "round trips per connection (instead of -d)")
	warmup := fl.Duration("warmup", 100*time.Millisecond, "unmeasured warm-up before -d")
	sizesFile := fl.String("sizes", "", "object sizes, one per line (default: 100 bytes)")
	fl.Parse(args)
	if fl.NArg() != 1 || *clients < 1 {
		usage()
	}
	addr := fl.Arg(0)
	sizes := []int{100}
	if *sizesFile != "" {
		var err error
		if sizes, err = readSizes(*sizesFile); err != nil {
			return err
		}
	}

	conns := make([]net.Conn, *clients)
	for i := range conns {
		nc, err := net.Dial(network(addr), addr)
		if err != nil {
			return err
		}
		if tc, ok := nc.(*net.TCPConn); ok {
			tc.SetNoDelay(true)
		}
		conns[i] = nc
		defer nc.Close()
	}

	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		samples []int64
		errs    []error
		start   = time.Now()
		measure = start.Add(*warmup)
		end     = measure.Add(*dur)
	)
	if *nops > 0 {
		measure, end = start, time.Time{}
	}
	for i, nc := range conns {
		wg.Add(1)
		go func(i int, nc net.Conn) {
			defer wg.Done()
			lat, err := pingLoop(nc, sizes, i*len(sizes)/len(conns), *nops, measure, end)
			mu.Lock()
			samples = append(samples, lat...)
			if err != nil {
				errs = append(errs, err)
			}
			mu.Unlock()
		}(i, nc)
	}
	wg.Wait()
	elapsed := time.Since(measure)
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if *nops == 0 {
		elapsed = *dur
	}
	r := summarize(samples, *clients, elapsed)
	return json.NewEncoder(os.Stdout).Encode(r)
}

func readSizes(path string) ([]int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var sizes []int
	for _, f := range strings.Fields(string(b)) {
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("%s: bad size %q", path, f)
		}
		sizes = append(sizes, n)
	}
	if len(sizes) == 0 {
		return nil, fmt.Errorf("%s: no sizes", path)
	}
	return sizes, nil
}

// pingLoop does round trips on nc until end (or nops of them when nops > 0)
// and returns the latencies of those that started at or after measure.
func pingLoop(nc net.Conn, sizes []int, off, nops int, measure, end time.Time) ([]int64, error) {
	br := bufio.NewReaderSize(nc, 64<<10)
	req := make([]byte, 4+requestSize)
	binary.BigEndian.PutUint32(req, requestSize)
	var buf []byte
	lat := make([]int64, 0, 1<<16)
	for i := 0; nops == 0 || i < nops; i++ {
		binary.BigEndian.PutUint32(req[4:], uint32(sizes[(off+i)%len(sizes)]+replyEnvelope))
		t0 := time.Now()
		if nops == 0 && !t0.Before(end) {
			break
		}
		if _, err := nc.Write(req); err != nil {
			return lat, err
		}
		f, err := readFrame(br, buf)
		if err != nil {
			return lat, err
		}
		buf = f[:0]
		if !t0.Before(measure) {
			lat = append(lat, int64(time.Since(t0)))
		}
	}
	return lat, nil
}

func summarize(samples []int64, clients int, elapsed time.Duration) result {
	slices.Sort(samples)
	r := result{Tool: "pingpong", Clients: clients, DurationS: elapsed.Seconds(), Ops: int64(len(samples)), LatencyNs: map[string]float64{}}
	if len(samples) == 0 {
		return r
	}
	r.OpsPerS = float64(len(samples)) / elapsed.Seconds()
	var sum float64
	for _, s := range samples {
		sum += float64(s)
	}
	q := func(p float64) float64 {
		return float64(samples[min(len(samples)-1, int(math.Ceil(p*float64(len(samples))))-1)])
	}
	r.LatencyNs["min"] = float64(samples[0])
	r.LatencyNs["mean"] = sum / float64(len(samples))
	r.LatencyNs["p50"] = q(0.50)
	r.LatencyNs["p90"] = q(0.90)
	r.LatencyNs["p99"] = q(0.99)
	r.LatencyNs["p999"] = q(0.999)
	r.LatencyNs["max"] = float64(samples[len(samples)-1])
	r.HistogramNs = histogram(samples)
	return r
}

// histogram buckets sorted samples log-linearly: 16 buckets per power of
// two (so a bucket is at most 1/16 = 6% wide), empty ones left out.
func histogram(sorted []int64) [][3]int64 {
	var h [][3]int64
	for _, s := range sorted {
		lo, hi := bucket(s)
		if n := len(h); n > 0 && h[n-1][0] == lo {
			h[n-1][2]++
		} else {
			h = append(h, [3]int64{lo, hi, 1})
		}
	}
	return h
}

func bucket(v int64) (lo, hi int64) {
	if v < 16 {
		return v, v + 1
	}
	e := bits.Len64(uint64(v)) - 5 // v>>e is in [16, 32)
	lo = v >> e << e
	return lo, lo + 1<<e
}
