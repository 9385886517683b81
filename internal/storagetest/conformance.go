package storagetest

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/zodbd/zodbd/zodb"
)

// Factory is what Run needs to test one zodb.Storage implementation.
//
// The capabilities under test come from the interfaces the storages
// implement: zodb.WriteStorage (and a Begin that does not return
// zodb.ErrReadOnly) for the commit tests, zodb.Undoer for undo,
// zodb.Watcher for commit events, zodb.Syncer, zodb.BeforeLoader,
// zodb.AppendLoader and zodb.ResolvingTxn for their own checks. A storage
// that lacks one skips its tests, saying why.
type Factory struct {
	// Fixture opens a new storage over a fresh copy of the database that
	// Reference describes. Run closes it (closing it again in a cleanup
	// must be harmless).
	Fixture func(t *testing.T) zodb.Storage
	// Reference is what the fixture holds; nil means FS1Reference of
	// FixtureFS1 (fs1/testdata/1.fs).
	Reference *Reference

	// New creates a new, empty database and opens a storage on it. When
	// peer is not nil, each call of it opens another storage on the same
	// database (for a network client: another connection to the same
	// server), for the tests of what one client sees of another's
	// commits. Run closes the storages it is given. A nil New runs the
	// write tests on Fixture's storage, where a read-only storage shows
	// that it is one.
	New func(t *testing.T) (s zodb.Storage, peer func(t *testing.T) zodb.Storage)

	// SameExtension, when not nil, decides whether a transaction's
	// extension as the storage returns it (iteration, history, undo log)
	// is the one stored: for a protocol that carries the extension as a
	// dict and pickles it again (ZEO), equal in content, not in bytes. nil
	// means byte equality.
	SameExtension func(tb testing.TB, got, want []byte) bool

	// Known names subtests (their names below Run's test, as
	// "Read/LastOid" or "Write/Undo") that are skipped with the given
	// reason: known defects and limitations of the implementation. Each
	// reason is reported as "known: REASON".
	Known map[string]string

	prefix string          // the name of Run's test, and a slash
	seen   map[string]bool // the subtests that ran (or were skipped as known)
}

// Timeout bounds every operation of the suite (a storage that hangs fails
// instead of blocking the test binary).
const Timeout = 20 * time.Second

// Run runs the conformance suite on the storages f opens: the read tests
// ("Read/...") on the fixture, the commit tests ("Write/...") on a new
// database, and closing ("Close").
func Run(t *testing.T, f Factory) {
	ref := f.Reference
	if ref == nil {
		ref = FS1Reference(t, FixtureFS1)
	}
	f.prefix, f.seen = t.Name()+"/", map[string]bool{}
	defer func() {
		for name := range f.Known {
			if !f.seen[name] {
				t.Errorf("Factory.Known names %q: no such subtest", name)
			}
		}
	}()
	m, err := newModel(ref)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("Read", func(t *testing.T) {
		s := f.Fixture(t)
		defer s.Close()
		runRead(t, f, s, m)
	})
	t.Run("Write", func(t *testing.T) {
		var s zodb.Storage
		var peer func(t *testing.T) zodb.Storage
		if f.New != nil {
			s, peer = f.New(t)
		} else {
			s = f.Fixture(t)
		}
		defer s.Close()
		runWrite(t, f, s, peer)
	})
	t.Run("Close", func(t *testing.T) {
		known(t, f)
		testClose(t, f.Fixture(t))
	})
}

// sameExt compares extensions as f says.
func (f *Factory) sameExt(tb testing.TB, got, want []byte) bool {
	if f.SameExtension != nil {
		return f.SameExtension(tb, got, want)
	}
	return bytes.Equal(got, want)
}

// known skips t when f lists it as known.
func known(t *testing.T, f Factory) {
	t.Helper()
	name := strings.TrimPrefix(t.Name(), f.prefix)
	f.seen[name] = true
	if reason, ok := f.Known[name]; ok {
		t.Skip("known: " + reason)
	}
}

// sub runs fn as subtest name of t, unless it is known.
func sub(t *testing.T, f Factory, name string, fn func(t *testing.T)) {
	t.Helper()
	t.Run(name, func(t *testing.T) {
		known(t, f)
		fn(t)
	})
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), Timeout)
	t.Cleanup(cancel)
	return ctx
}

// testClose checks that Close succeeds, that the storage then fails what
// needs its database (a load it has not cached, history) with an error
// instead of answering or hanging, and that a second Close is harmless.
// (Whether a client may still answer from its cache after Close is left
// open.)
func testClose(t *testing.T, s zodb.Storage) {
	ctx := ctxT(t)
	if _, _, err := s.Load(ctx, zodb.Xid{Oid: 0, At: zodb.TidMax}); err != nil {
		t.Fatalf("load before Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, c := range []struct {
		what string
		err  func() error
	}{
		{"Load of an oid not loaded before", func() error {
			_, _, err := s.Load(ctx, zodb.Xid{Oid: 1, At: zodb.TidMax})
			return err
		}},
		{"History", func() error {
			_, err := s.History(ctx, 0, 1)
			return err
		}},
	} {
		if err := c.err(); err == nil {
			t.Errorf("%s after Close: no error", c.what)
		} else if errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s after Close hung until the deadline: %v", c.what, err)
		}
	}
	s.Close() // harmless; its error is not specified
}
