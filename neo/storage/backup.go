package storage

import (
	"context"

	"github.com/zodbd/zodbd/zodb"
)

// Backup mode: the node is a member of a NEO backup cluster, a cluster
// that follows an upstream one (NEO/py's master started with
// --upstream-cluster/--upstream-masters, in BACKINGUP state). The
// semantics are NEO/py's (neo/master/backup_app.py, storage/replicator.py
// backup, storage/handlers/client.py ClientReadOnlyOperationHandler; read
// for facts only):
//
//   - The master tells StartOperation [true]. The node keeps a backup tid,
//     the tid up to which its database has every transaction of the
//     upstream cluster (the last tid it has when it enters backup mode),
//     durably in its database (BackupStore), and reports it in its
//     recovery answer.
//   - Its cells stay readable. The master sends Replicate(tid,
//     upstream name, {partition: address}): a partition with an address
//     is replicated up to tid from that storage node, which is the
//     upstream cluster's (the node then identifies anonymously, with the
//     upstream cluster's name) or, for the cells of a partition that one
//     node of this cluster fetches from upstream, that node; after each
//     the node sends NotifyReplicationDone(partition, tid). A partition
//     without an address has every transaction up to tid already (no
//     transaction touched it). The backup tid is the least of the
//     partitions' progress.
//   - Clients read only up to the backup tid (the rows after it may be
//     partly replicated) and cannot write (READ_ONLY_ACCESS).
//   - The cluster leaves backup mode by a Truncate at its backup tid
//     (Truncater), which also ends the node's backup mode; a
//     StartOperation [false] ends it too.

// BackupStore is a backend that can be a member of a backup cluster: it
// receives replicated data and keeps the backup tid.
type BackupStore interface {
	ReplicationSink

	// BackupTid returns the backup tid and whether the node is in backup
	// mode (the tid may then be 0: nothing yet).
	BackupTid() (zodb.Tid, bool)

	// SetBackupTid records the backup tid, durably, with on; without,
	// it ends backup mode.
	SetBackupTid(ctx context.Context, tid zodb.Tid, on bool) error
}

// setBackupMode enters backup mode (StartOperation [true]) or leaves it
// ([false]); the replicator is told at its start (or at once with
// running, when the cluster switches to backup mode while operational).
func (n *Node) setBackupMode(ctx context.Context, on, running bool) error {
	bs, ok := n.be.(BackupStore)
	if !on {
		n.backup.Store(nil)
		if ok && n.tm != nil {
			if _, was := bs.BackupTid(); was {
				if err := bs.SetBackupTid(ctx, 0, false); err != nil {
					return fatalf("leaving backup mode: %w", err)
				}
				n.log.Printf("neo storage: backup mode left")
			}
		}
		return nil
	}
	if !ok || n.tm == nil || n.repl == nil {
		return fatalf("the cluster is in backup mode, which needs a node that takes writes (--read-write) on a SQLite database; this one has %T%s", n.be, map[bool]string{true: ", read-only"}[n.tm == nil])
	}
	tid, was := bs.BackupTid()
	if !was {
		ids, err := n.be.LastIDs(ctx)
		if err != nil {
			return err
		}
		if ids.HasTid {
			tid = ids.Tid
		}
		if err := bs.SetBackupTid(ctx, tid, true); err != nil {
			return fatalf("entering backup mode: %w", err)
		}
	}
	n.backup.Store(&tid)
	n.log.Printf("neo storage: backup mode, backup tid %s", tid)
	if running {
		n.repl.enterBackup(tid)
	}
	return nil
}

// backupTid returns the backup tid and true in backup mode.
func (n *Node) backupTid() (zodb.Tid, bool) {
	if p := n.backup.Load(); p != nil {
		return *p, true
	}
	return 0, false
}

// boundRead limits a client's read to the backup tid in backup mode
// (NEO/py's ClientReadOnlyOperationHandler): an AskObject at a serial
// after it finds nothing, one before a tid after it or of the newest
// revision is before the backup tid + 1; AskTIDsFrom stops at it.
func (req *request) boundRead(bt zodb.Tid) {
	switch {
	case req.at != 0:
		if req.at > bt {
			// No revision before tid 1: OID_NOT_FOUND, or
			// OID_DOES_NOT_EXIST for an oid without records here.
			req.at, req.before = 0, 1
		}
	case req.before != 0:
		req.before = min(req.before, bt+1)
	default:
		req.before = bt + 1
	}
}
