package client_test

import (
	"context"
	"crypto/sha1"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/zodbd/zodbd/neo/client"
	"github.com/zodbd/zodbd/neo/internal/msgp"
	"github.com/zodbd/zodbd/neo/proto"
	"github.com/zodbd/zodbd/zodb"
)

// dialErr dials a client that must fail within a short deadline.
func dialErr(t *testing.T, addr string, substr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	t0 := time.Now()
	c, err := client.Dial(ctx, &client.Options{Cluster: "test", Masters: []string{addr}})
	if err == nil {
		c.Close()
		t.Fatalf("Dial succeeded")
	}
	if time.Since(t0) > 5*time.Second {
		t.Errorf("Dial took %v", time.Since(t0))
	}
	if !strings.Contains(err.Error(), substr) {
		t.Errorf("Dial: %v; want an error containing %q", err, substr)
	}
	t.Logf("Dial: %v", err)
}

// TestBadMaster: masters that misbehave during the session set-up give a
// clear error, bounded by the context's deadline.
func TestBadMaster(t *testing.T) {
	t.Run("garbage", func(t *testing.T) {
		s := startFakeOpt(t, true, func(pc *peerConn) { pc.write([]byte("HTTP/1.0 400 Bad Request\r\n\r\n")) })
		dialErr(t, s.addr(), "not a NEO peer")
	})
	t.Run("version", func(t *testing.T) {
		s := startFakeOpt(t, true, func(pc *peerConn) { pc.write([]byte{0x92, 0xa3, 'N', 'E', 'O', 4}) })
		dialErr(t, s.addr(), "version")
	})
	t.Run("silent", func(t *testing.T) {
		s := startFakeOpt(t, true, func(pc *peerConn) { io.Copy(io.Discard, pc.nc) })
		dialErr(t, s.addr(), "handshake")
	})
	t.Run("closed", func(t *testing.T) {
		s := startFake(t, func(pc *peerConn) {})
		dialErr(t, s.addr(), "")
	})
	t.Run("refused", func(t *testing.T) {
		s := startFake(t, func(pc *peerConn) {})
		addr := s.addr()
		s.close()
		dialErr(t, addr, "refused")
	})
	t.Run("error", func(t *testing.T) {
		s := startFake(t, func(pc *peerConn) {
			req, _ := pc.readPacket()
			pc.answer(req, proto.CodeError, errorArgs(proto.ProtocolError, "invalid cluster name"))
		})
		dialErr(t, s.addr(), "invalid cluster name")
	})
	t.Run("notmaster", func(t *testing.T) {
		s := startFake(t, func(pc *peerConn) {
			req, _ := pc.readPacket()
			pc.answerMsg(req, &proto.AcceptIdentification{NodeType: proto.Storage, MyNID: 1, YourNID: fakeClientNID})
		})
		dialErr(t, s.addr(), "not a master")
	})
	t.Run("shape", func(t *testing.T) {
		s := startFake(t, func(pc *peerConn) {
			req, _ := pc.readPacket()
			args := msgp.AppendArrayHeader(nil, 2)
			args = msgp.AppendUint(args, 1)
			args = msgp.AppendUint(args, 2)
			pc.answer(req, proto.CodeAcceptIdentification, args)
		})
		dialErr(t, s.addr(), "AcceptIdentification")
	})
	t.Run("wronganswer", func(t *testing.T) {
		s := startFake(t, func(pc *peerConn) {
			req, _ := pc.readPacket()
			pc.answerMsg(req, &proto.Pong{})
		})
		dialErr(t, s.addr(), "")
	})
	t.Run("nopt", func(t *testing.T) {
		s := startFake(t, func(pc *peerConn) {
			req, _ := pc.readPacket()
			pc.answerMsg(req, &proto.AcceptIdentification{NodeType: proto.Master, MyNID: fakeMasterNID, YourNID: fakeClientNID})
			drain(pc)
		})
		dialErr(t, s.addr(), "partition table")
	})
	t.Run("badnotify", func(t *testing.T) {
		s := startFake(t, func(pc *peerConn) {
			req, _ := pc.readPacket()
			pc.answerMsg(req, &proto.AcceptIdentification{NodeType: proto.Master, MyNID: fakeMasterNID, YourNID: fakeClientNID})
			pc.notify(proto.CodeSendPartitionTable, msgp.AppendArrayHeader(nil, 0))
			drain(pc)
		})
		dialErr(t, s.addr(), "SendPartitionTable")
	})
	t.Run("garbage-after-accept", func(t *testing.T) {
		s := startFake(t, func(pc *peerConn) {
			req, _ := pc.readPacket()
			pc.answerMsg(req, &proto.AcceptIdentification{NodeType: proto.Master, MyNID: fakeMasterNID, YourNID: fakeClientNID})
			pc.write([]byte{0xc1, 0xc1, 0xc1})
			drain(pc)
		})
		dialErr(t, s.addr(), "")
	})
}

