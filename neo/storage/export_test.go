package storage

import (
	"context"
	"time"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// The node's internals that the external tests drive directly (package
// storage_test, which can import the backends: they import this package).

// SetNID gives n the node id the master's identification would.
func SetNID(n *Node, nid proto.NodeID) { n.nid.Store(int32(nid)) }

// CloseListener closes n's listener, for a node that never served.
func CloseListener(n *Node) { n.ln.Close() }

// HasReplicator reports whether n replicates (a node that takes writes).
func HasReplicator(n *Node) bool { return n.repl != nil }

// CellsChanged passes changes to n's replicator as NotifyPartitionChanges
// does.
func CellsChanged(n *Node, changes []proto.CellChange) error { return n.repl.cellsChanged(changes) }

// IsFatal reports whether err stops the node.
var IsFatal = isFatal

// StoresLockless reports whether n keeps stores for partition p without
// lock (its cell is being replicated); StoresDropped, whether it drops
// them (no cell here).
func StoresLockless(n *Node, p uint32) bool { return n.repl.writeMode(p) == replLockless }
func StoresDropped(n *Node, p uint32) bool  { return n.repl.writeMode(p) == replNone }

// CheckTIDs and CheckSerials compute the answers to AskCheckTIDRange and
// AskCheckSerialRange over a ReplicationSource, as the node does.
var (
	CheckTIDs    = checkTIDs
	CheckSerials = checkSerials
)

// EnterBackup switches n to backup mode as StartOperation [true] does
// while the node is operational.
func EnterBackup(n *Node) error { return n.setBackupMode(context.Background(), true, true) }

// SetBackupTid sets the backup tid n bounds its clients' reads by, as its
// replicator does when partitions progress.
func SetBackupTid(n *Node, tid zodb.Tid) { n.backup.Store(&tid) }

// SetTxnSpool sets, for the nodes made after, the memory one
// transaction's spool keeps (-1: none, everything in its file) and that
// all transactions keep together; the returned function restores them.
func SetTxnSpool(mem int, total int64) (restore func()) {
	oldMem, oldTotal := txnSpoolMem, txnMemory
	txnSpoolMem, txnMemory = mem, total
	return func() { txnSpoolMem, txnMemory = oldMem, oldTotal }
}

// TxnMemoryUsed returns the memory the spools of n's transactions hold.
func TxnMemoryUsed(n *Node) int64 { return n.tm.txnMem.Used() }

// SetMaxConnTxns sets the transactions a connection may have in progress;
// the returned function restores it.
func SetMaxConnTxns(n int) (restore func()) {
	old := maxConnTxns
	maxConnTxns = n
	return func() { maxConnTxns = old }
}

// FramesHeld returns the memory charged to n's bound on the packets being
// received (Config.MaxFramesTotal).
func FramesHeld(n *Node) int64 { return n.frameMem.Held() }

// Peers returns the number of connections n serves (its link to the
// master is not one); Txns, the number of
// transactions its manager holds.
func Peers(n *Node) int {
	n.peersMu.Lock()
	defer n.peersMu.Unlock()
	return len(n.peers)
}

func Txns(n *Node) int {
	n.tm.mu.Lock()
	defer n.tm.mu.Unlock()
	return len(n.tm.txns)
}

// SetReplIdle sets how long a replication request waits with nothing from
// its source, until the test ends.
func SetReplIdle(tb interface{ Cleanup(func()) }, d time.Duration) {
	old := replIdle
	replIdle = d
	tb.Cleanup(func() { replIdle = old })
}
