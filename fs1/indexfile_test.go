package fs1

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	pickle "github.com/kisielk/og-rek"

	"github.com/zodbd/zodbd/zodb"
)

var ixFixtures = []string{"1", "1packed", "empty", "torn"}

// ixExpect derives, from testdata/NAME.expect.json, the index ZODB/py has
// for the fixture (the position of the last record of every oid) and the
// position it covers up to (getSize).
func ixExpect(t testing.TB, name string) (*Index, int64, int64) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name+".expect.json"))
	if err != nil {
		t.Fatal(err)
	}
	var e struct {
		FileSize int64 `json:"file_size"`
		GetSize  int64 `json:"getSize"`
		Txns     []struct {
			Status  string `json:"status"`
			Records []struct {
				Oid string `json:"oid"`
				Pos int64  `json:"pos"`
			} `json:"records"`
		} `json:"txns"`
	}
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatal(err)
	}
	idx := NewIndex(0)
	for _, txn := range e.Txns {
		if txn.Status == "u" {
			continue
		}
		for _, r := range txn.Records {
			oid, err := zodb.ParseOid(r.Oid)
			if err != nil {
				t.Fatal(err)
			}
			idx.Set(oid, r.Pos)
		}
	}
	return idx, e.GetSize, e.FileSize
}

func ixDiff(got, want *Index) string {
	var d []string
	for _, oid := range want.Oids() {
		w, _ := want.Get(oid)
		if g, ok := got.Get(oid); !ok {
			d = append(d, fmt.Sprintf("%s: missing, want %d", oid, w))
		} else if g != w {
			d = append(d, fmt.Sprintf("%s: %d, want %d", oid, g, w))
		}
	}
	for _, oid := range got.Oids() {
		if _, ok := want.Get(oid); !ok {
			g, _ := got.Get(oid)
			d = append(d, fmt.Sprintf("%s: %d, want absent", oid, g))
		}
	}
	return strings.Join(d, "\n")
}

func TestLoadIndexFileFixtures(t *testing.T) {
	for _, name := range ixFixtures {
		t.Run(name, func(t *testing.T) {
			want, wantPos, _ := ixExpect(t, name)
			pos, idx, err := LoadIndexFile(filepath.Join("testdata", name+".fs.index"))
			if err != nil {
				t.Fatal(err)
			}
			if pos != wantPos {
				t.Errorf("topPos = %d, want %d", pos, wantPos)
			}
			if !idx.Equal(want) {
				t.Errorf("index differs from expect.json:\n%s", ixDiff(idx, want))
			}
			if idx.MaxOid() != want.MaxOid() {
				t.Errorf("MaxOid = %s, want %s", idx.MaxOid(), want.MaxOid())
			}
		})
	}
}

// SaveFile writes exactly the bytes ZODB/py wrote for the same index.
func TestSaveFileMatchesZODBpy(t *testing.T) {
	dir := t.TempDir()
	for _, name := range ixFixtures {
		t.Run(name, func(t *testing.T) {
			zpy, err := os.ReadFile(filepath.Join("testdata", name+".fs.index"))
			if err != nil {
				t.Fatal(err)
			}
			// From the index derived independently of the .index file.
			want, pos, _ := ixExpect(t, name)
			path := filepath.Join(dir, name+".fs.index")
			if err := want.SaveFile(path, pos); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, zpy) {
				t.Errorf("SaveFile output (%d bytes) differs from ZODB/py's (%d bytes)\n got %x\nwant %x", len(got), len(zpy), got[:min(len(got), 64)], zpy[:min(len(zpy), 64)])
			}
			pos2, idx2, err := LoadIndexFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if pos2 != pos || !idx2.Equal(want) {
				t.Errorf("round trip: pos %d (want %d), diff:\n%s", pos2, pos, ixDiff(idx2, want))
			}
		})
	}
	// No temporary files are left behind.
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".fs.index") {
			t.Errorf("stray file %s", e.Name())
		}
	}
}

