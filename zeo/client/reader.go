package client

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"time"

	"github.com/zodbd/zodbd/internal/netconn"
	"github.com/zodbd/zodbd/zeo/wire"
)

// The read side of the connection.
//
// There is no goroutine dedicated to reading. The read side (the buffered
// reader, the decoder, their buffers) is a token (netconn.Token), held in c.token, that one
// goroutine at a time takes to read and dispatch messages. A goroutine that
// waits for a reply (wait) takes the token if it is free and reads until
// its own reply has been dispatched, dispatching every message before it
// (other callers' replies, invalidations) as the reader goroutine of a
// classic client would; then it puts the token back, where the next waiter
// finds it. With one request in flight, a load is therefore what a bare
// client does (write, read, decode on the calling goroutine): the reply
// does not go through a second goroutine, whose wake-up on another CPU
// costs more than the rest of the client together. With many requests in
// flight, whoever holds the token reads the replies of all, and the others
// are woken by their done channels, as before.
//
// Messages that no waiter asks for (invalidations while the client is
// idle, replies to Prefetch) are read by the idle reader: a goroutine that
// checks periodically (netconn.Token's Idle) whether the token has
// been taken since its last check, and if not, takes it and reads until a
// reply wakes a waiter (then the frames already buffered), then gives it
// back. Invalidations therefore reach the cache and watchers at once on a
// busy connection (they come before the replies that follow them), and
// within 2×netconn.MaxDelay of the connection going quiet, however many
// Prefetch replies nobody waits for are queued before them.

// readState is the read side of the connection: whoever holds it may read.
type readState struct {
	br  *bufio.Reader
	dec *wire.Decoder
	buf []byte
	msg wire.Message // reused: dispatch's callees keep pointers into it

	// part is the frame being read: its bytes so far, of n; partial
	// while a read interrupted inside it (errMidFrame) left it so.
	part    []byte
	k, n    int
	partial bool
}

// errInterrupted is returned by readFrame when a context cancellation
// interrupted the read between two frames.
var errInterrupted = errors.New("read interrupted")

// errMidFrame is returned by readFrame when a context cancellation
// interrupted the read inside a frame: the next readFrame goes on with
// it.
var errMidFrame = errors.New("read interrupted inside a frame")

// wait returns when done is closed or receives its signal (nil), reading
// the connection in the meantime when nobody else does, or when ctx is
// done (ctx.Err()). A signal is received at most once: a waiter on a
// signalled channel (a loadCall's) must call wait only once per signal.
func (c *Client) wait(ctx context.Context, done <-chan struct{}) error {
	for {
		rs, _, what := netconn.Take(c.token, ctx, done)
		switch what {
		case netconn.Ready:
			return nil
		case netconn.Cancelled:
			return ctx.Err()
		}
		signalled, handed, err := c.readUntil(ctx, rs, done)
		if !handed {
			c.token.Put(rs)
		}
		if signalled || err != nil {
			return err
		}
	}
}

// readUntil reads and dispatches messages until done is ready (closed, or
// signalled: then the signal has been received, and signalled is true),
// the connection fails (which readies every done channel, to be received
// by the caller) or ctx is done (its error is returned). When ctx ended
// inside a frame, handed is true: a goroutine of its own reads the rest of
// that frame, dispatches it and puts the read side back (a server that
// stalls inside a reply does not hold the caller).
func (c *Client) readUntil(ctx context.Context, rs *readState, done <-chan struct{}) (signalled, handed bool, err error) {
	for {
		select {
		case <-done:
			if rs.partial {
				// Inside a frame (an interruption for another
				// waiter): its rest is read on a goroutine of its own.
				go c.finishFrame(rs)
				return true, true, nil
			}
			// Dispatch the messages already buffered, which costs no
			// system call, rather than leave them to the next waiter:
			// their waiters are woken without having to read.
			for wire.FrameBuffered(rs.br) {
				if _, err := c.readOne(rs); err != nil {
					c.fail(err)
					break
				}
			}
			return true, false, nil
		default:
		}
		if ctx.Err() != nil && !rs.partial {
			// (Between frames: the interruption for ctx may have been
			// spent on another read.)
			return false, false, ctx.Err()
		}
		if _, err := c.readOne(rs); err != nil {
			if err == errInterrupted || err == errMidFrame {
				if ctx.Err() == nil {
					continue // another waiter's cancellation, meant for its read
				}
				if err == errMidFrame {
					go c.finishFrame(rs)
					return false, true, ctx.Err()
				}
				return false, false, ctx.Err()
			}
			c.fail(err)
			return false, false, nil
		}
	}
}

