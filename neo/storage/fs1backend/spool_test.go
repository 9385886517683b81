package fs1backend

import "testing"

// TestVotedSpooled runs the Writer tests with every voted byte in its
// spool's file: Lock reads the records back from it.
func TestVotedSpooled(t *testing.T) {
	defer func(old int) { votedSpoolMem = old }(votedSpoolMem)
	votedSpoolMem = -1
	for name, test := range map[string]func(*testing.T){
		"Commit":              TestFS1WriterCommit,
		"Abort":               TestFS1WriterAbort,
		"Crash":               TestFS1WriterCrash,
		"Undo":                TestFS1WriterUndo,
		"Pack":                TestFS1WriterPack,
		"ReadersDuringCommit": TestFS1WriterReadersDuringCommits,
	} {
		t.Run(name, test)
	}
}
