// Package wrk is a load generator for ZODB storages, like wrk for HTTP: N
// simulated clients in one process, each with its own storage connection
// (zodb.Open of the same URL), each loading objects in its own random
// order with one request in flight (or Inflight, from as many goroutines
// sharing the connection), for a fixed duration.
//
// A first pass, before the clock starts, loads every object (oids 0, 1, 2,
// ... up to the first missing one, like `zodbd hash`) at the storage's head
// and keeps a checksum of each; the clients then load at that same state
// and count every answer whose data differs as an error. Latencies go to a
// log-linear histogram per client, merged at the end, so the measured path
// touches no memory shared between clients.
package wrk

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand"
	"sync"
	"sync/atomic"
	"time"

	"github.com/zodbd/zodbd/internal/opstats"
	"github.com/zodbd/zodbd/zodb"
	"github.com/zodbd/zodbd/zodb/cache"
)

// Config is one wrk run.
type Config struct {
	URL     string // storage to load from (zodb.Open)
	Clients int    // simulated clients, each with its own connection
	// Inflight is the number of loads each client keeps in flight on its
	// connection, from as many goroutines with their own random orders
	// (0 or 1: one; loads only). More than one lets a server batch the
	// requests that queue on a connection.
	Inflight int
	Duration time.Duration // measured time
	// CacheSize is passed to zodb.Open for every client: 0 is the
	// driver's default cache, negative turns it off (every load is a
	// round trip: what `zodbd wrk` does unless asked).
	CacheSize int64
	// Progress, when not nil, receives a progress line every second,
	// rewritten in place (for a terminal).
	Progress io.Writer
	// Logf receives the drivers' warnings.
	Logf func(format string, args ...interface{})

	// Commit selects the commit workload instead of loads (commit.go):
	// each client commits transactions of 1 to 3 of its own Objects
	// (DefaultCommitObjects when 0) of Size bytes (DefaultCommitSize when
	// 0). The storage must be writable; run it on a scratch copy.
	Commit  bool
	Objects int
	Size    int
}

// Result is the outcome of Run.
type Result struct {
	URL      string
	Clients  int
	Inflight int // loads in flight per client (1 unless Config.Inflight asked for more)
	CacheOff bool
	Commit   bool     // the commit workload: Ops are commits
	At       zodb.Tid // the state every load was made at (loads only)
	// Objects is the number of objects of the first pass (loads), or
	// of objects written by all the clients (commits).
	Objects   int
	Bytes     int64         // their total size (loads); bytes per object stored (commits)
	Elapsed   time.Duration // measured wall time
	Ops       uint64        // loads (or commits) completed in Elapsed, the failed ones not included
	Errors    uint64        // failed loads and loads with wrong data; failed commits
	FirstErr  error         // the first of them
	CPU       time.Duration // user+system CPU time of this process during the run
	Latency   Histogram     // all clients merged
	PerClient []uint64      // loads per client (all its goroutines')
	// AnsweredBy says where the loads' answers came from: the server,
	// the client cache, or the storage itself (see answeredBy).
	AnsweredBy string
}

// client is one simulated client; its fields are only written by its own
// goroutine (done is read by the progress printer).
type client struct {
	stor     zodb.Storage
	hist     Histogram
	errors   uint64
	firstErr error
	done     atomic.Uint64
	_        [64]byte // keep clients' counters on separate cache lines
}

// ref is what the first pass learnt about one object.
type ref struct {
	oid zodb.Oid
	crc uint32
	n   int
}

