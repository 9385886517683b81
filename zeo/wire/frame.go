package wire

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
)

// DefaultMaxFrame is the default limit on the size of a received frame.
// ZEO itself has no limit; objects of hundreds of MiB are unusual, and a
// server must not be made to allocate gigabytes by a 4-byte header.
const DefaultMaxFrame = 256 << 20

// FrameTooBigError is returned by ReadFrame for a frame over the limit.
type FrameTooBigError struct {
	Size, Max uint64
}

func (e *FrameTooBigError) Error() string {
	return fmt.Sprintf("wire: frame of %d bytes exceeds the limit of %d", e.Size, e.Max)
}

// growStart is the size up to which ReadFrame allocates a frame's buffer
// at once; a bigger frame's buffer grows as its bytes arrive (a size a
// peer announces is not memory it made the reader spend).
const growStart = 128 << 10

// ReadFrame reads one frame from r and returns its payload, stored in buf
// when buf is big enough (else in a new slice). maxSize limits the
// payload's size. A connection closed between frames gives io.EOF; one
// closed inside a frame gives io.ErrUnexpectedEOF.
//
// A frame bigger than buf and than 1 MiB is read into a buffer that
// doubles as its bytes arrive until they are a quarter of the frame:
// a peer that announces a big frame and sends little of it holds little
// memory (at most four times what it sent).
func ReadFrame(r *bufio.Reader, buf []byte, maxSize int) ([]byte, error) {
	return ReadFrameGrow(r, buf, maxSize, nil)
}

// ReadFrameGrow is ReadFrame that calls grow, when not nil, before each
// growth of a big frame's buffer with the buffer's new size: an error
// from grow ends the read with that error.
func ReadFrameGrow(r *bufio.Reader, buf []byte, maxSize int, grow func(size int) error) ([]byte, error) {
	hdr, err := r.Peek(4)
	if err != nil {
		if err == io.EOF && len(hdr) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(hdr))
	r.Discard(4)
	if uint64(n) > uint64(maxSize) {
		return nil, &FrameTooBigError{uint64(n), uint64(maxSize)}
	}
	var got int
	switch {
	case cap(buf) >= n:
		buf = buf[:n]
	case n <= growStart:
		buf = make([]byte, n)
	default:
		buf = make([]byte, growStart)
		for {
			m, err := io.ReadFull(r, buf[got:])
			got += m
			if err != nil {
				return nil, unexpected(err)
			}
			if len(buf) == n {
				return buf, nil
			}
			// Double, up to a quarter of the frame; then the
			// whole frame: at most 1.5 times the frame is
			// allocated in all.
			size := 2 * len(buf)
			if 4*len(buf) >= n {
				size = n
			}
			if grow != nil {
				if err := grow(size); err != nil {
					return nil, err
				}
			}
			next := make([]byte, size)
			copy(next, buf)
			buf = next
		}
	}
	if _, err := io.ReadFull(r, buf[got:]); err != nil {
		return nil, unexpected(err)
	}
	return buf, nil
}

func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// FrameBuffered reports whether a whole frame is buffered in r, so that
// reading it costs no system call.
func FrameBuffered(r *bufio.Reader) bool {
	n := r.Buffered()
	if n < 4 {
		return false
	}
	hdr, _ := r.Peek(4)
	return uint64(binary.BigEndian.Uint32(hdr))+4 <= uint64(n)
}
