package zodb

import (
	"context"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"sync"
)

// This file holds the opening of a storage by URL and the optional
// interfaces that client drivers (zeo://, later neo://) add to Storage.
//
// The zodb package knows no driver: each engine or protocol client
// registers itself from an init function of its own package
// (RegisterDriver), and a program links the drivers it wants with blank
// imports:
//
//	import (
//		_ "github.com/zodbd/zodbd/fs1"        // file paths, file://
//		_ "github.com/zodbd/zodbd/zeo/client" // zeo://
//	)
//
//	stor, err := zodb.Open(ctx, "zeo://127.0.0.1:8100", nil)

// OpenOptions tune Open. The zero value (or nil) opens read-only with the
// driver's default client cache.
type OpenOptions struct {
	// ReadWrite asks for a storage that accepts commits: the result then
	// implements WriteStorage (if the driver and the server allow it).
	// Without it a driver opens read-only: a file is never modified, a
	// ZEO client registers read-only.
	ReadWrite bool

	// CacheSize is the byte budget of the client cache of a network
	// driver: 0 means the driver's default, a negative value turns the
	// cache off (every Load is a round trip). Local engines ignore it.
	CacheSize int64

	// Logf receives the driver's warnings; nil means log.Printf.
	Logf func(format string, args ...interface{})
}

// DriverOpener opens the storage that u names. opt is never nil.
type DriverOpener func(ctx context.Context, u *url.URL, opt *OpenOptions) (Storage, error)

var drivers struct {
	mu sync.RWMutex
	m  map[string]DriverOpener
}

// RegisterDriver makes Open use open for URLs with the given scheme
// ("file", "zeo", "neo"). It panics if the scheme is registered twice.
func RegisterDriver(scheme string, open DriverOpener) {
	drivers.mu.Lock()
	defer drivers.mu.Unlock()
	if drivers.m == nil {
		drivers.m = make(map[string]DriverOpener)
	}
	if _, dup := drivers.m[scheme]; dup {
		panic("zodb: driver for scheme " + scheme + " registered twice")
	}
	drivers.m[scheme] = open
}

// Drivers returns the registered schemes, sorted.
func Drivers() []string {
	drivers.mu.RLock()
	defer drivers.mu.RUnlock()
	s := make([]string, 0, len(drivers.m))
	for k := range drivers.m {
		s = append(s, k)
	}
	sort.Strings(s)
	return s
}

// ParseURL parses a storage URL as Open does: "scheme://..." is a URL;
// "scheme:rest" with a registered scheme of two letters or more is an
// opaque URL (sqlite:path/to/db); any other
// string without "://" is a file path and becomes a file:// URL whose Path
// is the string unchanged (relative paths stay relative).
func ParseURL(s string) (*url.URL, error) {
	if s == "" {
		return nil, fmt.Errorf("zodb: empty storage URL")
	}
	if !strings.Contains(s, "://") {
		// "scheme:rest" names a registered driver (sqlite:path/db); a
		// one-letter scheme would be a Windows drive.
		if i := strings.IndexByte(s, ':'); i > 1 && driverRegistered(s[:i]) {
			return &url.URL{Scheme: s[:i], Opaque: s[i+1:]}, nil
		}
		return &url.URL{Scheme: "file", Path: s}, nil
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("zodb: storage URL: %w", err)
	}
	return u, nil
}

func driverRegistered(scheme string) bool {
	drivers.mu.RLock()
	defer drivers.mu.RUnlock()
	_, ok := drivers.m[scheme]
	return ok
}

// Open opens the storage named by rawurl with the driver registered for its
// scheme. A string without "://" is a FileStorage path (scheme "file").
//
// The URL forms of the drivers in this repository:
//
//	path/to/Data.fs, file:///abs/Data.fs   FileStorage (package fs1)
//	zeo://host:port[?storage=NAME]         ZEO server over TCP (package zeo/client)
//	zeo:///path/to/socket[?storage=NAME]   ZEO server over a Unix socket
//	zeos://host:port[?storage=NAME&ca=...]  ZEO server over TLS (package zeo/client)
//	sqlite:path/db, sqlite:///abs/db       NEO/py SQLite database, read-only (package neosqlite)
//	neo://CLUSTER@MASTER[,MASTER...]       NEO cluster (package neo/client)
func Open(ctx context.Context, rawurl string, opt *OpenOptions) (Storage, error) {
	u, err := ParseURL(rawurl)
	if err != nil {
		return nil, err
	}
	if opt == nil {
		opt = &OpenOptions{}
	}
	drivers.mu.RLock()
	open := drivers.m[u.Scheme]
	drivers.mu.RUnlock()
	if open == nil {
		return nil, fmt.Errorf("zodb: open %s: no driver for scheme %q (have %s)",
			rawurl, u.Scheme, strings.Join(Drivers(), ", "))
	}
	return open(ctx, u, opt)
}

// CommitEvent is one committed transaction as a Watcher reports it: its tid
// and the oids it changed.
type CommitEvent struct {
	Tid  Tid
	Oids []Oid
}

// Watcher is implemented by storages that report commits as they happen
// (ZEO's invalidations).
type Watcher interface {
	// Watch returns a channel that receives, in commit order, every
	// transaction committed after the call: by other clients (the
	// server's invalidations) and by this storage's own commits. The
	// channel is closed when ctx is done or the storage stops: when its
	// connection is lost, after the events that came before; when it is
	// closed, at once (the events not yet received are dropped, so that
	// nothing waits for a reader that stopped). Events are queued without
	// bound, so that a slow reader never stalls the storage.
	Watch(ctx context.Context) (<-chan CommitEvent, error)
}

// Syncer is implemented by client storages whose view of the database lags
// the server's.
type Syncer interface {
	// Sync makes a round trip to the server and returns the server's last
	// tid; when it returns, every invalidation up to that tid has been
	// applied, so LastTid (and a Load at TidMax) see at least that state.
	Sync(ctx context.Context) (Tid, error)
}

// Prefetcher is implemented by client storages that can start a load
// without waiting for it.
type Prefetcher interface {
	// Prefetch starts loading xid into the client cache, if it is not
	// cached or being loaded already, and returns at once. A later Load of
	// xid waits for that same request instead of sending another.
	Prefetch(ctx context.Context, xid Xid)
}
