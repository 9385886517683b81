package zlibstorage_test

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/zlibstorage"
	"github.com/zodbd/zodbd/zodb"
)

var _ zlibstorage.Base = (*fs1.FileStorage)(nil)

var _ zlibstorage.Base = (*zlibstorage.Storage)(nil)

// TestMethods checks that the wrapper has every method of a FileStorage
// but those that expose fs1's internals: a server that looks for an
// optional interface on a FileStorage finds it on the wrapper too.
func TestMethods(t *testing.T) {
	fs1Only := map[string]bool{
		"CountTxn": true, "NumTxn": true, "TornPos": true, // statistics of the file (zodbd info)
		"File": true, "Index": true, "LoadRevision": true, "PackStats": true, // fs1 types, raw records
		"View":  true, // fs1's index and file end (the NEO node's FileStorage backend)
		"Stats": true, // fs1's figures for metrics: read on the FileStorage itself (cmd/zodbd/metrics.go)
	}
	w := reflect.TypeOf((*zlibstorage.Storage)(nil))
	f := reflect.TypeOf((*fs1.FileStorage)(nil))
	for i := 0; i < f.NumMethod(); i++ {
		m := f.Method(i)
		if fs1Only[m.Name] {
			continue
		}
		wm, ok := w.MethodByName(m.Name)
		if !ok {
			t.Errorf("zlibstorage.Storage has no method %s (fs1.FileStorage has: %v)", m.Name, m.Type)
			continue
		}
		if wm.Type.NumIn() != m.Type.NumIn() || wm.Type.NumOut() != m.Type.NumOut() {
			t.Errorf("%s: %v, fs1's is %v", m.Name, wm.Type, m.Type)
		}
	}
}

func TestCompress(t *testing.T) {
	long := []byte(strings.Repeat("persistent data ", 40))
	random := make([]byte, 300)
	x := uint64(88172645463325252)
	for i := range random {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		random[i] = byte(x)
	}
	for _, tc := range []struct {
		name       string
		data       []byte
		compressed bool
	}{
		{"empty", nil, false},
		{"20 bytes", []byte(strings.Repeat("a", 20)), false},
		{"21 bytes", []byte(strings.Repeat("a", 21)), true},
		{"compressible", long, true},
		{"incompressible", random, false},
		{"already compressed", zlibstorage.AppendCompress(nil, long), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := []byte("keep")
			c := zlibstorage.AppendCompress(append([]byte(nil), prefix...), tc.data)
			if !bytes.HasPrefix(c, prefix) {
				t.Fatalf("dst's bytes lost: %q", c)
			}
			c = c[len(prefix):]
			if got := zlibstorage.Compressed(c) && !zlibstorage.Compressed(tc.data); got != tc.compressed {
				t.Fatalf("compressed %v, want %v (%d -> %d bytes)", got, tc.compressed, len(tc.data), len(c))
			}
			if !tc.compressed && !bytes.Equal(c, tc.data) {
				t.Fatalf("stored %q, want the data as it is", c)
			}
			if tc.compressed && len(c) >= len(tc.data) {
				t.Fatalf("compressed to %d bytes from %d", len(c), len(tc.data))
			}
			want := tc.data
			if zlibstorage.Compressed(tc.data) {
				want = long // the already compressed record decompresses to long
			}
			d, err := zlibstorage.AppendDecompress(nil, c)
			if err != nil || !bytes.Equal(d, want) {
				t.Fatalf("AppendDecompress = %q, %v", d, err)
			}
		})
	}
	c := zlibstorage.AppendCompress(nil, long)
	for name, bad := range map[string][]byte{
		"truncated":    c[:len(c)-5],
		"bad checksum": append(append([]byte(nil), c[:len(c)-1]...), c[len(c)-1]^0xff),
		"not zlib":     []byte(".zoops, not zlib at all"),
	} {
		if d, err := zlibstorage.AppendDecompress(nil, bad); err == nil {
			t.Errorf("%s: AppendDecompress = %q, want an error", name, d)
		}
	}
}

