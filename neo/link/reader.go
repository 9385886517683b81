package link

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"github.com/zodbd/zodbd/internal/netconn"
	"github.com/zodbd/zodbd/neo/proto"
)

// The read side of a Conn.
//
// No goroutine is dedicated to reading. The packet reader is a token
// (netconn.Token), held in c.token, that one goroutine at a time takes to read and dispatch
// packets: answers to the Ask waiting for them, requests and notifications
// to the queue of Recv (or to Options.Handler). An Ask whose answer has not
// come takes the token when it is free and reads until its answer is
// there, so that with one request in flight a round trip is what a bare
// client does on the calling goroutine, without the wake-up of a reader
// goroutine (on another CPU, more than the rest of the round trip's CPU on
// the client side). With many Asks in flight, the one holding the token
// reads the answers of all and the others are woken with theirs.
//
// The idle reader is a goroutine that reads when no Ask does:
//   - from the start of the connection until the first answer, and
//     whenever a goroutine is blocked in Recv: such a connection is driven
//     by the peer's requests, and the idle reader keeps reading, as a
//     dedicated reader goroutine would;
//   - on a quiet connection: it checks periodically (netconn.Token's
//     Idle) whether an Ask took the token since its last
//     check, and if not, takes it and reads until the next answer. A
//     notification sent to a connection nobody Recv's on, on which Asks
//     just stopped, is therefore handled within 2×netconn.MaxDelay.

// waitAnswer waits for cl's result, reading the connection meanwhile when
// nobody else does. ok is false when ctx was done first.
func (c *Conn) waitAnswer(ctx context.Context, cl *call) (r result, ok bool) {
	for {
		rd, r, what := netconn.Take(c.token, ctx, cl.ch)
		switch what {
		case netconn.Ready:
			return r, true
		case netconn.Cancelled:
			return result{}, false
		}
		r, ok, cancelled := c.readUntil(ctx, rd, cl)
		c.token.Put(rd)
		if ok {
			return r, true
		}
		if cancelled {
			return result{}, false
		}
	}
}

// readUntil reads and dispatches packets until cl's result is there (ok),
// the connection fails (which delivers an error to cl: ok on the next
// round) or ctx is done (cancelled).
func (c *Conn) readUntil(ctx context.Context, rd *proto.Reader, cl *call) (r result, ok, cancelled bool) {
	for {
		select {
		case r = <-cl.ch:
			// Dispatch the packets already buffered (no system call)
			// rather than leave them to the next reader.
			for rd.Buffered() > 0 {
				if _, err := c.readOne(rd, true); err != nil {
					break
				}
			}
			return r, true, false
		default:
		}
		if _, err := c.readOne(rd, false); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() != nil {
				return result{}, false, true
			}
			// The connection failed: cl has its error.
		}
	}
}

// interruptRead makes the read in progress return os.ErrDeadlineExceeded
// (the reader stays usable, see proto.Reader.ReadPacket).
func (c *Conn) interruptRead() {
	c.nc.SetReadDeadline(time.Unix(1, 0))
}

// errIncomplete is readOne's answer when buffered is set and no whole
// packet is buffered.
var errIncomplete = errors.New("no whole packet buffered")

// readOne reads one packet and dispatches it; answer says whether it was
// an answer. An expired read deadline is cleared and returned; any other
// error shuts the connection down. With buffered, it only parses what is
// already buffered (errIncomplete if that is not a whole packet).
func (c *Conn) readOne(rd *proto.Reader, buffered bool) (answer bool, err error) {
	if buffered && !rd.PacketBuffered() {
		return false, errIncomplete
	}
	p, err := rd.ReadPacket()
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			c.nc.SetReadDeadline(time.Time{})
			return false, err
		}
		var fe *proto.FrameError
		switch {
		case c.Err() != nil: // closed by us
		case errors.As(err, &fe):
			err = fmt.Errorf("link: from %v: %w", c.nc.RemoteAddr(), err)
		case errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET):
			err = fmt.Errorf("link: %v closed the connection: %w", c.nc.RemoteAddr(), err)
		default:
			err = fmt.Errorf("link: read from %v at offset %d: %w", c.nc.RemoteAddr(), rd.Offset(), err)
		}
		c.shutdown(err)
		return false, err
	}
	c.dispatch(p)
	return p.Code&proto.AnswerBit != 0, nil
}

// dispatch delivers one packet: an answer to its Ask, a request or
// notification to the handler or the queue of Recv. p.Args is copied.
func (c *Conn) dispatch(p proto.Packet) {
	if p.Code&proto.AnswerBit != 0 {
		c.pmu.Lock()
		cl := c.pending[p.ID]
		queue := false
		stray := 0
		if cl != nil {
			delete(c.pending, p.ID)
			queue = cl.queue
			cl.ch <- result{code: p.Code, args: append(cl.buf, p.Args...)}
		} else {
			c.stray++
			stray = c.stray
		}
		c.pmu.Unlock()
		// An answer to an Ask abandoned (ctx done) comes late: dropped.
		// Logged, but not one line each for a peer that sends them
		// without end: the first 10, then at 16, 32, 64, ...
		if cl == nil && (stray <= 10 || stray&(stray-1) == 0) {
			c.logf("link: %v: dropping %s with unexpected msg_id %d (%d such answers)", c.nc.RemoteAddr(), proto.CodeName(p.Code), p.ID, stray)
		}
		if !queue {
			return
		}
		// AskQueued: a copy for Recv too, in stream order.
	}
	r := requestPool.Get().(*Request)
	r.ID, r.Code = p.ID, p.Code
	r.Args = append(r.Args[:0], p.Args...)
	if c.handler != nil {
		c.handler(c, r)
		return
	}
	c.qmu.Lock()
	c.queue = append(c.queue, r)
	c.qmu.Unlock()
	select {
	case c.qready <- struct{}{}:
	default:
	}
}

// idleReader reads when no Ask does (see the comment at the top of this
// file), until the connection is closed.
func (c *Conn) idleReader() {
	rd := c.token.Get() // the start of the connection: read until an answer
	c.readIdle(rd)
	c.token.Put(rd)
	c.token.Idle(c.done, c.readIdle)
}

// readIdle reads with the token rd until an answer comes while nobody
// waits in Recv (an Ask is then active: let it read) or the connection
// fails.
func (c *Conn) readIdle(rd *proto.Reader) {
	for {
		answer, err := c.readOne(rd, false)
		if err == nil && answer && c.recvWaiters.Load() == 0 {
			return
		}
		if err != nil && c.Err() != nil {
			return
		}
	}
}
