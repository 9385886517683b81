package zeo

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/zodbd/zodbd/internal/eventlog"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// syncBuffer is a log output written by several goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// waitFor waits (bounded) until the log holds want.
func (b *syncBuffer) waitFor(tb testing.TB, want string) {
	tb.Helper()
	for i := 0; i < 500; i++ {
		if strings.Contains(b.String(), want) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	tb.Fatalf("log has no %q:\n%s", want, b.String())
}

func testEventLog(tb testing.TB, level eventlog.Level) (*eventlog.Logger, *syncBuffer) {
	var buf syncBuffer
	h, err := eventlog.NewWriterHandler(&buf, eventlog.NotSet, "%(levelname)s %(name)s %(message)s", "")
	if err != nil {
		tb.Fatal(err)
	}
	return eventlog.New(level, h), &buf
}

// TestConnectionLog checks the connection lines: "new connection" with
// the handshake, and "disconnected" with the client's label.
func TestConnectionLog(t *testing.T) {
	el, buf := testEventLog(t, eventlog.Info)
	addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: openFixture(t), ReadOnly: true}}, Log: el})
	c := dialRawNoRegister(t, addr, wire.Pickle)
	c.call(t, 1, "register", func(e *wire.Encoder) { e.Str("1"); e.Bool(true) }, 2)
	local := c.nc.LocalAddr().(*net.TCPAddr)
	buf.waitFor(t, "INFO ZEO.asyncio.server new connection ('127.0.0.1', "+strconv.Itoa(local.Port)+"): received handshake 'Z5'")
	c.call(t, 2, "set_client_label", func(e *wire.Encoder) { e.Str("worker-1") }, 1)
	c.nc.Close()
	buf.waitFor(t, "INFO ZEO.StorageServer (worker-1 "+local.String()+") disconnected\n")
}

// TestDisconnectDuringTransaction: ZEO's words for a client that goes
// away with a transaction begun, and one that had voted.
func TestDisconnectDuringTransaction(t *testing.T) {
	el, buf := testEventLog(t, eventlog.Info)
	addr := startServer(t, Config{Storages: []StorageConfig{{Name: "1", Storage: openWritable(t)}}, Log: el})
	begin := func(e *wire.Encoder) {
		e.Int(7)
		e.Bytes(nil)
		e.Bytes(nil)
		e.BeginDict(0)
		e.EndDict(0)
		e.None()
		e.Str(" ")
	}
	dial := func() *rawClient {
		c := dialRawNoRegister(t, addr, wire.Pickle)
		c.call(t, 1, "register", func(e *wire.Encoder) { e.Str("1"); e.Bool(false) }, 2)
		return c
	}
	c := dial()
	c.call(t, 2, "tpc_begin", begin, 6)
	local := c.nc.LocalAddr().String()
	c.nc.Close()
	buf.waitFor(t, "INFO ZEO.StorageServer ("+local+") disconnected during unlocked transaction\n")

	c = dial()
	c.call(t, 2, "tpc_begin", begin, 6)
	c.call(t, 3, "vote", func(e *wire.Encoder) { e.Int(7) }, 1)
	local = c.nc.LocalAddr().String()
	c.nc.Close()
	buf.waitFor(t, "INFO ZEO.StorageServer ("+local+") disconnected during locked transaction\n")
}

// TestTxnLogHelpers checks the lines the transaction code logs: the
// timeout in ZEO's words, a failed vote (BLATHER for a conflict, ERROR
// otherwise) and a failed finish, with the storage and the transaction.
func TestTxnLogHelpers(t *testing.T) {
	el, buf := testEventLog(t, eventlog.Blather)
	srv, err := NewServer(Config{Storages: []StorageConfig{{Name: "main", Storage: openFixture(t), ReadOnly: true}},
		Log: el, TransactionTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	c := newConn(srv, a)
	c.st = srv.storages["main"]
	c.setLabel("app")
	tx := &ztxn{id: 1, meta: zodb.TxnMeta{User: []byte("bob"), Description: []byte("it's new")}, ops: make([]op, 2)}

	c.logTxnTimeout()
	c.logVoteFailed(tx, zodb.ConflictErrors{{Oid: 1, Committed: 2, Serial: 1}})
	c.logVoteFailed(tx, errors.New("disk full"))
	c.logVoteFailed(tx, context.Canceled)
	c.logFinishFailed(tx, errors.New("fsync: I/O error"))
	want := []string{
		"CRITICAL ZEO.StorageServer (app pipe) Transaction timeout after 30 seconds",
		"BLATHER ZEO.StorageServer (app pipe) conflict error in the vote of transaction of storage 'main' (user 'bob', description \"it's new\", 2 operations): ",
		"ERROR ZEO.StorageServer (app pipe) While voting transaction of storage 'main' (user 'bob', description \"it's new\", 2 operations): disk full",
		"INFO ZEO.StorageServer (app pipe) vote of transaction of storage 'main' (user 'bob', description \"it's new\", 2 operations) abandoned: context canceled",
		"ERROR ZEO.StorageServer (app pipe) tpc_finish of transaction of storage 'main' (user 'bob', description \"it's new\", 2 operations) failed: fsync: I/O error",
	}
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != len(want) {
		t.Fatalf("log:\n%s", buf.String())
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("line %d:\n got %s\nwant %s", i, lines[i], w)
		}
	}

	// A fractional timeout (zodbd serve -t 0.5) is written as a decimal.
	srv.cfg.TransactionTimeout = 1500 * time.Millisecond
	c.logTxnTimeout()
	buf.waitFor(t, "Transaction timeout after 1.5 seconds\n")
}

// TestLegacyLogf: the unleveled lines (zeo/txn.go's) go to
// ZEO.StorageServer, at CRITICAL when they say so.
func TestLegacyLogf(t *testing.T) {
	el, buf := testEventLog(t, eventlog.Info)
	srv, err := NewServer(Config{Storages: []StorageConfig{{Name: "1", Storage: openFixture(t), ReadOnly: true}}, Log: el})
	if err != nil {
		t.Fatal(err)
	}
	srv.logf("zeo: %s: tpc_finish failed: %v", "peer", "oops")
	srv.logf("zeo: CRITICAL: %s: timeout", "peer")
	if got, want := buf.String(), "ERROR ZEO.StorageServer peer: tpc_finish failed: oops\nCRITICAL ZEO.StorageServer peer: timeout\n"; got != want {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
}
