// Packets with a flat argument layout (the others are in packets_*.go).

package proto

import (
	"github.com/zodbd/zodbd/neo/msgp"
	"github.com/zodbd/zodbd/zodb"
)

// Ping is the packet Ping: [].
type Ping struct{}

func (m *Ping) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 0)
	return b
}

func (m *Ping) DecodeArgs(args []byte) error {
	d := newDecoder("Ping", args, 0)
	return d.finish()
}

// Pong is the packet Pong: [].
type Pong struct{}

func (m *Pong) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 0)
	return b
}

func (m *Pong) DecodeArgs(args []byte) error {
	d := newDecoder("Pong", args, 0)
	return d.finish()
}

// CloseClient is the packet CloseClient: [].
type CloseClient struct{}

func (m *CloseClient) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 0)
	return b
}

func (m *CloseClient) DecodeArgs(args []byte) error {
	d := newDecoder("CloseClient", args, 0)
	return d.finish()
}

// AskPrimary is the packet AskPrimary: [].
type AskPrimary struct{}

func (m *AskPrimary) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 0)
	return b
}

func (m *AskPrimary) DecodeArgs(args []byte) error {
	d := newDecoder("AskPrimary", args, 0)
	return d.finish()
}

// FlushLog is the packet FlushLog: [].
type FlushLog struct{}

func (m *FlushLog) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 0)
	return b
}

func (m *FlushLog) DecodeArgs(args []byte) error {
	d := newDecoder("FlushLog", args, 0)
	return d.finish()
}

// AskRecovery is the packet AskRecovery: [].
type AskRecovery struct{}

func (m *AskRecovery) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 0)
	return b
}

func (m *AskRecovery) DecodeArgs(args []byte) error {
	d := newDecoder("AskRecovery", args, 0)
	return d.finish()
}

// AnswerRecovery is the packet AnswerRecovery: [ptid, backup_tid, truncate_tid].
// PTid is NoPTid for nil (empty database); BackupTid, TruncateTid InvalidTid for nil.
type AnswerRecovery struct {
	PTid        uint64
	BackupTid   zodb.Tid
	TruncateTid zodb.Tid
}

func (m *AnswerRecovery) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 3)
	b = appendPTid(b, m.PTid)
	b = appendTid(b, m.BackupTid)
	b = appendTid(b, m.TruncateTid)
	return b
}

func (m *AnswerRecovery) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerRecovery", args, 3)
	m.PTid = d.a("ptid").ptid()
	m.BackupTid = d.a("backup_tid").tid()
	m.TruncateTid = d.a("truncate_tid").tid()
	return d.finish()
}

// AskLastIDs is the packet AskLastIDs: [].
type AskLastIDs struct{}

func (m *AskLastIDs) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 0)
	return b
}

func (m *AskLastIDs) DecodeArgs(args []byte) error {
	d := newDecoder("AskLastIDs", args, 0)
	return d.finish()
}

// AnswerLastIDs is the packet AnswerLastIDs: [last_tid, last_oid, first_tid].
// LastTid/LastOid are InvalidTid/InvalidOid for nil (empty database).
type AnswerLastIDs struct {
	LastTid  zodb.Tid
	LastOid  zodb.Oid
	FirstTid zodb.Tid
}

func (m *AnswerLastIDs) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 3)
	b = appendTid(b, m.LastTid)
	b = appendOid(b, m.LastOid)
	b = appendTid(b, m.FirstTid)
	return b
}

func (m *AnswerLastIDs) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerLastIDs", args, 3)
	m.LastTid = d.a("last_tid").tid()
	m.LastOid = d.a("last_oid").oid()
	m.FirstTid = d.a("first_tid").tid()
	return d.finish()
}

// AskPartitionTable is the packet AskPartitionTable: [].
type AskPartitionTable struct{}

func (m *AskPartitionTable) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 0)
	return b
}

func (m *AskPartitionTable) DecodeArgs(args []byte) error {
	d := newDecoder("AskPartitionTable", args, 0)
	return d.finish()
}

// AnswerPartitionTable is the packet AnswerPartitionTable: [ptid, num_replicas, row_list].
// PTid is NoPTid for nil. Rows has one entry per partition.
type AnswerPartitionTable struct {
	PTid        uint64
	NumReplicas uint32
	Rows        [][]CellInfo
}

func (m *AnswerPartitionTable) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 3)
	b = appendPTid(b, m.PTid)
	b = msgp.AppendUint(b, uint64(m.NumReplicas))
	b = appendRows(b, m.Rows)
	return b
}

func (m *AnswerPartitionTable) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerPartitionTable", args, 3)
	m.PTid = d.a("ptid").ptid()
	m.NumReplicas = d.a("num_replicas").u32()
	m.Rows = d.a("row_list").rows()
	return d.finish()
}

// SendPartitionTable is the packet SendPartitionTable: [ptid, num_replicas, row_list].
// PTid is NoPTid for nil (no partition table yet).
type SendPartitionTable struct {
	PTid        uint64
	NumReplicas uint32
	Rows        [][]CellInfo
}

func (m *SendPartitionTable) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 3)
	b = appendPTid(b, m.PTid)
	b = msgp.AppendUint(b, uint64(m.NumReplicas))
	b = appendRows(b, m.Rows)
	return b
}

func (m *SendPartitionTable) DecodeArgs(args []byte) error {
	d := newDecoder("SendPartitionTable", args, 3)
	m.PTid = d.a("ptid").ptid()
	m.NumReplicas = d.a("num_replicas").u32()
	m.Rows = d.a("row_list").rows()
	return d.finish()
}

// StartOperation is the packet StartOperation: [backup].
type StartOperation struct {
	Backup bool
}

func (m *StartOperation) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = msgp.AppendBool(b, m.Backup)
	return b
}

