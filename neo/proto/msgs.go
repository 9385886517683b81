// Code methods of every packet type and the generic constructor NewMsg.

package proto

func (*RequestIdentification) Code() uint16        { return CodeRequestIdentification }
func (*Ping) Code() uint16                         { return CodePing }
func (*CloseClient) Code() uint16                  { return CodeCloseClient }
func (*AskPrimary) Code() uint16                   { return CodeAskPrimary }
func (*NotPrimaryMaster) Code() uint16             { return CodeNotPrimaryMaster }
func (*NotifyNodeInformation) Code() uint16        { return CodeNotifyNodeInformation }
func (*AskRecovery) Code() uint16                  { return CodeAskRecovery }
func (*AskLastIDs) Code() uint16                   { return CodeAskLastIDs }
func (*AskPartitionTable) Code() uint16            { return CodeAskPartitionTable }
func (*SendPartitionTable) Code() uint16           { return CodeSendPartitionTable }
func (*NotifyPartitionChanges) Code() uint16       { return CodeNotifyPartitionChanges }
func (*StartOperation) Code() uint16               { return CodeStartOperation }
func (*StopOperation) Code() uint16                { return CodeStopOperation }
func (*AskUnfinishedTransactions) Code() uint16    { return CodeAskUnfinishedTransactions }
func (*AskLockedTransactions) Code() uint16        { return CodeAskLockedTransactions }
func (*AskFinalTID) Code() uint16                  { return CodeAskFinalTID }
func (*ValidateTransaction) Code() uint16          { return CodeValidateTransaction }
func (*AskBeginTransaction) Code() uint16          { return CodeAskBeginTransaction }
func (*FailedVote) Code() uint16                   { return CodeFailedVote }
func (*AskFinishTransaction) Code() uint16         { return CodeAskFinishTransaction }
func (*AskLockInformation) Code() uint16           { return CodeAskLockInformation }
func (*InvalidateObjects) Code() uint16            { return CodeInvalidateObjects }
func (*InvalidatePartitions) Code() uint16         { return CodeInvalidatePartitions }
func (*NotifyUnlockInformation) Code() uint16      { return CodeNotifyUnlockInformation }
func (*AskNewOIDs) Code() uint16                   { return CodeAskNewOIDs }
func (*NotifyDeadlock) Code() uint16               { return CodeNotifyDeadlock }
func (*AskRelockObject) Code() uint16              { return CodeAskRelockObject }
func (*AskStoreObject) Code() uint16               { return CodeAskStoreObject }
func (*AbortTransaction) Code() uint16             { return CodeAbortTransaction }
func (*AskStoreTransaction) Code() uint16          { return CodeAskStoreTransaction }
func (*AskVoteTransaction) Code() uint16           { return CodeAskVoteTransaction }
func (*AskObject) Code() uint16                    { return CodeAskObject }
func (*AskTIDs) Code() uint16                      { return CodeAskTIDs }
func (*AskTransactionInformation) Code() uint16    { return CodeAskTransactionInformation }
func (*AskObjectHistory) Code() uint16             { return CodeAskObjectHistory }
func (*AskPartitionList) Code() uint16             { return CodeAskPartitionList }
func (*AskNodeList) Code() uint16                  { return CodeAskNodeList }
func (*SetNodeState) Code() uint16                 { return CodeSetNodeState }
func (*AddPendingNodes) Code() uint16              { return CodeAddPendingNodes }
func (*TweakPartitionTable) Code() uint16          { return CodeTweakPartitionTable }
func (*SetNumReplicas) Code() uint16               { return CodeSetNumReplicas }
func (*SetClusterState) Code() uint16              { return CodeSetClusterState }
func (*Repair) Code() uint16                       { return CodeRepair }
func (*NotifyRepair) Code() uint16                 { return CodeNotifyRepair }
func (*NotifyClusterInformation) Code() uint16     { return CodeNotifyClusterInformation }
func (*AskClusterState) Code() uint16              { return CodeAskClusterState }
func (*AskObjectUndoSerial) Code() uint16          { return CodeAskObjectUndoSerial }
func (*AskTIDsFrom) Code() uint16                  { return CodeAskTIDsFrom }
func (*AskOIDsFrom) Code() uint16                  { return CodeAskOIDsFrom }
func (*WaitForPack) Code() uint16                  { return CodeWaitForPack }
func (*AskPackOrders) Code() uint16                { return CodeAskPackOrders }
func (*NotifyPackSigned) Code() uint16             { return CodeNotifyPackSigned }
func (*NotifyPackCompleted) Code() uint16          { return CodeNotifyPackCompleted }
func (*CheckReplicas) Code() uint16                { return CodeCheckReplicas }
func (*CheckPartition) Code() uint16               { return CodeCheckPartition }
func (*AskCheckTIDRange) Code() uint16             { return CodeAskCheckTIDRange }
func (*AskCheckSerialRange) Code() uint16          { return CodeAskCheckSerialRange }
func (*NotifyPartitionCorrupted) Code() uint16     { return CodeNotifyPartitionCorrupted }
func (*NotifyReady) Code() uint16                  { return CodeNotifyReady }
func (*AskLastTransaction) Code() uint16           { return CodeAskLastTransaction }
func (*AskCheckCurrentSerial) Code() uint16        { return CodeAskCheckCurrentSerial }
func (*NotifyTransactionFinished) Code() uint16    { return CodeNotifyTransactionFinished }
func (*Replicate) Code() uint16                    { return CodeReplicate }
func (*NotifyReplicationDone) Code() uint16        { return CodeNotifyReplicationDone }
func (*AskFetchTransactions) Code() uint16         { return CodeAskFetchTransactions }
func (*AskFetchObjects) Code() uint16              { return CodeAskFetchObjects }
func (*AddTransaction) Code() uint16               { return CodeAddTransaction }
func (*AddObject) Code() uint16                    { return CodeAddObject }
func (*Truncate) Code() uint16                     { return CodeTruncate }
func (*FlushLog) Code() uint16                     { return CodeFlushLog }
func (*AskMonitorInformation) Code() uint16        { return CodeAskMonitorInformation }
func (*NotifyMonitorInformation) Code() uint16     { return CodeNotifyMonitorInformation }
func (*NotifyUpstreamAdmin) Code() uint16          { return CodeNotifyUpstreamAdmin }
func (*Error) Code() uint16                        { return CodeError }
func (*AcceptIdentification) Code() uint16         { return CodeAcceptIdentification }
func (*Pong) Code() uint16                         { return CodePong }
func (*AnswerPrimary) Code() uint16                { return CodeAnswerPrimary }
func (*AnswerRecovery) Code() uint16               { return CodeAnswerRecovery }
func (*AnswerLastIDs) Code() uint16                { return CodeAnswerLastIDs }
func (*AnswerPartitionTable) Code() uint16         { return CodeAnswerPartitionTable }
func (*AnswerUnfinishedTransactions) Code() uint16 { return CodeAnswerUnfinishedTransactions }
func (*AnswerLockedTransactions) Code() uint16     { return CodeAnswerLockedTransactions }
func (*AnswerFinalTID) Code() uint16               { return CodeAnswerFinalTID }
func (*AnswerBeginTransaction) Code() uint16       { return CodeAnswerBeginTransaction }
func (*AnswerTransactionFinished) Code() uint16    { return CodeAnswerTransactionFinished }
func (*AnswerInformationLocked) Code() uint16      { return CodeAnswerInformationLocked }
func (*AnswerNewOIDs) Code() uint16                { return CodeAnswerNewOIDs }
func (*AnswerRelockObject) Code() uint16           { return CodeAnswerRelockObject }
func (*AnswerStoreObject) Code() uint16            { return CodeAnswerStoreObject }
func (*AnswerStoreTransaction) Code() uint16       { return CodeAnswerStoreTransaction }
func (*AnswerVoteTransaction) Code() uint16        { return CodeAnswerVoteTransaction }
func (*AnswerObject) Code() uint16                 { return CodeAnswerObject }
func (*AnswerTIDs) Code() uint16                   { return CodeAnswerTIDs }
func (*AnswerTransactionInformation) Code() uint16 { return CodeAnswerTransactionInformation }
func (*AnswerObjectHistory) Code() uint16          { return CodeAnswerObjectHistory }
func (*AnswerPartitionList) Code() uint16          { return CodeAnswerPartitionList }
func (*AnswerNodeList) Code() uint16               { return CodeAnswerNodeList }
func (*AnswerTweakPartitionTable) Code() uint16    { return CodeAnswerTweakPartitionTable }
func (*AnswerClusterState) Code() uint16           { return CodeAnswerClusterState }
func (*AnswerObjectUndoSerial) Code() uint16       { return CodeAnswerObjectUndoSerial }
func (*AnswerTIDsFrom) Code() uint16               { return CodeAnswerTIDsFrom }
func (*AnswerOIDsFrom) Code() uint16               { return CodeAnswerOIDsFrom }
func (*WaitedForPack) Code() uint16                { return CodeWaitedForPack }
func (*AnswerPackOrders) Code() uint16             { return CodeAnswerPackOrders }
func (*AnswerCheckTIDRange) Code() uint16          { return CodeAnswerCheckTIDRange }
func (*AnswerCheckSerialRange) Code() uint16       { return CodeAnswerCheckSerialRange }
func (*AnswerLastTransaction) Code() uint16        { return CodeAnswerLastTransaction }
func (*AnswerCheckCurrentSerial) Code() uint16     { return CodeAnswerCheckCurrentSerial }
func (*AnswerFetchTransactions) Code() uint16      { return CodeAnswerFetchTransactions }
func (*AnswerFetchObjects) Code() uint16           { return CodeAnswerFetchObjects }
func (*AnswerMonitorInformation) Code() uint16     { return CodeAnswerMonitorInformation }

