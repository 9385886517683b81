package zeo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/zodbd/zodbd/internal/eventlog"
	"github.com/zodbd/zodbd/zodb"
)

// The server's log: records with ZEO's logger names and levels, so that a
// log written by zodbd reads as runzeo's where operators and ZEO's tests
// look (for example "CRITICAL ZEO.StorageServer (label addr) Transaction
// timeout after 30 seconds"). Messages about a connection start with its
// label in parentheses, as ZEO's: the client's address, preceded by the
// label the client gave with set_client_label.

// ZEO's logger names.
const (
	logStorageServer = "ZEO.StorageServer"  // connections, transactions
	logProtocol      = "ZEO.asyncio.server" // handshakes, framing, bad messages
)

// zlog is a named logger writing to the server's event log.
type zlog struct {
	out  *eventlog.Logger
	name string
}

// log writes a record at level lv; the arguments are formatted only when
// the record passes the levels.
func (l zlog) log(lv eventlog.Level, format string, args ...any) {
	l.out.Logf(lv, l.name, format, args...)
}

// newEventLog returns cfg.Log, or without it a logger writing every
// record as one "LEVEL name message" line to cfg.Logf (log.Printf when
// nil).
func newEventLog(cfg *Config) *eventlog.Logger {
	if cfg.Log != nil {
		return cfg.Log
	}
	logf := cfg.Logf
	if logf == nil {
		logf = log.Printf
	}
	h, err := eventlog.NewWriterHandler(logfWriter(logf), eventlog.NotSet, "%(levelname)s %(name)s %(message)s", "")
	if err != nil {
		panic(err) // a constant format
	}
	return eventlog.New(eventlog.NotSet, h)
}

// logfWriter passes each written line to a Printf-like function.
type logfWriter func(format string, args ...any)

func (f logfWriter) Write(b []byte) (int, error) {
	f("%s", strings.TrimSuffix(string(b), "\n"))
	return len(b), nil
}

var _ io.Writer = logfWriter(nil)

// logf logs a line in the form the server's code used before it had
// levels: "zeo: " is dropped (the logger's name says it), a message
// starting with "CRITICAL: " after it is CRITICAL, any other is ERROR.
// New code uses the leveled helpers below.
func (s *Server) logf(format string, args ...any) {
	lv := eventlog.Error
	format = strings.TrimPrefix(format, "zeo: ")
	if f, ok := strings.CutPrefix(format, "CRITICAL: "); ok {
		lv, format = eventlog.Critical, f
	}
	s.ss.log(lv, format, args...)
}

// setLabel records the client's label (set_client_label): later messages
// about the connection name it, as ZEO's "(label addr)".
func (c *conn) setLabel(label string) {
	// Any bytes from the client (Python's surrogateescape'd names pickle
	// as invalid UTF-8): metrics refuse a label that is not UTF-8. A
	// label goes into every log line and scrape about the connection:
	// at most maxLabel bytes, and no control character (a newline split
	// the log line).
	label = strings.ToValidUTF8(label, "\uFFFD")
	if len(label) > maxLabel {
		label = strings.ToValidUTF8(label[:maxLabel], "")
	}
	label = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return '?'
		}
		return r
	}, label)
	c.label = label
	c.metricLabel.Store(&label)
	l := label + " " + c.addrLabel()
	c.logLabel.Store(&l)
}

// logName is a name (or other bytes) a client sent, as a log line shows
// it: Python's repr of its first 64 bytes, so that no byte it holds can
// end the line or forge another.
func logName(b []byte) string { return eventlog.PyReprCut(b, 64) }

// maxLogged is the most bytes of a client's string (a transaction's user
// or description, a file name) a log line quotes.
const maxLogged = 200

// maxLabel is the longest client label kept, in bytes.
const maxLabel = 128

// addrLabel is the connection's address as its log label: the peer's
// host:port, or for a Unix socket the socket's path.
func (c *conn) addrLabel() string {
	if c.peer != "" && c.peer != "@" {
		return c.peer
	}
	if a := c.nc.LocalAddr(); a != nil {
		return a.String()
	}
	return "unix"
}

// labelPrefix is "(label) ", the start of messages about the connection.
func (c *conn) labelPrefix() string {
	if l := c.logLabel.Load(); l != nil {
		return "(" + *l + ") "
	}
	return "(" + c.addrLabel() + ") "
}

// log logs a message about the connection under ZEO.StorageServer,
// prefixed by its label, as ZEO's ZEOStorage.log.
func (c *conn) log(lv eventlog.Level, format string, args ...any) {
	if !c.srv.ss.out.Enabled(lv) {
		return
	}
	c.srv.ss.log(lv, "%s%s", c.labelPrefix(), fmt.Sprintf(format, args...))
}

