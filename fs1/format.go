// Package fs1 reads and writes FileStorage files — the Data.fs
// format of ZODB/py — bit-compatibly with ZODB/py.
//
// File layout (all integers big-endian):
//
//	file        = magic ("FS21" or "FS30") txn*
//	txn         = tid[8] tlen[8] status[1] ulen[2] dlen[2] elen[2]
//	              user[ulen] description[dlen] extension[elen] data* tlen[8]
//	data        = oid[8] tid[8] prev[8] tloc[8] vlen[2] plen[8]
//	              (plen > 0: data[plen] | plen == 0: backpointer[8])
//
// tlen counts the transaction record without its trailing redundant copy of
// tlen, so the next transaction starts at pos+tlen+8. prev is the position
// of the previous data record of the same oid (0 for none), tloc the position
// of the enclosing transaction. A data record with plen == 0 holds a
// backpointer: the position of a data record (of the same oid, in an earlier
// transaction) whose data it shares; a backpointer of 0 means "no data"
// (undo of the object's creation, or deleteObject).
package fs1

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/zodbd/zodbd/zodb"
)

// File format constants.
const (
	Magic21 = "FS21" // written by ZODB/py on Python 2
	Magic30 = "FS30" // written by ZODB/py on Python 3
	// HeaderSize is the size of the file header (the magic).
	HeaderSize = 4
	// TxnHeaderFixSize is the fixed part of a transaction header.
	TxnHeaderFixSize = 8 + 8 + 1 + 2 + 2 + 2
	// DataHeaderSize is the size of a data record header.
	DataHeaderSize = 8 + 8 + 8 + 8 + 2 + 8
)

// Error reports a problem with a record of a FileStorage file, with the
// record's offset: "fs1: Data.fs:1234: data record: backpointer out of range".
type Error struct {
	Path   string // file name
	Pos    int64  // offset of the record (or of the damage)
	Record string // "transaction record", "data record", "file header", ...
	Err    error
}