// TestBadStorage: storages that misbehave give load errors, never a
// panic or a hang; a good replica is used when there is one.
func TestBadStorage(t *testing.T) {
	ctx := context.Background()
	good := func() *memStore {
		ms := newMemStore()
		ms.add(1, 0x100, []byte("hello"))
		return ms
	}
	loadErr := func(t *testing.T, c *client.Client, substr string) error {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, _, err := c.Load(ctx, zodb.Xid{Oid: 1, At: zodb.TidMax})
		if err == nil {
			t.Fatalf("load succeeded")
		}
		if !strings.Contains(err.Error(), substr) {
			t.Errorf("load: %v; want an error containing %q", err, substr)
		}
		t.Logf("load: %v", err)
		return err
	}
	answerWith := func(f func(pc *peerConn, req packet)) *memStore {
		ms := good()
		ms.hook = func(pc *peerConn, req packet) bool {
			if req.Code != proto.CodeAskObject {
				return false
			}
			f(pc, req)
			return true
		}
		return ms
	}

	t.Run("checksum", func(t *testing.T) {
		ms := answerWith(func(pc *peerConn, req packet) {
			pc.answerMsg(req, &proto.AnswerObject{Oid: 1, Serial: 0x100, NextSerial: proto.InvalidTid, DataSerial: proto.InvalidTid,
				Data: []byte("hello"), Checksum: [20]byte{1, 2, 3}})
		})
		fm := startCluster(t, 1, 0x100, ms)
		c := dialT(t, &client.Options{Cluster: "test", Masters: []string{fm.addr()}})
		if err := loadErr(t, c, "checksum"); !errors.Is(err, client.ErrChecksum) {
			t.Errorf("load: %v; want ErrChecksum", err)
		}
		// verify=0 skips the check.
		c2 := dialT(t, &client.Options{Cluster: "test", Masters: []string{fm.addr()}, NoVerify: true})
		if data, _, err := c2.Load(ctx, zodb.Xid{Oid: 1, At: zodb.TidMax}); err != nil || string(data) != "hello" {
			t.Errorf("load with NoVerify: %q, %v", data, err)
		}
	})
	t.Run("checksum-replica", func(t *testing.T) {
		bad := answerWith(func(pc *peerConn, req packet) {
			pc.answerMsg(req, &proto.AnswerObject{Oid: 1, Serial: 0x100, NextSerial: proto.InvalidTid, DataSerial: proto.InvalidTid,
				Data: []byte("hellO"), Checksum: [20]byte{1}})
		})
		fm := startCluster(t, 1, 0x100, bad, good())
		c := dialT(t, &client.Options{Cluster: "test", Masters: []string{fm.addr()}, CacheSize: -1})
		for range 10 {
			data, _, err := c.Load(ctx, zodb.Xid{Oid: 1, At: zodb.TidMax})
			if err != nil || string(data) != "hello" {
				t.Fatalf("load: %q, %v", data, err)
			}
		}
	})
	t.Run("nonreadable-replica", func(t *testing.T) {
		var n atomic.Int32
		bad := answerWith(func(pc *peerConn, req packet) {
			n.Add(1)
			pc.answer(req, proto.CodeError, errorArgs(proto.NonReadableCell, ""))
		})
		fm := startCluster(t, 1, 0x100, bad, good())
		c := dialT(t, &client.Options{Cluster: "test", Masters: []string{fm.addr()}, CacheSize: -1})
		for range 10 {
			data, _, err := c.Load(ctx, zodb.Xid{Oid: 1, At: zodb.TidMax})
			if err != nil || string(data) != "hello" {
				t.Fatalf("load: %q, %v", data, err)
			}
		}
	})
	t.Run("nonreadable", func(t *testing.T) {
		ms := answerWith(func(pc *peerConn, req packet) {
			pc.answer(req, proto.CodeError, errorArgs(proto.NonReadableCell, ""))
		})
		fm := startCluster(t, 1, 0x100, ms)
		c := dialT(t, &client.Options{Cluster: "test", Masters: []string{fm.addr()}})
		loadErr(t, c, "NON_READABLE_CELL")
	})
	t.Run("garbage", func(t *testing.T) {
		var n atomic.Int32
		ms := answerWith(func(pc *peerConn, req packet) {
			if n.Add(1) == 1 {
				pc.write([]byte{0x93, 0xc1, 0xc1, 0xc1})
				pc.nc.Close()
				return
			}
			pc.answerMsg(req, &proto.AnswerObject{Oid: 1, Serial: 0x100, NextSerial: proto.InvalidTid, DataSerial: proto.InvalidTid,
				Data: []byte("hello"), Checksum: sha1sum("hello")})
		})
		fm := startCluster(t, 1, 0x100, ms)
		c := dialT(t, &client.Options{Cluster: "test", Masters: []string{fm.addr()}})
		// The connection is re-established: the load tries the cell
		// again (as NEO/py's client does once every cell failed).
		if data, _, err := c.Load(ctx, zodb.Xid{Oid: 1, At: zodb.TidMax}); err != nil || string(data) != "hello" || n.Load() != 2 {
			t.Errorf("load after reconnection: %q, %v (%d requests)", data, err, n.Load())
		}
	})
	t.Run("shape", func(t *testing.T) {
		ms := answerWith(func(pc *peerConn, req packet) {
			args := msgp.AppendArrayHeader(nil, 3)
			args = msgp.AppendBin64(args, 1)
			args = msgp.AppendNil(args)
			args = msgp.AppendUint(args, 7)
			pc.answer(req, proto.CodeAnswerObject, args)
		})
		fm := startCluster(t, 1, 0x100, ms)
		c := dialT(t, &client.Options{Cluster: "test", Masters: []string{fm.addr()}})
		loadErr(t, c, "AnswerObject")
	})
	t.Run("wrong-oid", func(t *testing.T) {
		ms := answerWith(func(pc *peerConn, req packet) {
			pc.answerMsg(req, &proto.AnswerObject{Oid: 2, Serial: 0x100, NextSerial: proto.InvalidTid, DataSerial: proto.InvalidTid,
				Data: []byte("hello"), Checksum: sha1sum("hello")})
		})
		fm := startCluster(t, 1, 0x100, ms)
		c := dialT(t, &client.Options{Cluster: "test", Masters: []string{fm.addr()}})
		loadErr(t, c, "oid")
	})
	t.Run("future-serial", func(t *testing.T) {
		ms := answerWith(func(pc *peerConn, req packet) {
			pc.answerMsg(req, &proto.AnswerObject{Oid: 1, Serial: 0x200, NextSerial: proto.InvalidTid, DataSerial: proto.InvalidTid,
				Data: []byte("hello"), Checksum: sha1sum("hello")})
		})
		fm := startCluster(t, 1, 0x100, ms)
		c := dialT(t, &client.Options{Cluster: "test", Masters: []string{fm.addr()}})
		loadErr(t, c, "does not answer")
	})
	t.Run("bad-zlib", func(t *testing.T) {
		ms := answerWith(func(pc *peerConn, req packet) {
			pc.answerMsg(req, &proto.AnswerObject{Oid: 1, Serial: 0x100, NextSerial: proto.InvalidTid, DataSerial: proto.InvalidTid,
				Compression: 1, Data: []byte("hello"), Checksum: sha1sum("hello")})
		})
		fm := startCluster(t, 1, 0x100, ms)
		c := dialT(t, &client.Options{Cluster: "test", Masters: []string{fm.addr()}})
		loadErr(t, c, "zlib")
	})
	t.Run("silent", func(t *testing.T) {
		ms := answerWith(func(pc *peerConn, req packet) {})
		fm := startCluster(t, 1, 0x100, ms)
		c := dialT(t, &client.Options{Cluster: "test", Masters: []string{fm.addr()}})
		loadErr(t, c, "deadline")
	})
	t.Run("identification", func(t *testing.T) {
		ms := good()
		ms.hook = func(pc *peerConn, req packet) bool {
			if req.Code == proto.CodeRequestIdentification {
				pc.answer(req, proto.CodeError, errorArgs(proto.NotReady, "unknown by master"))
				return true
			}
			return false
		}
		fm := startCluster(t, 1, 0x100, ms)
		c := dialT(t, &client.Options{Cluster: "test", Masters: []string{fm.addr()}})
		loadErr(t, c, "unknown by master")
	})
	t.Run("no-storage", func(t *testing.T) {
		fm := startCluster(t, 1, 0x100)
		c := dialT(t, &client.Options{Cluster: "test", Masters: []string{fm.addr()}})
		loadErr(t, c, "no readable cell")
	})
}

