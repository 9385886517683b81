package link

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/zodbd/zodbd/neo/proto"
)

// TestAskStoreBoundedByCtxOnStalledPeer: Ask says "When ctx is done the
// wait is abandoned", but it wrote its request with Writer.WriteFunc,
// which blocks in the socket write (or waits for room behind another
// goroutine's write) with no regard for ctx: against a peer that
// completed the handshake and stopped reading, a store whose data did not
// fit in the socket buffers blocked for ever, its goroutine and ctx
// ignored (zeo/client uses Writer.WriteFuncCtx for exactly this).
func TestAskStoreBoundedByCtxOnStalledPeer(t *testing.T) {
	stop := make(chan struct{})
	defer close(stop)
	addr := rawServer(t, func(nc net.Conn) {
		nc.Write(proto.Handshake[:])
		<-stop // never reads
	})
	c, err := Dial(context.Background(), "tcp", addr, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		errc <- c.Ask(ctx, &proto.AskStoreObject{Oid: 1, Data: make([]byte, 64<<20)}, &proto.AnswerStoreObject{})
	}()
	select {
	case err := <-errc:
		if ctx.Err() == nil {
			t.Fatalf("Ask returned %v before ctx was done", err)
		}
	case <-time.After(10 * time.Second):
		c.Close() // lets the blocked write fail
		<-errc
		t.Fatal("Ask to a peer that stopped reading still blocked 10 s after its ctx (200 ms) was done")
	}
}