// Run runs the benchmark.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if cfg.Clients < 1 {
		return nil, fmt.Errorf("wrk: need at least 1 client")
	}
	opt := &zodb.OpenOptions{CacheSize: cfg.CacheSize, Logf: cfg.Logf, ReadWrite: cfg.Commit}
	inflight := max(cfg.Inflight, 1)
	if cfg.Commit {
		inflight = 1
	}
	res := &Result{URL: cfg.URL, Clients: cfg.Clients, Inflight: inflight, CacheOff: cfg.CacheSize < 0, Commit: cfg.Commit}
	if cfg.Commit {
		if cfg.Objects <= 0 {
			cfg.Objects = DefaultCommitObjects
		}
		if cfg.Size <= 0 {
			cfg.Size = DefaultCommitSize
		}
	}

	// Connections first, so that connecting is not measured.
	clients := make([]*client, cfg.Clients)
	defer func() {
		for _, c := range clients {
			if c != nil {
				c.stor.Close()
			}
		}
	}()
	for i := range clients {
		stor, err := zodb.Open(ctx, cfg.URL, opt)
		if err != nil {
			return nil, fmt.Errorf("wrk: client %d: %w", i, err)
		}
		clients[i] = &client{stor: stor}
	}

	var refs []ref
	var committers []*committer
	if cfg.Commit {
		for i, c := range clients {
			cm, err := c.setupCommitter(ctx, &cfg, int64(i)+1)
			if err != nil {
				return nil, fmt.Errorf("wrk: client %d: commit workload setup: %w", i, err)
			}
			committers = append(committers, cm)
		}
		res.Objects, res.Bytes = cfg.Clients*cfg.Objects, int64(cfg.Size)
	} else {
		var err error
		if refs, err = firstPass(ctx, clients, res); err != nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// The loading goroutines: the clients, then for each client the
	// others that share its connection (loaders[k*Clients+i] is client
	// i's k-th).
	loaders := clients
	for k := 1; k < inflight; k++ {
		for _, c := range clients {
			loaders = append(loaders, &client{stor: c.stor})
		}
	}

	cpu0, _ := opstats.ProcessCPU()
	start := time.Now()
	deadline := start.Add(cfg.Duration)
	var wg sync.WaitGroup
	for i, c := range loaders {
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			if cfg.Commit {
				c.runCommits(ctx, committers[i], deadline, seed)
			} else {
				c.run(ctx, refs, res.At, deadline, seed)
			}
		}(int64(i) + 1)
	}
	noun := "loads"
	if cfg.Commit {
		noun = "commits"
	}
	var progressDone chan struct{}
	if cfg.Progress != nil {
		progressDone = make(chan struct{})
		stop := make(chan struct{})
		go func() {
			defer close(progressDone)
			t := time.NewTicker(time.Second)
			defer t.Stop()
			var last uint64
			lastT := start
			for {
				select {
				case <-stop:
					fmt.Fprintf(cfg.Progress, "\r\033[K")
					return
				case now := <-t.C:
					var n uint64
					for _, c := range loaders {
						n += c.done.Load()
					}
					fmt.Fprintf(cfg.Progress, "\r\033[K%5.1fs %10d %s %10.0f %s/s",
						now.Sub(start).Seconds(), n, noun, float64(n-last)/now.Sub(lastT).Seconds(), noun)
					last, lastT = n, now
				}
			}
		}()
		defer func() { close(stop); <-progressDone }()
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	cpu1, _ := opstats.ProcessCPU()
	res.CPU = cpu1 - cpu0

	res.PerClient = make([]uint64, len(clients))
	for i, c := range loaders {
		res.Latency.Merge(&c.hist)
		res.Errors += c.errors
		if res.FirstErr == nil {
			res.FirstErr = c.firstErr
		}
		res.PerClient[i%len(clients)] += c.hist.Count()
	}
	res.Ops = res.Latency.Count()
	res.AnsweredBy = answeredBy(clients, res)
	if err := ctx.Err(); err != nil {
		return res, err
	}
	return res, nil
}

// cacheStatser is a storage with a client cache (zeo://, neo://).
type cacheStatser interface{ CacheStats() cache.Stats }

// answeredBy describes where the answers of the run came from. A client
// with its cache on answers from it every load of an object it loaded
// before (the first pass warms client 0's cache; the others warm their own
// on their first load of each object); the cache keeps no hit counters
// (they would be touched by every load), so this tells how many objects
// the caches held at the end.
func answeredBy(clients []*client, res *Result) string {
	if _, ok := clients[0].stor.(cacheStatser); !ok {
		return "the storage, opened in this process (no client cache)"
	}
	if res.CacheOff {
		return "the server (client cache off)"
	}
	if res.Commit {
		return "the server (commits)"
	}
	var cached int
	for _, c := range clients {
		cached += c.stor.(cacheStatser).CacheStats().Objects
	}
	return fmt.Sprintf("the client cache after a client's first load of an object "+
		"(%d of %d objects cached per client at the end), else the server",
		cached/len(clients), res.Objects)
}

