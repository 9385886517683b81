//go:build unix

package fs1

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"testing"

	"github.com/zodbd/zodbd/zodb"
)

// txnPositions lists the positions and tids of the transactions of the
// FileStorage file b (well formed).
func txnPositions(b []byte) (pos []int64, tids []zodb.Tid) {
	p := int64(HeaderSize)
	for p+TxnHeaderFixSize <= int64(len(b)) {
		h := DecodeTxnHeaderFix(b[p : p+TxnHeaderFixSize])
		pos = append(pos, p)
		tids = append(tids, h.Tid)
		p += int64(h.Len) + 8
	}
	return
}

// TestPackFileDamagedLength: a transaction in the middle of the file
// whose length field is damaged (it points past the end of the file, with
// committed transactions after it) is damage: Open reports it with its
// offset (Scan's tornTail finds that the file's last transaction is a
// committed one). The offline PackFile took it for a torn tail
// (Packer.readTxn with tornOK treated any length past the end, or status
// 'c', as torn, without tornTail), logged "incomplete transaction (torn
// tail)" and put in place a packed Data.fs that ended before it: every
// committed transaction after the damaged header was silently dropped from
// the storage (only Data.fs.old kept them, and the next pack removes it).
// Both now classify a header with checkTxnHeader.
func TestPackFileDamagedLength(t *testing.T) {
	path := copyFixture(t, "1.fs")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pos, tids := txnPositions(b)
	if len(pos) < 6 {
		t.Fatalf("fixture has only %d transactions", len(pos))
	}
	k := len(pos) / 2
	// Damage the length of transaction k: far past the end of the file.
	binary.BigEndian.PutUint64(b[pos[k]+8:], uint64(len(b))*4)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	quiet := func(string, ...interface{}) {}
	// Open reports the damage, with its offset.
	if fs, err := Open(path, &Options{Logf: quiet}); err == nil {
		fs.Close()
		t.Fatalf("Open accepted a file whose transaction at %d has a damaged length", pos[k])
	} else {
		t.Logf("Open: %v", err)
	}
	var logged []string
	logf := func(format string, args ...interface{}) { logged = append(logged, fmt.Sprintf(format, args...)) }
	st, err := PackFile(context.Background(), path, tids[k-1], &PackOptions{NoGC: true, Logf: logf})
	if err != nil {
		t.Logf("PackFile: %v (reported: good)", err)
		return
	}
	after, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, left := txnPositions(after)
	lost := 0
	for _, tid := range tids[k:] {
		found := false
		for _, l := range left {
			found = found || l == tid
		}
		if !found {
			lost++
		}
	}
	if lost > 0 {
		t.Fatalf("PackFile succeeded (torn at %d, log %q) on a file Open refuses as damaged, and the packed Data.fs lost %d committed transactions (the one with the damaged header at %d and %d after it)",
			st.Torn, logged, lost, pos[k], len(tids)-k-1)
	}
}

// TestPackFileAfterPowerLoss: after a power loss, the offline
// PackFile of the file left (before any read-write Open) must accept what
// Open accepts. The tail below is what a power loss leaves of a
// transaction being written when only its last sector (with the redundant
// length) reached the disk and the size change zero-filled the rest (the
// workload of TestPowerLoss produces such files: seed 7789884472663754158,
// crash at 246). Open (Scan's tornTail: the last transaction of the file,
// found from the trailer, starts at the damaged header) recognizes it as
// a torn tail; Packer.readTxn only applied ZODB/py's tornGarbage to a
// length shorter than the header (and nothing to a bad status), so that
// `zodbd pack` of a storage that Open recovers failed, naming it damaged.
func TestPackFileAfterPowerLoss(t *testing.T) {
	path := copyFixture(t, "1.fs")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, tids := txnPositions(b)
	tornPos := int64(len(b))
	const l = 1000
	tail := make([]byte, l+8)
	binary.BigEndian.PutUint64(tail[l:], l)
	if err := os.WriteFile(path, append(b, tail...), 0o644); err != nil {
		t.Fatal(err)
	}
	quiet := func(string, ...interface{}) {}
	fs, err := Open(path, &Options{Logf: quiet})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if got := fs.state.Load().torn; got != tornPos {
		t.Fatalf("Open: torn tail at %d, want %d", got, tornPos)
	}
	fs.Close()
	if _, err := PackFile(context.Background(), path, tids[len(tids)-1], &PackOptions{NoGC: true, Logf: quiet}); err != nil {
		t.Fatalf("Open accepts the file (torn tail at %d), PackFile fails: %v", tornPos, err)
	}
}