func (m *StartOperation) DecodeArgs(args []byte) error {
	d := newDecoder("StartOperation", args, 1)
	m.Backup = d.a("backup").boolean()
	return d.finish()
}

// StopOperation is the packet StopOperation: [].
type StopOperation struct{}

func (m *StopOperation) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 0)
	return b
}

func (m *StopOperation) DecodeArgs(args []byte) error {
	d := newDecoder("StopOperation", args, 0)
	return d.finish()
}

// AskUnfinishedTransactions is the packet AskUnfinishedTransactions: [offset_list].
type AskUnfinishedTransactions struct {
	Offsets []uint32
}

func (m *AskUnfinishedTransactions) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = appendU32s(b, m.Offsets)
	return b
}

func (m *AskUnfinishedTransactions) DecodeArgs(args []byte) error {
	d := newDecoder("AskUnfinishedTransactions", args, 1)
	m.Offsets = d.a("offset_list").u32s()
	return d.finish()
}

// AnswerUnfinishedTransactions is the packet AnswerUnfinishedTransactions: [max_tid, ttid_list].
type AnswerUnfinishedTransactions struct {
	MaxTid zodb.Tid
	TTids  []zodb.Tid
}

func (m *AnswerUnfinishedTransactions) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 2)
	b = appendTid(b, m.MaxTid)
	b = appendTids(b, m.TTids)
	return b
}

func (m *AnswerUnfinishedTransactions) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerUnfinishedTransactions", args, 2)
	m.MaxTid = d.a("max_tid").tid()
	m.TTids = d.a("ttid_list").tids()
	return d.finish()
}

// AskLockedTransactions is the packet AskLockedTransactions: [].
type AskLockedTransactions struct{}

func (m *AskLockedTransactions) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 0)
	return b
}

func (m *AskLockedTransactions) DecodeArgs(args []byte) error {
	d := newDecoder("AskLockedTransactions", args, 0)
	return d.finish()
}

// AskFinalTID is the packet AskFinalTID: [ttid].
type AskFinalTID struct {
	TTid zodb.Tid
}

func (m *AskFinalTID) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = appendTid(b, m.TTid)
	return b
}

func (m *AskFinalTID) DecodeArgs(args []byte) error {
	d := newDecoder("AskFinalTID", args, 1)
	m.TTid = d.a("ttid").tid()
	return d.finish()
}

// AnswerFinalTID is the packet AnswerFinalTID: [tid].
// Tid is InvalidTid for nil (not committed).
type AnswerFinalTID struct {
	Tid zodb.Tid
}

func (m *AnswerFinalTID) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = appendTid(b, m.Tid)
	return b
}

func (m *AnswerFinalTID) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerFinalTID", args, 1)
	m.Tid = d.a("tid").tid()
	return d.finish()
}

// ValidateTransaction is the packet ValidateTransaction: [ttid, tid].
type ValidateTransaction struct {
	TTid zodb.Tid
	Tid  zodb.Tid
}

func (m *ValidateTransaction) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 2)
	b = appendTid(b, m.TTid)
	b = appendTid(b, m.Tid)
	return b
}

func (m *ValidateTransaction) DecodeArgs(args []byte) error {
	d := newDecoder("ValidateTransaction", args, 2)
	m.TTid = d.a("ttid").tid()
	m.Tid = d.a("tid").tid()
	return d.finish()
}

// AskBeginTransaction is the packet AskBeginTransaction: [tid].
type AskBeginTransaction struct {
	Tid zodb.Tid
}

func (m *AskBeginTransaction) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = appendTid(b, m.Tid)
	return b
}

func (m *AskBeginTransaction) DecodeArgs(args []byte) error {
	d := newDecoder("AskBeginTransaction", args, 1)
	m.Tid = d.a("tid").tid()
	return d.finish()
}

// AnswerBeginTransaction is the packet AnswerBeginTransaction: [ttid].
type AnswerBeginTransaction struct {
	TTid zodb.Tid
}

func (m *AnswerBeginTransaction) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = appendTid(b, m.TTid)
	return b
}

func (m *AnswerBeginTransaction) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerBeginTransaction", args, 1)
	m.TTid = d.a("ttid").tid()
	return d.finish()
}

// FailedVote is the packet FailedVote: [ttid, failed_list].
// Answered by Error only.
type FailedVote struct {
	TTid     zodb.Tid
	NodeList []NodeID
}

func (m *FailedVote) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 2)
	b = appendTid(b, m.TTid)
	b = appendNIDs(b, m.NodeList)
	return b
}

func (m *FailedVote) DecodeArgs(args []byte) error {
	d := newDecoder("FailedVote", args, 2)
	m.TTid = d.a("ttid").tid()
	m.NodeList = d.a("failed_list").nids()
	return d.finish()
}

// AnswerTransactionFinished is the packet AnswerTransactionFinished: [ttid, tid].
type AnswerTransactionFinished struct {
	TTid zodb.Tid
	Tid  zodb.Tid
}

func (m *AnswerTransactionFinished) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 2)
	b = appendTid(b, m.TTid)
	b = appendTid(b, m.Tid)
	return b
}

func (m *AnswerTransactionFinished) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerTransactionFinished", args, 2)
	m.TTid = d.a("ttid").tid()
	m.Tid = d.a("tid").tid()
	return d.finish()
}

// AnswerInformationLocked is the packet AnswerInformationLocked: [ttid].
type AnswerInformationLocked struct {
	TTid zodb.Tid
}

func (m *AnswerInformationLocked) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = appendTid(b, m.TTid)
	return b
}

func (m *AnswerInformationLocked) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerInformationLocked", args, 1)
	m.TTid = d.a("ttid").tid()
	return d.finish()
}