func sha1sum(s string) [20]byte { return sha1.Sum([]byte(s)) }

// TestMasterLost: a protocol violation from the master (a partition table
// change that skips a ptid), then the loss of the master, make the client
// unusable with a clear error.
func TestMasterLost(t *testing.T) {
	ctx := context.Background()
	ms := newMemStore()
	ms.add(1, 0x100, []byte("hello"))
	fm := startCluster(t, 1, 0x100, ms)
	c := dialT(t, &client.Options{Cluster: "test", Masters: []string{fm.addr()}})
	w, err := c.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Load(ctx, zodb.Xid{Oid: 1, At: zodb.TidMax}); err != nil {
		t.Fatal(err)
	}
	fm.broadcast(&proto.NotifyPartitionChanges{PTid: 3, Changes: []proto.CellChange{{Offset: 0, NID: 1, State: proto.OutOfDate}}})
	select {
	case _, ok := <-w:
		if ok {
			t.Fatal("watch: unexpected event")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("watch channel not closed")
	}
	_, _, err = c.Load(ctx, zodb.Xid{Oid: 2, At: zodb.TidMax})
	var de *client.DisconnectedError
	if !errors.As(err, &de) || !strings.Contains(err.Error(), "ptid") {
		t.Errorf("load after protocol error: %v; want DisconnectedError about the ptid", err)
	}
	if _, err := c.LastTid(ctx); err == nil {
		t.Errorf("LastTid after master lost: no error")
	}
}

// drain reads until the client closes the connection.
func drain(pc *peerConn) {
	for {
		if _, err := pc.readPacket(); err != nil {
			return
		}
	}
}
