package fs1

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/zodbd/zodbd/zodb"
)

// FuzzOpen feeds damaged FileStorage files to Open, Load, History and the
// iterator. Damage must be reported as an error (an *Error naming an offset
// where the damage is in a record), never as a panic or an out-of-range read.
func FuzzOpen(f *testing.F) {
	for _, name := range []string{"1", "1packed", "torn", "empty"} {
		b, err := os.ReadFile(filepath.Join("testdata", name+".fs"))
		if err != nil {
			f.Fatal(err)
		}
		if len(b) > 2048 {
			b = b[:2048] // keep seeds small so that mutations hit headers
		}
		f.Add(b)
	}
	f.Add([]byte("FS30"))
	f.Add([]byte("XXXX"))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(dir, "fuzz.fs")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		fs, err := Open(path, &Options{Logf: func(string, ...interface{}) {}})
		if err != nil {
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Open error without offset: %v", err)
			}
			return
		}
		defer fs.Close()
		ctx := context.Background()
		for _, oid := range fs.Index().Oids() {
			for _, at := range []zodb.Tid{zodb.TidMax, 0x03f58e3d9c455bdd} {
				fs.Load(ctx, zodb.Xid{Oid: oid, At: at})
			}
			fs.History(ctx, oid, 100)
		}
		it := fs.Iterate(ctx, 0, zodb.TidMax)
		for {
			_, dit, err := it.NextTxn(ctx)
			if err != nil {
				break
			}
			for {
				if _, err := dit.NextData(ctx); err != nil {
					if err != io.EOF {
						return
					}
					break
				}
			}
		}
	})
}

// FuzzDataHeader decodes arbitrary bytes as a data record header.
func FuzzDataHeader(f *testing.F) {
	b, err := os.ReadFile(filepath.Join("testdata", "1.fs"))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b[52:52+DataHeaderSize+8], int64(52), int64(1000))
	f.Fuzz(func(t *testing.T, b []byte, pos, end int64) {
		var dh DataHeader
		if err := dh.decode(b, "fuzz", pos, end); err == nil {
			if dh.Len() <= 0 || dh.Pos+dh.Len() > end {
				t.Fatalf("accepted record [%d, %d) beyond end %d", dh.Pos, dh.Pos+dh.Len(), end)
			}
		}
	})
}