// InvalidateObjects is the packet InvalidateObjects: [tid, oid_list].
type InvalidateObjects struct {
	Tid  zodb.Tid
	Oids []zodb.Oid
}

func (m *InvalidateObjects) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 2)
	b = appendTid(b, m.Tid)
	b = appendOids(b, m.Oids)
	return b
}

func (m *InvalidateObjects) DecodeArgs(args []byte) error {
	d := newDecoder("InvalidateObjects", args, 2)
	m.Tid = d.a("tid").tid()
	m.Oids = d.a("oid_list").oids()
	return d.finish()
}

// InvalidatePartitions is the packet InvalidatePartitions: [tid, partition_list].
type InvalidatePartitions struct {
	Tid        zodb.Tid
	Partitions []uint32
}

func (m *InvalidatePartitions) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 2)
	b = appendTid(b, m.Tid)
	b = appendU32s(b, m.Partitions)
	return b
}

func (m *InvalidatePartitions) DecodeArgs(args []byte) error {
	d := newDecoder("InvalidatePartitions", args, 2)
	m.Tid = d.a("tid").tid()
	m.Partitions = d.a("partition_list").u32s()
	return d.finish()
}

// NotifyUnlockInformation is the packet NotifyUnlockInformation: [ttid].
type NotifyUnlockInformation struct {
	TTid zodb.Tid
}

func (m *NotifyUnlockInformation) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = appendTid(b, m.TTid)
	return b
}

func (m *NotifyUnlockInformation) DecodeArgs(args []byte) error {
	d := newDecoder("NotifyUnlockInformation", args, 1)
	m.TTid = d.a("ttid").tid()
	return d.finish()
}

// AskNewOIDs is the packet AskNewOIDs: [num_oids].
type AskNewOIDs struct {
	NumOIDs uint32
}

func (m *AskNewOIDs) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = msgp.AppendUint(b, uint64(m.NumOIDs))
	return b
}

func (m *AskNewOIDs) DecodeArgs(args []byte) error {
	d := newDecoder("AskNewOIDs", args, 1)
	m.NumOIDs = d.a("num_oids").u32()
	return d.finish()
}

// AnswerNewOIDs is the packet AnswerNewOIDs: [oid_list].
type AnswerNewOIDs struct {
	Oids []zodb.Oid
}

func (m *AnswerNewOIDs) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = appendOids(b, m.Oids)
	return b
}

func (m *AnswerNewOIDs) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerNewOIDs", args, 1)
	m.Oids = d.a("oid_list").oids()
	return d.finish()
}

// NotifyDeadlock is the packet NotifyDeadlock: [ttid, oid].
type NotifyDeadlock struct {
	TTid zodb.Tid
	Oid  zodb.Oid
}

func (m *NotifyDeadlock) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 2)
	b = appendTid(b, m.TTid)
	b = appendOid(b, m.Oid)
	return b
}

func (m *NotifyDeadlock) DecodeArgs(args []byte) error {
	d := newDecoder("NotifyDeadlock", args, 2)
	m.TTid = d.a("ttid").tid()
	m.Oid = d.a("oid").oid()
	return d.finish()
}

// AskRelockObject is the packet AskRelockObject: [ttid, oid].
type AskRelockObject struct {
	TTid zodb.Tid
	Oid  zodb.Oid
}

func (m *AskRelockObject) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 2)
	b = appendTid(b, m.TTid)
	b = appendOid(b, m.Oid)
	return b
}

func (m *AskRelockObject) DecodeArgs(args []byte) error {
	d := newDecoder("AskRelockObject", args, 2)
	m.TTid = d.a("ttid").tid()
	m.Oid = d.a("oid").oid()
	return d.finish()
}

// AnswerStoreObject is the packet AnswerStoreObject: [conflict].
// Conflict is InvalidTid for nil (stored and locked), ZeroTid for "stored without lock", else the conflicting serial.
type AnswerStoreObject struct {
	Conflict zodb.Tid
}

func (m *AnswerStoreObject) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = appendTid(b, m.Conflict)
	return b
}

func (m *AnswerStoreObject) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerStoreObject", args, 1)
	m.Conflict = d.a("conflict").tid()
	return d.finish()
}

// AbortTransaction is the packet AbortTransaction: [ttid, node_list].
type AbortTransaction struct {
	TTid     zodb.Tid
	NodeList []NodeID
}

func (m *AbortTransaction) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 2)
	b = appendTid(b, m.TTid)
	b = appendNIDs(b, m.NodeList)
	return b
}

func (m *AbortTransaction) DecodeArgs(args []byte) error {
	d := newDecoder("AbortTransaction", args, 2)
	m.TTid = d.a("ttid").tid()
	m.NodeList = d.a("node_list").nids()
	return d.finish()
}

// AnswerStoreTransaction is the packet AnswerStoreTransaction: [].
type AnswerStoreTransaction struct{}

func (m *AnswerStoreTransaction) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 0)
	return b
}

func (m *AnswerStoreTransaction) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerStoreTransaction", args, 0)
	return d.finish()
}

// AskVoteTransaction is the packet AskVoteTransaction: [ttid].
type AskVoteTransaction struct {
	TTid zodb.Tid
}

func (m *AskVoteTransaction) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = appendTid(b, m.TTid)
	return b
}

func (m *AskVoteTransaction) DecodeArgs(args []byte) error {
	d := newDecoder("AskVoteTransaction", args, 1)
	m.TTid = d.a("ttid").tid()
	return d.finish()
}

// AnswerVoteTransaction is the packet AnswerVoteTransaction: [].
type AnswerVoteTransaction struct{}

func (m *AnswerVoteTransaction) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 0)
	return b
}

func (m *AnswerVoteTransaction) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerVoteTransaction", args, 0)
	return d.finish()
}