// TestStorage commits through the wrapper to a FileStorage: the file holds
// compressed records, the wrapper's loads, loadBefore, iteration and
// history read plain data; with compress false, new records are stored
// plain and old compressed ones still read plain.
func TestStorage(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "Data.fs")
	fs, err := fs1.Open(path, &fs1.Options{ReadWrite: true, Create: true})
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	s := zlibstorage.Wrap(fs, true)

	commit := func(s zodb.WriteStorage, oid zodb.Oid, serial zodb.Tid, data []byte) zodb.Tid {
		t.Helper()
		return commitOne(t, s, oid, serial, data)
	}
	v1 := []byte(strings.Repeat("first revision ", 30))
	v2 := []byte(strings.Repeat("second revision ", 30))
	short := []byte("tiny")
	t1 := commit(s, 0, 0, v1)
	t2 := commit(s, 0, t1, v2)
	t3 := commit(s, 1, 0, short)
	plain := zlibstorage.Wrap(fs, false)
	v3 := []byte(strings.Repeat("stored plain ", 30))
	t4 := commit(plain, 0, t2, v3)

	raw := func(oid zodb.Oid, at zodb.Tid) []byte {
		d, _, err := fs.Load(ctx, zodb.Xid{Oid: oid, At: at})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if !zlibstorage.Compressed(raw(0, t1)) || !zlibstorage.Compressed(raw(0, t2)) {
		t.Errorf("records not compressed in the file")
	}
	if !bytes.Equal(raw(1, t3), short) || !bytes.Equal(raw(0, t4), v3) {
		t.Errorf("short data, or data stored with compress false, compressed in the file")
	}

	for _, w := range []*zlibstorage.Storage{s, plain} {
		for _, tc := range []struct {
			oid  zodb.Oid
			at   zodb.Tid
			want []byte
		}{{0, t1, v1}, {0, t2, v2}, {0, t3, v2}, {1, t3, short}, {0, t4, v3}} {
			d, serial, err := w.Load(ctx, zodb.Xid{Oid: tc.oid, At: tc.at})
			if err != nil || !bytes.Equal(d, tc.want) || serial > tc.at {
				t.Errorf("Load(%v@%v) = %q %v %v", tc.oid, tc.at, d, serial, err)
			}
			d, serial2, err := w.LoadAppend(ctx, zodb.Xid{Oid: tc.oid, At: tc.at}, []byte("x"))
			if err != nil || !bytes.Equal(d, append([]byte("x"), tc.want...)) || serial2 != serial {
				t.Errorf("LoadAppend(%v@%v) = %q %v %v", tc.oid, tc.at, d, serial2, err)
			}
		}
		d, serial, next, err := w.LoadBefore(ctx, 0, t2, nil)
		if err != nil || !bytes.Equal(d, v1) || serial != t1 || next != t2 {
			t.Errorf("LoadBefore(0, t2) = %q %v %v %v", d, serial, next, err)
		}
	}

	var got [][]byte
	it := s.Iterate(ctx, 0, zodb.TidMax)
	for {
		_, di, err := it.NextTxn(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		for {
			d, err := di.NextData(ctx)
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, append([]byte(nil), d.Data...))
		}
	}
	if want := [][]byte{v1, v2, short, v3}; len(got) != len(want) || !bytes.Equal(got[0], v1) || !bytes.Equal(got[1], v2) || !bytes.Equal(got[2], short) || !bytes.Equal(got[3], v3) {
		t.Errorf("iteration: %q", got)
	}

	h, err := s.History(ctx, 0, 10)
	if err != nil || len(h) != 3 || h[0].Size != len(v3) || h[1].Size != len(raw(0, t2)) {
		t.Errorf("History: %+v %v (sizes are of the stored records)", h, err)
	}
	if s.Len() != fs.Len() || s.End() != fs.End() {
		t.Errorf("Len, End: %d %d, want %d %d", s.Len(), s.End(), fs.Len(), fs.End())
	}

	// A damaged compressed record (stored through the base) is an error,
	// not data.
	t5 := commit(fs, 2, 0, []byte(".z this is not zlib data"))
	if d, _, err := s.Load(ctx, zodb.Xid{Oid: 2, At: t5}); err == nil {
		t.Errorf("Load of a damaged record = %q, want an error", d)
	}
}
