package fs1

import (
	"fmt"
	"math/rand"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zodbd/zodbd/zodb"
)

// BenchmarkCommit measures commits of small transactions (1-10 objects of
// ~300 bytes, each committer on its own objects, so no conflicts) with
// fsync on, from 1, 4, 16 and 64 concurrent committers, with group commit
// with NoGroupCommit (two fsyncs per transaction, under the commit lock),
// and with group commit and SingleFsync (single: the status byte made
// durable with the data, as ZODB/py does), and with group commit and a
// pause of 100 µs between Vote and Finish (rtt: a network client's round
// trip, during which the commit lock is held, as in ZEO; the committer
// yields the processor until it has passed). It reports
// commits/s, the p50, p99 and mean latency of a commit (Begin to Finish
// returned), the fsyncs per commit, the mean duration of one fsync and
// the mean latency in fsyncs (mean/fsync: with many committers,
// commits/s is about committers / mean latency, and a commit waits for
// the fsyncs of its data and of its status byte in a row).
//
//	go test -run '^$' -bench BenchmarkCommit -benchtime 3s ./fs1
//
// The file is in $TMPDIR: put that on the disk to measure.
func BenchmarkCommit(b *testing.B) {
	for _, mode := range []string{"group", "nogroup", "single", "rtt"} {
		for _, c := range []int{1, 4, 16, 64} {
			b.Run(fmt.Sprintf("%s/committers=%d", mode, c), func(b *testing.B) {
				var pause time.Duration
				if mode == "rtt" {
					pause = 100 * time.Microsecond
				}
				benchCommit(b, c, mode == "nogroup", mode == "single", pause)
			})
		}
	}
}

func benchCommit(b *testing.B, committers int, noGroup, single bool, pause time.Duration) {
	fs := createStorage(b, &Options{NoGroupCommit: noGroup, SingleFsync: single, Logf: func(string, ...interface{}) {}})
	payload := make([]byte, 1024)
	rand.New(rand.NewSource(1)).Read(payload)
	var left atomic.Int64
	left.Store(int64(b.N))
	lat := make([][]time.Duration, committers)
	var wg sync.WaitGroup
	// The duration of each fdatasync of the commit path, for the latency
	// of a commit in fdatasyncs (mean-µs / fsync-µs).
	var syncNs, syncN atomic.Int64
	realSync := fs.w.sync
	fs.w.sync = func(slot int) error {
		t := time.Now()
		err := realSync(slot)
		syncNs.Add(int64(time.Since(t)))
		syncN.Add(1)
		return err
	}
	b.ResetTimer()
	start := time.Now()
	for c := 0; c < committers; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(c)))
			serials := map[zodb.Oid]zodb.Tid{}
			base := zodb.Oid(c) << 20
			for left.Add(-1) >= 0 {
				t0 := time.Now()
				tx, err := fs.Begin(bg, zodb.TxnMeta{User: []byte("bench"), Description: []byte("small")})
				if err != nil {
					b.Error(err)
					return
				}
				n := 1 + rng.Intn(10)
				oids := make([]zodb.Oid, 0, n)
				for k := 0; k < n; k++ {
					oid := base + zodb.Oid(rng.Intn(1000))
					if slices.Contains(oids, oid) {
						continue
					}
					oids = append(oids, oid)
					size := 250 + rng.Intn(100)
					off := rng.Intn(len(payload) - size)
					tx.Store(oid, serials[oid], payload[off:off+size])
				}
				if _, err := tx.Vote(bg); err != nil {
					b.Error(err)
					return
				}
				if pause > 0 {
					// time.Sleep oversleeps by far more than 100 µs
					// on a busy machine.
					for t := time.Now(); time.Since(t) < pause; {
						runtime.Gosched()
					}
				}
				tid, err := tx.Finish(bg, nil)
				if err != nil {
					b.Error(err)
					return
				}
				for _, oid := range oids {
					serials[oid] = tid
				}
				lat[c] = append(lat[c], time.Since(t0))
			}
		}(c)
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) == 0 {
		return
	}
	pct := func(p float64) float64 {
		return float64(all[int(p*float64(len(all)-1))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "commits/s")
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
	b.ReportMetric(float64(fs.w.nsync.Load())/float64(len(all)), "fsyncs/commit")
	var sum time.Duration
	for _, d := range all {
		sum += d
	}
	mean := float64(sum.Nanoseconds()) / float64(len(all)) / 1e3
	b.ReportMetric(mean, "mean-µs")
	if n := syncN.Load(); n > 0 {
		fsync := float64(syncNs.Load()) / float64(n) / 1e3
		b.ReportMetric(fsync, "fsync-µs")
		b.ReportMetric(mean/fsync, "mean/fsync")
	}
}