// AskTIDs is the packet AskTIDs: [first, last, partition].
// Partition InvalidPartition asks every readable partition; [First, Last) slices the newest-first list.
type AskTIDs struct {
	First     uint64
	Last      uint64
	Partition uint32
}

func (m *AskTIDs) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 3)
	b = msgp.AppendUint(b, m.First)
	b = msgp.AppendUint(b, m.Last)
	b = msgp.AppendUint(b, uint64(m.Partition))
	return b
}

func (m *AskTIDs) DecodeArgs(args []byte) error {
	d := newDecoder("AskTIDs", args, 3)
	m.First = d.a("first").u64()
	m.Last = d.a("last").u64()
	m.Partition = d.a("partition").u32()
	return d.finish()
}

// AnswerTIDs is the packet AnswerTIDs: [tid_list].
type AnswerTIDs struct {
	Tids []zodb.Tid
}

func (m *AnswerTIDs) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = appendTids(b, m.Tids)
	return b
}

func (m *AnswerTIDs) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerTIDs", args, 1)
	m.Tids = d.a("tid_list").tids()
	return d.finish()
}

// AskTransactionInformation is the packet AskTransactionInformation: [tid].
type AskTransactionInformation struct {
	Tid zodb.Tid
}

func (m *AskTransactionInformation) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = appendTid(b, m.Tid)
	return b
}

func (m *AskTransactionInformation) DecodeArgs(args []byte) error {
	d := newDecoder("AskTransactionInformation", args, 1)
	m.Tid = d.a("tid").tid()
	return d.finish()
}

// AnswerTransactionInformation is the packet AnswerTransactionInformation: [tid, user, description, extension, packed, oid_list].
type AnswerTransactionInformation struct {
	Tid         zodb.Tid
	User        []byte
	Description []byte
	Extension   []byte
	Packed      bool
	Oids        []zodb.Oid
}

func (m *AnswerTransactionInformation) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 6)
	b = appendTid(b, m.Tid)
	b = msgp.AppendBin(b, m.User)
	b = msgp.AppendBin(b, m.Description)
	b = msgp.AppendBin(b, m.Extension)
	b = msgp.AppendBool(b, m.Packed)
	b = appendOids(b, m.Oids)
	return b
}

func (m *AnswerTransactionInformation) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerTransactionInformation", args, 6)
	m.Tid = d.a("tid").tid()
	m.User = d.a("user").bin()
	m.Description = d.a("description").bin()
	m.Extension = d.a("extension").bin()
	m.Packed = d.a("packed").boolean()
	m.Oids = d.a("oid_list").oids()
	return d.finish()
}

// AskObjectHistory is the packet AskObjectHistory: [oid, first, last].
type AskObjectHistory struct {
	Oid   zodb.Oid
	First uint64
	Last  uint64
}

func (m *AskObjectHistory) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 3)
	b = appendOid(b, m.Oid)
	b = msgp.AppendUint(b, m.First)
	b = msgp.AppendUint(b, m.Last)
	return b
}

func (m *AskObjectHistory) DecodeArgs(args []byte) error {
	d := newDecoder("AskObjectHistory", args, 3)
	m.Oid = d.a("oid").oid()
	m.First = d.a("first").u64()
	m.Last = d.a("last").u64()
	return d.finish()
}

// AskPartitionList is the packet AskPartitionList: [min_offset, max_offset, nid].
type AskPartitionList struct {
	MinOffset uint32
	MaxOffset uint32
	NID       NodeID
}

func (m *AskPartitionList) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 3)
	b = msgp.AppendUint(b, uint64(m.MinOffset))
	b = msgp.AppendUint(b, uint64(m.MaxOffset))
	b = appendNID(b, m.NID)
	return b
}

func (m *AskPartitionList) DecodeArgs(args []byte) error {
	d := newDecoder("AskPartitionList", args, 3)
	m.MinOffset = d.a("min_offset").u32()
	m.MaxOffset = d.a("max_offset").u32()
	m.NID = d.a("nid").nid()
	return d.finish()
}

// AnswerPartitionList is the packet AnswerPartitionList: [ptid, num_replicas, row_list].
type AnswerPartitionList struct {
	PTid        uint64
	NumReplicas uint32
	Rows        [][]CellInfo
}

func (m *AnswerPartitionList) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 3)
	b = appendPTid(b, m.PTid)
	b = msgp.AppendUint(b, uint64(m.NumReplicas))
	b = appendRows(b, m.Rows)
	return b
}

func (m *AnswerPartitionList) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerPartitionList", args, 3)
	m.PTid = d.a("ptid").ptid()
	m.NumReplicas = d.a("num_replicas").u32()
	m.Rows = d.a("row_list").rows()
	return d.finish()
}

// AnswerNodeList is the packet AnswerNodeList: [node_list].
type AnswerNodeList struct {
	Nodes []NodeInfo
}

func (m *AnswerNodeList) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = appendNodeInfos(b, m.Nodes)
	return b
}

func (m *AnswerNodeList) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerNodeList", args, 1)
	m.Nodes = d.a("node_list").nodeInfos()
	return d.finish()
}

// SetNodeState is the packet SetNodeState: [nid, state].
// Answered by Error only.
type SetNodeState struct {
	NID   NodeID
	State NodeState
}

func (m *SetNodeState) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 2)
	b = appendNID(b, m.NID)
	b = msgp.AppendEnum(b, ExtNodeState, int(m.State))
	return b
}

func (m *SetNodeState) DecodeArgs(args []byte) error {
	d := newDecoder("SetNodeState", args, 2)
	m.NID = d.a("nid").nid()
	m.State = d.a("state").nodeState()
	return d.finish()
}

// AddPendingNodes is the packet AddPendingNodes: [nid_list].
// Answered by Error only.
type AddPendingNodes struct {
	NIDs []NodeID
}

func (m *AddPendingNodes) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = appendNIDs(b, m.NIDs)
	return b
}