// finishFrame reads the rest of the frame a cancelled waiter left, and
// dispatches it, then puts the read side back: the stream stays in step.
func (c *Client) finishFrame(rs *readState) {
	for {
		_, err := c.readOne(rs)
		if err == errMidFrame {
			continue // (a later interruption: go on)
		}
		if err != nil {
			c.fail(err)
		}
		break
	}
	c.token.Put(rs)
}

// interruptRead makes the current read return (see readFrame). c.token
// calls it when the context of a reader is done.
func (c *Client) interruptRead() {
	c.nc.SetReadDeadline(time.Unix(1, 0))
}

// readOne reads and dispatches one message; woke reports whether it was a
// reply that a caller waits for (see dispatch).
func (c *Client) readOne(rs *readState) (woke bool, err error) {
	f, err := c.readFrame(rs)
	if err != nil {
		return false, err
	}
	if cap(f) <= 1<<20 {
		rs.buf = f[:0]
	} else {
		rs.buf = nil
	}
	rs.msg, err = rs.dec.DecodeMessage(f)
	if err != nil {
		c.nc.Close()
		return false, &decodeError{err}
	}
	woke, err = c.dispatch(&rs.msg)
	// dispatch used the message's values synchronously: let go of them,
	// so that a big reply does not keep its buffers on an idle connection.
	rs.dec.Release()
	if err != nil {
		c.nc.Close()
		return false, &protocolError{err}
	}
	return woke, nil
}

// protocolError is a message that breaks the protocol (see dispatch).
type protocolError struct{ err error }

func (e *protocolError) Error() string { return "protocol error from server: " + e.err.Error() }
func (e *protocolError) Unwrap() error { return e.err }

type decodeError struct{ err error }

func (e *decodeError) Error() string { return "undecodable message from server: " + e.err.Error() }
func (e *decodeError) Unwrap() error { return e.err }

// readFrame reads one frame, like wire.ReadFrame. A read deadline (set by
// interruptRead) that expires before any byte of the frame was consumed
// gives errInterrupted, with the read side intact; one that expires inside
// a frame is cleared and gives errMidFrame, the frame's bytes so far kept
// in rs: the next readFrame reads on from there, so that the stream stays
// in step.
func (c *Client) readFrame(rs *readState) ([]byte, error) {
	if !rs.partial {
		hdr, err := rs.br.Peek(4)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				c.nc.SetReadDeadline(time.Time{})
				return nil, errInterrupted
			}
			if err == io.EOF && len(hdr) > 0 {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
		n := binary.BigEndian.Uint32(hdr)
		if uint64(n) > uint64(c.maxFrame) {
			return nil, &wire.FrameTooBigError{Size: uint64(n), Max: uint64(c.maxFrame)}
		}
		rs.br.Discard(4)
		// A big frame's buffer grows as its bytes arrive (doubling),
		// so that a length header alone does not make the client
		// allocate it.
		buf := rs.buf
		switch {
		case cap(buf) >= int(n):
			buf = buf[:n]
		case n <= frameGrowStart:
			buf = make([]byte, n)
		default:
			buf = make([]byte, frameGrowStart)
		}
		rs.part, rs.k, rs.n, rs.partial = buf, 0, int(n), true
	}
	for rs.k < rs.n {
		if rs.k == len(rs.part) {
			grown := make([]byte, min(2*len(rs.part), rs.n))
			copy(grown, rs.part)
			rs.part = grown
		}
		m, err := rs.br.Read(rs.part[rs.k:])
		rs.k += m
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				c.nc.SetReadDeadline(time.Time{})
				return nil, errMidFrame
			}
			rs.partial = false
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
	rs.partial = false
	f := rs.part
	rs.part = nil
	return f, nil
}

// frameGrowStart is the buffer a frame bigger than it starts with.
const frameGrowStart = 1 << 20

// idleReader reads what arrives while no waiter holds the token (see the
// comment at the top of this file). It returns when the connection fails.
//
// Once it has woken a caller with its reply, that caller is active and
// reads its next replies itself: the idle reader gives the token back,
// after the frames already buffered (which cost no system call, and
// whose waiters are then woken without reading). Until then it reads on:
// invalidations, and the replies to Prefetch, which nobody waits for
// (giving the token back after each of those, to take it again an idle
// period later, drained them at about one per millisecond, and held an
// invalidation queued behind them for as long).
func (c *Client) idleReader() {
	defer close(c.idleDone)
	c.token.Idle(c.failed, func(rs *readState) {
		woke := false
		for {
			w, err := c.readOne(rs)
			if err != nil {
				if err == errInterrupted || err == errMidFrame {
					continue
				}
				c.fail(err)
				return
			}
			woke = woke || w
			if woke && !wire.FrameBuffered(rs.br) {
				return // a waiter is active: let it read
			}
		}
	})
}
