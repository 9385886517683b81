package backup

import (
	"encoding/binary"
	"fmt"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/zodb"
)

// txnHeaderLen is the fixed part of a transaction header: tid[8] tlen[8]
// status[1] ulen[2] dlen[2] elen[2].
const txnHeaderLen = 23

// walker follows the transaction records of a FileStorage byte stream as it
// passes through (in the order of the file, starting at some transaction
// boundary or at offset 0), without buffering more than one header. It
// checks the structure repozo's checksums cannot locate (the magic, each
// header's length and status, the redundant length after each record) and
// finds where to cut the stream for a point-in-time restore.
type walker struct {
	pos  int64 // logical Data.fs offset of the next byte fed
	next int64 // offset of the next transaction header, or of the redundant length when inTail

	// cut, when non-zero: stop before the first transaction whose tid is
	// greater. cutAt is then that transaction's offset (-1 until found),
	// cutTid and cutStatus its tid and status.
	cut       zodb.Tid
	cutAt     int64
	cutTid    zodb.Tid
	cutStatus byte

	inTail  bool  // reading the redundant length of the current record
	txnPos  int64 // offset of the current transaction
	txnLen  uint64
	lastTid zodb.Tid // tid of the last complete transaction
	ntxn    int

	// idx, when not nil, receives the position of each data record of
	// the committed transactions (what fs1.Scan builds); the walker then
	// also follows the data records inside each transaction.
	idx    *fs1.Index
	inData bool       // reading the data record headers of the current transaction
	dend   int64      // where its data records end (its redundant length)
	tindex []idxEntry // the current transaction's records, set in idx at its end

	buf [fs1.DataHeaderSize]byte
	n   int // bytes in buf
}

type idxEntry struct {
	oid zodb.Oid
	pos int64
}

// newWalker returns a walker for a stream that starts at Data.fs offset
// start: 0 (the magic comes first) or a transaction boundary.
func newWalker(start int64, cut zodb.Tid) *walker {
	return &walker{pos: start, next: start, cut: cut, cutAt: -1}
}

// walkError is structural damage found by the walker, at Data.fs offset Pos.
type walkError struct {
	Pos int64
	Msg string
}

func (e *walkError) Error() string { return fmt.Sprintf("offset %d: %s", e.Pos, e.Msg) }

// feed passes p through the walker. It returns how many bytes of p come
// before the cut (len(p) while no cut was found) and the first structural
// error. After a cut, further bytes are not looked at.
func (w *walker) feed(p []byte) (keep int, err error) {
	if w.cutAt >= 0 {
		return 0, nil
	}
	i := 0
	for i < len(p) {
		if w.pos < 4 && w.next == 0 {
			// The magic.
			k := copy(w.buf[w.n:4], p[i:])
			w.n += k
			i += k
			w.pos += int64(k)
			if w.n == 4 {
				if m := string(w.buf[:4]); m != "FS21" && m != "FS30" {
					return i, &walkError{0, fmt.Sprintf("not a FileStorage file (magic %q)", m)}
				}
				w.n = 0
				w.next = 4
			}
			continue
		}
		if w.pos < w.next {
			// Skip data records up to the next point of interest.
			k := w.next - w.pos
			if k > int64(len(p)-i) {
				k = int64(len(p) - i)
			}
			i += int(k)
			w.pos += k
			continue
		}
		if w.inData && w.next == w.dend {
			w.inData, w.inTail = false, true
			continue
		}
		want := txnHeaderLen
		switch {
		case w.inTail:
			want = 8
		case w.inData:
			if w.dend-w.next < fs1.DataHeaderSize {
				return i, &walkError{w.next, fmt.Sprintf("data record header exceeds its transaction (at %d, ending at %d)", w.txnPos, w.dend)}
			}
			want = fs1.DataHeaderSize
		}
		k := copy(w.buf[w.n:want], p[i:])
		w.n += k
		i += k
		w.pos += int64(k)
		if w.n < want {
			continue
		}
		w.n = 0
		if w.inTail {
			if rl := binary.BigEndian.Uint64(w.buf[:8]); rl != w.txnLen {
				return i, &walkError{w.next, fmt.Sprintf("redundant transaction length %d, want %d (transaction at %d)", rl, w.txnLen, w.txnPos)}
			}
			w.inTail = false
			w.next += 8
			w.ntxn++
			for _, e := range w.tindex {
				w.idx.Set(e.oid, e.pos)
			}
			w.tindex = w.tindex[:0]
			continue
		}
		if w.inData {
			dpos := w.next
			d := fs1.DecodeDataHeaderRaw(w.buf[:])
			rlen := uint64(8) // a backpointer
			if d.DataLen != 0 {
				rlen = d.DataLen
			}
			switch {
			case d.VerLen != 0:
				return i, &walkError{dpos, fmt.Sprintf("data record: version length %d", d.VerLen)}
			case d.TxnPos != uint64(w.txnPos):
				return i, &walkError{dpos, fmt.Sprintf("data record: transaction pointer %d, want %d", d.TxnPos, w.txnPos)}
			case rlen > uint64(w.dend-dpos-fs1.DataHeaderSize):
				return i, &walkError{dpos, fmt.Sprintf("data record exceeds its transaction (at %d, ending at %d)", w.txnPos, w.dend)}
			}
			w.tindex = append(w.tindex, idxEntry{d.Oid, dpos})
			w.next = dpos + fs1.DataHeaderSize + int64(rlen)
			continue
		}
		// A transaction header.
		tpos := w.next
		tid := zodb.Tid(binary.BigEndian.Uint64(w.buf[0:8]))
		tlen := binary.BigEndian.Uint64(w.buf[8:16])
		status := w.buf[16]
		if w.cut != 0 && tid > w.cut {
			w.cutAt, w.cutTid, w.cutStatus = tpos, tid, status
			// The header may have begun in an earlier call: the caller
			// truncates its output at cutAt.
			if keep := i - int(w.pos-tpos); keep > 0 {
				return keep, nil
			}
			return 0, nil
		}
		meta := uint64(txnHeaderLen) + uint64(binary.BigEndian.Uint16(w.buf[17:19])) +
			uint64(binary.BigEndian.Uint16(w.buf[19:21])) + uint64(binary.BigEndian.Uint16(w.buf[21:23]))
		switch {
		case status != ' ' && status != 'p' && status != 'u':
			return i, &walkError{tpos, fmt.Sprintf("transaction %s: status %q", tid, status)}
		case tlen < meta || tlen > 1<<48:
			return i, &walkError{tpos, fmt.Sprintf("transaction %s: length %d", tid, tlen)}
		}
		w.txnPos, w.txnLen, w.lastTid = tpos, tlen, tid
		w.next = tpos + int64(tlen)
		if w.idx != nil && status != 'u' {
			// Its data records, from after its metadata.
			w.inData, w.dend = true, w.next
			w.next = tpos + int64(meta)
		} else {
			w.inTail = true
		}
		if w.pos > w.next { // cannot happen: tlen >= 23
			w.next = w.pos
		}
	}
	return len(p), nil
}

// atBoundary tells whether the stream fed so far ends on a transaction
// boundary (or after the magic); if not, it says where the incomplete record
// began.
func (w *walker) atBoundary() error {
	if w.cutAt >= 0 {
		return nil
	}
	if w.pos < 4 && w.next == 0 {
		return &walkError{w.pos, "file ends inside the magic"}
	}
	if w.inTail || w.pos != w.next || w.n != 0 {
		return &walkError{w.txnPos, fmt.Sprintf("incomplete transaction record (the data ends at %d)", w.pos)}
	}
	return nil
}
