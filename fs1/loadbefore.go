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

// loadBefore is LoadBefore (and LoadAppend) without the OpError wrapping.
func (fs *FileStorage) loadBefore(oid zodb.Oid, before zodb.Tid, dst []byte) (data []byte, serial, next zodb.Tid, err error) {
	s := fs.state.Load()
	pos, ok := s.index.Get(oid)
	if !ok {
		return dst, 0, 0, &zodb.NoObjectError{Oid: oid}
	}
	n0 := len(dst)
	if cap(dst)-n0 < DataHeaderSize+8 {
		dst = append(dst, make([]byte, DataHeaderSize+8)...)[:n0]
	}
	var dh DataHeader
	var got []byte // bytes read at pos: the header and maybe some data
	for {
		want := min(cap(dst)-n0, speculativeRead)
		if rest := s.end - pos; int64(want) > rest {
			want = int(rest)
		}
		got = dst[n0 : n0+want]
		m, err := s.file.ReadAt(got, pos)
		if m < DataHeaderSize || (m < len(got) && err != nil && err != io.EOF) {
			if err == nil || err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return dst[:n0], 0, 0, &Error{fs.path, pos, "data record", fmt.Errorf("read: %w", err)}
		}
		got = got[:m]
		if err := dh.decode(got, fs.path, pos, s.end); err != nil {
			return dst[:n0], 0, 0, err
		}
		if dh.Oid != oid {
			return dst[:n0], 0, 0, &Error{fs.path, pos, "data record", fmt.Errorf("oid %s, expected %s (index or previous pointer corrupt)", dh.Oid, oid)}
		}
		if dh.Tid < before {
			break
		}
		if dh.PrevRevPos == 0 {
			return dst[:n0], 0, 0, &zodb.NoDataError{Oid: oid}
		}
		next = dh.Tid
		pos = dh.PrevRevPos
	}
	if dh.DataLen == 0 {
		// Backpointer: follow the chain to the record with the data.
		data, src, err := dh.LoadData(s.file, fs.path, dst[:n0])
		if err != nil {
			return dst[:n0], 0, 0, err
		}
		if src.DataLen == 0 {
			return dst[:n0], 0, 0, &zodb.NoDataError{Oid: oid, DeletedAt: dh.Tid}
		}
		return data, dh.Tid, next, nil
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
			return dst[:n0], 0, 0, &Error{fs.path, pos, "data record", fmt.Errorf("read data: %w", err)}
		}
	}
	return dst, dh.Tid, next, nil
}

func (fs *FileStorage) loadBeforeErr(oid zodb.Oid, before zodb.Tid, err error) error {
	return &zodb.OpError{URL: fs.path, Op: "loadBefore", Args: fmt.Sprintf("%s<%s", oid, before), Err: err}
}

var _ zodb.BeforeLoader = (*FileStorage)(nil)
