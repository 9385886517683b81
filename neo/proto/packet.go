package proto

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"

	"github.com/zodbd/zodbd/internal/memtrim"
	"github.com/zodbd/zodbd/neo/internal/msgp"
)

// Packet is one framed packet [msg_id, code, args] as read from a stream.
// Args is the raw msgpack array of the arguments; it aliases the Reader's
// buffer until the next ReadPacket.
type Packet struct {
	ID   uint32
	Code uint16
	Args []byte
}

// IsAnswer tells whether the packet is an answer (including Error).
func (p Packet) IsAnswer() bool { return p.Code&AnswerBit != 0 }

// Decode decodes the packet's arguments into m, which must be of the
// packet's type (an Error packet is decoded into an *Error and returned
// as the error when m is not an *Error).
func (p Packet) Decode(m Msg) error {
	return DecodeMsg(p.Code, p.Args, m)
}

// DecodeMsg decodes args of a packet with the given code into m. If code is
// CodeError and m is not an *Error, the decoded *Error is returned as the
// error. Any other mismatch of code is an error.
func DecodeMsg(code uint16, args []byte, m Msg) error {
	if c := m.Code(); c != code {
		if code == CodeError {
			e := new(Error)
			if err := e.DecodeArgs(args); err != nil {
				return err
			}
			return e
		}
		return fmt.Errorf("proto: got %s, want %s", CodeName(code), CodeName(c))
	}
	return m.DecodeArgs(args)
}

// AppendPacket appends the encoding of packet [id, m.Code(), m's args].
func AppendPacket(b []byte, id uint32, m Msg) []byte {
	return m.AppendArgs(appendPacketHeader(b, id, m.Code()))
}

// AppendRawPacket appends the encoding of packet [id, code, args] whose
// arguments are already encoded: args is appended as is. Neither code nor
// args is checked, so that tests can forge malformed packets with it; a
// well-formed packet has a known code and args that are one msgpack array.
func AppendRawPacket(b []byte, id uint32, code uint16, args []byte) []byte {
	return append(appendPacketHeader(b, id, code), args...)
}

// appendPacketHeader appends the 3-array header of a packet, its msg_id and
// code: what precedes its arguments.
func appendPacketHeader(b []byte, id uint32, code uint16) []byte {
	b = append(b, 0x93) // fixarray of 3
	b = msgp.AppendUint(b, uint64(id))
	return msgp.AppendUint(b, uint64(code))
}

// AppendHandshake appends the handshake ("NEO", Version).
func AppendHandshake(b []byte) []byte { return append(b, Handshake[:]...) }

// HandshakeError reports a peer whose first 6 bytes are not our handshake.
type HandshakeError struct {
	Got          []byte // the bytes received
	OtherVersion bool   // NEO, but another protocol version
}

func (e *HandshakeError) Error() string {
	if e.OtherVersion {
		v := int(e.Got[5])
		if e.Got[5] > 0x7f {
			return fmt.Sprintf("proto: NEO protocol version mismatch (peer handshake % x, want version %d)", e.Got, Version)
		}
		return fmt.Sprintf("proto: NEO protocol version mismatch: peer speaks version %d, we speak %d", v, Version)
	}
	return fmt.Sprintf("proto: not a NEO peer (handshake % x)", e.Got)
}

// FrameError reports a malformed stream: a packet that is not a 3-array, a
// bad msg_id or code, an unknown code, non-array args or a packet over
// MaxPacketSize. The connection must be closed.
type FrameError struct {
	Offset int64 // stream offset of the packet's first byte
	Err    error
}

func (e *FrameError) Error() string {
	return fmt.Sprintf("proto: malformed packet at offset %d: %v", e.Offset, e.Err)
}

func (e *FrameError) Unwrap() error { return e.Err }

// Errors wrapped by FrameError.
var (
	ErrTooLarge    = errors.New("packet larger than MaxPacketSize")
	ErrUnknownCode = errors.New("unknown packet code")
)

// Reader reads the handshake and packets from a stream, with one reusable
// buffer: in steady state reading a packet does not allocate.
type Reader struct {
	r          io.Reader
	buf        []byte
	start, end int   // unread data is buf[start:end]
	off        int64 // stream offset of buf[start]
	err        error // sticky read error
	MaxSize    int   // maximal packet size; MaxPacketSize when 0
	// Resize, when not nil, is called before the buffer grows to size
	// bytes, and with 0 when the Reader lets go of a buffer that grew
	// (nothing buffered, or Release): an error refuses the growth and
	// ends the reading with it (a server's bound on the memory of the
	// packets being received, internal/netconn.FrameCharge.Resize).
	Resize func(size int) error
	// scan sizes the packet at buf[start:], resuming over reads, so that
	// a packet of n bytes arriving in many reads costs O(n).
	scan msgp.Scanner
}