// synthIndex returns an index with n oids spread over several prefixes,
// with positions up to beyond 32 bits.
func synthIndex(n int) *Index {
	idx := NewIndex(n)
	oid := zodb.Oid(0)
	for i := 0; i < n; i++ {
		switch i % 1000 {
		case 999:
			oid += 1 << 16 // start a new bucket now and then
		case 500:
			oid += 1 << 40
		default:
			oid += zodb.Oid(1 + i%3)
		}
		idx.Set(oid, int64(4+i)*1234567)
	}
	return idx
}

func TestSaveLoadRoundTrip(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		n   int
		pos int64
	}{
		{0, 4}, {1, 100}, {10, 255}, {100, 65535}, {1000, 65536},
		{5000, 1<<31 - 1}, {5000, 1 << 31}, {5000, 1<<32 - 1}, {5000, 1 << 32},
		{70000, 1 << 40}, {1, 1<<48 - 1},
	} {
		idx := synthIndex(tc.n)
		pos := max(tc.pos, int64(4+tc.n)*1234567+1)
		if tc.n <= 1 {
			idx = NewIndex(0)
			if tc.n == 1 {
				idx.Set(0, 4)
			}
			pos = tc.pos
		}
		path := filepath.Join(dir, "Data.fs.index")
		if err := idx.SaveFile(path, pos); err != nil {
			t.Fatal(err)
		}
		gotPos, got, err := LoadIndexFile(path)
		if err != nil {
			t.Fatalf("n=%d pos=%d: %v", tc.n, pos, err)
		}
		if gotPos != pos {
			t.Errorf("n=%d: pos %d, want %d", tc.n, gotPos, pos)
		}
		if !got.Equal(idx) || got.MaxOid() != idx.MaxOid() {
			t.Errorf("n=%d: round trip differs:\n%s", tc.n, ixDiff(got, idx))
		}
	}
}

// The position pickle is what Python 3's pickle writes (protocol 3),
// including LONG1 for positions beyond 31 bits.
func TestIndexPosPickle(t *testing.T) {
	for _, tc := range []struct {
		pos  int64
		want string // pickle.dumps(pos, 3).hex() in Python 3
	}{
		{0, "80034b002e"},
		{100, "80034b642e"},
		{255, "80034bff2e"},
		{256, "80034d00012e"},
		{65535, "80034dffff2e"},
		{65536, "80034a000001002e"},
		{2147483647, "80034affffff7f2e"},
		{2147483648, "80038a0500000080002e"},
		{4294967295, "80038a05ffffffff002e"},
		{4294967296, "80038a0500000000012e"},
		{1099511627776, "80038a060000000000012e"},
		{140737488355328, "80038a07000000000080002e"},
		{281474976710655, "80038a07ffffffffffff002e"},
	} {
		var buf bytes.Buffer
		if err := NewIndex(0).writeIndex(&buf, tc.pos); err != nil {
			t.Fatal(err)
		}
		got := hex.EncodeToString(buf.Bytes())
		want := tc.want + "80034e2e" // followed by the None pickle
		if got != want {
			t.Errorf("pos %d: got %s, want %s", tc.pos, got, want)
		}
		pos, _, err := loadIndex(bytes.NewReader(buf.Bytes()), "x", -1, -1)
		if err != nil || pos != tc.pos {
			t.Errorf("pos %d: loaded %d, %v", tc.pos, pos, err)
		}
	}
}

// py2Index encodes idx the way ZODB/py on Python 2 wrote it: pickle protocol
// proto, the position a Python int, prefix and bucket Python 2 str.
func py2Index(t testing.TB, idx *Index, pos int64, proto int) []byte {
	t.Helper()
	var py3 bytes.Buffer
	if err := idx.writeIndex(&py3, pos); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	enc := pickle.NewEncoderWithConfig(&out, &pickle.EncoderConfig{Protocol: proto})
	d := pickle.NewDecoder(bytes.NewReader(py3.Bytes()))
	for {
		v, err := d.Decode()
		if err != nil {
			t.Fatal(err)
		}
		if tu, ok := v.(pickle.Tuple); ok {
			// Go strings encode as py2 str (STRING/BINSTRING) at protocol <= 2.
			v = pickle.Tuple{string(tu[0].(pickle.Bytes)), string(tu[1].(pickle.Bytes))}
		}
		if err := enc.Encode(v); err != nil {
			t.Fatal(err)
		}
		if _, ok := v.(pickle.None); ok {
			return out.Bytes()
		}
	}
}

