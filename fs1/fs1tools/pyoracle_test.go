package fs1tools

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/datasets"
)

// runPy runs a Python script with the venv's python (ZODB/py, the
// oracle) and returns its stdout, stderr and whether it exited with 0.
func runPy(t *testing.T, script string, args ...string) (stdout, stderr string, ok bool) {
	t.Helper()
	py := datasets.Python(t)
	path := filepath.Join(t.TempDir(), "audit.py")
	if err := os.WriteFile(path, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, append([]string{path}, args...)...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if err != nil {
		if _, isExit := err.(*exec.ExitError); !isExit {
			t.Fatalf("python: %v", err)
		}
	}
	return o.String(), e.String(), err == nil
}

// mustPy is runPy that fails the test when the script fails.
func mustPy(t *testing.T, script string, args ...string) string {
	t.Helper()
	out, errOut, ok := runPy(t, script, args...)
	if !ok {
		t.Fatalf("python script failed:\n%s", errOut)
	}
	return out
}

// rawStorePy writes a FileStorage whose records are the raw class
// pickles given (one transaction per line of oid:hexpickle pairs), each
// followed by a small state pickle.
const rawStorePy = `
import sys, binascii
from ZODB.FileStorage import FileStorage
from ZODB.Connection import TransactionMetaData
from ZODB.utils import p64, z64
st = FileStorage(sys.argv[1])
state = b'\x80\x03}q\x01.'
for txn in sys.argv[2:]:
    t = TransactionMetaData(); st.tpc_begin(t)
    for rec in txn.split(','):
        oid, cls = rec.split(':')
        oid = p64(int(oid))
        try: s = st.load(oid)[1]
        except Exception: s = z64
        st.store(oid, s, binascii.unhexlify(cls) + state, '', t)
    st.tpc_vote(t); st.tpc_finish(t)
st.close()
`

const analyzePy = `
import sys
from ZODB.scripts.analyze import analyze, report
report(analyze(sys.argv[1]))
`

// globalPickle is the class pickle ZODB writes for module.name.
func globalPickle(module, name string) string {
	return fmt.Sprintf("%x", "\x80\x03c"+module+"\n"+name+"\nq\x00.")
}

// goAnalyze runs Analyze and WriteAnalysis on path, turning a panic into
// a test failure.
func goAnalyze(t *testing.T, path string) (out string, err error) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("analyze panicked: %v", r)
		}
	}()
	fs, err := fs1.Open(path, &fs1.Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	a, err := Analyze(context.Background(), fs, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	err = WriteAnalysis(&b, a)
	return b.String(), err
}

// Class names that analyze.py's shorten cuts: one whose last dotted
// component is 44 to 46 characters long, in a dotted name longer than 46
// (analyze.py's shorten returns s[-46:], the whole last component; shorten
// sliced s[len(s)-46:] with len(s) < 46 and panicked), and names with
// non-ASCII characters (Python 3 identifiers), which analyze.py measures in
// characters (shorten measured bytes, so that a name of 41 characters and
// 81 bytes was shortened by zodbd and not by analyze.py).
func TestAnalyzeShorten(t *testing.T) {
	for _, c := range []struct {
		name    string
		classes []string
	}{
		{"short last component", []string{globalPickle("Products.Site", strings.Repeat("C", 44))}},
		{"non-ASCII", []string{globalPickle("m", strings.Repeat("\u00c9", 39)), globalPickle("caf\u00e9.m\u00f6dule", strings.Repeat("\u00c9", 40))}},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "Data.fs")
			args := []string{path, "0:" + globalPickle("persistent.mapping", "PersistentMapping")}
			for i, cl := range c.classes {
				args = append(args, fmt.Sprintf("%d:%s", i+1, cl))
			}
			mustPy(t, rawStorePy, args...)
			want := mustPy(t, analyzePy, path)
			got, err := goAnalyze(t, path)
			if err != nil {
				t.Fatalf("WriteAnalysis: %v", err)
			}
			if got != want {
				t.Errorf("analyze report differs from analyze.py's:\n%s", firstDiff([]byte(got), []byte(want)))
			}
		})
	}
}

