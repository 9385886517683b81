package fs1

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// The buffered output of the packer. Records are encoded with
// appendTxnHeader and appendDataHeader (format.go), as the writer does.

// PackDest is where a Packer writes the packed file: it writes at
// increasing positions and sometimes reads back or patches what it wrote.
// *os.File implements it.
type PackDest interface {
	io.ReaderAt
	io.WriterAt
}

// packOut writes the packed file sequentially through a buffer. Patches
// (the length of a transaction, known at its end) and reads of what was
// written (to find the target of a backpointer) see the buffered bytes.
type packOut struct {
	f    PackDest
	path string
	buf  []byte // bytes at positions [pos-len(buf), pos)
	pos  int64  // end of the data written

	wb *writeBehind // nil: no page-cache hints
}

const packOutBufSize = 1 << 20

func (o *packOut) start() int64 { return o.pos - int64(len(o.buf)) }

func (o *packOut) write(b []byte) error {
	if len(o.buf)+len(b) > packOutBufSize && len(o.buf) > 0 {
		if err := o.flush(); err != nil {
			return err
		}
	}
	if len(b) >= packOutBufSize {
		if _, err := o.f.WriteAt(b, o.pos); err != nil {
			return o.fail(o.pos, err)
		}
		o.pos += int64(len(b))
		return o.written()
	}
	if o.buf == nil {
		o.buf = make([]byte, 0, packOutBufSize)
	}
	o.buf = append(o.buf, b...)
	o.pos += int64(len(b))
	return nil
}

func (o *packOut) flush() error {
	if len(o.buf) == 0 {
		return nil
	}
	start := o.start()
	if _, err := o.f.WriteAt(o.buf, start); err != nil {
		return o.fail(start, err)
	}
	o.buf = o.buf[:0]
	return o.written()
}

// written tells the write-behind that everything before o.pos is written.
func (o *packOut) written() error {
	if o.wb == nil {
		return nil
	}
	if err := o.wb.advance(o.start()); err != nil {
		return o.fail(o.wb.waited, err)
	}
	return nil
}

// patch overwrites b at pos (pos+len(b) <= o.pos).
func (o *packOut) patch(b []byte, pos int64) error {
	start := o.start()
	if pos >= start {
		copy(o.buf[pos-start:], b)
		return nil
	}
	if pos+int64(len(b)) > start {
		if err := o.flush(); err != nil {
			return err
		}
	}
	if _, err := o.f.WriteAt(b, pos); err != nil {
		return o.fail(pos, err)
	}
	return nil
}

// readAt reads what was written at pos.
func (o *packOut) readAt(b []byte, pos int64) error {
	if pos+int64(len(b)) > o.pos {
		return &Error{o.path, pos, "packed file", io.ErrUnexpectedEOF}
	}
	if pos+int64(len(b)) > o.start() {
		if err := o.flush(); err != nil {
			return err
		}
	}
	if _, err := o.f.ReadAt(b, pos); err != nil {
		return &Error{o.path, pos, "packed file", fmt.Errorf("read: %w", err)}
	}
	return nil
}

// ReadAt is readAt as an io.ReaderAt (DataHeader's readers).
func (o *packOut) ReadAt(b []byte, pos int64) (int, error) {
	if err := o.readAt(b, pos); err != nil {
		return 0, err
	}
	return len(b), nil
}

func (o *packOut) fail(pos int64, err error) error {
	return &Error{o.path, pos, "packed file", fmt.Errorf("write: %w", err)}
}

// errNoHints is returned by the page-cache hints (pagecache_*.go) where
// the system or the file does not support them.
var errNoHints = errors.New("page-cache hints not supported")

// writeBehindChunk is the unit in which the write-behind starts and waits
// for writeback.
const writeBehindChunk = 8 << 20

// writeBehind keeps the dirty pages of the packed file few: as the packer
// writes, the writeback of each chunk of writeBehindChunk bytes is started
// as soon as it is written, and waited for once the next chunk is written
// too (with drop, its pages then leave the page cache). The disk writes
// the packed file while the packer produces it, the final Sync has at most
// two chunks left to write, and the pack's memory is bounded by the chunks
// in flight rather than by the size of the file: without it, a pack
// dirties the whole output in the page cache, where it competes with the
// source being read (and, in a virtual machine, may take memory the host
// has to provide first), and the Sync writes it all at the end.
//
// The hints change when data reaches the disk, never what the file holds;
// durability comes from the Sync the callers do as before. Patches and
// reads of the packed file behind the chunks (transaction lengths,
// backpointer targets) simply read or re-dirty pages. Where the system
// does not support the hints, the write-behind turns itself off.
type writeBehind struct {
	f       *os.File
	drop    bool  // drop the pages once written back (an offline pack)
	started int64 // writeback started for [0, started)
	waited  int64 // written back (and dropped) for [0, waited)
	off     bool  // not supported: do nothing
}

func newWriteBehind(f *os.File, drop bool) *writeBehind {
	return &writeBehind{f: f, drop: drop}
}

// advance is called when the file is written up to end.
func (wb *writeBehind) advance(end int64) error {
	for !wb.off && end-wb.started >= writeBehindChunk {
		if err := wb.hint(startWriteback(wb.f, wb.started, writeBehindChunk)); err != nil {
			return err
		}
		wb.started += writeBehindChunk
		if n := wb.started - writeBehindChunk - wb.waited; n > 0 && !wb.off {
			// An I/O error seen here is reported (and the pack
			// fails): a later fsync may not see it again.
			if err := wb.hint(waitWriteback(wb.f, wb.waited, n)); err != nil {
				return err
			}
			if wb.drop {
				dropCache(wb.f, wb.waited, n)
			}
			wb.waited += n
		}
	}
	return nil
}

func (wb *writeBehind) hint(err error) error {
	if err == errNoHints {
		wb.off = true
		return nil
	}
	return err
}