func TestLoadIndexFilePy2(t *testing.T) {
	dir := t.TempDir()
	for _, name := range []string{"1", "1packed"} {
		want, pos, _ := ixExpect(t, name)
		for _, proto := range []int{0, 1, 2} {
			b := py2Index(t, want, pos, proto)
			if proto == 1 && !bytes.Contains(b, []byte{'(', 'U', 6, 0, 0, 0, 0, 0, 0}) {
				t.Fatalf("py2 protocol 1 encoding is not MARK SHORT_BINSTRING: %x", b[:20])
			}
			path := filepath.Join(dir, fmt.Sprintf("%s-p%d.fs.index", name, proto))
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}
			gotPos, got, err := LoadIndexFile(path)
			if err != nil {
				t.Fatalf("%s protocol %d: %v", name, proto, err)
			}
			if gotPos != pos || !got.Equal(want) {
				t.Errorf("%s protocol %d: pos %d (want %d), diff:\n%s", name, proto, gotPos, pos, ixDiff(got, want))
			}
		}
	}

	// Python 2's cPickle without "fast" memoizes (BINPUT), and writes
	// positions beyond 32 bits as INT text; a bucket > 255 bytes is BINSTRING.
	bucket := make([]byte, 40*8)
	for i := 0; i < 40; i++ {
		bucket[2*i+1] = byte(i)
		p := bucket[80+6*i:]
		p[1], p[5] = 1, byte(i) // 1<<32 + i
	}
	var b []byte
	b = append(b, "I5000000000\n."...)
	b = append(b, "(U\x06\x00\x00\x00\x00\x00\x07q\x01T"...)
	b = append(b, 0x40, 0x01, 0, 0)
	b = append(b, bucket...)
	b = append(b, "q\x02tq\x03.N."...)
	pos, idx, err := loadIndex(bytes.NewReader(b), "py2memo", -1, -1)
	if err != nil {
		t.Fatal(err)
	}
	if pos != 5000000000 || idx.Len() != 40 {
		t.Fatalf("pos %d, len %d", pos, idx.Len())
	}
	if p, ok := idx.Get(0x7_0027); !ok || p != 1<<32+39 {
		t.Errorf("oid 70027: %d %v", p, ok)
	}
}