// logProto logs a protocol-level message about the connection (handshake,
// framing, undecodable or unknown messages) under ZEO.asyncio.server.
func (c *conn) logProto(lv eventlog.Level, format string, args ...any) {
	if !c.srv.proto.out.Enabled(lv) {
		return
	}
	c.srv.proto.log(lv, "%s%s", c.labelPrefix(), fmt.Sprintf(format, args...))
}

// logConnected logs a connection whose handshake succeeded: "new
// connection ('host', port): received handshake 'Z5'" (zeoserverlog's
// pattern of a connection, and ZEO 5's words for the handshake).
func (c *conn) logConnected(proto []byte) {
	c.srv.proto.log(eventlog.Info, "new connection %s: received handshake '%s'", pyAddr(c.addrLabel()), proto)
}

// pyAddr writes a host:port as Python's repr of the (host, port) tuple,
// and anything else (a socket path) as a Python string.
func pyAddr(a string) string {
	if host, port, err := net.SplitHostPort(a); err == nil {
		if _, err := strconv.Atoi(port); err == nil {
			return "('" + host + "', " + port + ")"
		}
	}
	return "'" + a + "'"
}

// logDisconnected logs the end of a connection as ZEO does: "disconnected",
// or "disconnected during locked transaction" (it had voted: it held the
// commit lock) or "... unlocked transaction" (begun, not voted). Called
// before the open transaction is aborted.
func (c *conn) logDisconnected() {
	c.txmu.Lock()
	t := c.txn
	locked := t != nil && (t.stxn != nil || t.finishing)
	c.txmu.Unlock()
	switch {
	case t == nil:
		c.log(eventlog.Info, "disconnected")
	case locked:
		c.log(eventlog.Info, "disconnected during locked transaction")
	default:
		c.log(eventlog.Info, "disconnected during unlocked transaction")
	}
}

// txnDesc describes a transaction for the log: its tid once the storage
// assigned one, its user and description, its number of operations.
func (c *conn) txnDesc(t *ztxn) string {
	var b strings.Builder
	b.WriteString("transaction")
	if tt, ok := t.stxn.(tidder); ok && t.stxn != nil {
		b.WriteString(" " + tt.Tid().String())
	} else if t.meta.Tid != 0 {
		b.WriteString(" " + t.meta.Tid.String())
	}
	// User and description as the client sent them, cut (a client may
	// send megabytes).
	fmt.Fprintf(&b, " of storage %s (user %s, description %s, %d operations)", eventlog.PyRepr(c.st.name),
		eventlog.PyReprCut(string(t.meta.User), maxLogged), eventlog.PyReprCut(string(t.meta.Description), maxLogged), len(t.ops))
	return b.String()
}

// logVoteFailed logs a vote that ends in an error reply (not the conflicts
// returned to the client for resolution). As ZEO: a conflict the client
// cannot resolve is logged at BLATHER ("conflict error ..."), a vote
// abandoned because the connection ended or aborted at INFO, anything
// else is an ERROR ("While voting ...").
func (c *conn) logVoteFailed(t *ztxn, err error) {
	var ce *zodb.ConflictError
	var ces zodb.ConflictErrors
	switch {
	case errors.As(err, &ce) || errors.As(err, &ces):
		c.log(eventlog.Blather, "conflict error in the vote of %s: %v", c.txnDesc(t), err)
	case errors.Is(err, context.Canceled):
		c.log(eventlog.Info, "vote of %s abandoned: %v", c.txnDesc(t), err)
	default:
		c.log(eventlog.Error, "While voting %s: %v", c.txnDesc(t), err)
	}
}

// logFinishFailed logs a tpc_finish that failed after a successful vote:
// the storage could not write the transaction's status or make it durable.
func (c *conn) logFinishFailed(t *ztxn, err error) {
	c.log(eventlog.Error, "tpc_finish of %s failed: %v", c.txnDesc(t), err)
}

// logTxnTimeout logs a client that held the commit lock longer than the
// transaction timeout, in ZEO's words ("Transaction timeout after N
// seconds", CRITICAL); the caller then closes the connection.
func (c *conn) logTxnTimeout() {
	c.log(eventlog.Critical, "Transaction timeout after %s seconds", seconds(c.srv.cfg.TransactionTimeout))
}

// seconds writes d in seconds: a whole number when it is one, as ZEO
// writes its integer transaction-timeout.
func seconds(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10)
	}
	return strconv.FormatFloat(d.Seconds(), 'f', -1, 64)
}
