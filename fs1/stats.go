package fs1

import (
	"time"

	"github.com/zodbd/zodbd/internal/opstats"
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
}

// Stats returns fs's figures (see Stats).
func (fs *FileStorage) Stats() Stats {
	st := Stats{Objects: fs.Len(), Size: fs.End()}
	if w := fs.w; w != nil {
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
