package fs1tools

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/zodbd/zodbd/fs1"
)

const testdata = "../testdata"

var fixtures = []string{"1", "1packed", "empty", "torn"}

// wantErr is the error a tool must return on a fixture where ZODB/py's tool
// fails (substring of the message), or "" where it succeeds.
var wantErr = map[string]map[string]string{
	"fsdump":  {},
	"fsdumpv": {"torn": "232352: data record: short header (0 of 42 bytes)"},
	"fstail": {
		"empty": "no room for a transaction length before offset 4",
		"torn":  "points before the start of the file",
	},
	"fstest": {"torn": "truncated possibly because of damaged records at 229576"},
}

// wantLog is what Dump logs (ZODB/py's FileIterator warnings).
var wantLog = map[string]string{
	"torn": "torn.fs truncated, possibly due to damaged records at 229576\n",
}

// runTool runs the Go port of ZODB/py tool on fixture name.
func runTool(tool, path string, logw *bytes.Buffer) ([]byte, error) {
	var out bytes.Buffer
	var err error
	switch tool {
	case "fsdump":
		err = Dump(&out, path, WithLogf(func(format string, args ...interface{}) {
			fmt.Fprintf(logw, format+"\n", args...)
		}))
	case "fsdumpv":
		err = DumpVerbose(&out, path)
	case "fstail":
		err = Tail(&out, path, 10)
	case "fstest":
		err = Verify(&out, path, 2)
	default:
		panic(tool)
	}
	return out.Bytes(), err
}

func TestToolsMatchZODBpy(t *testing.T) {
	for _, tool := range []string{"fsdump", "fsdumpv", "fstail", "fstest"} {
		for _, name := range fixtures {
			t.Run(tool+"/"+name, func(t *testing.T) {
				path := filepath.Join(testdata, name+".fs")
				want, err := os.ReadFile(filepath.Join(testdata, name+"."+tool+".ok"))
				if err != nil {
					t.Fatal(err)
				}
				var logw bytes.Buffer
				got, err := runTool(tool, path, &logw)
				if werr := wantErr[tool][name]; werr == "" {
					if err != nil {
						t.Errorf("error: %v", err)
					}
				} else if err == nil || !strings.Contains(err.Error(), werr) {
					t.Errorf("error %v, want one with %q", err, werr)
				}
				if !bytes.Equal(got, want) {
					t.Errorf("output differs from %s.%s.ok:\n%s", name, tool, firstDiff(got, want))
				}
				if tool == "fsdump" {
					if got, want := logw.String(), strings.ReplaceAll(wantLog[name], "torn.fs", path); got != want {
						t.Errorf("log %q, want %q", got, want)
					}
				}
			})
		}
	}
}

// firstDiff describes where got first differs from want.
func firstDiff(got, want []byte) string {
	gl, wl := strings.SplitAfter(string(got), "\n"), strings.SplitAfter(string(want), "\n")
	for i := 0; i < len(gl) || i < len(wl); i++ {
		var g, w string
		if i < len(gl) {
			g = gl[i]
		}
		if i < len(wl) {
			w = wl[i]
		}
		if g != w {
			return fmt.Sprintf("line %d:\n got  %q\n want %q", i+1, g, w)
		}
	}
	return "(same lines)"
}

// TestVerifyTornMessage checks the exact message of fstest on torn.fs.
func TestVerifyTornMessage(t *testing.T) {
	path := filepath.Join(testdata, "torn.fs")
	err := Verify(&bytes.Buffer{}, path, 0)
	want := path + " truncated possibly because of damaged records at 229576"
	var verr *VerifyError
	if !errors.As(err, &verr) || err.Error() != want || verr.Pos != 229576 {
		t.Fatalf("Verify(torn.fs) = %v, want %q at 229576", err, want)
	}
}

