package fs1

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/zodbd/zodbd/zodb"
)

// PackDryRun computes what PackFile(ctx, path, at, opt) would do, without
// changing anything: it takes no lock (the file may be in use by a server
// that appends to it; the transactions present when it starts are
// considered) and writes the packed file to an unlinked temporary file in
// path's directory, which disappears when it returns (so it needs the
// packed file's size in free space there, as the pack itself). The stats
// say what the pack would remove (records, transactions, unreachable
// objects, bytes) and DanglingRefs how many references of reachable
// objects point to objects that have no revision at the pack time.
func PackDryRun(ctx context.Context, path string, at zodb.Tid, opt *PackOptions) (PackStats, error) {
	t0 := time.Now()
	if at == 0 {
		return PackStats{}, fmt.Errorf("fs1: pack %s: %w", path, ErrPackTime)
	}
	f, err := os.Open(path)
	if err != nil {
		return PackStats{}, fmt.Errorf("fs1: pack: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return PackStats{}, fmt.Errorf("fs1: pack: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".zodbd-pack-dry-run-*")
	if err != nil {
		return PackStats{}, fmt.Errorf("fs1: pack --dry-run: %w", err)
	}
	os.Remove(tmp.Name())
	defer tmp.Close()
	p := NewPacker(f, path, tmp, at, opt)
	p.out.wb = newWriteBehind(tmp, true)
	err = p.Pack(ctx, fi.Size())
	st := p.Stats()
	st.Duration = time.Since(t0)
	return st, err
}