// Records whose class pickle analyze.py cannot read (here the records of a
// zc.zlibstorage-compressed FileStorage, which zodbd serves): analyze.py
// prints the error and leaves the record out of the class table and of the
// current/old counts (only "Processed N records" and the byte totals count
// it); Analyze counted it under a class named "" and as a current or old
// object.
func TestAnalyzeUnreadableClassPickle(t *testing.T) {
	path := filepath.Join(t.TempDir(), "Data.fs")
	mustPy(t, `
import sys, transaction, ZODB
from ZODB.FileStorage import FileStorage
from zc.zlibstorage import ZlibStorage
from persistent.mapping import PersistentMapping
db = ZODB.DB(FileStorage(sys.argv[1])); c = db.open(); r = c.root()
r['a'] = PersistentMapping({'x': 1}); transaction.commit()
r['a']['x'] = 2; transaction.commit()
db.close()
db = ZODB.DB(ZlibStorage(FileStorage(sys.argv[1]))); c = db.open(); r = c.root()
r['b'] = PersistentMapping({'y': 'z' * 100}); transaction.commit()
r['b']['y'] = 'w' * 100; transaction.commit()
db.close()
`, path)
	want := mustPy(t, analyzePy, path)
	if !strings.Contains(want, "bad pickle data") {
		t.Fatalf("oracle did not see unreadable records:\n%s", want)
	}
	got, err := goAnalyze(t, path)
	if err != nil {
		t.Fatalf("WriteAnalysis: %v", err)
	}
	// The lines analyze.py prints for the unreadable records come before
	// its report; compare the report itself.
	want = want[strings.Index(want, "Processed "):]
	if got != want {
		t.Errorf("analyze report differs from analyze.py's:\n%s\ngot:\n%s\nwant:\n%s", firstDiff([]byte(got), []byte(want)), got, want)
	}
}

// extFilePy writes a one-transaction FileStorage whose extension is the
// raw bytes ext (hex).
const extFilePy = `
import sys, binascii
from ZODB.FileStorage import FileStorage
from ZODB.Connection import TransactionMetaData
from ZODB.utils import p64, z64
st = FileStorage(sys.argv[1])
t = TransactionMetaData(user='u', description='d', extension=binascii.unhexlify(sys.argv[2]))
st.tpc_begin(t)
st.store(p64(0), z64, b'\x80\x03cpersistent.mapping\nPersistentMapping\nq\x00.\x80\x03}q\x01.', '', t)
st.tpc_vote(t); st.tpc_finish(t); st.close()
`

// fstail unpickles each extension with zodbpickle (ZODB._compat.loads) and
// fails where that fails. Tail's og-rek check accepted extensions that
// zodbpickle refuses: a BINUNICODE string that is not UTF-8 (a damaged
// extension: a bit flip in any ZODB-written extension's text) and pickle
// protocols 4 and 5 (zodbpickle reads up to 3).
func TestTailExtensionUnpickle(t *testing.T) {
	for _, tc := range []struct{ name, ext string }{
		{"invalid UTF-8", "\x80\x03}q\x00X\x02\x00\x00\x00\xc3(q\x01K\x01s."},
		{"protocol 4", "\x80\x04\x95\x0b\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x01a\x94K\x01s."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "Data.fs")
			mustPy(t, extFilePy, path, fmt.Sprintf("%x", tc.ext))
			pyOut, pyErr, pyOK := runPy(t, "import sys\nfrom ZODB.scripts import fstail\nfstail.main(sys.argv[1], 10)\n", path)
			var out bytes.Buffer
			err := Tail(&out, path, 10)
			if pyOK != (err == nil) {
				t.Errorf("Tail = %v (output %q); fstail succeeded: %v (stderr tail %q)", err, out.String(), pyOK, tail(pyErr))
			}
			if out.String() != pyOut {
				t.Errorf("Tail output %q, fstail's %q", out.String(), pyOut)
			}
		})
	}
}

