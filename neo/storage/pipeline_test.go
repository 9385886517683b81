package storage_test

import (
	"testing"
	"time"

	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/neo/storage"
)

// TestAnswerNotWithheldByPartialPacket: the answer to a complete request
// goes out while part of the next packet is buffered. The peer loop
// (serve.go) stayed corked while its reader had any byte buffered and
// blocked reading the rest of that packet: the answer waited for the
// client to send more.
func TestAnswerNotWithheldByPartialPacket(t *testing.T) {
	c := startWriteCluster(t, newMemWriter(), nil)
	cl := c.client(-536870911)
	req := &proto.AskObject{Oid: 1, At: proto.InvalidTid, Before: proto.InvalidTid}
	a := proto.AppendPacket(nil, 100, req)
	b := proto.AppendPacket(nil, 101, req)
	if err := cl.l.Write(append(a, b[:1]...)); err != nil {
		t.Fatal(err)
	}
	cl.l.Conn().SetReadDeadline(time.Now().Add(2 * time.Second))
	p, err := cl.l.Recv()
	if err != nil {
		t.Errorf("no answer to the complete request 100 within 2 s while 1 byte of the next is buffered: %v", err)
	} else {
		t.Logf("answer to %d: %s", p.ID, proto.CodeName(p.Code))
	}
	cl.l.Conn().SetReadDeadline(time.Time{})
	if err := cl.l.Write(b[1:]); err != nil {
		t.Fatal(err)
	}
	cl.l.Conn().SetReadDeadline(time.Now().Add(2 * time.Second))
	if p, err = cl.l.Recv(); err != nil {
		t.Fatal(err)
	}
	t.Logf("once the rest of 101 was sent: answer to %d: %s", p.ID, proto.CodeName(p.Code))
}

// TestCorkedQueueBounded: a client that sends many AskObject of a
// 256 KiB object in one write, the last packet cut short, and does not
// read: the answers queued stay within Config.MaxQueued (1 MiB here) and
// MaxQueuedTotal (4 MiB). The peer loop stayed corked until the last
// packet was whole, and its corked Writer took every answer, nothing
// written.
func TestCorkedQueueBounded(t *testing.T) {
	c := startWriteCluster(t, newMemWriter(), nil, func(cfg *storage.Config) {
		cfg.MaxQueued = 1 << 20
		cfg.MaxQueuedTotal = 4 << 20
	})
	c.n.EnableStats()
	cl := c.client(-536870911)
	c.commit(cl, 10, 11, 1, 0, string(make([]byte, 256<<10)))
	req := &proto.AskObject{Oid: 1, At: proto.InvalidTid, Before: proto.InvalidTid}
	var b []byte
	for i := 0; i < 200; i++ {
		b = proto.AppendPacket(b, uint32(1000+i), req)
	}
	last := proto.AppendPacket(nil, 2000, req)
	if err := cl.l.Write(append(b, last[:1]...)); err != nil {
		t.Fatal(err)
	}
	var q int64
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		if q = c.n.Stats().Queued; q >= 200<<18 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("queued %d bytes (MaxQueued %d, MaxQueuedTotal %d)", q, 1<<20, 4<<20)
	if q > 4<<20 {
		t.Errorf("a client that does not read made the node queue %d bytes of answers, MaxQueued 1 MiB", q)
	}
}
