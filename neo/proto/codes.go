// Packet codes of NEO protocol 5, in the declaration order of class Packets in
// NEO/py (neo/lib/protocol.py); transcribed from testdata packet-codes.json.

package proto

// Packet codes. An answer's code is its request's code | AnswerBit.
const (
	CodeRequestIdentification        uint16 = 0x0001 // request
	CodePing                         uint16 = 0x0002 // request
	CodeCloseClient                  uint16 = 0x0003 // notification
	CodeAskPrimary                   uint16 = 0x0004 // request
	CodeNotPrimaryMaster             uint16 = 0x0005 // notification
	CodeNotifyNodeInformation        uint16 = 0x0006 // notification
	CodeAskRecovery                  uint16 = 0x0007 // request
	CodeAskLastIDs                   uint16 = 0x0008 // request
	CodeAskPartitionTable            uint16 = 0x0009 // request
	CodeSendPartitionTable           uint16 = 0x000a // notification
	CodeNotifyPartitionChanges       uint16 = 0x000b // notification
	CodeStartOperation               uint16 = 0x000c // notification
	CodeStopOperation                uint16 = 0x000d // notification
	CodeAskUnfinishedTransactions    uint16 = 0x000e // request
	CodeAskLockedTransactions        uint16 = 0x000f // request
	CodeAskFinalTID                  uint16 = 0x0010 // request
	CodeValidateTransaction          uint16 = 0x0011 // notification
	CodeAskBeginTransaction          uint16 = 0x0012 // request
	CodeFailedVote                   uint16 = 0x0013 // request
	CodeAskFinishTransaction         uint16 = 0x0014 // request
	CodeAskLockInformation           uint16 = 0x0015 // request
	CodeInvalidateObjects            uint16 = 0x0016 // notification
	CodeInvalidatePartitions         uint16 = 0x0017 // notification
	CodeNotifyUnlockInformation      uint16 = 0x0018 // notification
	CodeAskNewOIDs                   uint16 = 0x0019 // request
	CodeNotifyDeadlock               uint16 = 0x001a // notification
	CodeAskRelockObject              uint16 = 0x001b // request
	CodeAskStoreObject               uint16 = 0x001c // request
	CodeAbortTransaction             uint16 = 0x001d // notification
	CodeAskStoreTransaction          uint16 = 0x001e // request
	CodeAskVoteTransaction           uint16 = 0x001f // request
	CodeAskObject                    uint16 = 0x0020 // request
	CodeAskTIDs                      uint16 = 0x0021 // request
	CodeAskTransactionInformation    uint16 = 0x0022 // request
	CodeAskObjectHistory             uint16 = 0x0023 // request
	CodeAskPartitionList             uint16 = 0x0024 // request
	CodeAskNodeList                  uint16 = 0x0025 // request
	CodeSetNodeState                 uint16 = 0x0026 // request
	CodeAddPendingNodes              uint16 = 0x0027 // request
	CodeTweakPartitionTable          uint16 = 0x0028 // request
	CodeSetNumReplicas               uint16 = 0x0029 // request
	CodeSetClusterState              uint16 = 0x002a // request
	CodeRepair                       uint16 = 0x002b // request
	CodeNotifyRepair                 uint16 = 0x002c // notification
	CodeNotifyClusterInformation     uint16 = 0x002d // notification
	CodeAskClusterState              uint16 = 0x002e // request
	CodeAskObjectUndoSerial          uint16 = 0x002f // request
	CodeAskTIDsFrom                  uint16 = 0x0030 // request
	CodeAskOIDsFrom                  uint16 = 0x0031 // request
	CodeWaitForPack                  uint16 = 0x0032 // request
	CodeAskPackOrders                uint16 = 0x0033 // request
	CodeNotifyPackSigned             uint16 = 0x0034 // notification
	CodeNotifyPackCompleted          uint16 = 0x0035 // notification
	CodeCheckReplicas                uint16 = 0x0036 // request
	CodeCheckPartition               uint16 = 0x0037 // notification
	CodeAskCheckTIDRange             uint16 = 0x0038 // request
	CodeAskCheckSerialRange          uint16 = 0x0039 // request
	CodeNotifyPartitionCorrupted     uint16 = 0x003a // notification
	CodeNotifyReady                  uint16 = 0x003b // notification
	CodeAskLastTransaction           uint16 = 0x003c // request
	CodeAskCheckCurrentSerial        uint16 = 0x003d // request
	CodeNotifyTransactionFinished    uint16 = 0x003e // notification
	CodeReplicate                    uint16 = 0x003f // notification
	CodeNotifyReplicationDone        uint16 = 0x0040 // notification
	CodeAskFetchTransactions         uint16 = 0x0041 // request
	CodeAskFetchObjects              uint16 = 0x0042 // request
	CodeAddTransaction               uint16 = 0x0043 // notification
	CodeAddObject                    uint16 = 0x0044 // notification
	CodeTruncate                     uint16 = 0x0045 // request
	CodeFlushLog                     uint16 = 0x0046 // notification
	CodeAskMonitorInformation        uint16 = 0x0047 // request
	CodeNotifyMonitorInformation     uint16 = 0x0048 // notification
	CodeNotifyUpstreamAdmin          uint16 = 0x0049 // notification
	CodeError                        uint16 = 0x8000 // error
	CodeAcceptIdentification         uint16 = 0x8001 // answer
	CodePong                         uint16 = 0x8002 // answer
	CodeAnswerPrimary                uint16 = 0x8004 // answer
	CodeAnswerRecovery               uint16 = 0x8007 // answer
	CodeAnswerLastIDs                uint16 = 0x8008 // answer
	CodeAnswerPartitionTable         uint16 = 0x8009 // answer
	CodeAnswerUnfinishedTransactions uint16 = 0x800e // answer
	CodeAnswerLockedTransactions     uint16 = 0x800f // answer
	CodeAnswerFinalTID               uint16 = 0x8010 // answer
	CodeAnswerBeginTransaction       uint16 = 0x8012 // answer
	CodeAnswerTransactionFinished    uint16 = 0x8014 // answer
	CodeAnswerInformationLocked      uint16 = 0x8015 // answer
	CodeAnswerNewOIDs                uint16 = 0x8019 // answer
	CodeAnswerRelockObject           uint16 = 0x801b // answer
	CodeAnswerStoreObject            uint16 = 0x801c // answer
	CodeAnswerStoreTransaction       uint16 = 0x801e // answer
	CodeAnswerVoteTransaction        uint16 = 0x801f // answer
	CodeAnswerObject                 uint16 = 0x8020 // answer
	CodeAnswerTIDs                   uint16 = 0x8021 // answer
	CodeAnswerTransactionInformation uint16 = 0x8022 // answer
	CodeAnswerObjectHistory          uint16 = 0x8023 // answer
	CodeAnswerPartitionList          uint16 = 0x8024 // answer
	CodeAnswerNodeList               uint16 = 0x8025 // answer
	CodeAnswerTweakPartitionTable    uint16 = 0x8028 // answer
	CodeAnswerClusterState           uint16 = 0x802e // answer
	CodeAnswerObjectUndoSerial       uint16 = 0x802f // answer
	CodeAnswerTIDsFrom               uint16 = 0x8030 // answer
	CodeAnswerOIDsFrom               uint16 = 0x8031 // answer
	CodeWaitedForPack                uint16 = 0x8032 // answer
	CodeAnswerPackOrders             uint16 = 0x8033 // answer
	CodeAnswerCheckTIDRange          uint16 = 0x8038 // answer
	CodeAnswerCheckSerialRange       uint16 = 0x8039 // answer
	CodeAnswerLastTransaction        uint16 = 0x803c // answer
	CodeAnswerCheckCurrentSerial     uint16 = 0x803d // answer
	CodeAnswerFetchTransactions      uint16 = 0x8041 // answer
	CodeAnswerFetchObjects           uint16 = 0x8042 // answer
	CodeAnswerMonitorInformation     uint16 = 0x8047 // answer
)