// DefaultReaderBufSize is the initial buffer size of a Reader.
const DefaultReaderBufSize = 32 << 10

// maxKeptBuf is the largest buffer a Reader keeps once it is empty.
const maxKeptBuf = 256 << 10

// NewReader returns a Reader of r.
func NewReader(r io.Reader) *Reader {
	return &Reader{r: r}
}

// Offset returns the stream offset of the next byte to be parsed.
func (r *Reader) Offset() int64 { return r.off }

// Buffered returns the number of bytes read from the stream and not parsed
// yet.
func (r *Reader) Buffered() int { return r.end - r.start }

// PacketBuffered reports whether a whole packet is buffered: whether the
// next ReadPacket returns without reading from the stream.
func (r *Reader) PacketBuffered() bool {
	data := r.buf[r.start:r.end]
	if len(data) == 0 {
		return false
	}
	s := r.scan // resume where ReadPacket's scan stopped, without moving it
	n, err := s.Len(data)
	return err != msgp.ErrShort && n <= len(data)
}

// fill reads more bytes, making room for at least one more byte. The
// previous packet's bytes may be moved.
func (r *Reader) fill() error {
	if r.err != nil {
		return r.err
	}
	if r.buf == nil || (r.start == r.end && len(r.buf) > maxKeptBuf) {
		// Nothing is buffered: a buffer that a big packet made grow
		// goes, so that an idle connection does not keep it.
		if r.buf != nil {
			memtrim.Dropped(len(r.buf))
			if r.Resize != nil {
				r.Resize(0)
			}
		}
		r.buf = make([]byte, DefaultReaderBufSize)
		r.start, r.end = 0, 0
	}
	if r.start > 0 && (r.end == len(r.buf) || r.start == r.end) {
		n := copy(r.buf, r.buf[r.start:r.end])
		r.start, r.end = 0, n
	}
	if r.end == len(r.buf) {
		if r.Resize != nil {
			if err := r.Resize(2 * len(r.buf)); err != nil {
				r.err = err
				return err
			}
		}
		nb := make([]byte, 2*len(r.buf))
		copy(nb, r.buf[r.start:r.end])
		r.end -= r.start
		r.start = 0
		r.buf = nb
	}
	for i := 0; i < 100; i++ {
		n, err := r.r.Read(r.buf[r.end:])
		r.end += n
		if err != nil {
			if n > 0 {
				if !isTimeout(err) {
					r.err = err
				}
				return nil
			}
			if !isTimeout(err) {
				r.err = err
			}
			return err
		}
		if n > 0 {
			return nil
		}
	}
	r.err = io.ErrNoProgress
	return r.err
}

// Release drops the Reader's buffer (when the connection ends), telling
// internal/memtrim about a big one. Reading after Release starts a new
// buffer.
func (r *Reader) Release() {
	memtrim.Dropped(len(r.buf))
	if r.Resize != nil {
		r.Resize(0)
	}
	r.buf, r.start, r.end = nil, 0, 0
	r.scan.Reset()
}

// isTimeout reports an expired deadline. It is not sticky: the stream is
// intact (a Reader never consumes part of a packet), and reading may go on
// once the deadline is moved.
func isTimeout(err error) bool { return errors.Is(err, os.ErrDeadlineExceeded) }

