package fs1

import (
	"fmt"
	"io"
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
		return nil
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

func (o *packOut) fail(pos int64, err error) error {
	return &Error{o.path, pos, "packed file", fmt.Errorf("write: %w", err)}
}