// codeNames maps every code of protocol 5 to its NEO/py name.
var codeNames = map[uint16]string{
	0x0001: "RequestIdentification",
	0x0002: "Ping",
	0x0003: "CloseClient",
	0x0004: "AskPrimary",
	0x0005: "NotPrimaryMaster",
	0x0006: "NotifyNodeInformation",
	0x0007: "AskRecovery",
	0x0008: "AskLastIDs",
	0x0009: "AskPartitionTable",
	0x000a: "SendPartitionTable",
	0x000b: "NotifyPartitionChanges",
	0x000c: "StartOperation",
	0x000d: "StopOperation",
	0x000e: "AskUnfinishedTransactions",
	0x000f: "AskLockedTransactions",
	0x0010: "AskFinalTID",
	0x0011: "ValidateTransaction",
	0x0012: "AskBeginTransaction",
	0x0013: "FailedVote",
	0x0014: "AskFinishTransaction",
	0x0015: "AskLockInformation",
	0x0016: "InvalidateObjects",
	0x0017: "InvalidatePartitions",
	0x0018: "NotifyUnlockInformation",
	0x0019: "AskNewOIDs",
	0x001a: "NotifyDeadlock",
	0x001b: "AskRelockObject",
	0x001c: "AskStoreObject",
	0x001d: "AbortTransaction",
	0x001e: "AskStoreTransaction",
	0x001f: "AskVoteTransaction",
	0x0020: "AskObject",
	0x0021: "AskTIDs",
	0x0022: "AskTransactionInformation",
	0x0023: "AskObjectHistory",
	0x0024: "AskPartitionList",
	0x0025: "AskNodeList",
	0x0026: "SetNodeState",
	0x0027: "AddPendingNodes",
	0x0028: "TweakPartitionTable",
	0x0029: "SetNumReplicas",
	0x002a: "SetClusterState",
	0x002b: "Repair",
	0x002c: "NotifyRepair",
	0x002d: "NotifyClusterInformation",
	0x002e: "AskClusterState",
	0x002f: "AskObjectUndoSerial",
	0x0030: "AskTIDsFrom",
	0x0031: "AskOIDsFrom",
	0x0032: "WaitForPack",
	0x0033: "AskPackOrders",
	0x0034: "NotifyPackSigned",
	0x0035: "NotifyPackCompleted",
	0x0036: "CheckReplicas",
	0x0037: "CheckPartition",
	0x0038: "AskCheckTIDRange",
	0x0039: "AskCheckSerialRange",
	0x003a: "NotifyPartitionCorrupted",
	0x003b: "NotifyReady",
	0x003c: "AskLastTransaction",
	0x003d: "AskCheckCurrentSerial",
	0x003e: "NotifyTransactionFinished",
	0x003f: "Replicate",
	0x0040: "NotifyReplicationDone",
	0x0041: "AskFetchTransactions",
	0x0042: "AskFetchObjects",
	0x0043: "AddTransaction",
	0x0044: "AddObject",
	0x0045: "Truncate",
	0x0046: "FlushLog",
	0x0047: "AskMonitorInformation",
	0x0048: "NotifyMonitorInformation",
	0x0049: "NotifyUpstreamAdmin",
	0x8000: "Error",
	0x8001: "AcceptIdentification",
	0x8002: "Pong",
	0x8004: "AnswerPrimary",
	0x8007: "AnswerRecovery",
	0x8008: "AnswerLastIDs",
	0x8009: "AnswerPartitionTable",
	0x800e: "AnswerUnfinishedTransactions",
	0x800f: "AnswerLockedTransactions",
	0x8010: "AnswerFinalTID",
	0x8012: "AnswerBeginTransaction",
	0x8014: "AnswerTransactionFinished",
	0x8015: "AnswerInformationLocked",
	0x8019: "AnswerNewOIDs",
	0x801b: "AnswerRelockObject",
	0x801c: "AnswerStoreObject",
	0x801e: "AnswerStoreTransaction",
	0x801f: "AnswerVoteTransaction",
	0x8020: "AnswerObject",
	0x8021: "AnswerTIDs",
	0x8022: "AnswerTransactionInformation",
	0x8023: "AnswerObjectHistory",
	0x8024: "AnswerPartitionList",
	0x8025: "AnswerNodeList",
	0x8028: "AnswerTweakPartitionTable",
	0x802e: "AnswerClusterState",
	0x802f: "AnswerObjectUndoSerial",
	0x8030: "AnswerTIDsFrom",
	0x8031: "AnswerOIDsFrom",
	0x8032: "WaitedForPack",
	0x8033: "AnswerPackOrders",
	0x8038: "AnswerCheckTIDRange",
	0x8039: "AnswerCheckSerialRange",
	0x803c: "AnswerLastTransaction",
	0x803d: "AnswerCheckCurrentSerial",
	0x8041: "AnswerFetchTransactions",
	0x8042: "AnswerFetchObjects",
	0x8047: "AnswerMonitorInformation",
}
