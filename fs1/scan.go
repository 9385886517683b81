package fs1

import (
	"encoding/binary"
	"fmt"
	"io"

	"github.com/zodbd/zodbd/zodb"
)

// scanBufSize is the read size of the sequential scanner. Headers are read
// from this window; data larger than the window is skipped without reading.
const scanBufSize = 1 << 20

// windowReader serves small forward reads (headers) at increasing positions
// from a large buffer refilled with ReadAt, so that scanning a file costs one
// system call per megabyte rather than one per record, and large data
// payloads are skipped without being read.
type windowReader struct {
	r    io.ReaderAt
	buf  []byte
	bpos int64 // file position of buf[0]
	n    int   // valid bytes in buf
}

// peek returns n bytes at pos. The slice is valid until the next peek.
func (w *windowReader) peek(pos int64, n int) ([]byte, error) {
	if pos >= w.bpos && pos+int64(n) <= w.bpos+int64(w.n) {
		off := pos - w.bpos
		return w.buf[off : off+int64(n)], nil
	}
	if n > len(w.buf) {
		w.buf = make([]byte, n)
	}
	m, err := w.r.ReadAt(w.buf, pos)
	w.bpos, w.n = pos, m
	if m >= n {
		return w.buf[:n], nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return nil, err
}

// ScanResult is what a scan of a FileStorage file found.
type ScanResult struct {
	// End is the position after the last complete transaction: the end of
	// the data readers may see.
	End int64
	// LastTid is the tid of the last complete transaction scanned (0 if
	// none was).
	LastTid zodb.Tid
	// Torn is the position of an incomplete transaction at the end of the
	// file (a torn tail), or 0. End == Torn when it is set.
	Torn int64
	// NTxn is the number of complete transactions scanned.
	NTxn int
	// Warnings lists anomalies that ZODB/py tolerates with a warning
	// (time-stamp reductions, wrong previous pointers), each with its offset.
	Warnings []string
}

// Scan reads the transactions of the FileStorage file r (whose size is size)
// from position from on, checks their structure, and records in idx the
// position of the latest data record of every oid it meets. It stops at the
// end of the file or at a torn tail (reported in ScanResult.Torn, not as an
// error). prevTid is the tid of the transaction before from (0 at the start).
//
// Damage that is not a torn tail — a bad status, data records that do not add
// up to the transaction length, a redundant length that does not match — is
// an *Error naming its offset.
func Scan(r io.ReaderAt, path string, from, size int64, prevTid zodb.Tid, idx *Index) (ScanResult, error) {
	res := ScanResult{End: from, LastTid: prevTid}
	w := &windowReader{r: r, buf: make([]byte, scanBufSize)}
	pos := from
	fail := func(pos int64, rec string, format string, args ...interface{}) (ScanResult, error) {
		return res, &Error{path, pos, rec, fmt.Errorf(format, args...)}
	}
	// Positions of this transaction's records; the index is updated only
	// once the whole transaction has been checked.
	type ent struct {
		oid zodb.Oid
		pos int64
	}
	var tindex []ent
	for pos < size {
		if size-pos < TxnHeaderFixSize {
			res.Torn = pos
			break
		}
		b, err := w.peek(pos, TxnHeaderFixSize)
		if err != nil {
			return fail(pos, "transaction record", "read: %w", err)
		}
		h := DecodeTxnHeaderFix(b)
		if torn, damage := checkTxnHeader(r, &h, pos, size); torn {
			res.Torn = pos
			break
		} else if damage != "" {
			return fail(pos, "transaction record", "%s", damage)
		}
		tpos, tlen := pos, int64(h.Len)
		tend := tpos + tlen
		if h.Tid <= res.LastTid && res.LastTid != 0 {
			res.Warnings = append(res.Warnings, fmt.Sprintf("%s: time-stamp reduction at %d", path, tpos))
		}
		if zodb.TxnStatus(h.Status) != zodb.TxnInprogress {
			tindex = tindex[:0]
			dpos := tpos + TxnHeaderFixSize + h.MetaLen()
			for dpos < tend {
				if tend-dpos < DataHeaderSize {
					return fail(dpos, "data record", "header exceeds transaction record (ends at %d)", tend)
				}
				b, err := w.peek(dpos, DataHeaderSize)
				if err != nil {
					return fail(dpos, "data record", "read: %w", err)
				}
				d := DecodeDataHeaderRaw(b)
				if d.VerLen != 0 {
					return fail(dpos, "data record", "version length %d != 0 (versions are not supported)", d.VerLen)
				}
				if d.TxnPos != uint64(tpos) {
					return fail(dpos, "data record", "transaction pointer %d != transaction position %d", d.TxnPos, tpos)
				}
				rlen := int64(8)
				if d.DataLen != 0 {
					rlen = int64(d.DataLen)
				}
				if d.DataLen > uint64(tend) || dpos+DataHeaderSize+rlen > tend {
					return fail(dpos, "data record", "data record exceeds transaction record (ends at %d)", tend)
				}
				if d.Prev >= uint64(dpos) {
					return fail(dpos, "data record", "previous-revision pointer %d out of range", d.Prev)
				}
				if cur, _ := idx.Get(d.Oid); uint64(cur) != d.Prev {
					res.Warnings = append(res.Warnings, fmt.Sprintf("%s: incorrect previous pointer at %d", path, dpos))
				}
				tindex = append(tindex, ent{d.Oid, dpos})
				dpos += DataHeaderSize + rlen
			}
			if dpos != tend {
				return fail(tpos, "transaction record", "data records don't add up to the transaction length")
			}
		}
		b, err = w.peek(tend, 8)
		if err != nil {
			return fail(tend, "transaction record", "read redundant length: %w", err)
		}
		if rl := binary.BigEndian.Uint64(b); rl != uint64(tlen) {
			return fail(tpos, "transaction record", "redundant length %d != transaction length %d", rl, tlen)
		}
		for _, e := range tindex {
			idx.Set(e.oid, e.pos)
		}
		tindex = tindex[:0]
		pos = tend + 8
		res.End, res.LastTid = pos, h.Tid
		res.NTxn++
	}
	return res, nil
}

// checkTxnHeader classifies the fixed transaction header h at pos of a
// file of size bytes (read through r), as Scan and pack read it: torn (the
// start of a tail a crash left half written: voted but never finished,
// or an impossible length or status that tornTail finds at the end), or
// damage (its description: committed transactions follow it), or neither.
// The length is checked before the status, as ZODB/py does: a tail of
// garbage (zeros after a crash) is a torn tail, not an invalid status.
func checkTxnHeader(r io.ReaderAt, h *TxnHeaderFix, pos, size int64) (torn bool, damage string) {
	if h.Status == byte(zodb.TxnCheckpoint) {
		return true, "" // voted, never finished
	}
	switch {
	case h.Len > uint64(size) || pos+int64(h.Len)+8 > size:
		// A header written before a crash whose transaction did not
		// all reach the disk; in the middle of the file, a damaged
		// length.
		damage = fmt.Sprintf("transaction length %d goes past the end of the file (%d)", h.Len, size)
	case int64(h.Len) < TxnHeaderFixSize+h.MetaLen():
		damage = fmt.Sprintf("transaction length %d shorter than its header (%d)", h.Len, TxnHeaderFixSize+h.MetaLen())
	default:
		switch zodb.TxnStatus(h.Status) {
		case zodb.TxnComplete, zodb.TxnPacked, zodb.TxnInprogress:
			return false, ""
		}
		damage = fmt.Sprintf("invalid status %q", h.Status)
		// A crash leaves a status 'c' or, not written, 0: any other
		// in a record whose length and redundant length agree is
		// damage, whatever the end of the file looks like.
		if h.Status != 0 {
			var b [8]byte
			if _, err := r.ReadAt(b[:], pos+int64(h.Len)); err == nil && binary.BigEndian.Uint64(b[:]) == h.Len {
				return false, damage
			}
		}
	}
	if tornTail(r, pos, size) {
		return true, ""
	}
	return false, damage
}

// tornGarbage reports whether a transaction header at pos with an impossible
// length looks like garbage at the end of the file (as after a crash) rather
// than damage in the middle: ZODB/py's heuristic reads the last 8 bytes of
// the file as a transaction length and checks whether it is plausible.
func tornGarbage(r io.ReaderAt, pos, size int64) bool {
	var b [8]byte
	if size < 8 {
		return true
	}
	if _, err := r.ReadAt(b[:], size-8); err != nil {
		return true
	}
	rtl := binary.BigEndian.Uint64(b[:])
	return rtl < TxnHeaderFixSize || rtl > uint64(size) || size-int64(rtl) < pos
}

// tornTail reports whether the damaged transaction header at pos (an
// impossible length or status) is the start of a tail that a crash left
// half written rather than damage in the middle of the file: ZODB/py's
// heuristic (tornGarbage: the last 8 bytes of the file are not a plausible
// transaction length), or, walking back from the end of the file through
// the redundant lengths, no transaction that committed (status ' ' or
// 'p', its length agreeing) comes after pos, and the header at pos, if
// the walk reaches it, was not written (status 0).
//
// After a power loss, the transactions that were not made durable may
// have reached the disk sector by sector in any order: the trailer of the
// last one can be there while a header before it is still zeros. ZODB/py
// refuses such a file ("invalid transaction header"); zodbd's writer
// writes a transaction's status byte only once its data is durable
// (groupcommit.go), so that no committed status follows the durable part
// of the file, and treats the tail as torn (a read-write open saves it to
// path.trN before truncating it).
func tornTail(r io.ReaderAt, pos, size int64) bool {
	if tornGarbage(r, pos, size) {
		return true
	}
	// Walk back from the end of the file through the redundant lengths
	// down to pos: a transaction that committed after pos means that the
	// header at pos is damage, not the start of a tail a crash left (the
	// writers flip a status to committed only once every byte before it
	// is durable).
	var b [TxnHeaderFixSize]byte
	end := size
	for {
		if _, err := r.ReadAt(b[:8], end-8); err != nil {
			return false
		}
		rtl := binary.BigEndian.Uint64(b[:8])
		if rtl < TxnHeaderFixSize || rtl > uint64(end-8) || end-8-int64(rtl) < pos {
			return true // the chain breaks in the tail: garbage
		}
		start := end - 8 - int64(rtl)
		if _, err := r.ReadAt(b[:], start); err != nil {
			return false
		}
		h := DecodeTxnHeaderFix(b[:])
		if start == pos {
			// The damaged header is the last one before the end: a
			// crash leaves it in the checkpoint state (handled by the
			// caller) or not written (status byte 0), never with a
			// committed or other status.
			return h.Status == 0
		}
		committed := (h.Status == byte(zodb.TxnComplete) || h.Status == byte(zodb.TxnPacked)) && h.Len == rtl && h.Tid != 0
		if committed {
			return false
		}
		end = start
	}
}