func (e *Error) Error() string {
	return fmt.Sprintf("fs1: %s:%d: %s: %v", e.Path, e.Pos, e.Record, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// ErrTorn says that a transaction record extends past the end of the file,
// or is left in the checkpoint ('c') state: the file ends in a transaction
// whose commit did not finish. Readers treat the file as ending before it.
var ErrTorn = errors.New("transaction record extends past end of file (torn tail)")

// TxnHeader is the header of a transaction record and its metadata.
type TxnHeader struct {
	Pos    int64 // position of the record in the file
	Tid    zodb.Tid
	Len    int64 // tlen: length of the record without the trailing redundant length
	Status zodb.TxnStatus
	// User, Description and Extension alias an internal buffer that the next
	// Load reuses; copy them to keep them.
	User        []byte
	Description []byte
	Extension   []byte

	buf []byte
}

// HeaderLen is the length of the header including user/description/extension:
// the position of the first data record is Pos+HeaderLen().
func (th *TxnHeader) HeaderLen() int64 {
	return TxnHeaderFixSize + int64(len(th.User)+len(th.Description)+len(th.Extension))
}

// DataPos returns the position of the transaction's first data record.
func (th *TxnHeader) DataPos() int64 { return th.Pos + th.HeaderLen() }

// End returns the position of the redundant length, which is also the end of
// the transaction's data records.
func (th *TxnHeader) End() int64 { return th.Pos + th.Len }

// Next returns the position of the following transaction record.
func (th *TxnHeader) Next() int64 { return th.Pos + th.Len + 8 }

// TxnHeaderFix is the fixed part of a transaction header, decoded without any
// validation (for tools that must report what the bytes say).
type TxnHeaderFix struct {
	Tid                      zodb.Tid
	Len                      uint64
	Status                   byte
	UserLen, DescLen, ExtLen uint16
}

// DecodeTxnHeaderFix decodes the first TxnHeaderFixSize bytes of b.
func DecodeTxnHeaderFix(b []byte) TxnHeaderFix {
	_ = b[TxnHeaderFixSize-1]
	return TxnHeaderFix{
		Tid:     zodb.Tid(binary.BigEndian.Uint64(b[0:])),
		Len:     binary.BigEndian.Uint64(b[8:]),
		Status:  b[16],
		UserLen: binary.BigEndian.Uint16(b[17:]),
		DescLen: binary.BigEndian.Uint16(b[19:]),
		ExtLen:  binary.BigEndian.Uint16(b[21:]),
	}
}

// MetaLen is the total length of user, description and extension.
func (h *TxnHeaderFix) MetaLen() int64 {
	return int64(h.UserLen) + int64(h.DescLen) + int64(h.ExtLen)
}

// Load reads and checks the transaction header at pos of a file whose valid
// data ends at size. It checks that the record fits in the file (else the
// error wraps ErrTorn), that the status is one ZODB/py writes, and that the
// metadata fits in the record. It does not read the redundant length; see
// CheckRedundantLen.
func (th *TxnHeader) Load(r io.ReaderAt, path string, pos, size int64) error {
	fail := func(err error) error { return &Error{path, pos, "transaction record", err} }
	if pos+TxnHeaderFixSize > size {
		return fail(ErrTorn)
	}
	if cap(th.buf) < TxnHeaderFixSize+256 {
		th.buf = make([]byte, TxnHeaderFixSize+256)
	}
	// One read usually gets the header and all of its metadata.
	n := int64(len(th.buf[:cap(th.buf)]))
	if pos+n > size {
		n = size - pos
	}
	buf := th.buf[:n]
	if _, err := r.ReadAt(buf, pos); err != nil {
		return fail(fmt.Errorf("read: %w", err))
	}
	h := DecodeTxnHeaderFix(buf)
	th.Pos, th.Tid, th.Status = pos, h.Tid, zodb.TxnStatus(h.Status)
	if h.Len > uint64(size) || pos+int64(h.Len)+8 > size {
		return fail(ErrTorn)
	}
	th.Len = int64(h.Len)
	if th.Status == zodb.TxnCheckpoint {
		return fail(ErrTorn)
	}
	switch th.Status {
	case zodb.TxnComplete, zodb.TxnPacked, zodb.TxnInprogress:
	default:
		return fail(fmt.Errorf("invalid status %q", byte(th.Status)))
	}
	meta := h.MetaLen()
	if th.Len < TxnHeaderFixSize+meta {
		return fail(fmt.Errorf("transaction length %d shorter than its header (%d)", th.Len, TxnHeaderFixSize+meta))
	}
	if TxnHeaderFixSize+meta > int64(len(buf)) {
		if int64(cap(th.buf)) < TxnHeaderFixSize+meta {
			th.buf = make([]byte, TxnHeaderFixSize+meta)
		}
		buf = th.buf[:TxnHeaderFixSize+meta]
		if _, err := r.ReadAt(buf, pos); err != nil {
			return fail(fmt.Errorf("read: %w", err))
		}
	}
	m := buf[TxnHeaderFixSize:]
	th.User = m[:h.UserLen:h.UserLen]
	m = m[h.UserLen:]
	th.Description = m[:h.DescLen:h.DescLen]
	m = m[h.DescLen:]
	th.Extension = m[:h.ExtLen:h.ExtLen]
	return nil
}

// CheckRedundantLen checks that the redundant length at the end of the
// transaction record equals its header's length.
func (th *TxnHeader) CheckRedundantLen(r io.ReaderAt, path string) error {
	var b [8]byte
	if _, err := r.ReadAt(b[:], th.End()); err != nil {
		return &Error{path, th.End(), "transaction record", fmt.Errorf("read redundant length: %w", err)}
	}
	if rl := binary.BigEndian.Uint64(b[:]); rl != uint64(th.Len) {
		return &Error{path, th.Pos, "transaction record", fmt.Errorf("redundant length %d != transaction length %d", rl, th.Len)}
	}
	return nil
}

// LoadPrev loads the transaction that ends just before the transaction record
// at pos (pos is the position of a transaction record, or the end of the
// valid data). It returns io.EOF when pos is the first record.
func (th *TxnHeader) LoadPrev(r io.ReaderAt, path string, pos, size int64) error {
	if pos <= HeaderSize {
		return io.EOF
	}
	var b [8]byte
	if pos-8 < HeaderSize {
		return &Error{path, pos, "transaction record", errors.New("no room for previous transaction's length")}
	}
	if _, err := r.ReadAt(b[:], pos-8); err != nil {
		return &Error{path, pos - 8, "transaction record", fmt.Errorf("read redundant length: %w", err)}
	}
	tl := binary.BigEndian.Uint64(b[:])
	if tl > uint64(pos) || pos-8-int64(tl) < HeaderSize {
		return &Error{path, pos - 8, "transaction record", fmt.Errorf("redundant length %d out of range", tl)}
	}
	ppos := pos - 8 - int64(tl)
	if err := th.Load(r, path, ppos, size); err != nil {
		return err
	}
	if th.Len != int64(tl) {
		return &Error{path, ppos, "transaction record", fmt.Errorf("transaction length %d != redundant length %d", th.Len, tl)}
	}
	return nil
}

// DataHeader is the header of a data record.
type DataHeader struct {
	Pos        int64 // position of the record
	Oid        zodb.Oid
	Tid        zodb.Tid
	PrevRevPos int64 // position of the oid's previous revision, 0 if none
	TxnPos     int64 // position of the enclosing transaction record
	DataLen    int64 // plen; 0 means the record holds a backpointer
	// BackPos is the backpointer when DataLen == 0 (0: no data), else 0.
	BackPos int64
}

// DataHeaderRaw is a data record header decoded without validation.
type DataHeaderRaw struct {
	Oid     zodb.Oid
	Tid     zodb.Tid
	Prev    uint64
	TxnPos  uint64
	VerLen  uint16
	DataLen uint64
}

// DecodeDataHeaderRaw decodes the first DataHeaderSize bytes of b.
func DecodeDataHeaderRaw(b []byte) DataHeaderRaw {
	_ = b[DataHeaderSize-1]
	return DataHeaderRaw{
		Oid:     zodb.Oid(binary.BigEndian.Uint64(b[0:])),
		Tid:     zodb.Tid(binary.BigEndian.Uint64(b[8:])),
		Prev:    binary.BigEndian.Uint64(b[16:]),
		TxnPos:  binary.BigEndian.Uint64(b[24:]),
		VerLen:  binary.BigEndian.Uint16(b[32:]),
		DataLen: binary.BigEndian.Uint64(b[34:]),
	}
}

// Len returns the length of the whole record.
func (dh *DataHeader) Len() int64 {
	if dh.DataLen == 0 {
		return DataHeaderSize + 8
	}
	return DataHeaderSize + dh.DataLen
}

// Load reads and checks the data record header at pos, which must lie inside
// [pos, end) where end is the end of the enclosing transaction's data (its
// redundant-length position). It checks that the record fits, that it has no
// version, that prev points before it and the backpointer before it.
func (dh *DataHeader) Load(r io.ReaderAt, path string, pos, end int64) error {
	var b [DataHeaderSize + 8]byte
	fail := func(err error) error { return &Error{path, pos, "data record", err} }
	if pos < HeaderSize || pos+DataHeaderSize > end {
		return fail(fmt.Errorf("header out of range (transaction data ends at %d)", end))
	}
	n := len(b)
	if pos+int64(n) > end {
		n = DataHeaderSize
	}
	if _, err := r.ReadAt(b[:n], pos); err != nil {
		return fail(fmt.Errorf("read: %w", err))
	}
	return dh.decode(b[:n], path, pos, end)
}

func (dh *DataHeader) decode(b []byte, path string, pos, end int64) error {
	fail := func(err error) error { return &Error{path, pos, "data record", err} }
	if len(b) < DataHeaderSize {
		return fail(fmt.Errorf("short header (%d bytes)", len(b)))
	}
	h := DecodeDataHeaderRaw(b)
	if h.VerLen != 0 {
		return fail(fmt.Errorf("version length %d != 0 (versions are not supported)", h.VerLen))
	}
	if h.Prev >= uint64(pos) || (h.Prev != 0 && h.Prev < HeaderSize) {
		return fail(fmt.Errorf("previous-revision pointer %d out of range", h.Prev))
	}
	if h.TxnPos >= uint64(pos) || h.TxnPos < HeaderSize {
		return fail(fmt.Errorf("transaction pointer %d out of range", h.TxnPos))
	}
	if h.DataLen > uint64(end-pos-DataHeaderSize) {
		return fail(fmt.Errorf("data length %d exceeds transaction record (ends at %d)", h.DataLen, end))
	}
	*dh = DataHeader{
		Pos: pos, Oid: h.Oid, Tid: h.Tid,
		PrevRevPos: int64(h.Prev), TxnPos: int64(h.TxnPos), DataLen: int64(h.DataLen),
	}
	if dh.DataLen == 0 {
		if pos+DataHeaderSize+8 > end || len(b) < DataHeaderSize+8 {
			return fail(fmt.Errorf("backpointer exceeds transaction record (ends at %d)", end))
		}
		back := binary.BigEndian.Uint64(b[DataHeaderSize:])
		if back != 0 && (back >= uint64(pos) || back < HeaderSize) {
			return fail(fmt.Errorf("backpointer %d out of range", back))
		}
		dh.BackPos = int64(back)
	}
	return nil
}

// LoadData appends the data of the record described by dh to dst, following
// the backpointer chain when dh holds a backpointer. It returns the extended
// dst and the header of the record that holds the data; when the chain ends
// in "no data" (backpointer 0) it returns dst unchanged and a header with
// DataLen == 0 and BackPos == 0.
//
// Every backpointer must point to an earlier record of the same oid, so the
// chain is finite.
func (dh *DataHeader) LoadData(r io.ReaderAt, path string, dst []byte) ([]byte, DataHeader, error) {
	cur := *dh
	for cur.DataLen == 0 {
		if cur.BackPos == 0 {
			return dst, cur, nil
		}
		from := cur.Pos
		var next DataHeader
		// The record pointed to lies wholly before the record pointing to it.
		if err := next.Load(r, path, cur.BackPos, from); err != nil {
			return dst, cur, &Error{path, from, "data record", fmt.Errorf("backpointer %d: %w", cur.BackPos, err)}
		}
		if next.Oid != cur.Oid {
			return dst, cur, &Error{path, from, "data record", fmt.Errorf("backpointer %d: points to a record of oid %s, not %s", cur.BackPos, next.Oid, cur.Oid)}
		}
		cur = next
	}
	n := len(dst)
	if int64(cap(dst)-n) < cur.DataLen {
		grown := make([]byte, n, int64(n)+cur.DataLen)
		copy(grown, dst)
		dst = grown
	}
	dst = dst[:n+int(cur.DataLen)]
	if _, err := r.ReadAt(dst[n:], cur.Pos+DataHeaderSize); err != nil {
		return dst[:n], cur, &Error{path, cur.Pos, "data record", fmt.Errorf("read data: %w", err)}
	}
	return dst, cur, nil
}

// appendTxnHeader appends a transaction header: the fixed part, then user,
// description and extension.
func appendTxnHeader(b []byte, tid zodb.Tid, tlen int64, status byte, user, desc, ext []byte) []byte {
	var h [TxnHeaderFixSize]byte
	binary.BigEndian.PutUint64(h[0:], uint64(tid))
	binary.BigEndian.PutUint64(h[8:], uint64(tlen))
	h[16] = status
	binary.BigEndian.PutUint16(h[17:], uint16(len(user)))
	binary.BigEndian.PutUint16(h[19:], uint16(len(desc)))
	binary.BigEndian.PutUint16(h[21:], uint16(len(ext)))
	b = append(b, h[:]...)
	b = append(b, user...)
	b = append(b, desc...)
	return append(b, ext...)
}

// appendDataHeader appends a data record header (version length 0).
func appendDataHeader(b []byte, oid zodb.Oid, tid zodb.Tid, prev, tpos, plen int64) []byte {
	var h [DataHeaderSize]byte
	binary.BigEndian.PutUint64(h[0:], uint64(oid))
	binary.BigEndian.PutUint64(h[8:], uint64(tid))
	binary.BigEndian.PutUint64(h[16:], uint64(prev))
	binary.BigEndian.PutUint64(h[24:], uint64(tpos))
	binary.BigEndian.PutUint64(h[34:], uint64(plen))
	return append(b, h[:]...)
}