// get_pickle_metadata decodes a class pickle that is not a GLOBAL with
// zodbpickle and returns two empty names (".") when that fails; PickleClass
// decoded it with og-rek, which accepts what zodbpickle refuses (protocol
// 4, BINUNICODE that is not UTF-8), and so printed a class where fsdump
// prints ".".
func TestPickleClassUnreadable(t *testing.T) {
	cases := []string{
		// ('mod', 'name') in protocol 4.
		"\x80\x04\x95\x13\x00\x00\x00\x00\x00\x00\x00\x8c\x03mod\x94\x8c\x04name\x94\x86\x94.",
		// (b'\xc3(' as BINUNICODE, 'n').
		"\x80\x03X\x02\x00\x00\x00\xc3(X\x01\x00\x00\x00n\x86.",
	}
	var args []string
	for _, c := range cases {
		args = append(args, fmt.Sprintf("%x", c))
	}
	out := mustPy(t, `
import sys, binascii
from ZODB.utils import get_pickle_metadata
for a in sys.argv[1:]:
    print('%s.%s' % get_pickle_metadata(binascii.unhexlify(a)))
`, args...)
	want := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	for i, c := range cases {
		got, err := PickleClass([]byte(c))
		if err != nil || got != want[i] {
			t.Errorf("PickleClass(%q) = %q, %v; get_pickle_metadata gives %q", c, got, err, want[i])
		}
	}
}

// A file whose records all lack data (an undo of a creation, as restore
// writes it): analyze.py prints its whole table (averages of 0.00, the
// totals) and only fails at "Current Objects" (CBYTES / DBYTES);
// WriteAnalysis stopped after the first line.
func TestAnalyzeNoDataBytes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "Data.fs")
	mustPy(t, `
import sys
from ZODB.FileStorage import FileStorage
from ZODB.Connection import TransactionMetaData
from ZODB.utils import p64
tid = p64(0x03d0000000000000)
st = FileStorage(sys.argv[1])
t = TransactionMetaData(); st.tpc_begin(t, tid)
st.restore(p64(1), tid, None, '', None, t)
st.tpc_vote(t); st.tpc_finish(t); st.close()
`, path)
	want, pyErr, ok := runPy(t, analyzePy, path)
	if ok || !strings.Contains(pyErr, "ZeroDivisionError") {
		t.Fatalf("oracle: ok=%v stderr %q", ok, tail(pyErr))
	}
	got, err := goAnalyze(t, path)
	if err == nil {
		t.Errorf("WriteAnalysis succeeded where analyze.py fails")
	}
	if got != want {
		t.Errorf("analyze output before the failure differs from analyze.py's:\n%s\ngot:\n%s\nwant:\n%s", firstDiff([]byte(got), []byte(want)), got, want)
	}
}

// Referrers with no targets (zodbd refs FILE) keeps each reference once per
// referrer; it did so by searching the references kept so far: quadratic in the
// number of distinct references of one object. One record with 300000
// references (a PersistentList of persistent objects, 5 MB) takes tens of
// seconds, a crafted record of some 100 MB hours; the listing itself is
// linear (well under a second here).
func TestReferrersManyRefs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "Data.fs")
	mustPy(t, `
import sys, io
from ZODB.FileStorage import FileStorage
from ZODB.Connection import TransactionMetaData
from ZODB.utils import p64, z64
import zodbpickle.pickle as zp
class Ref:
    def __init__(s, pid): s.pid = pid
f = io.BytesIO()
f.write(b'\x80\x03cpersistent.list\nPersistentList\nq\x00.')
p = zp.Pickler(f, 3); p.persistent_id = lambda o: o.pid if isinstance(o, Ref) else None
p.dump({'data': [Ref(p64(i + 1)) for i in range(300000)]})
st = FileStorage(sys.argv[1])
t = TransactionMetaData(); st.tpc_begin(t); st.store(z64, z64, f.getvalue(), '', t)
st.tpc_vote(t); st.tpc_finish(t); st.close()
`, path)
	fs, err := fs1.Open(path, &fs1.Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	// No time bound (the machines are shared): quadratic, this takes tens
	// of seconds, and the test binary's timeout ends it in the worst case.
	if n, err := Referrers(context.Background(), io.Discard, fs, nil); err != nil || n != 300000 {
		t.Fatalf("Referrers = %d, %v; want 300000 lines", n, err)
	}
}
