package zeo

import (
	"fmt"
	"testing"

	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// TestEncodeQuotaError: A quota error (fs1's) goes to the client as ZODB/py's
// FileStorageQuotaError with its message, also when wrapped.
func TestEncodeQuotaError(t *testing.T) {
	for _, m := range []wire.Marshal{wire.Pickle, wire.Msgpack} {
		var e wire.Encoder
		e.M = m
		id := wire.Value{Kind: wire.Int, Int: 5}
		err := fmt.Errorf("vote: %w", &zodb.QuotaError{URL: "Data.fs", Pos: 200, Quota: 100})
		encodeError(&e, &id, err)
		msg, derr := wire.NewDecoder(m).DecodeMessage(e.Buf[4:])
		if derr != nil {
			t.Fatal(derr)
		}
		if got, want := msg.Args.String(), `("ZODB.FileStorage.FileStorage.FileStorageQuotaError", ("The storage quota has been exceeded.",))`; msg.Flags.Int != 2 || got != want {
			t.Errorf("%c: flags %d, args %s; want %s", m, msg.Flags.Int, got, want)
		}
	}
}
