// Package neotest helps testing NEO nodes: a raw packet-level link (Link)
// and a minimal in-process master (Master) that speaks the packets of
// NEO/py's master, enough for a storage node and clients to form a cluster
// in tests.
package neotest

import (
	"bytes"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sync"
	"time"

	"github.com/zodbd/zodbd/neo/msgp"
	"github.com/zodbd/zodbd/neo/proto"
)

// Packet is one NEO packet; Args is the msgpack array of its arguments.
type Packet struct {
	ID   uint32
	Code uint16
	Args []byte
}

func (p Packet) String() string { return fmt.Sprintf("%d %s", p.ID, proto.CodeName(p.Code)) }

// Link is one NEO connection at the packet level. Recv is for one
// goroutine; Send and Ask may be called from several.
type Link struct {
	nc     net.Conn
	buf    []byte
	rbuf   []byte
	wmu    sync.Mutex
	nextID uint32
}

// Dial connects to addr and exchanges the handshake.
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

// NewLink exchanges the handshake on nc.
func NewLink(nc net.Conn) (*Link, error) {
	l := &Link{nc: nc}
	if _, err := nc.Write(proto.Handshake[:]); err != nil {
		nc.Close()
		return nil, err
	}
	hs := make([]byte, len(proto.Handshake))
	nc.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(nc, hs); err != nil {
		nc.Close()
		return nil, err
	}
	nc.SetReadDeadline(time.Time{})
	if !bytes.Equal(hs, proto.Handshake[:]) {
		nc.Close()
		return nil, fmt.Errorf("bad handshake % x", hs)
	}
	return l, nil
}

// Conn is the underlying connection.
func (l *Link) Conn() net.Conn { return l.nc }

// Close closes the link.
func (l *Link) Close() error { return l.nc.Close() }

// Recv reads the next packet.
func (l *Link) Recv() (Packet, error) {
	for {
		n, err := msgp.Len(l.buf)
		if err == nil {
			pkt := l.buf[:n:n]
			l.buf = l.buf[n:]
			cnt, b, err := msgp.ReadArrayHeader(pkt)
			if err != nil || cnt != 3 {
				return Packet{}, errors.New("packet is not a 3-array")
			}
			id, b, err := msgp.ReadUint32(b)
			if err != nil {
				return Packet{}, err
			}
			c, b, err := msgp.ReadUint(b)
			if err != nil || c > math.MaxUint16 {
				return Packet{}, errors.New("bad code")
			}
			return Packet{ID: id, Code: uint16(c), Args: append([]byte(nil), b...)}, nil
		}
		if err != msgp.ErrShort {
			return Packet{}, err
		}
		if l.rbuf == nil {
			l.rbuf = make([]byte, 64<<10)
		}
		m, err := l.nc.Read(l.rbuf)
		if m > 0 {
			l.buf = append(l.buf, l.rbuf[:m]...)
			continue
		}
		if err == nil {
			err = io.ErrNoProgress
		}
		return Packet{}, err
	}
}

// Encode returns the bytes of packet [id, code, args].
func Encode(id uint32, code uint16, args []byte) []byte {
	b := []byte{0x93}
	b = msgp.AppendUint(b, uint64(id))
	b = msgp.AppendUint(b, uint64(code))
	return append(b, args...)
}

// Write writes raw bytes.
func (l *Link) Write(b []byte) error {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	_, err := l.nc.Write(b)
	return err
}

// Send sends a request or notification with the next message id and
// returns that id.
func (l *Link) Send(code uint16, args []byte) (uint32, error) {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	id := l.nextID
	l.nextID++
	_, err := l.nc.Write(Encode(id, code, args))
	return id, err
}

// Answer sends the answer to request id.
func (l *Link) Answer(id uint32, code uint16, args []byte) error {
	return l.Write(Encode(id, code|proto.AnswerBit, args))
}

// Ask sends a request and reads packets until its answer, which it
// returns; other packets are dropped. For a link used by one goroutine.
func (l *Link) Ask(code uint16, args []byte) (Packet, error) {
	id, err := l.Send(code, args)
	if err != nil {
		return Packet{}, err
	}
	for {
		p, err := l.Recv()
		if err != nil {
			return p, err
		}
		if p.ID == id && p.Code&proto.AnswerBit != 0 {
			return p, nil
		}
	}
}

// ---- argument builders ----

// Tid appends an 8-byte id.
func Tid(b []byte, v uint64) []byte { return msgp.AppendBin64(b, v) }

