package crashfs

import (
	"math/rand"
	"os"
	"path/filepath"
	"testing"
)

// Point is one crash point of a power-loss test: a scratch directory whose
// src subdirectory the workload writes through FS, and into whose after
// subdirectory Materialize puts what the power loss left.
type Point struct {
	FS  *FS
	Dir string // the scratch directory (Remove deletes it)
	Src string // Dir/src, FS's root
}

// NewPoint makes a new scratch directory under base and an FS over its
// src, which crashes at its crashAt-th operation (crashAt <= 0: never, until
// Crash). It fails tb if the directories cannot be made.
func NewPoint(tb testing.TB, base string, crashAt int) *Point {
	tb.Helper()
	dir, err := os.MkdirTemp(base, "pl")
	if err != nil {
		tb.Fatal(err)
	}
	src := filepath.Join(dir, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		tb.Fatal(err)
	}
	fs, err := New(src)
	if err != nil {
		tb.Fatal(err)
	}
	if crashAt > 0 {
		fs.CrashAt(crashAt)
	}
	return &Point{FS: fs, Dir: dir, Src: src}
}

// Materialize writes what the disk holds after the crash into Dir/after
// and returns that directory: exactly what was synced, or, torn, also a
// random part of the unsynced sectors (from a generator seeded with seed,
// so that a failure replays). The FS must have crashed (Crash).
func (p *Point) Materialize(tb testing.TB, seed int64, torn bool) string {
	tb.Helper()
	after := filepath.Join(p.Dir, "after")
	var rng *rand.Rand
	if torn {
		rng = rand.New(rand.NewSource(seed))
	}
	if err := p.FS.Materialize(after, rng); err != nil {
		tb.Fatal(err)
	}
	return after
}

// Remove deletes the scratch directory.
func (p *Point) Remove() { os.RemoveAll(p.Dir) }
