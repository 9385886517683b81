// Package opstats holds the figures a server keeps for its metrics
// without sharing anything between requests of different connections: a
// fixed-bucket histogram (Hist) and a counter (Counter) that live in one
// connection (or one goroutine) and are only read, atomically, by whoever
// collects them. ProcessCPU is the process's CPU time, which the status
// page divides by the requests answered.
//
// The servers' hot-path rule is that no lock or atomic is shared by every
// request across connections. A prometheus.Histogram shared by all
// connections would be one (its buckets are atomics every Observe
// touches). So each connection keeps its own Hist and Counter, updated by
// the goroutine serving it (Observe and Add are an atomic load and an
// atomic store: plain moves on amd64 and arm64, no locked instruction);
// figures that several goroutines may update at once use ObserveShared
// and AddShared (atomic adds, still on memory of one connection or one
// storage). A collector sums the snapshots (Snapshot, Merge) at scrape
// time.
//
// Buckets are powers of two: bucket i counts the values v with
// Base<<(i-1) < v ≤ Base<<i (bucket 0: v ≤ Base), and the last bucket
// everything above. The bucket is found with one bits.Len64, never a
// search. Durations use DurationBase (1024 ns, so the bounds are about
// 1 µs, 2 µs, 4 µs, ... 34 s), small counts base 1 (1, 2, 4, ...).
package opstats