// firstPass loads every object on the first client's connection, with a
// reference checksum of each, at the storage's head, to which it brings
// every client's view; it sets res.At, Objects and Bytes.
func firstPass(ctx context.Context, clients []*client, res *Result) ([]ref, error) {
	stor := clients[0].stor
	var at zodb.Tid
	var err error
	if s, ok := stor.(zodb.Syncer); ok {
		at, err = s.Sync(ctx)
	} else {
		at, err = stor.LastTid(ctx)
	}
	if err != nil {
		return nil, fmt.Errorf("wrk: %w", err)
	}
	// Bring every client's view up to at, so that their caches can answer
	// loads at at.
	for _, c := range clients[1:] {
		if s, ok := c.stor.(zodb.Syncer); ok {
			if _, err := s.Sync(ctx); err != nil {
				return nil, fmt.Errorf("wrk: %w", err)
			}
		}
	}
	res.At = at
	var refs []ref
	var buf []byte
	for oid := zodb.Oid(0); ; oid++ {
		data, _, err := load(ctx, stor, zodb.Xid{Oid: oid, At: at}, buf[:0])
		if err != nil {
			var noObj *zodb.NoObjectError
			var noData *zodb.NoDataError
			if errors.As(err, &noObj) || errors.As(err, &noData) {
				break
			}
			return nil, fmt.Errorf("wrk: first pass: %w", err)
		}
		buf = data
		refs = append(refs, ref{oid, crc32.ChecksumIEEE(data), len(data)})
		res.Bytes += int64(len(data))
	}
	res.Objects = len(refs)
	if len(refs) == 0 {
		return nil, fmt.Errorf("wrk: %s: no object at oid 0", res.URL)
	}
	return refs, nil
}

func load(ctx context.Context, stor zodb.Storage, xid zodb.Xid, buf []byte) ([]byte, zodb.Tid, error) {
	if al, ok := stor.(zodb.AppendLoader); ok {
		return al.LoadAppend(ctx, xid, buf)
	}
	return stor.Load(ctx, xid)
}

// run is one client's loop: random permutations of the objects until the
// deadline, one load at a time.
func (c *client) run(ctx context.Context, refs []ref, at zodb.Tid, deadline time.Time, seed int64) {
	rnd := rand.New(rand.NewSource(seed))
	al, _ := c.stor.(zodb.AppendLoader)
	order := make([]int, len(refs))
	for i := range order {
		order[i] = i
	}
	buf := make([]byte, 0, 64<<10)
	var n uint64
	for now := time.Now(); now.Before(deadline) && ctx.Err() == nil; {
		rnd.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, i := range order {
			r := &refs[i]
			xid := zodb.Xid{Oid: r.oid, At: at}
			var data []byte
			var err error
			t0 := time.Now()
			if al != nil {
				data, _, err = al.LoadAppend(ctx, xid, buf[:0])
			} else {
				data, _, err = c.stor.Load(ctx, xid)
			}
			now = time.Now()
			// A failed load or wrong data is an error, not a load: it
			// counts in neither loads/s nor the latencies (a dead server
			// answers errors fast), as a failed commit.
			switch {
			case err != nil:
				c.fail(err)
			case len(data) != r.n || crc32.ChecksumIEEE(data) != r.crc:
				c.fail(fmt.Errorf("wrk: %s: wrong data: %d bytes crc32 %08x, want %d bytes %08x",
					xid, len(data), crc32.ChecksumIEEE(data), r.n, r.crc))
			default:
				c.hist.Record(now.Sub(t0))
			}
			if cap(data) <= 1<<20 {
				buf = data
			}
			n++
			if n&63 == 0 {
				c.done.Store(n)
			}
			if !now.Before(deadline) || ctx.Err() != nil {
				break
			}
		}
	}
	c.done.Store(n)
}

func (c *client) fail(err error) {
	c.errors++
	if c.firstErr == nil {
		c.firstErr = err
	}
}
