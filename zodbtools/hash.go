// Package zodbtools holds the storage-independent zodbd tools: they work on
// any zodb.Storage, whatever engine or protocol is behind it.
package zodbtools

import (
	"context"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"hash/adler32"
	"hash/crc32"
	"time"

	"github.com/zodbd/zodbd/zodb"
)

// NewHash returns the hash function named name: "crc32" (zlib's, the
// default of the reference tool), "adler32", "sha1" or "sha256".
func NewHash(name string) (hash.Hash, error) {
	switch name {
	case "crc32":
		return crc32.NewIEEE(), nil
	case "adler32":
		return adler32.New(), nil
	case "sha1":
		return sha1.New(), nil
	case "sha256":
		return sha256.New(), nil
	}
	return nil, fmt.Errorf("unknown hash %q (want crc32, adler32, sha1 or sha256)", name)
}

// HashResult is the outcome of Hash.
type HashResult struct {
	HashName string
	Sum      []byte
	NObj     int   // objects read: oids 0..NObj-1
	NRead    int64 // bytes of object data read
	Elapsed  time.Duration
}

// String formats r the way the reference tool (and NEO's zhash) prints it:
//
//	crc32:565d9a85 ; oid=0..3588 nread=5134299 t=0.019s (5.3 µs / object)
func (r HashResult) String() string {
	sec := r.Elapsed.Seconds()
	n := r.NObj
	if n < 1 {
		n = 1
	}
	return fmt.Sprintf("%s:%s ; oid=0..%d nread=%d t=%.3fs (%.1f µs / object)",
		r.HashName, hex.EncodeToString(r.Sum), r.NObj-1, r.NRead, sec, sec*1e6/float64(n))
}

// Hash loads oids 0, 1, 2, ... at state at, one after the other, until the
// first oid that has no data there, and folds each object's data into h. It is
// the serial "load every object" benchmark: the time per object is the
// latency of one load. It uses LoadAppend with a reused buffer when the
// storage offers it.
func Hash(ctx context.Context, stor zodb.Loader, at zodb.Tid, name string) (HashResult, error) {
	h, err := NewHash(name)
	if err != nil {
		return HashResult{}, err
	}
	res := HashResult{HashName: name}
	al, _ := stor.(zodb.AppendLoader)
	var buf []byte
	t0 := time.Now()
	for oid := zodb.Oid(0); ; oid++ {
		xid := zodb.Xid{Oid: oid, At: at}
		var data []byte
		if al != nil {
			data, _, err = al.LoadAppend(ctx, xid, buf[:0])
			buf = data
		} else {
			data, _, err = stor.Load(ctx, xid)
		}
		if err != nil {
			var noObj *zodb.NoObjectError
			var noData *zodb.NoDataError
			if errors.As(err, &noObj) || errors.As(err, &noData) {
				break
			}
			return res, err
		}
		h.Write(data)
		res.NRead += int64(len(data))
		res.NObj++
	}
	res.Elapsed = time.Since(t0)
	res.Sum = h.Sum(nil)
	return res, nil
}
