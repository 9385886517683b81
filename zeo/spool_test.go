package zeo

import "testing"

// TestSpooledTransactions runs the tests of commits, conflicts, undo and
// blobs with every transaction's data in its spool's file (none kept in
// memory): the server reads it back for the vote, the conflict replies and
// the conflict figures.
func TestSpooledTransactions(t *testing.T) {
	old := txnSpoolMem
	txnSpoolMem = -1
	defer func() { txnSpoolMem = old }()
	for name, f := range map[string]func(*testing.T){
		"VoteConflicts":             TestVoteConflicts,
		"VoteResolvedInServer":      TestVoteResolvedInServer,
		"InvalidationBeforeCurrent": TestInvalidationBeforeCurrentData,
		"BlobStoreAndSend":          TestBlobStoreAndSend,
		"BlobAbortRemovesFiles":     TestBlobAbortRemovesFiles,
		"BlobUndo":                  TestBlobUndo,
		"BlobWrappedStorage":        TestBlobWrappedStorage,
	} {
		t.Run(name, f)
	}
}
