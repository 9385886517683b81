package storagetest

import (
	"bytes"
	"context"
	"errors"
	"math/rand"
	"sync"
	"testing"

	"github.com/zodbd/zodbd/zodb"
)

// ErrClass names the kind of a load error, for comparing two storages'
// answers: "ok", "noobject", "nodata@TID" or "error: MESSAGE".
func ErrClass(err error) string {
	var noObj *zodb.NoObjectError
	var noData *zodb.NoDataError
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &noObj):
		return "noobject"
	case errors.As(err, &noData):
		return "nodata@" + noData.DeletedAt.String()
	}
	return "error: " + err.Error()
}

// CompareLoads loads every xid through got, from 8 goroutines that each go
// through a share of them in their own random order (requests pipelined
// on one connection, for a client), and checks each answer against want's
// Load of the same xid: the error's ErrClass, and the data and serial.
func CompareLoads(t *testing.T, want zodb.Loader, got zodb.AppendLoader, xids []zodb.Xid) {
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(seed int64) {
			defer wg.Done()
			order := rand.New(rand.NewSource(seed)).Perm(len(xids))
			var buf []byte
			for k, i := range order {
				if k%8 != int(seed) {
					continue // each xid once, in a random order
				}
				xid := xids[i]
				wdata, wserial, werr := want.Load(ctx, xid)
				data, serial, err := got.LoadAppend(ctx, xid, buf[:0])
				buf = data
				if ErrClass(err) != ErrClass(werr) {
					t.Errorf("load %s: got %s, want %s", xid, ErrClass(err), ErrClass(werr))
					continue
				}
				if err == nil && (!bytes.Equal(data, wdata) || serial != wserial) {
					t.Errorf("load %s: got %d bytes @%s, want %d bytes @%s", xid, len(data), serial, len(wdata), wserial)
				}
			}
		}(int64(g))
	}
	wg.Wait()
}