func TestLoadIndexFileErrors(t *testing.T) {
	good, err := os.ReadFile(filepath.Join("testdata", "1.fs.index"))
	if err != nil {
		t.Fatal(err)
	}
	enc := func(vs ...interface{}) []byte {
		var buf bytes.Buffer
		e := pickle.NewEncoderWithConfig(&buf, &pickle.EncoderConfig{Protocol: 3})
		for _, v := range vs {
			if err := e.Encode(v); err != nil {
				t.Fatal(err)
			}
		}
		return buf.Bytes()
	}
	prefix := pickle.Bytes("\x00\x00\x00\x00\x00\x00")
	bucket := pickle.Bytes("\x00\x01\x00\x00\x00\x00\x01\x00") // oid 1 at 256
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "empty file"},
		{"not a pickle", []byte("hello world"), "pickle 1"},
		{"old format", enc(map[interface{}]interface{}{"pos": int64(1000), "index": map[interface{}]interface{}{}}), "old-format"},
		{"pos is str", enc("1000"), "want the position"},
		{"negative pos", enc(int64(-1)), "out of range"},
		{"no end marker", enc(int64(1000), pickle.Tuple{prefix, bucket}), "truncated"},
		{"not a tuple", enc(int64(1000), pickle.Bytes("x"), pickle.None{}), "want a (prefix, bucket) tuple"},
		{"3-tuple", enc(int64(1000), pickle.Tuple{prefix, bucket, bucket}, pickle.None{}), "want a (prefix, bucket) tuple"},
		{"unicode", enc(int64(1000), pickle.Tuple{"\x00\x00\x00\x00\x00\x00", bucket}, pickle.None{}), "tuple of bytes"},
		{"short prefix", enc(int64(1000), pickle.Tuple{prefix[:5], bucket}, pickle.None{}), "prefix of 5 bytes"},
		{"bad bucket", enc(int64(1000), pickle.Tuple{prefix, bucket[:7]}, pickle.None{}), "not a multiple of 8"},
		{"pos beyond top", enc(int64(256), pickle.Tuple{prefix, bucket}, pickle.None{}), "outside the data"},
		{"pos before header", enc(int64(1000), pickle.Tuple{prefix, pickle.Bytes("\x00\x01\x00\x00\x00\x00\x00\x03")}, pickle.None{}), "outside the data"},
		{"truncated fixture", good[:len(good)-3], "pickle"},
		{"garbage in bucket", append(append([]byte{}, good[:20]...), 0xff, 0xff), "pickle 2"},
	} {
		path := filepath.Join(t.TempDir(), "Data.fs.index")
		if err := os.WriteFile(path, tc.data, 0o644); err != nil {
			t.Fatal(err)
		}
		_, _, err := LoadIndexFile(path)
		t.Logf("%s: %v", tc.name, err)
		if err == nil {
			t.Errorf("%s: no error", tc.name)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: error %q, want it to name the file and say %q", tc.name, err, tc.want)
		}
		var ie *IndexFileError
		if !errors.As(err, &ie) {
			t.Errorf("%s: error %T is not an *IndexFileError", tc.name, err)
		}
		if tc.name == "old format" && !errors.Is(err, ErrIndexOldFormat) {
			t.Errorf("old format: error does not wrap ErrIndexOldFormat")
		}
	}
	// Every truncation of a good file is an error.
	for n := 0; n < len(good); n++ {
		if _, _, err := loadIndex(bytes.NewReader(good[:n]), "trunc", int64(n), -1); err == nil {
			t.Errorf("truncated to %d bytes: no error", n)
		}
	}
	if _, _, err := LoadIndexFile(filepath.Join(t.TempDir(), "missing.index")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

func TestSaveFileErrors(t *testing.T) {
	idx := NewIndex(0)
	idx.Set(1, 1<<48)
	dir := t.TempDir()
	path := filepath.Join(dir, "Data.fs.index")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := idx.SaveFile(path, 1<<48-1); err == nil {
		t.Error("position beyond 48 bits: no error")
	}
	if err := NewIndex(0).SaveFile(path, 1<<48); err == nil {
		t.Error("topPos beyond 48 bits: no error")
	}
	// A failed save leaves the old file and no temporary file.
	if b, _ := os.ReadFile(path); string(b) != "old" {
		t.Errorf("old index replaced by %q", b)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("%d files in dir, want 1", len(ents))
	}
	if err := NewIndex(0).SaveFile(filepath.Join(dir, "nodir", "x.index"), 4); err == nil {
		t.Error("save into missing dir: no error")
	}
}

func TestCheckIndex(t *testing.T) {
	open := func(name string) (*os.File, int64) {
		f, err := os.Open(filepath.Join("testdata", name+".fs"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		st, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		return f, st.Size()
	}
	// The fixtures' own index files are usable, except empty.fs's (it
	// covers only the magic; ZODB/py ignores it too).
	for _, name := range ixFixtures {
		f, size := open(name)
		pos, idx, err := LoadIndexFile(filepath.Join("testdata", name+".fs.index"))
		if err != nil {
			t.Fatal(err)
		}
		err = CheckIndex(f, f.Name(), idx, pos, size)
		if name == "empty" {
			if err == nil || !strings.Contains(err.Error(), "less than 100 bytes") {
				t.Errorf("empty: %v", err)
			}
		} else if err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}

	f, size := open("1")
	want, top, _ := ixExpect(t, "1")
	clone := func() *Index {
		c := NewIndex(want.Len())
		for _, oid := range want.Oids() {
			p, _ := want.Get(oid)
			c.Set(oid, p)
		}
		return c
	}
	// The last transaction of 1.fs (at 229576) writes oids 7, 5 and 1.
	const lastTxn = 229576
	wrongPos := clone()
	wrongPos.Set(5, 1234)
	missing := NewIndex(0)
	for _, oid := range want.Oids() {
		if oid != 1 {
			p, _ := want.Get(oid)
			missing.Set(oid, p)
		}
	}
	for _, tc := range []struct {
		name string
		idx  *Index
		pos  int64
		size int64
		want string
	}{
		{"pos < 100", want, 99, size, "less than 100 bytes"},
		{"file shorter", want, top, top - 1, "file is only"},
		{"pos not at a transaction end", want, top - 1, size, "not usable"},
		{"pos inside a transaction", want, lastTxn + 100, size, "not usable"},
		{"index newer than pos", want, lastTxn, size, "index has oid"},
		{"wrong position", wrongPos, top, size, "index has oid 0000000000000005 at 1234"},
		{"oid missing", missing, top, size, "not in the index"},
	} {
		err := CheckIndex(f, f.Name(), tc.idx, tc.pos, tc.size)
		t.Logf("%s: %v", tc.name, err)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
	// An index built by scanning up to an earlier transaction is usable at
	// that position.
	partial := NewIndex(0)
	res, err := Scan(f, f.Name(), HeaderSize, lastTxn, 0, partial)
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckIndex(f, f.Name(), partial, res.End, size); err != nil {
		t.Errorf("partial index: %v", err)
	}
}

// A file whose last transactions are undone ('u') or empty: the check looks
// further back, to the last transaction with data records.
func TestCheckIndexSkipsUndoneAndEmpty(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("testdata", "1.fs"))
	if err != nil {
		t.Fatal(err)
	}
	want, top, _ := ixExpect(t, "1")
	// Append an empty transaction, and mark the last data transaction of
	// the original file as undone ('u'): the check must then verify the
	// transaction before it, which the full index contradicts for oid 1.
	empty := make([]byte, TxnHeaderFixSize+8)
	copy(empty, "\x03\xf5\x8e\xb8\xc2\x00\x00\x00")
	empty[15] = TxnHeaderFixSize
	empty[16] = ' '
	empty[TxnHeaderFixSize+7] = TxnHeaderFixSize
	data := append(append([]byte{}, src...), empty...)
	newTop := top + int64(len(empty))
	path := filepath.Join(t.TempDir(), "x.fs")
	check := func(data []byte) error {
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		return CheckIndex(f, path, want, newTop, int64(len(data)))
	}
	if err := check(data); err != nil {
		t.Errorf("trailing empty transaction: %v", err)
	}
	data[229576+16] = 'u'
	err = check(data)
	t.Logf("undone: %v", err)
	if err == nil || !strings.Contains(err.Error(), "index has oid") {
		t.Errorf("last data transaction undone: %v", err)
	}
	data[229576+16] = 'c'
	if err := check(data); err == nil {
		t.Errorf("checkpoint status: no error")
	}
}

// FuzzLoadIndexFile feeds damaged index files to the loader: they must give
// an error (never a panic, nor an allocation out of proportion to the
// input). What loads must save and load back unchanged, and CheckIndex must
// judge it against a real file without failing otherwise than by an error.
func FuzzLoadIndexFile(f *testing.F) {
	for _, name := range ixFixtures {
		b, err := os.ReadFile(filepath.Join("testdata", name+".fs.index"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		want, pos, _ := ixExpect(f, name)
		f.Add(py2Index(f, want, pos, 1))
	}
	f.Add([]byte("I5000000000\n.(U\x06\x00\x00\x00\x00\x00\x07q\x01U\x08\x00\x01\x00\x01\x00\x00\x00\x05q\x02tq\x03.N."))
	data, err := os.ReadFile(filepath.Join("testdata", "1.fs"))
	if err != nil {
		f.Fatal(err)
	}
	r := bytes.NewReader(data)
	f.Fuzz(func(t *testing.T, b []byte) {
		pos, idx, err := loadIndex(bytes.NewReader(b), "fuzz.index", int64(len(b)), -1)
		if err != nil {
			var ie *IndexFileError
			if !errors.As(err, &ie) || ie.Path != "fuzz.index" {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		var buf bytes.Buffer
		if err := idx.writeIndex(&buf, pos); err != nil {
			t.Fatalf("save of a loaded index: %v", err)
		}
		pos2, idx2, err := loadIndex(bytes.NewReader(buf.Bytes()), "again", int64(buf.Len()), -1)
		if err != nil {
			t.Fatalf("reload: %v", err)
		}
		if pos2 != pos || !idx2.Equal(idx) || idx2.MaxOid() != idx.MaxOid() {
			t.Fatalf("round trip differs: pos %d -> %d\n%s", pos, pos2, ixDiff(idx2, idx))
		}
		_ = CheckIndex(r, "1.fs", idx, pos, int64(len(data)))
	})
}

// BenchmarkLoadIndexFile measures loading an index file of
// $ZODBD_INDEX_BENCH_N (default 1M) dense oids.
func BenchmarkLoadIndexFile(b *testing.B) {
	n := 1_000_000
	if s := os.Getenv("ZODBD_INDEX_BENCH_N"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil {
			b.Fatal(err)
		}
		n = v
	}
	idx := NewIndex(n)
	for i := 0; i < n; i++ {
		idx.Set(zodb.Oid(i), int64(4+i*100))
	}
	path := filepath.Join(b.TempDir(), "Data.fs.index")
	t0 := time.Now()
	if err := idx.SaveFile(path, int64(4+n*100)); err != nil {
		b.Fatal(err)
	}
	b.Logf("SaveFile of %d oids: %v", n, time.Since(t0))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		_, got, err := LoadIndexFile(path)
		if err != nil {
			b.Fatal(err)
		}
		if got.Len() != n {
			b.Fatalf("len %d", got.Len())
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/oid")
}

// TestLoadIndexBoundedByData: an index holds no more oids than data
// records fit in the part of the data file it covers, and covers no more
// than the data file: a crafted index (oids spread one per chunk, ~1 KiB
// of nodes each) costs no more memory than a scan of the data file could.
func TestLoadIndexBoundedByData(t *testing.T) {
	save := func(topPos int64, oids ...zodb.Oid) []byte {
		x := NewIndex(0)
		for _, oid := range oids {
			x.Set(oid, HeaderSize)
		}
		var buf bytes.Buffer
		if err := x.writeIndex(&buf, topPos); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	three := HeaderSize + 3*DataHeaderSize
	if _, idx, err := loadIndex(bytes.NewReader(save(int64(three), 0, 1<<16, 2<<16)), "ok", -1, int64(three)); err != nil || idx.Len() != 3 {
		t.Fatalf("3 oids in %d bytes: %v", three, err)
	}
	_, _, err := loadIndex(bytes.NewReader(save(int64(three), 0, 1<<16, 2<<16, 3<<16)), "many", -1, -1)
	if err == nil || !strings.Contains(err.Error(), "more than 3 oids") {
		t.Errorf("4 oids in %d bytes: %v, want an error", three, err)
	}
	_, _, err = loadIndex(bytes.NewReader(save(1<<40, 0, 1<<16)), "beyond", -1, int64(three))
	if err == nil || !strings.Contains(err.Error(), "beyond its end") {
		t.Errorf("index covering 1 TiB of a %d-byte file: %v, want an error", three, err)
	}
}