func (m *AddPendingNodes) DecodeArgs(args []byte) error {
	d := newDecoder("AddPendingNodes", args, 1)
	m.NIDs = d.a("nid_list").nids()
	return d.finish()
}

// TweakPartitionTable is the packet TweakPartitionTable: [dry_run, nid_list].
type TweakPartitionTable struct {
	DryRun bool
	NIDs   []NodeID
}

func (m *TweakPartitionTable) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 2)
	b = msgp.AppendBool(b, m.DryRun)
	b = appendNIDs(b, m.NIDs)
	return b
}

func (m *TweakPartitionTable) DecodeArgs(args []byte) error {
	d := newDecoder("TweakPartitionTable", args, 2)
	m.DryRun = d.a("dry_run").boolean()
	m.NIDs = d.a("nid_list").nids()
	return d.finish()
}

// AnswerTweakPartitionTable is the packet AnswerTweakPartitionTable: [changed, row_list].
type AnswerTweakPartitionTable struct {
	Changed bool
	Rows    [][]CellInfo
}

func (m *AnswerTweakPartitionTable) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 2)
	b = msgp.AppendBool(b, m.Changed)
	b = appendRows(b, m.Rows)
	return b
}

func (m *AnswerTweakPartitionTable) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerTweakPartitionTable", args, 2)
	m.Changed = d.a("changed").boolean()
	m.Rows = d.a("row_list").rows()
	return d.finish()
}

// SetNumReplicas is the packet SetNumReplicas: [num_replicas].
// Answered by Error only.
type SetNumReplicas struct {
	NumReplicas uint32
}

func (m *SetNumReplicas) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = msgp.AppendUint(b, uint64(m.NumReplicas))
	return b
}

func (m *SetNumReplicas) DecodeArgs(args []byte) error {
	d := newDecoder("SetNumReplicas", args, 1)
	m.NumReplicas = d.a("num_replicas").u32()
	return d.finish()
}

// SetClusterState is the packet SetClusterState: [state].
// Answered by Error only.
type SetClusterState struct {
	State ClusterState
}

func (m *SetClusterState) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = msgp.AppendEnum(b, ExtClusterState, int(m.State))
	return b
}

func (m *SetClusterState) DecodeArgs(args []byte) error {
	d := newDecoder("SetClusterState", args, 1)
	m.State = d.a("state").clusterState()
	return d.finish()
}

// Repair is the packet Repair: [nid_list, dry_run].
// Answered by Error only.
type Repair struct {
	NIDs   []NodeID
	DryRun bool
}

func (m *Repair) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 2)
	b = appendNIDs(b, m.NIDs)
	b = msgp.AppendBool(b, m.DryRun)
	return b
}

func (m *Repair) DecodeArgs(args []byte) error {
	d := newDecoder("Repair", args, 2)
	m.NIDs = d.a("nid_list").nids()
	m.DryRun = d.a("dry_run").boolean()
	return d.finish()
}

// NotifyRepair is the packet NotifyRepair: [dry_run].
type NotifyRepair struct {
	DryRun bool
}

func (m *NotifyRepair) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = msgp.AppendBool(b, m.DryRun)
	return b
}

func (m *NotifyRepair) DecodeArgs(args []byte) error {
	d := newDecoder("NotifyRepair", args, 1)
	m.DryRun = d.a("dry_run").boolean()
	return d.finish()
}

// NotifyClusterInformation is the packet NotifyClusterInformation: [state].
type NotifyClusterInformation struct {
	State ClusterState
}

func (m *NotifyClusterInformation) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = msgp.AppendEnum(b, ExtClusterState, int(m.State))
	return b
}

func (m *NotifyClusterInformation) DecodeArgs(args []byte) error {
	d := newDecoder("NotifyClusterInformation", args, 1)
	m.State = d.a("state").clusterState()
	return d.finish()
}

// AskClusterState is the packet AskClusterState: [].
type AskClusterState struct{}

func (m *AskClusterState) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 0)
	return b
}

func (m *AskClusterState) DecodeArgs(args []byte) error {
	d := newDecoder("AskClusterState", args, 0)
	return d.finish()
}

// AnswerClusterState is the packet AnswerClusterState: [state].
type AnswerClusterState struct {
	State ClusterState
}

func (m *AnswerClusterState) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = msgp.AppendEnum(b, ExtClusterState, int(m.State))
	return b
}

func (m *AnswerClusterState) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerClusterState", args, 1)
	m.State = d.a("state").clusterState()
	return d.finish()
}

// AskObjectUndoSerial is the packet AskObjectUndoSerial: [ttid, ltid, undone_tid, oid_list].
type AskObjectUndoSerial struct {
	TTid      zodb.Tid
	LTid      zodb.Tid
	UndoneTid zodb.Tid
	Oids      []zodb.Oid
}

func (m *AskObjectUndoSerial) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 4)
	b = appendTid(b, m.TTid)
	b = appendTid(b, m.LTid)
	b = appendTid(b, m.UndoneTid)
	b = appendOids(b, m.Oids)
	return b
}

func (m *AskObjectUndoSerial) DecodeArgs(args []byte) error {
	d := newDecoder("AskObjectUndoSerial", args, 4)
	m.TTid = d.a("ttid").tid()
	m.LTid = d.a("ltid").tid()
	m.UndoneTid = d.a("undone_tid").tid()
	m.Oids = d.a("oid_list").oids()
	return d.finish()
}

// AskTIDsFrom is the packet AskTIDsFrom: [min_tid, max_tid, length, partition].
type AskTIDsFrom struct {
	MinTid    zodb.Tid
	MaxTid    zodb.Tid
	Length    uint32
	Partition uint32
}