// NewMsg returns a fresh zero packet of the given code, or false for an
// unknown code.
func NewMsg(code uint16) (Msg, bool) {
	switch code {
	case CodeRequestIdentification:
		return new(RequestIdentification), true
	case CodePing:
		return new(Ping), true
	case CodeCloseClient:
		return new(CloseClient), true
	case CodeAskPrimary:
		return new(AskPrimary), true
	case CodeNotPrimaryMaster:
		return new(NotPrimaryMaster), true
	case CodeNotifyNodeInformation:
		return new(NotifyNodeInformation), true
	case CodeAskRecovery:
		return new(AskRecovery), true
	case CodeAskLastIDs:
		return new(AskLastIDs), true
	case CodeAskPartitionTable:
		return new(AskPartitionTable), true
	case CodeSendPartitionTable:
		return new(SendPartitionTable), true
	case CodeNotifyPartitionChanges:
		return new(NotifyPartitionChanges), true
	case CodeStartOperation:
		return new(StartOperation), true
	case CodeStopOperation:
		return new(StopOperation), true
	case CodeAskUnfinishedTransactions:
		return new(AskUnfinishedTransactions), true
	case CodeAskLockedTransactions:
		return new(AskLockedTransactions), true
	case CodeAskFinalTID:
		return new(AskFinalTID), true
	case CodeValidateTransaction:
		return new(ValidateTransaction), true
	case CodeAskBeginTransaction:
		return new(AskBeginTransaction), true
	case CodeFailedVote:
		return new(FailedVote), true
	case CodeAskFinishTransaction:
		return new(AskFinishTransaction), true
	case CodeAskLockInformation:
		return new(AskLockInformation), true
	case CodeInvalidateObjects:
		return new(InvalidateObjects), true
	case CodeInvalidatePartitions:
		return new(InvalidatePartitions), true
	case CodeNotifyUnlockInformation:
		return new(NotifyUnlockInformation), true
	case CodeAskNewOIDs:
		return new(AskNewOIDs), true
	case CodeNotifyDeadlock:
		return new(NotifyDeadlock), true
	case CodeAskRelockObject:
		return new(AskRelockObject), true
	case CodeAskStoreObject:
		return new(AskStoreObject), true
	case CodeAbortTransaction:
		return new(AbortTransaction), true
	case CodeAskStoreTransaction:
		return new(AskStoreTransaction), true
	case CodeAskVoteTransaction:
		return new(AskVoteTransaction), true
	case CodeAskObject:
		return new(AskObject), true
	case CodeAskTIDs:
		return new(AskTIDs), true
	case CodeAskTransactionInformation:
		return new(AskTransactionInformation), true
	case CodeAskObjectHistory:
		return new(AskObjectHistory), true
	case CodeAskPartitionList:
		return new(AskPartitionList), true
	case CodeAskNodeList:
		return new(AskNodeList), true
	case CodeSetNodeState:
		return new(SetNodeState), true
	case CodeAddPendingNodes:
		return new(AddPendingNodes), true
	case CodeTweakPartitionTable:
		return new(TweakPartitionTable), true
	case CodeSetNumReplicas:
		return new(SetNumReplicas), true
	case CodeSetClusterState:
		return new(SetClusterState), true
	case CodeRepair:
		return new(Repair), true
	case CodeNotifyRepair:
		return new(NotifyRepair), true
	case CodeNotifyClusterInformation:
		return new(NotifyClusterInformation), true
	case CodeAskClusterState:
		return new(AskClusterState), true
	case CodeAskObjectUndoSerial:
		return new(AskObjectUndoSerial), true
	case CodeAskTIDsFrom:
		return new(AskTIDsFrom), true
	case CodeAskOIDsFrom:
		return new(AskOIDsFrom), true
	case CodeWaitForPack:
		return new(WaitForPack), true
	case CodeAskPackOrders:
		return new(AskPackOrders), true
	case CodeNotifyPackSigned:
		return new(NotifyPackSigned), true
	case CodeNotifyPackCompleted:
		return new(NotifyPackCompleted), true
	case CodeCheckReplicas:
		return new(CheckReplicas), true
	case CodeCheckPartition:
		return new(CheckPartition), true
	case CodeAskCheckTIDRange:
		return new(AskCheckTIDRange), true
	case CodeAskCheckSerialRange:
		return new(AskCheckSerialRange), true
	case CodeNotifyPartitionCorrupted:
		return new(NotifyPartitionCorrupted), true
	case CodeNotifyReady:
		return new(NotifyReady), true
	case CodeAskLastTransaction:
		return new(AskLastTransaction), true
	case CodeAskCheckCurrentSerial:
		return new(AskCheckCurrentSerial), true
	case CodeNotifyTransactionFinished:
		return new(NotifyTransactionFinished), true
	case CodeReplicate:
		return new(Replicate), true
	case CodeNotifyReplicationDone:
		return new(NotifyReplicationDone), true
	case CodeAskFetchTransactions:
		return new(AskFetchTransactions), true
	case CodeAskFetchObjects:
		return new(AskFetchObjects), true
	case CodeAddTransaction:
		return new(AddTransaction), true
	case CodeAddObject:
		return new(AddObject), true
	case CodeTruncate:
		return new(Truncate), true
	case CodeFlushLog:
		return new(FlushLog), true
	case CodeAskMonitorInformation:
		return new(AskMonitorInformation), true
	case CodeNotifyMonitorInformation:
		return new(NotifyMonitorInformation), true
	case CodeNotifyUpstreamAdmin:
		return new(NotifyUpstreamAdmin), true
	case CodeError:
		return new(Error), true
	case CodeAcceptIdentification:
		return new(AcceptIdentification), true
	case CodePong:
		return new(Pong), true
	case CodeAnswerPrimary:
		return new(AnswerPrimary), true
	case CodeAnswerRecovery:
		return new(AnswerRecovery), true
	case CodeAnswerLastIDs:
		return new(AnswerLastIDs), true
	case CodeAnswerPartitionTable:
		return new(AnswerPartitionTable), true
	case CodeAnswerUnfinishedTransactions:
		return new(AnswerUnfinishedTransactions), true
	case CodeAnswerLockedTransactions:
		return new(AnswerLockedTransactions), true
	case CodeAnswerFinalTID:
		return new(AnswerFinalTID), true
	case CodeAnswerBeginTransaction:
		return new(AnswerBeginTransaction), true
	case CodeAnswerTransactionFinished:
		return new(AnswerTransactionFinished), true
	case CodeAnswerInformationLocked:
		return new(AnswerInformationLocked), true
	case CodeAnswerNewOIDs:
		return new(AnswerNewOIDs), true
	case CodeAnswerRelockObject:
		return new(AnswerRelockObject), true
	case CodeAnswerStoreObject:
		return new(AnswerStoreObject), true
	case CodeAnswerStoreTransaction:
		return new(AnswerStoreTransaction), true
	case CodeAnswerVoteTransaction:
		return new(AnswerVoteTransaction), true
	case CodeAnswerObject:
		return new(AnswerObject), true
	case CodeAnswerTIDs:
		return new(AnswerTIDs), true
	case CodeAnswerTransactionInformation:
		return new(AnswerTransactionInformation), true
	case CodeAnswerObjectHistory:
		return new(AnswerObjectHistory), true
	case CodeAnswerPartitionList:
		return new(AnswerPartitionList), true
	case CodeAnswerNodeList:
		return new(AnswerNodeList), true
	case CodeAnswerTweakPartitionTable:
		return new(AnswerTweakPartitionTable), true
	case CodeAnswerClusterState:
		return new(AnswerClusterState), true
	case CodeAnswerObjectUndoSerial:
		return new(AnswerObjectUndoSerial), true
	case CodeAnswerTIDsFrom:
		return new(AnswerTIDsFrom), true
	case CodeAnswerOIDsFrom:
		return new(AnswerOIDsFrom), true
	case CodeWaitedForPack:
		return new(WaitedForPack), true
	case CodeAnswerPackOrders:
		return new(AnswerPackOrders), true
	case CodeAnswerCheckTIDRange:
		return new(AnswerCheckTIDRange), true
	case CodeAnswerCheckSerialRange:
		return new(AnswerCheckSerialRange), true
	case CodeAnswerLastTransaction:
		return new(AnswerLastTransaction), true
	case CodeAnswerCheckCurrentSerial:
		return new(AnswerCheckCurrentSerial), true
	case CodeAnswerFetchTransactions:
		return new(AnswerFetchTransactions), true
	case CodeAnswerFetchObjects:
		return new(AnswerFetchObjects), true
	case CodeAnswerMonitorInformation:
		return new(AnswerMonitorInformation), true
	}
	return nil, false
}

