package fs1

import (
	"context"
	"fmt"
	"io"

	"github.com/zodbd/zodbd/zodb"
)

// LoadBefore appends to dst the data of the revision of oid that was current
// just before tid before: the revision with the greatest serial < before.
// It returns the extended dst, the revision's serial, and next, the serial of
// the revision that replaced it (0 when it is still the current one in the
// storage's published state). This is what ZEO's loadBefore answers; next
// costs nothing extra because the walk back from the current revision
// passes over it.
//
// Errors are those of Load: *zodb.NoObjectError when oid was never stored,
// *zodb.NoDataError when it has no data before `before` (DeletedAt 0: not
// yet created; else the tid of the deletion or undone creation). With a dst
// of enough capacity it makes no allocation.
func (fs *FileStorage) LoadBefore(ctx context.Context, oid zodb.Oid, before zodb.Tid, dst []byte) (data []byte, serial, next zodb.Tid, err error) {
	data, serial, next, err = fs.loadBefore(oid, before, dst)
	if err != nil {
		err = fs.loadBeforeErr(oid, before, err)
	}
	return data, serial, next, err
}

// Revision describes the record LoadRevision found.
type Revision struct {
	Serial zodb.Tid // the record's tid
	Next   zodb.Tid // the serial of the revision that replaced it; 0 if none
	Pos    int64    // the record's position
	// BackPos is the position the record's backpointer names (an undo
	// record; its data is the data of the end of that chain), 0 for a
	// record with its own data.
	BackPos int64
	// BackTid is the tid of the record at BackPos (one link, as ZODB/py's
	// iterator gives data_txn), 0 when BackPos is 0. It comes from the
	// same published state as the rest of the Revision.
	BackTid zodb.Tid
	// NoData: the revision has no data (a deletion or an undone creation).
	NoData bool
}

// LoadRevision is LoadBefore for storage servers that must describe the
// record itself (NEO's AnswerObject): it appends the data of the revision of
// oid with the greatest serial < before to dst and returns the record's
// Revision. A revision without data is not an error here (Revision.NoData,
// nothing appended). Errors: *zodb.NoObjectError when oid was never stored,
// *zodb.NoDataError{DeletedAt: 0} when it has no revision before `before`.
func (fs *FileStorage) LoadRevision(ctx context.Context, oid zodb.Oid, before zodb.Tid, dst []byte) ([]byte, Revision, error) {
	data, rev, err := fs.loadRevision(oid, before, dst)
	if err != nil {
		err = fs.loadBeforeErr(oid, before, err)
	}
	return data, rev, err
}

// loadBefore is LoadBefore (and LoadAppend) without the OpError wrapping.
func (fs *FileStorage) loadBefore(oid zodb.Oid, before zodb.Tid, dst []byte) (data []byte, serial, next zodb.Tid, err error) {
	data, rev, err := fs.loadRevision(oid, before, dst)
	if err != nil {
		return data, 0, 0, err
	}
	if rev.NoData {
		return data, 0, 0, &zodb.NoDataError{Oid: oid, DeletedAt: rev.Serial}
	}
	return data, rev.Serial, rev.Next, nil
}

// loadRevision is LoadRevision without the OpError wrapping.
func (fs *FileStorage) loadRevision(oid zodb.Oid, before zodb.Tid, dst []byte) (data []byte, rev Revision, err error) {
	s := fs.state.Load()
	pos, ok := s.index.Get(oid)
	if !ok {
		return dst, rev, &zodb.NoObjectError{Oid: oid}
	}
	var next zodb.Tid
	n0 := len(dst)
	if cap(dst)-n0 < DataHeaderSize+8 {
		dst = append(dst, make([]byte, DataHeaderSize+8)...)[:n0]
	}
	var dh DataHeader
	var got []byte // bytes read at pos: the header and maybe some data
	for {
		want := min(cap(dst)-n0, speculativeLen(pos))
		if rest := s.end - pos; int64(want) > rest {
			want = int(rest)
		}
		got = dst[n0 : n0+want]
		m, err := s.file.ReadAt(got, pos)
		if m < DataHeaderSize || (m < len(got) && err != nil && err != io.EOF) {
			if err == nil || err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return dst[:n0], rev, &Error{fs.path, pos, "data record", fmt.Errorf("read: %w", err)}
		}
		got = got[:m]
		if err := dh.decode(got, fs.path, pos, s.end); err != nil {
			return dst[:n0], rev, err
		}
		if dh.Oid != oid {
			return dst[:n0], rev, &Error{fs.path, pos, "data record", fmt.Errorf("oid %s, expected %s (index or previous pointer corrupt)", dh.Oid, oid)}
		}
		if dh.Tid < before {
			break
		}
		if dh.PrevRevPos == 0 {
			return dst[:n0], rev, &zodb.NoDataError{Oid: oid}
		}
		next = dh.Tid
		pos = dh.PrevRevPos
	}
	rev = Revision{Serial: dh.Tid, Next: next, Pos: pos, BackPos: dh.BackPos}
	if dh.DataLen == 0 {
		// Backpointer: follow the chain to the record with the data,
		// noting the tid of its first link.
		first := dh
		if dh.BackPos != 0 {
			if err := first.Load(s.file, fs.path, dh.BackPos, pos); err != nil {
				return dst[:n0], Revision{}, &Error{fs.path, pos, "data record", fmt.Errorf("backpointer %d: %w", dh.BackPos, err)}
			}
			if first.Oid != oid {
				return dst[:n0], Revision{}, &Error{fs.path, pos, "data record", fmt.Errorf("backpointer %d: points to a record of oid %s, not %s", dh.BackPos, first.Oid, oid)}
			}
			rev.BackTid = first.Tid
		}
		data, src, err := first.LoadData(s.file, fs.path, dst[:n0])
		if err != nil {
			return dst[:n0], Revision{}, err
		}
		if src.DataLen == 0 {
			rev.NoData = true
			return dst[:n0], rev, nil
		}
		return data, rev, nil
	}
	// Move the data already read to its place, then read what is missing.
	have := min(int64(len(got)-DataHeaderSize), dh.DataLen)
	if int64(cap(dst)-n0) < dh.DataLen {
		grown := make([]byte, n0, int64(n0)+dh.DataLen)
		copy(grown, dst[:n0])
		copy(grown[n0:n0+int(have)], got[DataHeaderSize:])
		dst = grown
	} else {
		copy(dst[n0:n0+int(have)], got[DataHeaderSize:DataHeaderSize+have])
	}
	dst = dst[:n0+int(dh.DataLen)]
	if have < dh.DataLen {
		if _, err := s.file.ReadAt(dst[n0+int(have):], pos+DataHeaderSize+have); err != nil {
			return dst[:n0], rev, &Error{fs.path, pos, "data record", fmt.Errorf("read data: %w", err)}
		}
	}
	return dst, rev, nil
}

func (fs *FileStorage) loadBeforeErr(oid zodb.Oid, before zodb.Tid, err error) error {
	return &zodb.OpError{URL: fs.path, Op: "loadBefore", Args: fmt.Sprintf("%s<%s", oid, before), Err: err}
}

var _ zodb.BeforeLoader = (*FileStorage)(nil)