func (m *AskTIDsFrom) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 4)
	b = appendTid(b, m.MinTid)
	b = appendTid(b, m.MaxTid)
	b = msgp.AppendUint(b, uint64(m.Length))
	b = msgp.AppendUint(b, uint64(m.Partition))
	return b
}

func (m *AskTIDsFrom) DecodeArgs(args []byte) error {
	d := newDecoder("AskTIDsFrom", args, 4)
	m.MinTid = d.a("min_tid").tid()
	m.MaxTid = d.a("max_tid").tid()
	m.Length = d.a("length").u32()
	m.Partition = d.a("partition").u32()
	return d.finish()
}

// AnswerTIDsFrom is the packet AnswerTIDsFrom: [tid_list].
type AnswerTIDsFrom struct {
	Tids []zodb.Tid
}

func (m *AnswerTIDsFrom) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = appendTids(b, m.Tids)
	return b
}

func (m *AnswerTIDsFrom) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerTIDsFrom", args, 1)
	m.Tids = d.a("tid_list").tids()
	return d.finish()
}

// AskOIDsFrom is the packet AskOIDsFrom: [partition, length, min_oid, tid].
type AskOIDsFrom struct {
	Partition uint32
	Length    uint32
	MinOid    zodb.Oid
	Tid       zodb.Tid
}

func (m *AskOIDsFrom) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 4)
	b = msgp.AppendUint(b, uint64(m.Partition))
	b = msgp.AppendUint(b, uint64(m.Length))
	b = appendOid(b, m.MinOid)
	b = appendTid(b, m.Tid)
	return b
}

func (m *AskOIDsFrom) DecodeArgs(args []byte) error {
	d := newDecoder("AskOIDsFrom", args, 4)
	m.Partition = d.a("partition").u32()
	m.Length = d.a("length").u32()
	m.MinOid = d.a("min_oid").oid()
	m.Tid = d.a("tid").tid()
	return d.finish()
}

// AnswerOIDsFrom is the packet AnswerOIDsFrom: [next_oid, oid_list].
// NextOid is InvalidOid for nil (end of the partition).
type AnswerOIDsFrom struct {
	NextOid zodb.Oid
	Oids    []zodb.Oid
}

func (m *AnswerOIDsFrom) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 2)
	b = appendOid(b, m.NextOid)
	b = appendOids(b, m.Oids)
	return b
}

func (m *AnswerOIDsFrom) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerOIDsFrom", args, 2)
	m.NextOid = d.a("next_oid").oid()
	m.Oids = d.a("oid_list").oids()
	return d.finish()
}

// WaitForPack is the packet WaitForPack: [tid].
type WaitForPack struct {
	Tid zodb.Tid
}

func (m *WaitForPack) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = appendTid(b, m.Tid)
	return b
}

func (m *WaitForPack) DecodeArgs(args []byte) error {
	d := newDecoder("WaitForPack", args, 1)
	m.Tid = d.a("tid").tid()
	return d.finish()
}

// WaitedForPack is the packet WaitedForPack: [].
type WaitedForPack struct{}

func (m *WaitedForPack) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 0)
	return b
}

func (m *WaitedForPack) DecodeArgs(args []byte) error {
	d := newDecoder("WaitedForPack", args, 0)
	return d.finish()
}

// AskPackOrders is the packet AskPackOrders: [min_id].
type AskPackOrders struct {
	MinPackID zodb.Tid
}

func (m *AskPackOrders) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = appendTid(b, m.MinPackID)
	return b
}

func (m *AskPackOrders) DecodeArgs(args []byte) error {
	d := newDecoder("AskPackOrders", args, 1)
	m.MinPackID = d.a("min_id").tid()
	return d.finish()
}

// NotifyPackSigned is the packet NotifyPackSigned: [approved, rejected].
type NotifyPackSigned struct {
	Approved []zodb.Tid
	Rejected []zodb.Tid
}

func (m *NotifyPackSigned) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 2)
	b = appendTids(b, m.Approved)
	b = appendTids(b, m.Rejected)
	return b
}

func (m *NotifyPackSigned) DecodeArgs(args []byte) error {
	d := newDecoder("NotifyPackSigned", args, 2)
	m.Approved = d.a("approved").tids()
	m.Rejected = d.a("rejected").tids()
	return d.finish()
}

// NotifyPackCompleted is the packet NotifyPackCompleted: [pack_id].
type NotifyPackCompleted struct {
	PackID zodb.Tid
}

func (m *NotifyPackCompleted) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = appendTid(b, m.PackID)
	return b
}

func (m *NotifyPackCompleted) DecodeArgs(args []byte) error {
	d := newDecoder("NotifyPackCompleted", args, 1)
	m.PackID = d.a("pack_id").tid()
	return d.finish()
}

// NotifyPartitionCorrupted is the packet NotifyPartitionCorrupted: [partition, cell_list].
type NotifyPartitionCorrupted struct {
	Partition uint32
	CellList  []NodeID
}

func (m *NotifyPartitionCorrupted) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 2)
	b = msgp.AppendUint(b, uint64(m.Partition))
	b = appendNIDs(b, m.CellList)
	return b
}

func (m *NotifyPartitionCorrupted) DecodeArgs(args []byte) error {
	d := newDecoder("NotifyPartitionCorrupted", args, 2)
	m.Partition = d.a("partition").u32()
	m.CellList = d.a("cell_list").nids()
	return d.finish()
}

// NotifyReady is the packet NotifyReady: [].
type NotifyReady struct{}

func (m *NotifyReady) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 0)
	return b
}

func (m *NotifyReady) DecodeArgs(args []byte) error {
	d := newDecoder("NotifyReady", args, 0)
	return d.finish()
}

// AskLastTransaction is the packet AskLastTransaction: [].
type AskLastTransaction struct{}

func (m *AskLastTransaction) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 0)
	return b
}