// Compile-time checks that every packet type implements Msg.
var _ = [...]Msg{
	(*RequestIdentification)(nil),
	(*Ping)(nil),
	(*CloseClient)(nil),
	(*AskPrimary)(nil),
	(*NotPrimaryMaster)(nil),
	(*NotifyNodeInformation)(nil),
	(*AskRecovery)(nil),
	(*AskLastIDs)(nil),
	(*AskPartitionTable)(nil),
	(*SendPartitionTable)(nil),
	(*NotifyPartitionChanges)(nil),
	(*StartOperation)(nil),
	(*StopOperation)(nil),
	(*AskUnfinishedTransactions)(nil),
	(*AskLockedTransactions)(nil),
	(*AskFinalTID)(nil),
	(*ValidateTransaction)(nil),
	(*AskBeginTransaction)(nil),
	(*FailedVote)(nil),
	(*AskFinishTransaction)(nil),
	(*AskLockInformation)(nil),
	(*InvalidateObjects)(nil),
	(*InvalidatePartitions)(nil),
	(*NotifyUnlockInformation)(nil),
	(*AskNewOIDs)(nil),
	(*NotifyDeadlock)(nil),
	(*AskRelockObject)(nil),
	(*AskStoreObject)(nil),
	(*AbortTransaction)(nil),
	(*AskStoreTransaction)(nil),
	(*AskVoteTransaction)(nil),
	(*AskObject)(nil),
	(*AskTIDs)(nil),
	(*AskTransactionInformation)(nil),
	(*AskObjectHistory)(nil),
	(*AskPartitionList)(nil),
	(*AskNodeList)(nil),
	(*SetNodeState)(nil),
	(*AddPendingNodes)(nil),
	(*TweakPartitionTable)(nil),
	(*SetNumReplicas)(nil),
	(*SetClusterState)(nil),
	(*Repair)(nil),
	(*NotifyRepair)(nil),
	(*NotifyClusterInformation)(nil),
	(*AskClusterState)(nil),
	(*AskObjectUndoSerial)(nil),
	(*AskTIDsFrom)(nil),
	(*AskOIDsFrom)(nil),
	(*WaitForPack)(nil),
	(*AskPackOrders)(nil),
	(*NotifyPackSigned)(nil),
	(*NotifyPackCompleted)(nil),
	(*CheckReplicas)(nil),
	(*CheckPartition)(nil),
	(*AskCheckTIDRange)(nil),
	(*AskCheckSerialRange)(nil),
	(*NotifyPartitionCorrupted)(nil),
	(*NotifyReady)(nil),
	(*AskLastTransaction)(nil),
	(*AskCheckCurrentSerial)(nil),
	(*NotifyTransactionFinished)(nil),
	(*Replicate)(nil),
	(*NotifyReplicationDone)(nil),
	(*AskFetchTransactions)(nil),
	(*AskFetchObjects)(nil),
	(*AddTransaction)(nil),
	(*AddObject)(nil),
	(*Truncate)(nil),
	(*FlushLog)(nil),
	(*AskMonitorInformation)(nil),
	(*NotifyMonitorInformation)(nil),
	(*NotifyUpstreamAdmin)(nil),
	(*Error)(nil),
	(*AcceptIdentification)(nil),
	(*Pong)(nil),
	(*AnswerPrimary)(nil),
	(*AnswerRecovery)(nil),
	(*AnswerLastIDs)(nil),
	(*AnswerPartitionTable)(nil),
	(*AnswerUnfinishedTransactions)(nil),
	(*AnswerLockedTransactions)(nil),
	(*AnswerFinalTID)(nil),
	(*AnswerBeginTransaction)(nil),
	(*AnswerTransactionFinished)(nil),
	(*AnswerInformationLocked)(nil),
	(*AnswerNewOIDs)(nil),
	(*AnswerRelockObject)(nil),
	(*AnswerStoreObject)(nil),
	(*AnswerStoreTransaction)(nil),
	(*AnswerVoteTransaction)(nil),
	(*AnswerObject)(nil),
	(*AnswerTIDs)(nil),
	(*AnswerTransactionInformation)(nil),
	(*AnswerObjectHistory)(nil),
	(*AnswerPartitionList)(nil),
	(*AnswerNodeList)(nil),
	(*AnswerTweakPartitionTable)(nil),
	(*AnswerClusterState)(nil),
	(*AnswerObjectUndoSerial)(nil),
	(*AnswerTIDsFrom)(nil),
	(*AnswerOIDsFrom)(nil),
	(*WaitedForPack)(nil),
	(*AnswerPackOrders)(nil),
	(*AnswerCheckTIDRange)(nil),
	(*AnswerCheckSerialRange)(nil),
	(*AnswerLastTransaction)(nil),
	(*AnswerCheckCurrentSerial)(nil),
	(*AnswerFetchTransactions)(nil),
	(*AnswerFetchObjects)(nil),
	(*AnswerMonitorInformation)(nil),
}
