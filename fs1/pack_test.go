package fs1

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/zodbd/zodbd/zodb"
)

// copyFixture copies testdata/name into a temporary directory.
func copyFixture(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestPackFixtureMatchesZODBpy packs 1.fs at the time ZODB/py packed it to
// make 1packed.fs: the packed file and its index are byte-identical.
func TestPackFixtureMatchesZODBpy(t *testing.T) {
	var fx map[string]struct {
		PackTime float64 `json:"pack_time"`
		PackTid  string  `json:"pack_tid"`
	}
	b, err := os.ReadFile("testdata/fixtures.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &fx); err != nil {
		t.Fatal(err)
	}
	at := zodb.TidFromUnix(fx["1packed.fs"].PackTime)
	if at.String() != fx["1packed.fs"].PackTid {
		t.Fatalf("pack tid %s, ZODB/py's %s", at, fx["1packed.fs"].PackTid)
	}
	path := copyFixture(t, "1.fs")
	st, err := PackFile(context.Background(), path, at, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%+v", st)
	got, _ := os.ReadFile(path)
	want, _ := os.ReadFile("testdata/1packed.fs")
	if !bytes.Equal(got, want) {
		t.Errorf("packed file differs from 1packed.fs (%d / %d bytes)", len(got), len(want))
	}
	gotIdx, _ := os.ReadFile(path + ".index")
	wantIdx, _ := os.ReadFile("testdata/1packed.fs.index")
	if !bytes.Equal(gotIdx, wantIdx) {
		t.Errorf("index differs from 1packed.fs.index")
	}
	old, _ := os.ReadFile(path + ".old")
	orig, _ := os.ReadFile("testdata/1.fs")
	if !bytes.Equal(old, orig) {
		t.Errorf("%s.old is not the original", path)
	}
}

// memDest is a PackDest in memory.
type memDest struct{ b []byte }

func (m *memDest) WriteAt(p []byte, off int64) (int, error) {
	if end := int(off) + len(p); end > len(m.b) {
		m.b = append(m.b, make([]byte, end-len(m.b))...)
	}
	return copy(m.b[off:], p), nil
}

func (m *memDest) ReadAt(p []byte, off int64) (int, error) {
	if off >= int64(len(m.b)) {
		return 0, io.EOF
	}
	n := copy(p, m.b[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// FuzzPack packs damaged files: damage must be an error (an *Error, with
// an offset), never a panic; a pack that succeeds gives a file that opens
// and whose index is the packer's.
func FuzzPack(f *testing.F) {
	for _, name := range []string{"1", "1packed"} {
		b, err := os.ReadFile(filepath.Join("testdata", name+".fs"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b[:min(len(b), 6000)], uint64(0x03f58e3d0d566cee))
	}
	dir := f.TempDir()
	quiet := &Options{Logf: func(string, ...interface{}) {}}
	f.Fuzz(func(t *testing.T, b []byte, at uint64) {
		if at == 0 {
			at = 1
		}
		for _, gc := range []bool{true, false} {
			var dst memDest
			p := NewPacker(bytes.NewReader(b), "fuzz.fs", &dst, zodb.Tid(at), &PackOptions{NoGC: !gc, Workers: 2, Logf: quiet.Logf})
			if err := p.Pack(context.Background(), int64(len(b))); err != nil {
				var e *Error
				if !errors.As(err, &e) {
					t.Fatalf("error without an offset: %v", err)
				}
				continue
			}
			if !p.Changed() {
				continue
			}
			path := filepath.Join(dir, "packed.fs")
			if err := os.WriteFile(path, dst.b, 0o644); err != nil {
				t.Fatal(err)
			}
			fs, err := Open(path, quiet)
			if err != nil {
				t.Fatalf("packed file does not open: %v", err)
			}
			if !fs.Index().Equal(p.Index()) || fs.End() != p.Size() {
				t.Fatalf("packer's index differs from the packed file's")
			}
			fs.Close()
		}
	})
}
