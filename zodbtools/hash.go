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
	"sync"
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
	return HashPrefetch(ctx, stor, at, name, 0)
}

// HashPrefetch is Hash with up to inflight loads in flight at once
// (inflight <= 1 is Hash's serial loop): oid i+inflight is being loaded
// while oid i is folded into the hash. The objects, their order and so
// the result are those of Hash; only the time differs. Loads beyond the
// first missing oid are made and discarded.
func HashPrefetch(ctx context.Context, stor zodb.Loader, at zodb.Tid, name string, inflight int) (HashResult, error) {
	if inflight > 1 {
		return hashWindow(ctx, stor, at, name, inflight)
	}
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
			if isMissing(err) {
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

// isMissing reports whether err says that the object has no data (the end
// of a hash pass).
func isMissing(err error) bool {
	var noObj *zodb.NoObjectError
	var noData *zodb.NoDataError
	return errors.As(err, &noObj) || errors.As(err, &noData)
}

// loaded is one load's outcome, passed from a worker to the hasher.
type loaded struct {
	data []byte
	err  error
}

// hashWindow keeps n loads in flight with n workers: worker w loads oids
// w, w+n, w+2n, ... and hands each result over on its own unbuffered
// channel, so the hasher takes them in oid order. Each worker alternates
// between two buffers: it fills one while the hasher still reads the
// other (the hasher is done with a buffer before it receives the worker's
// next result).
func hashWindow(ctx context.Context, stor zodb.Loader, at zodb.Tid, name string, n int) (HashResult, error) {
	h, err := NewHash(name)
	if err != nil {
		return HashResult{}, err
	}
	res := HashResult{HashName: name}
	al, _ := stor.(zodb.AppendLoader)
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	t0 := time.Now()
	chans := make([]chan loaded, n)
	for w := range chans {
		ch := make(chan loaded)
		chans[w] = ch
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			var bufs [2][]byte
			for i, oid := 0, zodb.Oid(w); ; i, oid = i+1, oid+zodb.Oid(n) {
				xid := zodb.Xid{Oid: oid, At: at}
				var r loaded
				if al != nil {
					r.data, _, r.err = al.LoadAppend(ctx, xid, bufs[i%2][:0])
					bufs[i%2] = r.data
				} else {
					r.data, _, r.err = stor.Load(ctx, xid)
				}
				select {
				case ch <- r:
				case <-ctx.Done():
					return
				}
				if r.err != nil {
					return
				}
			}
		}(w)
	}
	for oid := 0; ; oid++ {
		r := <-chans[oid%n]
		if r.err != nil {
			if isMissing(r.err) {
				break
			}
			return res, r.err
		}
		h.Write(r.data)
		res.NRead += int64(len(r.data))
		res.NObj++
	}
	res.Elapsed = time.Since(t0)
	res.Sum = h.Sum(nil)
	return res, nil
}
