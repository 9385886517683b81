package fs1

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// TestPackWriteBehind packs a synthetic file of ~48 MiB (a packed file of
// several write-behind chunks) with the page-cache hints of an offline
// pack (write-behind dropping the written pages, the source dropped as
// the copy goes) and without any: the packed files are the same bytes,
// and on Linux the write-behind went through the file (it waited for all
// but the last chunks) instead of turning itself off.
func TestPackWriteBehind(t *testing.T) {
	if testing.Short() {
		t.Skip("writes ~100 MiB")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "s.fs")
	at := writePackSynthetic(t, src, 48<<20)
	pack := func(name string, hints bool) ([]byte, *Packer) {
		f, err := os.Open(src)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		st, _ := f.Stat()
		dst, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		defer dst.Close()
		p := NewPacker(f, src, dst, at, nil)
		if hints {
			p.out.wb = newWriteBehind(dst, true)
			p.dropSrc = f
		}
		if err := p.Pack(context.Background(), st.Size()); err != nil {
			t.Fatal(err)
		}
		if !p.Changed() {
			t.Fatal("nothing packed")
		}
		b, err := os.ReadFile(dst.Name())
		if err != nil {
			t.Fatal(err)
		}
		return b, p
	}
	want, _ := pack("plain.fs", false)
	got, p := pack("hinted.fs", true)
	if !bytes.Equal(got, want) {
		t.Fatalf("packed with the hints: %d bytes, differs from the pack without (%d bytes)", len(got), len(want))
	}
	wb := p.out.wb
	t.Logf("packed %d bytes; write-behind waited for [0, %d), started [0, %d); source dropped up to %d", len(got), wb.waited, wb.started, p.srcDropped)
	if runtime.GOOS == "linux" {
		if wb.off || wb.waited < int64(len(got))-3*writeBehindChunk || p.srcDropped == 0 {
			t.Errorf("write-behind off=%v waited for %d of %d bytes; source dropped up to %d", wb.off, wb.waited, len(got), p.srcDropped)
		}
	}
}