// ReadHandshake reads the peer's 6-byte handshake and checks it.
func (r *Reader) ReadHandshake() error {
	if r.buf == nil {
		// No read buffer yet: the handshake is read on its own, so that
		// a peer that sends nothing (or only the handshake) costs no
		// buffer (DefaultReaderBufSize) while it is there.
		var got [len(Handshake)]byte
		n, err := io.ReadFull(r.r, got[:])
		switch {
		case err == io.EOF:
			return fmt.Errorf("proto: handshake: %w", io.EOF)
		case err != nil:
			return fmt.Errorf("proto: handshake: %w", err)
		}
		r.off += int64(n)
		if got != Handshake {
			return &HandshakeError{Got: got[:], OtherVersion: string(got[:5]) == string(Handshake[:5])}
		}
		return nil
	}
	for r.end-r.start < len(Handshake) {
		if err := r.fill(); err != nil {
			if err == io.EOF {
				if r.end > r.start {
					return fmt.Errorf("proto: handshake: %w", io.ErrUnexpectedEOF)
				}
				return fmt.Errorf("proto: handshake: %w", io.EOF)
			}
			return fmt.Errorf("proto: handshake: %w", err)
		}
	}
	got := r.buf[r.start : r.start+len(Handshake)]
	if string(got) == string(Handshake[:]) {
		r.start += len(Handshake)
		r.off += int64(len(Handshake))
		return nil
	}
	e := &HandshakeError{Got: append([]byte(nil), got...)}
	e.OtherVersion = string(got[:5]) == string(Handshake[:5])
	return e
}

// ReadPacket reads the next packet. The returned Args aliases the Reader's
// buffer until the next call. Errors: io.EOF at a clean end of stream,
// io.ErrUnexpectedEOF inside a packet, *FrameError for malformed input, or
// the underlying reader's error. An expired read deadline
// (os.ErrDeadlineExceeded) leaves the Reader as it was: a later call
// resumes where this one stopped, even inside a packet.
func (r *Reader) ReadPacket() (Packet, error) {
	maxSize := r.MaxSize
	if maxSize <= 0 {
		maxSize = MaxPacketSize
	}
	for {
		data := r.buf[r.start:r.end]
		if len(data) > 0 {
			// reject non-arrays at once, without waiting for more bytes
			if t, err := msgp.NextType(data); err != nil || t != msgp.Array {
				return Packet{}, r.frameErr(fmt.Errorf("packet is not an array (lead byte 0x%02x)", data[0]))
			}
			n, err := r.scan.Len(data)
			if err == nil {
				if n > maxSize {
					return Packet{}, r.frameErr(ErrTooLarge)
				}
				p, err := parsePacket(data[:n:n])
				if err != nil {
					return Packet{}, r.frameErr(err)
				}
				r.start += n
				r.off += int64(n)
				return p, nil
			}
			if err != msgp.ErrShort {
				return Packet{}, r.frameErr(err)
			}
			if len(data) >= maxSize {
				return Packet{}, r.frameErr(ErrTooLarge)
			}
		}
		if err := r.fill(); err != nil {
			if err == io.EOF {
				if r.end > r.start {
					return Packet{}, fmt.Errorf("proto: packet at offset %d: %w", r.off, io.ErrUnexpectedEOF)
				}
				return Packet{}, io.EOF
			}
			return Packet{}, err
		}
	}
}

func (r *Reader) frameErr(err error) error {
	r.scan.Reset()
	r.err = &FrameError{Offset: r.off, Err: err}
	return r.err
}

// ParsePacket parses one complete packet [msg_id, code, args] that is
// exactly b; Args aliases b.
func ParsePacket(b []byte) (Packet, error) {
	n, err := msgp.Len(b)
	if err != nil {
		return Packet{}, err
	}
	if n != len(b) {
		return Packet{}, fmt.Errorf("%d trailing bytes after the packet", len(b)-n)
	}
	return parsePacket(b)
}

func parsePacket(b []byte) (Packet, error) {
	n, rest, err := msgp.ReadArrayHeader(b)
	if err != nil {
		return Packet{}, err
	}
	if n != 3 {
		return Packet{}, fmt.Errorf("packet is an array of %d, want 3", n)
	}
	id, rest, err := msgp.ReadUint(rest)
	if err != nil {
		return Packet{}, fmt.Errorf("msg_id: %w", err)
	}
	if id > math.MaxUint32 {
		return Packet{}, fmt.Errorf("msg_id %d out of range", id)
	}
	code, rest, err := msgp.ReadUint(rest)
	if err != nil {
		return Packet{}, fmt.Errorf("code: %w", err)
	}
	if code > math.MaxUint16 {
		return Packet{}, fmt.Errorf("code %d out of range", code)
	}
	if !KnownCode(uint16(code)) {
		return Packet{}, fmt.Errorf("%w 0x%x", ErrUnknownCode, code)
	}
	if t, err := msgp.NextType(rest); err != nil || t != msgp.Array {
		return Packet{}, fmt.Errorf("%s: args are not an array", CodeName(uint16(code)))
	}
	return Packet{ID: uint32(id), Code: uint16(code), Args: rest}, nil
}