func TestVerifyQuiet(t *testing.T) {
	for _, name := range []string{"1", "1packed", "empty"} {
		var out bytes.Buffer
		if err := Verify(&out, filepath.Join(testdata, name+".fs"), 0); err != nil || out.Len() != 0 {
			t.Errorf("%s: Verify(verbose 0) = %v, output %q", name, err, out.String())
		}
		out.Reset()
		if err := Verify(&out, filepath.Join(testdata, name+".fs"), 1); err != nil || !strings.HasSuffix(out.String(), " \nno errors detected") && name != "empty" {
			t.Errorf("%s: Verify(verbose 1) = %v, output ends %q", name, err, tail(out.String()))
		}
		if strings.Contains(out.String(), "object oid") {
			t.Errorf("%s: Verify(verbose 1) prints objects", name)
		}
	}
}

func tail(s string) string {
	if len(s) > 60 {
		return s[len(s)-60:]
	}
	return s
}

// damage returns the path of a copy of fixture name with the bytes at off
// replaced by b.
func damage(t *testing.T, name string, off int64, b []byte) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testdata, name+".fs"))
	if err != nil {
		t.Fatal(err)
	}
	copy(data[off:], b)
	path := filepath.Join(t.TempDir(), name+".fs")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// Layout of 1.fs used below (from 1.expect.json): T01 is at 166, its first
// data record at 208; T02 is at 631.
func TestVerifyDamage(t *testing.T) {
	for _, tc := range []struct {
		what string
		off  int64
		b    []byte
		pos  int64
		msg  string
	}{
		{"data record tloc", 208 + 24 + 7, []byte{0xa7}, 208, "data record exceeds transaction record at 208: tloc 167 != tpos 166"},
		{"data record length", 208 + 34 + 6, []byte{0x10}, 208, "has data records that extend beyond the transaction record; end at 4496"},
		{"tid reduction", 631, make([]byte, 8), 631, "time-stamp reduction at 631: 0x0000000000000000 <= 0x03f58e0006666666"},
		{"status", 166 + 16, []byte{'x'}, 166, "has invalid status 'b'x'' at 166"},
		{"checkpoint", 166 + 16, []byte{'c'}, 166, "checkpoint flag was not cleared at 166"},
		{"transaction length", 166 + 8, []byte{0x01}, 166, "truncated possibly because of damaged records at 166"},
		{"metadata length", 166 + 19, []byte{0xff, 0xff}, 166, "has an invalid transaction header at 166"},
		{"redundant length", 623 + 7, []byte{0}, 166, "has inconsistent transaction length for undone transaction at 623"},
		{"magic", 0, []byte("XX"), 0, "invalid file header"},
	} {
		t.Run(tc.what, func(t *testing.T) {
			path := damage(t, "1", tc.off, tc.b)
			var out bytes.Buffer
			err := Verify(&out, path, 2)
			var verr *VerifyError
			if !errors.As(err, &verr) {
				t.Fatalf("Verify = %v, want a *VerifyError", err)
			}
			if verr.Pos != tc.pos || !strings.HasSuffix(err.Error(), tc.msg) {
				t.Errorf("Verify = %q at %d, want ...%q at %d", err, verr.Pos, tc.msg, tc.pos)
			}
			if tc.pos != 0 && !strings.HasPrefix(err.Error(), path+" ") {
				t.Errorf("message %q does not start with the path", err)
			}
		})
	}
}

func TestVerifyEmptyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "zero.fs")
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := Verify(&bytes.Buffer{}, path, 0); err == nil || err.Error() != "empty file" {
		t.Errorf("Verify(0 bytes) = %v, want \"empty file\"", err)
	}
	if err := Verify(&bytes.Buffer{}, filepath.Join(t.TempDir(), "missing.fs"), 0); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Verify(missing) = %v", err)
	}
}

