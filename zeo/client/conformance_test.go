package client_test

import (
	"path/filepath"
	"testing"

	"github.com/zodbd/zodbd/internal/storagetest"
	"github.com/zodbd/zodbd/internal/zeotest"
	"github.com/zodbd/zodbd/zeo/client"
	"github.com/zodbd/zodbd/zodb"
)

// TestConformance runs the storage conformance suite on the client
// against zodbd's server in process (both marshallings) and runzeo, with
// a second client on the same server for the tests of invalidations; and,
// registered read-only, against zodbd's server.
func TestConformance(t *testing.T) {
	quiet := func(string, ...interface{}) {}
	for _, c := range []struct {
		name    string
		start   func(tb testing.TB, path string, msgpack bool) string
		msgpack bool
	}{
		{"zodbd/Z5", zeotest.StartZodbd, false},
		{"zodbd/M5", zeotest.StartZodbd, true},
		{"runzeo/Z5", zeotest.StartRunzeo, false},
		{"runzeo/M5", zeotest.StartRunzeo, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			opt := &client.Options{ReadWrite: true, Logf: quiet}
			// Read and Close share one server: neither writes.
			fixture := c.start(t, storagetest.CopyFixture(t, storagetest.FixtureFS1), c.msgpack)
			storagetest.Run(t, storagetest.Factory{
				SameExtension: sameExt,
				Fixture:       func(t *testing.T) zodb.Storage { return dial(t, fixture, opt) },
				New: func(t *testing.T) (zodb.Storage, func(*testing.T) zodb.Storage) {
					addr := c.start(t, filepath.Join(t.TempDir(), "Data.fs"), c.msgpack)
					return dial(t, addr, opt), func(t *testing.T) zodb.Storage { return dial(t, addr, opt) }
				},
			})
		})
	}
	t.Run("zodbd/ReadOnly", func(t *testing.T) {
		storagetest.Run(t, storagetest.Factory{
			SameExtension: sameExt,
			Fixture: func(t *testing.T) zodb.Storage {
				return dial(t, zeotest.StartZodbd(t, storagetest.CopyFixture(t, storagetest.FixtureFS1), false), &client.Options{Logf: quiet})
			},
		})
	})
}

// sameExt compares extensions by content: ZEO carries them as dicts, which
// the client pickles again.
func sameExt(tb testing.TB, got, want []byte) bool {
	return extString(tb, got) == extString(tb, want)
}
