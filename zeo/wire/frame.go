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

// ReadFrame reads one frame from r and returns its payload, stored in buf
// when buf is big enough (else in a new slice). maxSize limits the
// payload's size. A connection closed between frames gives io.EOF; one
// closed inside a frame gives io.ErrUnexpectedEOF.
func ReadFrame(r *bufio.Reader, buf []byte, maxSize int) ([]byte, error) {
	hdr, err := r.Peek(4)
	if err != nil {
		if err == io.EOF && len(hdr) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	n := binary.BigEndian.Uint32(hdr)
	r.Discard(4)
	if uint64(n) > uint64(maxSize) {
		return nil, &FrameTooBigError{uint64(n), uint64(maxSize)}
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	if _, err := io.ReadFull(r, buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	return buf, nil
}
