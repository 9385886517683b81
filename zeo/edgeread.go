package zeo

import (
	"encoding/binary"
	"io"
	"net"
	"os"
	"syscall"

	"github.com/zodbd/zodbd/internal/memtrim"
	"github.com/zodbd/zodbd/internal/netconn"
	"github.com/zodbd/zodbd/zeo/wire"
)

// The request loop of a plain TCP connection reads its socket inside one
// syscall.RawConn.Read, so that a read which drained the socket is not
// followed by a second read that finds nothing.
//
// Through net.Conn.Read, a client with one request in flight costs the
// server two reads per request: the one that gets the request and, once the
// reply is written, one that fails with EAGAIN before the reader parks in
// the runtime's poller. Every net.Conn.Read must try the socket first: it
// starts by forgetting what the poller reported (a readiness seen before
// the call may be stale), so waiting without reading could sleep through
// a request that already arrived.
//
// The poller is edge-triggered, and a TCP read that returns less than it
// was offered emptied the socket's receive queue: any byte that arrives
// later (even while that read ran) makes a new edge. So within one
// RawConn.Read, whose readiness is reset only at its start, a reader that
// got a short read, answered what it got and then waits for the poller
// wakes up exactly when there is something new: it needs no read to find
// out. A stale readiness (an edge for bytes the short read took) costs one
// read that finds nothing, as before. A read that filled what it was
// offered is followed by another read at once.
//
// It waits only after a short read that brought exactly one request and
// nothing more, a call answered at once: the pattern of a client with one
// request in flight, which cannot send the next before it has the reply.
// The end of the stream is the exception to "any byte makes a new edge":
// a read that returns the last bytes also takes the FIN queued behind
// them (in the same segment, or the edge of that FIN was the one the wait
// before the read took: both arrived while the loop answered the request
// before). After a call answered at once, a client that closed or went
// gets the reply and answers it with a reset, which makes an edge. After
// a one-way request or a heartbeat, which nothing answers, and after a
// call whose reply comes later from a goroutine of its own (a vote that
// waits for the commit lock, whose gone client would keep its
// transaction until the lock's holder finished), the loop reads again at
// once, and finds the end there. (A client that half-closes after a call
// and reads the reply keeps the connection until the server next writes
// to it or TCP keepalive finds it gone.) A read that brought
// several requests, or part of one, is from a client that pipelines: its
// next requests may have arrived while they were answered, and the poller
// hears of them only when it next runs (under load, when a P runs out of
// goroutines), so the loop reads again at once, as net.Conn.Read would.
//
// The loop ends when the connection must close: a handler or a write
// failed (the writer then fails, which a flush reports), the client went,
// or the connection was closed (the wait fails). Connections with
// busy-polling (its reader spins on its own reads) and TLS connections
// (the record layer reads) use the buffered loop of serve instead.

// edgeBuf is the read buffer of serveEdge: the unread bytes are buf[r:w];
// a request bigger than buf is assembled in big (bigN bytes in all) as
// its bytes arrive; spare is the buffer of the last one, kept for the
// next when at most keepFrame.
type edgeBuf struct {
	buf    []byte
	r, w   int
	big    []byte
	bigN   int
	spare  []byte
	charge netconn.FrameCharge // big's, to the server's FrameMemory
}

// edgeBufSize is serveEdge's read buffer: the bufio.Reader's size of the
// buffered loop.
const edgeBufSize = 64 << 10

// serveEdge runs the connection's request loop (see above) when its
// connection allows it, and reports whether it did.
func (c *conn) serveEdge() bool {
	if c.srv.cfg.BusyPoll != nil {
		return false
	}
	rc, ok := edgeConn(c.nc)
	if !ok {
		return false
	}
	e := &edgeBuf{buf: make([]byte, edgeBufSize), charge: netconn.FrameCharge{M: c.srv.frameMem}}
	defer func() {
		if e.big != nil { // a request's buffer lost with the connection
			memtrim.Dropped(cap(e.big))
		}
		e.charge.Done()
	}()
	// What the handshake's reader read beyond the handshake (a client
	// that sent its first requests at once).
	if n := c.br.Buffered(); n > 0 {
		b, _ := c.br.Peek(n)
		e.w = copy(e.buf, b)
	}
	c.br = nil

	var (
		rerr error // the read's failure, or io.EOF
		stop bool  // a handler or a write asked to close
	)
	err := rc.Read(func(fd uintptr) bool {
		for {
			if _, ok := c.edgeCallsN(e); !ok {
				stop = true
				return true
			}
			dst, err := e.space()
			if err != nil {
				rerr = err
				return true
			}
			n, err := syscall.Read(int(fd), dst)
			switch {
			case err == syscall.EINTR:
				continue
			case err == syscall.EAGAIN:
				c.edgeIdle(e)
				return false // wait for the poller
			case err != nil:
				rerr = &net.OpError{Op: "read", Net: c.nc.LocalAddr().Network(), Source: c.nc.LocalAddr(), Addr: c.nc.RemoteAddr(),
					Err: os.NewSyscallError("read", err)}
				return true
			case n == 0:
				rerr = io.EOF
				if e.r < e.w || e.big != nil {
					rerr = io.ErrUnexpectedEOF
				}
				return true
			}
			e.got(n)
			if n == len(dst) {
				continue // there may be more: answer, read again
			}
			// The socket is empty.
			calls, ok := c.edgeCallsN(e)
			if !ok {
				stop = true
				return true
			}
			if calls == 1 && c.awaited && !c.spawned && e.r == e.w && e.big == nil {
				// One call, answered: a client with one request in
				// flight sends no other before it reads the reply.
				// Wait for the poller without a read.
				c.edgeIdle(e)
				return false
			}
			// Several requests or part of one: a client that
			// pipelines, whose next bytes may be here already
			// (the poller hears of them only when it next runs):
			// read again at once, as net.Conn.Read would.
		}
	})
	switch {
	case stop:
	case err != nil:
		c.readFailed(err)
	case rerr != nil:
		c.readFailed(rerr)
	}
	return true
}