func (m *AskLastTransaction) DecodeArgs(args []byte) error {
	d := newDecoder("AskLastTransaction", args, 0)
	return d.finish()
}

// AnswerLastTransaction is the packet AnswerLastTransaction: [tid].
type AnswerLastTransaction struct {
	Tid zodb.Tid
}

func (m *AnswerLastTransaction) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = appendTid(b, m.Tid)
	return b
}

func (m *AnswerLastTransaction) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerLastTransaction", args, 1)
	m.Tid = d.a("tid").tid()
	return d.finish()
}

// AskCheckCurrentSerial is the packet AskCheckCurrentSerial: [ttid, oid, serial].
type AskCheckCurrentSerial struct {
	TTid   zodb.Tid
	Oid    zodb.Oid
	Serial zodb.Tid
}

func (m *AskCheckCurrentSerial) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 3)
	b = appendTid(b, m.TTid)
	b = appendOid(b, m.Oid)
	b = appendTid(b, m.Serial)
	return b
}

func (m *AskCheckCurrentSerial) DecodeArgs(args []byte) error {
	d := newDecoder("AskCheckCurrentSerial", args, 3)
	m.TTid = d.a("ttid").tid()
	m.Oid = d.a("oid").oid()
	m.Serial = d.a("serial").tid()
	return d.finish()
}

// AnswerCheckCurrentSerial is the packet AnswerCheckCurrentSerial: [conflict].
// Same semantics as AnswerStoreObject.Conflict.
type AnswerCheckCurrentSerial struct {
	Conflict zodb.Tid
}

func (m *AnswerCheckCurrentSerial) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = appendTid(b, m.Conflict)
	return b
}

func (m *AnswerCheckCurrentSerial) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerCheckCurrentSerial", args, 1)
	m.Conflict = d.a("conflict").tid()
	return d.finish()
}

// NotifyTransactionFinished is the packet NotifyTransactionFinished: [ttid, max_tid].
type NotifyTransactionFinished struct {
	TTid   zodb.Tid
	MaxTid zodb.Tid
}

func (m *NotifyTransactionFinished) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 2)
	b = appendTid(b, m.TTid)
	b = appendTid(b, m.MaxTid)
	return b
}

func (m *NotifyTransactionFinished) DecodeArgs(args []byte) error {
	d := newDecoder("NotifyTransactionFinished", args, 2)
	m.TTid = d.a("ttid").tid()
	m.MaxTid = d.a("max_tid").tid()
	return d.finish()
}

// NotifyReplicationDone is the packet NotifyReplicationDone: [offset, tid].
type NotifyReplicationDone struct {
	Offset uint32
	Tid    zodb.Tid
}

func (m *NotifyReplicationDone) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 2)
	b = msgp.AppendUint(b, uint64(m.Offset))
	b = appendTid(b, m.Tid)
	return b
}

func (m *NotifyReplicationDone) DecodeArgs(args []byte) error {
	d := newDecoder("NotifyReplicationDone", args, 2)
	m.Offset = d.a("offset").u32()
	m.Tid = d.a("tid").tid()
	return d.finish()
}

// AskFetchTransactions is the packet AskFetchTransactions: [partition, length, min_tid, max_tid, tid_list, ask_pack_info].
type AskFetchTransactions struct {
	Partition   uint32
	Length      uint32
	MinTid      zodb.Tid
	MaxTid      zodb.Tid
	KnownTids   []zodb.Tid
	AskPackInfo bool
}

func (m *AskFetchTransactions) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 6)
	b = msgp.AppendUint(b, uint64(m.Partition))
	b = msgp.AppendUint(b, uint64(m.Length))
	b = appendTid(b, m.MinTid)
	b = appendTid(b, m.MaxTid)
	b = appendTids(b, m.KnownTids)
	b = msgp.AppendBool(b, m.AskPackInfo)
	return b
}

func (m *AskFetchTransactions) DecodeArgs(args []byte) error {
	d := newDecoder("AskFetchTransactions", args, 6)
	m.Partition = d.a("partition").u32()
	m.Length = d.a("length").u32()
	m.MinTid = d.a("min_tid").tid()
	m.MaxTid = d.a("max_tid").tid()
	m.KnownTids = d.a("tid_list").tids()
	m.AskPackInfo = d.a("ask_pack_info").boolean()
	return d.finish()
}

// AnswerFetchTransactions is the packet AnswerFetchTransactions: [next_tid, tid_list, completed_pack].
type AnswerFetchTransactions struct {
	NextTid       zodb.Tid
	TidsToDelete  []zodb.Tid
	CompletedPack zodb.Tid
}

func (m *AnswerFetchTransactions) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 3)
	b = appendTid(b, m.NextTid)
	b = appendTids(b, m.TidsToDelete)
	b = appendTid(b, m.CompletedPack)
	return b
}

func (m *AnswerFetchTransactions) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerFetchTransactions", args, 3)
	m.NextTid = d.a("next_tid").tid()
	m.TidsToDelete = d.a("tid_list").tids()
	m.CompletedPack = d.a("completed_pack").tid()
	return d.finish()
}

// AddObject is the packet AddObject: [oid, serial, compression, checksum, data, data_serial].
type AddObject struct {
	Oid         zodb.Oid
	Serial      zodb.Tid
	Compression uint8
	Checksum    [20]byte
	Data        []byte
	DataSerial  zodb.Tid
}

func (m *AddObject) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 6)
	b = appendOid(b, m.Oid)
	b = appendTid(b, m.Serial)
	b = msgp.AppendUint(b, uint64(m.Compression))
	b = appendHash(b, &m.Checksum)
	b = msgp.AppendBin(b, m.Data)
	b = appendTid(b, m.DataSerial)
	return b
}

