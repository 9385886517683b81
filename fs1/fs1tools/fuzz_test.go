package fs1tools

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// FuzzPickleClass checks that the class sniffing of fsdump never panics:
// corrupted input gives a class string or an error.
func FuzzPickleClass(f *testing.F) {
	for _, seed := range []string{
		"\x80\x03cpersistent.mapping\nPersistentMapping\nq\x00.\x80\x03}q\x01.",
		"(cfoo\nBar\nq\x01Nt.",
		"cfoo\nBar",
		"\x80\x03(X\x03\x00\x00\x00modX\x04\x00\x00\x00nameq\x00tq\x01.",
		"\x80\x03((X\x03\x00\x00\x00modX\x04\x00\x00\x00nametq\x00Ntq\x01.",
		"\x80\x02(U\x03modU\x04\xffametq\x00.",
		"\x80\x04\x95\x18\x00\x00\x00\x00\x00\x00\x00\x8c\x03mod\x94\x8c\x04name\x94\x93\x94.",
		"K\x05.",
		"\x80\x03]q\x00(K\x01G?\xf8\x00\x00\x00\x00\x00\x00X\x01\x00\x00\x00'e.",
		"",
		"\x80",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		PickleClass(data)
	})
}

// FuzzTools runs every tool on corrupted FileStorage files: they must
// report damage as an error (or, like ZODB/py, stop with a warning), never
// panic or loop.
func FuzzTools(f *testing.F) {
	one, err := os.ReadFile(filepath.Join(testdata, "1.fs"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(one[:1125]) // T00..T03
	f.Add(one[:12])
	f.Add([]byte("FS30"))
	f.Add([]byte{})
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(dir, "fuzz.fs")
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		nolog := WithLogf(func(string, ...interface{}) {})
		var out bytes.Buffer
		Dump(&out, path, nolog)
		DumpVerbose(io.Discard, path)
		Tail(io.Discard, path, 10)
		out.Reset()
		if err := Verify(&out, path, 2); err == nil && len(data) > 0 && !bytes.HasSuffix(out.Bytes(), []byte("no errors detected")) {
			t.Errorf("Verify passed without saying so: %q", out.String())
		}
	})
}
