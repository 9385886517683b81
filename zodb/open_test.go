package zodb_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	_ "github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/zodb"
)

func TestParseURL(t *testing.T) {
	for in, want := range map[string]string{
		"Data.fs":                     "file::Data.fs",
		"../x/Data.fs":                "file::../x/Data.fs",
		"/abs/Data.fs":                "file::/abs/Data.fs",
		"file:///abs/Data.fs":         "file::/abs/Data.fs",
		"zeo://127.0.0.1:8100":        "zeo:127.0.0.1:8100:",
		"zeo:///tmp/s.sock?storage=2": "zeo::/tmp/s.sock",
	} {
		u, err := zodb.ParseURL(in)
		if err != nil {
			t.Errorf("%s: %v", in, err)
			continue
		}
		if got := u.Scheme + ":" + u.Host + ":" + u.Path; got != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
	if _, err := zodb.ParseURL(""); err == nil {
		t.Error("empty URL accepted")
	}
	// "scheme:rest" is an opaque URL only for a registered scheme.
	registerOpaque.Do(func() {
		zodb.RegisterDriver("opaquetest", func(context.Context, *url.URL, *zodb.OpenOptions) (zodb.Storage, error) {
			return nil, errFake
		})
	})
	for in, want := range map[string]string{
		"opaquetest:rel/db":    "opaquetest:rel/db:",
		"opaquetest:/abs/db":   "opaquetest:/abs/db:",
		"unknownscheme:x":      "file::unknownscheme:x",
		"c:/windows/Data.fs":   "file::c:/windows/Data.fs",
		"opaquetest:///abs/db": "opaquetest::/abs/db",
	} {
		u, err := zodb.ParseURL(in)
		if err != nil {
			t.Fatal(err)
		}
		if got := u.Scheme + ":" + u.Opaque + ":" + u.Path; got != want {
			t.Errorf("%s: %s, want %s", in, got, want)
		}
	}
}

var errFake = errors.New("fake driver")

// The registry is global and has no Unregister: a test registers its
// drivers once per process (go test -count=N runs it N times).
var (
	registerOpaque sync.Once
	fakeSchemes    atomic.Int32
)

func TestRegistry(t *testing.T) {
	var got *url.URL
	var gotOpt *zodb.OpenOptions
	fake := fmt.Sprintf("fake%d", fakeSchemes.Add(1))
	zodb.RegisterDriver(fake, func(ctx context.Context, u *url.URL, opt *zodb.OpenOptions) (zodb.Storage, error) {
		got, gotOpt = u, opt
		return nil, errFake
	})
	if _, err := zodb.Open(context.Background(), fake+"://h:1/p?x=y", &zodb.OpenOptions{ReadWrite: true}); err != errFake {
		t.Errorf("open: %v", err)
	}
	if got.Host != "h:1" || got.Path != "/p" || got.Query().Get("x") != "y" || !gotOpt.ReadWrite {
		t.Errorf("driver got %v %+v", got, gotOpt)
	}
	zodb.Open(context.Background(), fake+"://h", nil)
	if gotOpt == nil {
		t.Error("nil options passed to the driver")
	}
	_, err := zodb.Open(context.Background(), "nosuch://x", nil)
	if err == nil || !strings.Contains(err.Error(), `no driver for scheme "nosuch"`) || !strings.Contains(err.Error(), "file") {
		t.Errorf("unknown scheme: %v", err)
	}
	defer func() {
		if recover() == nil {
			t.Error("registering a scheme twice did not panic")
		}
	}()
	zodb.RegisterDriver(fake, nil)
}

// TestOpenFile opens the fs1 fixture through the file driver: read-only
// unless asked.
func TestOpenFile(t *testing.T) {
	ctx := context.Background()
	for _, u := range []string{"../fs1/testdata/1.fs", "file://../fs1/testdata/1.fs"} {
		stor, err := zodb.Open(ctx, u, nil)
		if err != nil {
			t.Fatalf("%s: %v", u, err)
		}
		if _, _, err := stor.Load(ctx, zodb.Xid{Oid: 0, At: zodb.TidMax}); err != nil {
			t.Errorf("%s: %v", u, err)
		}
		if ws, ok := stor.(zodb.WriteStorage); ok {
			if _, err := ws.Begin(ctx, zodb.TxnMeta{}); !errors.Is(err, zodb.ErrReadOnly) {
				t.Errorf("%s: Begin on a read-only open: %v", u, err)
			}
		}
		stor.Close()
	}
	if _, err := zodb.Open(ctx, "file://", nil); err == nil {
		t.Error("file:// without a path opened")
	}
}
