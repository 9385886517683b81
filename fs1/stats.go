package fs1

import (
	"sync/atomic"
	"time"

	"github.com/zodbd/zodbd/internal/opstats"
	"github.com/zodbd/zodbd/zodb"
)

// Stats are a FileStorage's figures for a server's metrics, read at any
// time without stopping commits. The histograms are cumulative since Open
// (opstats: power-of-two buckets; durations in nanoseconds with
// opstats.DurationShift, group sizes with shift 0).
type Stats struct {
	// Objects is the number of oids in the index (Len); Size the file's
	// size in bytes as far as published (End).
	Objects int
	Size    int64
	// IndexBytes estimates the memory of the in-memory index
	// (Index.Bytes).
	IndexBytes int64
	// Writable: the storage was opened read-write. The histograms below
	// are empty otherwise.
	Writable bool
	// LockWait is how long each taker of the commit lock (a vote, an
	// online pack's tail, Close) waited for it; LockHold how long each
	// held it (a commit: from the start of its vote until its status is
	// written or it aborts).
	LockWait, LockHold opstats.Snapshot
	// Fsync is the duration of each fdatasync of the group commit;
	// FsyncGroup the number of transactions whose status byte each one
	// made durable (0 for an fdatasync begun at vote for data only).
	Fsync, FsyncGroup opstats.Snapshot
	// Pack is the progress of the online pack running (Pack, PackStats),
	// its zero value when none runs.
	Pack PackProgress
}

// PackProgress is how far a running online pack got: its phase and, in
// that phase, Done of Total (PackOptions.Progress: bytes of the source
// for PackScan and PackCopy, objects for PackGC). Install is set once
// the packed file is written and the pack waits for the commit lock,
// copies the transactions committed meanwhile and swaps the files.
type PackProgress struct {
	Running     bool
	Started     time.Time
	At          zodb.Tid // the pack time
	Phase       PackPhase
	Done, Total int64
	Install     bool
}

// packProgress is PackProgress as the pack's goroutine publishes it, read
// by Stats at any time (the fields may be one report apart).
type packProgress struct {
	started     atomic.Int64 // unix nanoseconds; 0: no pack runs
	at          atomic.Uint64
	phase       atomic.Int32
	done, total atomic.Int64
	install     atomic.Bool
}

// begin marks a pack at tid at of a source of size bytes as started.
func (p *packProgress) begin(at zodb.Tid, size int64) {
	p.at.Store(uint64(at))
	p.report(PackScan, 0, size)
	p.install.Store(false)
	p.started.Store(time.Now().UnixNano())
}

func (p *packProgress) report(phase PackPhase, done, total int64) {
	p.phase.Store(int32(phase))
	p.done.Store(done)
	p.total.Store(total)
}

func (p *packProgress) end() { p.started.Store(0) }

func (p *packProgress) load() PackProgress {
	t := p.started.Load()
	if t == 0 {
		return PackProgress{}
	}
	return PackProgress{Running: true, Started: time.Unix(0, t), At: zodb.Tid(p.at.Load()),
		Phase: PackPhase(p.phase.Load()), Done: p.done.Load(), Total: p.total.Load(), Install: p.install.Load()}
}

// CommitWaiting returns the number of transactions waiting for the
// commit lock now (their votes are blocked behind the holder's), as ZEO's
// server_status reports them ("waiting").
func (fs *FileStorage) CommitWaiting() int {
	if w := fs.w; w != nil {
		return w.commit.Waiting()
	}
	return 0
}

// Stats returns fs's figures (see Stats).
func (fs *FileStorage) Stats() Stats {
	s := fs.state.Load()
	st := Stats{Objects: s.index.Len(), Size: s.end, IndexBytes: s.index.Bytes()}
	if w := fs.w; w != nil {
		st.Pack = w.progress.load()
		st.Writable = true
		st.LockWait = w.commit.wait.Snapshot()
		st.LockHold = w.commit.hold.Snapshot()
		st.Fsync = w.syncs.latency.Snapshot()
		st.FsyncGroup = w.syncs.group.Snapshot()
	}
	return st
}

// syncStats are the syncers' figures, updated under the writer's mu (two
// syncers may finish an fdatasync at once).
type syncStats struct {
	latency, group opstats.Hist
}

// observe records one fdatasync that took d and made the status bytes of
// claimed durable (barriers aside).
func (s *syncStats) observe(d time.Duration, claimed []*commitEntry) {
	n := 0
	for _, e := range claimed {
		if !e.barrier {
			n++
		}
	}
	s.latency.ObserveDuration(d)
	s.group.Observe(uint64(n), 0)
}
