// Package neotest helps testing NEO nodes. It provides a minimal
// in-process master (Master), enough for storage nodes and clients to form
// a cluster that commits, with replicas (several storage nodes, cells
// outdated when a node is lost and made up to date by its replication),
// and a packet-level link (Link) for tests that control the bytes on the
// wire: pipelined requests whose answers they read themselves, recorded or
// malformed packets.
//
// Both use package proto for every packet; the Master uses package link
// for its connections. The package has no protocol code of its own.
package neotest

import (
	"crypto/tls"
	"net"
	"sync"
	"time"

	"github.com/zodbd/zodbd/neo/proto"
)

// handshakeTimeout bounds the wait for the peer's handshake in NewLink.
const handshakeTimeout = 10 * time.Second

// Link is one NEO connection at the packet level: unlike a link.Conn it
// does not match answers to requests, but returns every packet it reads,
// in order, from Recv. Recv and Ask are for one goroutine at a time; Send
// and Write may be called from several, concurrently with them.
type Link struct {
	nc  net.Conn
	rd  *proto.Reader
	wmu sync.Mutex
	buf []byte // encoding buffer, under wmu
	id  uint32 // msg_id of the next packet sent, under wmu
}

// Dial connects to addr over TCP, within 10 s, runs the TLS handshake as
// a client when tlsConf is not nil, and exchanges the NEO handshake as
// NewLink does.
func Dial(addr string, tlsConf *tls.Config) (*Link, error) {
	nc, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return nil, err
	}
	if tlsConf != nil {
		tc := tls.Client(nc, tlsConf)
		if err := tc.Handshake(); err != nil {
			nc.Close()
			return nil, err
		}
		nc = tc
	}
	return NewLink(nc)
}

// NewLink sends the NEO handshake on nc and reads the peer's, waiting at
// most 10 s for it. On error nc is closed.
func NewLink(nc net.Conn) (*Link, error) {
	if _, err := nc.Write(proto.Handshake[:]); err != nil {
		nc.Close()
		return nil, err
	}
	rd := proto.NewReader(nc)
	nc.SetReadDeadline(time.Now().Add(handshakeTimeout))
	if err := rd.ReadHandshake(); err != nil {
		nc.Close()
		return nil, err
	}
	nc.SetReadDeadline(time.Time{})
	return &Link{nc: nc, rd: rd}, nil
}

// Conn returns the underlying connection (to set deadlines, for example).
func (l *Link) Conn() net.Conn { return l.nc }

// Close closes the connection.
func (l *Link) Close() error { return l.nc.Close() }

// Recv reads the next packet, whatever it is. The packet's Args belong to
// the caller. Errors are those of proto.Reader.ReadPacket: a malformed
// packet (*proto.FrameError) ends the link.
func (l *Link) Recv() (proto.Packet, error) {
	p, err := l.rd.ReadPacket()
	if err != nil {
		return proto.Packet{}, err
	}
	p.Args = append([]byte(nil), p.Args...)
	return p, nil
}

// RecvShared is Recv without the copy: the packet's Args are only valid
// until the next Recv or RecvShared (for benchmarks).
func (l *Link) RecvShared() (proto.Packet, error) {
	return l.rd.ReadPacket()
}

// Received is the number of bytes read from the peer so far, its
// handshake included: the difference around a Recv is the packet's size
// on the wire.
func (l *Link) Received() int64 { return l.rd.Offset() }

// Write writes b to the connection as it is: a packet encoded by the
// caller, several, or any bytes.
func (l *Link) Write(b []byte) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	_, err := l.nc.Write(b)
	return err
}

// Send sends m, a request or a notification, with the next msg_id of the
// link (0 first) and returns that msg_id.
func (l *Link) Send(m proto.Msg) (uint32, error) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	id := l.id
	l.id++
	l.buf = proto.AppendPacket(l.buf[:0], id, m)
	_, err := l.nc.Write(l.buf)
	return id, err
}

// Ask sends the request m and reads packets until its answer (an Error
// included), which it returns; the packets read before it are dropped.
// The caller decodes the answer with its Decode method.
func (l *Link) Ask(m proto.Msg) (proto.Packet, error) {
	id, err := l.Send(m)
	if err != nil {
		return proto.Packet{}, err
	}
	for {
		p, err := l.Recv()
		if err != nil {
			return p, err
		}
		if p.ID == id && p.IsAnswer() {
			return p, nil
		}
	}
}