// edgeIdle is conn.idle for the edge loop, whose request buffer's spare
// goes too.
func (c *conn) edgeIdle(e *edgeBuf) {
	if e.big == nil && cap(e.spare) > idleKeep {
		memtrim.Dropped(cap(e.spare))
		e.spare = nil
	}
	c.idle()
}

// edgeConn returns the raw socket of nc when serveEdge reads it: a TCP
// connection's. Anything else (a TLS connection, a wrapper, a Unix
// socket) is read through net.Conn. A Unix socket would be read correctly
// the same way, but measured no fewer system calls (BENCHMARKS.md, "Over
// a Unix socket"): with either loop, nearly every request there is
// followed by a read that finds nothing, the reader having been woken
// again after its reply (Linux 6.18; probably by the wake-up a Unix
// socket gets whenever its peer consumes data, which TCP does not send).
func edgeConn(nc net.Conn) (syscall.RawConn, bool) {
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return nil, false
	}
	rc, err := tc.SyscallConn()
	return rc, err == nil
}

// edgeCallsN answers every complete request in e and returns how many it
// answered; ok is false when the connection must be closed.
func (c *conn) edgeCallsN(e *edgeBuf) (calls int, ok bool) {
	for ; ; calls++ {
		var frame []byte
		switch {
		case e.big != nil:
			if len(e.big) < e.bigN {
				e.compact()
				return calls, true
			}
			frame, e.big, e.bigN = e.big, nil, 0
		case e.w-e.r < 4:
			e.compact()
			return calls, true
		default:
			n := int(binary.BigEndian.Uint32(e.buf[e.r:]))
			if uint64(n) > uint64(c.srv.cfg.MaxFrame) {
				c.readFailed(&wire.FrameTooBigError{Size: uint64(n), Max: uint64(c.srv.cfg.MaxFrame)})
				return calls, false
			}
			if 4+n > len(e.buf) {
				// Bigger than the buffer, which holds nothing but
				// its start: assembled on its own, in a buffer that
				// grows as the bytes arrive (a size claimed is not
				// memory spent).
				e.bigN = n
				if cap(e.spare) >= min(n, bigStart) {
					e.big, e.spare = e.spare[:e.w-e.r-4], nil
				} else {
					e.big = make([]byte, e.w-e.r-4, min(n, bigStart))
				}
				copy(e.big, e.buf[e.r+4:e.w])
				e.r, e.w = 0, 0
				calls-- // none answered
				continue
			}
			if e.w-e.r < 4+n {
				e.compact()
				return calls, true
			}
			frame = e.buf[e.r+4 : e.r+4+n]
			e.r += 4 + n
		}
		ok := c.call(frame)
		e.charge.Done()
		switch {
		case cap(frame) <= edgeBufSize: // in buf
		case cap(frame) <= keepFrame:
			e.spare = frame[:0]
		default:
			memtrim.Dropped(cap(frame))
		}
		if !ok || !c.answered(e.buffered()) {
			return calls + 1, false
		}
	}
}

// awaitsReply reports whether m is a call that the client awaits a reply
// to: not one-way, not a heartbeat.
func awaitsReply(m *wire.Message) bool {
	return !m.Flags.Truth() && !(m.ID.Kind == wire.Int && m.ID.Int == -1)
}

// bigStart is the size up to which a request bigger than the read buffer
// gets its buffer at once (wire.ReadFrame's rule); a bigger one's buffer
// starts there and doubles as its bytes arrive. Small: a header that
// announces a megabyte followed by nothing costs a connection little.
const bigStart = 128 << 10

// buffered reports whether a complete request is in e.
func (e *edgeBuf) buffered() bool {
	if e.big != nil {
		return len(e.big) == e.bigN
	}
	if e.w-e.r < 4 {
		return false
	}
	return uint64(binary.BigEndian.Uint32(e.buf[e.r:]))+4 <= uint64(e.w-e.r)
}

// compact moves the unread bytes to the start of the buffer when the room
// after them is short.
func (e *edgeBuf) compact() {
	switch {
	case e.r == e.w:
		e.r, e.w = 0, 0
	case e.r > 0 && len(e.buf)-e.w < 4<<10:
		e.w = copy(e.buf, e.buf[e.r:e.w])
		e.r = 0
	}
}

// space returns where the next read goes: the rest of the request being
// assembled (grown as needed, never past its end, within the server's
// FrameMemory), or the buffer's room.
func (e *edgeBuf) space() ([]byte, error) {
	if e.big != nil {
		if len(e.big) == cap(e.big) {
			size := min(max(2*cap(e.big), bigStart), e.bigN)
			if err := e.charge.Resize(size); err != nil {
				return nil, err
			}
			b := make([]byte, len(e.big), size)
			copy(b, e.big)
			memtrim.Dropped(cap(e.big))
			e.big = b
		}
		return e.big[len(e.big):min(cap(e.big), e.bigN)], nil
	}
	return e.buf[e.w:], nil
}

// got records n bytes read into space().
func (e *edgeBuf) got(n int) {
	if e.big != nil {
		e.big = e.big[:len(e.big)+n]
	} else {
		e.w += n
	}
}