// IdentifyArgs builds RequestIdentification's arguments.
func IdentifyArgs(typ proto.NodeType, nid proto.NodeID, addr proto.Address, cluster string, idTime float64, hasIdTime bool) []byte {
	b := []byte{0x96}
	b = msgp.AppendEnum(b, proto.ExtNodeType, int(typ))
	if nid == proto.NoNode {
		b = msgp.AppendNil(b)
	} else {
		b = msgp.AppendInt(b, int64(nid))
	}
	if addr.Host == "" {
		b = msgp.AppendNil(b)
	} else {
		b = append(b, 0x92)
		b = msgp.AppendBin(b, []byte(addr.Host))
		b = msgp.AppendUint(b, uint64(addr.Port))
	}
	b = msgp.AppendBin(b, []byte(cluster))
	if hasIdTime {
		b = msgp.AppendFloat64(b, idTime)
	} else {
		b = msgp.AppendNil(b)
	}
	return msgp.AppendMapHeader(b, 0)
}

// AskObjectArgs builds AskObject's arguments (0 stands for nil).
func AskObjectArgs(oid, at, before uint64) []byte {
	b := []byte{0x93}
	b = Tid(b, oid)
	for _, t := range []uint64{at, before} {
		if t == 0 {
			b = msgp.AppendNil(b)
		} else {
			b = Tid(b, t)
		}
	}
	return b
}

// ErrorArgs decodes the arguments of an Error packet.
func ErrorArgs(args []byte) (proto.ErrorCode, string, error) {
	v, err := Decode(args)
	if err != nil {
		return 0, "", err
	}
	a, ok := v.([]any)
	if !ok || len(a) != 2 {
		return 0, "", errors.New("malformed Error")
	}
	c, ok1 := a[0].(int64)
	m, ok2 := a[1].([]byte)
	if !ok1 || !ok2 {
		return 0, "", errors.New("malformed Error")
	}
	return proto.ErrorCode(c), string(m), nil
}

// Ext is a decoded msgpack ext object (NEO's enums).
type Ext struct {
	Type  int8
	Value int64
}

// Map is a decoded msgpack map, in wire order.
type Map [][2]any

// Decode decodes one msgpack object into generic values: nil, bool,
// int64 (every integer that fits), uint64 (larger ones), float64, []byte
// (bin), string (str), []any, Map, Ext. The whole of b must be the object.
func Decode(b []byte) (any, error) {
	v, rest, err := decode(b, 0)
	if err != nil {
		return nil, err
	}
	if len(rest) != 0 {
		return nil, errors.New("trailing bytes")
	}
	return v, nil
}

func decode(b []byte, depth int) (any, []byte, error) {
	if depth > msgp.MaxDepth {
		return nil, b, errors.New("too deep")
	}
	t, err := msgp.NextType(b)
	if err != nil {
		return nil, b, err
	}
	switch t {
	case msgp.Nil:
		rest, err := msgp.ReadNil(b)
		return nil, rest, err
	case msgp.Bool:
		return boolV(msgp.ReadBool(b))
	case msgp.Int, msgp.Uint:
		if v, rest, err := msgp.ReadInt(b); err == nil {
			return v, rest, nil
		}
		v, rest, err := msgp.ReadUint(b)
		return v, rest, err
	case msgp.Float:
		v, rest, err := msgp.ReadFloat64(b)
		return v, rest, err
	case msgp.Bin:
		v, rest, err := msgp.ReadBin(b)
		return append([]byte{}, v...), rest, err
	case msgp.Str:
		v, rest, err := msgp.ReadStr(b)
		return string(v), rest, err
	case msgp.Array:
		n, rest, err := msgp.ReadArrayHeader(b)
		if err != nil {
			return nil, b, err
		}
		a := make([]any, n)
		for i := range a {
			if a[i], rest, err = decode(rest, depth+1); err != nil {
				return nil, b, err
			}
		}
		return a, rest, nil
	case msgp.Map:
		n, rest, err := msgp.ReadMapHeader(b)
		if err != nil {
			return nil, b, err
		}
		m := make(Map, n)
		for i := range m {
			if m[i][0], rest, err = decode(rest, depth+1); err != nil {
				return nil, b, err
			}
			if m[i][1], rest, err = decode(rest, depth+1); err != nil {
				return nil, b, err
			}
		}
		return m, rest, nil
	case msgp.Ext:
		typ, payload, rest, err := msgp.ReadExt(b)
		if err != nil {
			return nil, b, err
		}
		v, _, err := msgp.ReadInt(payload)
		if err != nil {
			return nil, b, err
		}
		return Ext{typ, v}, rest, nil
	}
	return nil, b, fmt.Errorf("unexpected %v", t)
}

func boolV(v bool, rest []byte, err error) (any, []byte, error) { return v, rest, err }
