package storage_test

import (
	"testing"
)

// TestReplayReplicationSource plays NEO/py's run repl (testdata/neo
// README) up to the replica check, against our node as S1 on a new SQLite
// database: the master's session with S1 (c00: identification, recovery,
// the commits' lock and unlock, S2's arrival, the cells S2 gets), the
// clients' sessions with S1 (c05: T1..T5 and their reads; c07: the second
// client; c16: T6, committed once S2 had replicated), and S2's own session
// with S1 (c12), in capture order. In c12 S2 fetches the transactions then
// the objects of partitions 0 and 1 (AddTransaction and AddObject
// notifications with the request's msg_id, then the answer), and later
// (neoctl check 0: 1:) asks the tid and serial range checksums of both. Every
// packet our node sends must equal NEO/py's S1's byte for byte, but
// RequestIdentification (the node's own port; see replayWriteRun). No field
// differs legitimately in this run: the known lists S2 sends are empty, so
// the order of tids_to_delete and of the remaining known records (NEO/py's
// Python set order; ours is the order asked) does not show.
//
// FileStorage is not replayed: the run has 2 partitions, and an fs1backend.Backend
// serves a table of one (the Go tests below compare both backends).
func TestReplayReplicationSource(t *testing.T) {
	c12 := loadCaptured(t, "repl", "c12-storage-storage")
	until := c12.Packets[len(c12.Packets)-1].T
	// The capture holds what the test is about.
	seen := map[string]int{}
	for _, p := range c12.Packets {
		seen[p.Name]++
	}
	for name, n := range map[string]int{"AskFetchTransactions": 2, "AddTransaction": 6, "AnswerFetchTransactions": 2,
		"AskFetchObjects": 2, "AddObject": 10, "AnswerFetchObjects": 2,
		"AnswerCheckTIDRange": 2, "AnswerCheckSerialRange": 2} {
		if seen[name] != n {
			t.Fatalf("capture c12: %d %s, want %d", seen[name], name, n)
		}
	}

	be := newSQLiteBackend(t)
	replayRunUntil(t, "repl", []string{"c00-storage-master", "c05-client-storage", "c07-client-storage",
		"c16-client-storage", "c12-storage-storage"}, be, until)
}