// The other tools on damaged copies: errors with offsets, never a panic.
func TestToolsOnDamage(t *testing.T) {
	// A backpointer (T09's record of oid 1) pointing to a record of
	// another oid: fsdump fails like ZODB/py's getTxnFromData.
	exp := fixtureTxns(t, "1")
	var bpRec, otherRec int64
	for _, txn := range exp {
		for _, r := range txn.records {
			if r.backpointer > 0 && bpRec == 0 {
				bpRec = r.pos
			}
			if r.oid == 0 && otherRec == 0 {
				otherRec = r.pos
			}
		}
	}
	var b [8]byte
	for i := 0; i < 8; i++ {
		b[7-i] = byte(otherRec >> (8 * i))
	}
	path := damage(t, "1", bpRec+fs1.DataHeaderSize, b[:])
	err := Dump(&bytes.Buffer{}, path, WithLogf(t.Logf))
	var ferr *fs1.Error
	if !errors.As(err, &ferr) || ferr.Pos != bpRec {
		t.Errorf("Dump with a bad backpointer = %v, want an fs1.Error at %d", err, bpRec)
	}

	// A version length: fsdump and Dumper fail at that record.
	path = damage(t, "1", 208+32, []byte{0, 1})
	for name, dump := range map[string]func() error{
		"Dump":        func() error { return Dump(&bytes.Buffer{}, path, WithLogf(t.Logf)) },
		"DumpVerbose": func() error { return DumpVerbose(&bytes.Buffer{}, path) },
	} {
		if err := dump(); !errors.As(err, &ferr) || ferr.Pos != 208 || !strings.Contains(err.Error(), "version") {
			t.Errorf("%s with a version = %v, want an fs1.Error at 208", name, err)
		}
	}
}

type txnRec struct {
	pos     int64
	records []struct{ pos, backpointer, oid int64 }
}

// fixtureTxns decodes the layout of a fixture with the Go reader's own
// view (fs1.TxnHeader/DataHeader), to find records to damage.
func fixtureTxns(t *testing.T, name string) []txnRec {
	f, err := os.Open(filepath.Join(testdata, name+".fs"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	var txns []txnRec
	var th fs1.TxnHeader
	for pos := int64(fs1.HeaderSize); pos < st.Size(); pos = th.Next() {
		if err := th.Load(f, name, pos, st.Size()); err != nil {
			t.Fatal(err)
		}
		tr := txnRec{pos: pos}
		for dpos := th.DataPos(); dpos < th.End(); {
			var dh fs1.DataHeader
			if err := dh.Load(f, name, dpos, th.End()); err != nil {
				t.Fatal(err)
			}
			bp := int64(-1)
			if dh.DataLen == 0 {
				bp = dh.BackPos
			}
			tr.records = append(tr.records, struct{ pos, backpointer, oid int64 }{dpos, bp, int64(dh.Oid)})
			dpos += dh.Len()
		}
		txns = append(txns, tr)
	}
	return txns
}

func TestTailN(t *testing.T) {
	path := filepath.Join(testdata, "1.fs")
	want, err := os.ReadFile(filepath.Join(testdata, "1.fstail.ok"))
	if err != nil {
		t.Fatal(err)
	}
	entries := strings.SplitAfter(string(want), "\n\n")
	var out bytes.Buffer
	if err := Tail(&out, path, 3); err != nil || out.String() != strings.Join(entries[:3], "") {
		t.Errorf("Tail(3) = %v, %q", err, out.String())
	}
	// More than there are: stops at the first transaction, the oldest.
	out.Reset()
	if err := Tail(&out, path, 1000); err != nil || strings.Count(out.String(), "hash=") != 30 ||
		!strings.HasSuffix(out.String(), "offset=4 (+48)\n\n") {
		t.Errorf("Tail(1000) = %v, %d entries, ends %q", err, strings.Count(out.String(), "hash="), tail(out.String()))
	}
	out.Reset()
	if err := Tail(&out, path, 0); err != nil || out.Len() != 0 {
		t.Errorf("Tail(0) = %v, %q", err, out.String())
	}
}