func (m *AddObject) DecodeArgs(args []byte) error {
	d := newDecoder("AddObject", args, 6)
	m.Oid = d.a("oid").oid()
	m.Serial = d.a("serial").tid()
	m.Compression = d.a("compression").u8()
	m.Checksum = d.a("checksum").hash()
	m.Data = d.a("data").bin()
	m.DataSerial = d.a("data_serial").tid()
	return d.finish()
}

// AskCheckTIDRange is the packet AskCheckTIDRange: [partition, length, min_tid, max_tid].
type AskCheckTIDRange struct {
	Partition uint32
	Length    uint32
	MinTid    zodb.Tid
	MaxTid    zodb.Tid
}

func (m *AskCheckTIDRange) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 4)
	b = msgp.AppendUint(b, uint64(m.Partition))
	b = msgp.AppendUint(b, uint64(m.Length))
	b = appendTid(b, m.MinTid)
	b = appendTid(b, m.MaxTid)
	return b
}

func (m *AskCheckTIDRange) DecodeArgs(args []byte) error {
	d := newDecoder("AskCheckTIDRange", args, 4)
	m.Partition = d.a("partition").u32()
	m.Length = d.a("length").u32()
	m.MinTid = d.a("min_tid").tid()
	m.MaxTid = d.a("max_tid").tid()
	return d.finish()
}

// AnswerCheckTIDRange is the packet AnswerCheckTIDRange: [count, checksum, max_tid].
type AnswerCheckTIDRange struct {
	Count    uint64
	Checksum [20]byte
	MaxTid   zodb.Tid
}

func (m *AnswerCheckTIDRange) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 3)
	b = msgp.AppendUint(b, m.Count)
	b = appendHash(b, &m.Checksum)
	b = appendTid(b, m.MaxTid)
	return b
}

func (m *AnswerCheckTIDRange) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerCheckTIDRange", args, 3)
	m.Count = d.a("count").u64()
	m.Checksum = d.a("checksum").hash()
	m.MaxTid = d.a("max_tid").tid()
	return d.finish()
}

// AskCheckSerialRange is the packet AskCheckSerialRange: [partition, length, min_tid, max_tid, min_oid].
type AskCheckSerialRange struct {
	Partition uint32
	Length    uint32
	MinTid    zodb.Tid
	MaxTid    zodb.Tid
	MinOid    zodb.Oid
}

func (m *AskCheckSerialRange) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 5)
	b = msgp.AppendUint(b, uint64(m.Partition))
	b = msgp.AppendUint(b, uint64(m.Length))
	b = appendTid(b, m.MinTid)
	b = appendTid(b, m.MaxTid)
	b = appendOid(b, m.MinOid)
	return b
}

func (m *AskCheckSerialRange) DecodeArgs(args []byte) error {
	d := newDecoder("AskCheckSerialRange", args, 5)
	m.Partition = d.a("partition").u32()
	m.Length = d.a("length").u32()
	m.MinTid = d.a("min_tid").tid()
	m.MaxTid = d.a("max_tid").tid()
	m.MinOid = d.a("min_oid").oid()
	return d.finish()
}

// AnswerCheckSerialRange is the packet AnswerCheckSerialRange: [count, tid_checksum, max_tid, oid_checksum, max_oid].
type AnswerCheckSerialRange struct {
	Count       uint64
	TidChecksum [20]byte
	MaxTid      zodb.Tid
	OidChecksum [20]byte
	MaxOid      zodb.Oid
}

func (m *AnswerCheckSerialRange) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 5)
	b = msgp.AppendUint(b, m.Count)
	b = appendHash(b, &m.TidChecksum)
	b = appendTid(b, m.MaxTid)
	b = appendHash(b, &m.OidChecksum)
	b = appendOid(b, m.MaxOid)
	return b
}

func (m *AnswerCheckSerialRange) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerCheckSerialRange", args, 5)
	m.Count = d.a("count").u64()
	m.TidChecksum = d.a("tid_checksum").hash()
	m.MaxTid = d.a("max_tid").tid()
	m.OidChecksum = d.a("oid_checksum").hash()
	m.MaxOid = d.a("max_oid").oid()
	return d.finish()
}

// Truncate is the packet Truncate: [tid].
// Answered by Error only (sent as a notification by the master to storages).
type Truncate struct {
	Tid zodb.Tid
}

func (m *Truncate) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = appendTid(b, m.Tid)
	return b
}

func (m *Truncate) DecodeArgs(args []byte) error {
	d := newDecoder("Truncate", args, 1)
	m.Tid = d.a("tid").tid()
	return d.finish()
}

// AskMonitorInformation is the packet AskMonitorInformation: [].
type AskMonitorInformation struct{}

func (m *AskMonitorInformation) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 0)
	return b
}

func (m *AskMonitorInformation) DecodeArgs(args []byte) error {
	d := newDecoder("AskMonitorInformation", args, 0)
	return d.finish()
}

// NotifyMonitorInformation is the packet NotifyMonitorInformation: [info].
type NotifyMonitorInformation struct {
	Info []RawPair
}

func (m *NotifyMonitorInformation) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = appendPairs(b, m.Info)
	return b
}

func (m *NotifyMonitorInformation) DecodeArgs(args []byte) error {
	d := newDecoder("NotifyMonitorInformation", args, 1)
	m.Info = d.a("info").pairs()
	return d.finish()
}

// NotifyUpstreamAdmin is the packet NotifyUpstreamAdmin: [address].
type NotifyUpstreamAdmin struct {
	Addr Address
}

func (m *NotifyUpstreamAdmin) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = appendAddr(b, m.Addr)
	return b
}

func (m *NotifyUpstreamAdmin) DecodeArgs(args []byte) error {
	d := newDecoder("NotifyUpstreamAdmin", args, 1)
	m.Addr = d.a("address").addr()
	return d.finish()
}
