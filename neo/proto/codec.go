package proto

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"unsafe"

	"github.com/zodbd/zodbd/neo/internal/msgp"
	"github.com/zodbd/zodbd/zodb"
)

// NoPTid stands for a nil partition table id (a storage with an empty
// database, or no partition table yet). The zero value 0 is a real ptid on
// the wire, so the nil value is this sentinel.
const NoPTid = uint64(math.MaxUint64)

// NoNodeType stands for a nil node type (AskNodeList: every type).
const NoNodeType NodeType = 0xff

// NoPrimary stands for a nil primary index in NotPrimaryMaster.
const NoPrimary = -1

// Raw is one msgpack object kept verbatim (for arguments whose values are
// arbitrary, such as the values of RequestIdentification's extra map). A
// decoded Raw aliases the input. An empty Raw encodes as nil.
type Raw []byte

// BinPair returns a RawPair whose key is the byte string k and whose value
// is the given raw object.
func BinPair(k string, v Raw) RawPair {
	return RawPair{Key: msgp.AppendBin(nil, []byte(k)), Value: v}
}

// LookupPair returns the value of the pair whose key is the byte (or text)
// string k.
func LookupPair(pairs []RawPair, k string) (Raw, bool) {
	for _, p := range pairs {
		kb, rest, err := msgp.ReadBin(p.Key)
		if err != nil {
			kb, rest, err = msgp.ReadStr(p.Key)
		}
		if err == nil && len(rest) == 0 && string(kb) == k {
			return p.Value, true
		}
	}
	return nil, false
}

// IsZero tells whether a is the zero Address, which encodes as nil.
func (a Address) IsZero() bool { return a.Host == "" && a.Port == 0 }

func (a Address) String() string {
	if strings.IndexByte(a.Host, ':') >= 0 {
		return fmt.Sprintf("[%s]:%d", a.Host, a.Port)
	}
	return fmt.Sprintf("%s:%d", a.Host, a.Port)
}

// DecodeError reports arguments that do not match a packet's layout.
type DecodeError struct {
	Packet string // packet name
	Arg    int    // index of the argument, -1 for the args array itself
	Name   string // argument name
	Err    error
}

func (e *DecodeError) Error() string {
	msg := strings.TrimPrefix(e.Err.Error(), "msgp: ")
	if e.Arg < 0 {
		return fmt.Sprintf("proto: %s: %s", e.Packet, msg)
	}
	return fmt.Sprintf("proto: %s: arg %d (%s): %s", e.Packet, e.Arg, e.Name, msg)
}

func (e *DecodeError) Unwrap() error { return e.Err }

// ---- encoding helpers ----

func appendTid(b []byte, t zodb.Tid) []byte {
	if t == InvalidTid {
		return msgp.AppendNil(b)
	}
	return msgp.AppendBin64(b, uint64(t))
}

func appendOid(b []byte, o zodb.Oid) []byte {
	if o == InvalidOid {
		return msgp.AppendNil(b)
	}
	return msgp.AppendBin64(b, uint64(o))
}

func appendNID(b []byte, n NodeID) []byte {
	if n == NoNode {
		return msgp.AppendNil(b)
	}
	return msgp.AppendInt(b, int64(n))
}

func appendPTid(b []byte, p uint64) []byte {
	if p == NoPTid {
		return msgp.AppendNil(b)
	}
	return msgp.AppendUint(b, p)
}

func appendIdTime(b []byte, t float64) []byte {
	if math.IsInf(t, -1) {
		return msgp.AppendNil(b)
	}
	return msgp.AppendFloat64(b, t)
}

func appendStrBin(b []byte, s string) []byte {
	b = msgp.AppendBinHeader(b, len(s))
	return append(b, s...)
}

func appendAddr(b []byte, a Address) []byte {
	if a.IsZero() {
		return msgp.AppendNil(b)
	}
	b = msgp.AppendArrayHeader(b, 2)
	b = appendStrBin(b, a.Host)
	return msgp.AppendUint(b, uint64(a.Port))
}

func appendRaw(b []byte, r Raw) []byte {
	if len(r) == 0 {
		return msgp.AppendNil(b)
	}
	return append(b, r...)
}

func appendHash(b []byte, h *[20]byte) []byte {
	b = append(b, 0xc4, 20)
	return append(b, h[:]...)
}

func appendOptBin(b []byte, v []byte) []byte {
	if v == nil {
		return msgp.AppendNil(b)
	}
	return msgp.AppendBin(b, v)
}

// appendHostPort appends a as [host, port], never as nil.
func appendHostPort(b []byte, a Address) []byte {
	b = msgp.AppendArrayHeader(b, 2)
	b = appendStrBin(b, a.Host)
	return msgp.AppendUint(b, uint64(a.Port))
}

// appendIndex appends a non-negative index, nil for a negative one.
func appendIndex(b []byte, i int) []byte {
	if i < 0 {
		return msgp.AppendNil(b)
	}
	return msgp.AppendInt(b, int64(i))
}

func appendOptNodeType(b []byte, t NodeType) []byte {
	if t == NoNodeType {
		return msgp.AppendNil(b)
	}
	return msgp.AppendEnum(b, ExtNodeType, int(t))
}

// ---- decoding helpers ----

// decoder reads the arguments of one packet. The first error sticks: every
// later read returns zero values, and finish reports it.
type decoder struct {
	b    []byte
	pkt  string
	idx  int
	name string
	err  error
	// left is what the lists of the args may still allocate, in bytes:
	// allocBase + allocFactor times the size of the args.
	left int
}

// A packet's args of n bytes decode to lists of at most allocBase +
// allocFactor*n bytes: elements of one byte (nil) may not make a list of
// 24- or 56-byte structs.
const (
	allocBase   = 64 << 10
	allocFactor = 16
)

var errTooMany = errors.New("lists too long for the size of the packet")

// makeList returns a list of n elements, charged against d's allocation
// bound (nil, with d failed, over it).
func makeList[T any](d *decoder, n int) []T {
	var zero T
	if size := int(unsafe.Sizeof(zero)); n > d.left/max(size, 1) {
		d.fail(errTooMany)
		return nil
	} else {
		d.left -= n * size
	}
	return make([]T, n)
}

// newDecoder starts decoding args, an array of exactly n arguments.
func newDecoder(pkt string, args []byte, n int) decoder {
	d := decoder{b: args, pkt: pkt, idx: -1, left: allocBase + allocFactor*len(args)}
	got, rest, err := msgp.ReadArrayHeader(args)
	if err != nil {
		d.fail(fmt.Errorf("args: %w", err))
		return d
	}
	if got != n {
		d.fail(fmt.Errorf("want %d args, got %d", n, got))
		return d
	}
	d.b = rest
	return d
}

func (d *decoder) fail(err error) {
	if d.err == nil {
		d.err = &DecodeError{Packet: d.pkt, Arg: d.idx, Name: d.name, Err: err}
	}
}

// a moves to the next argument, named name.
func (d *decoder) a(name string) *decoder {
	d.idx++
	d.name = name
	return d
}

func (d *decoder) finish() error {
	if d.err == nil && len(d.b) != 0 {
		d.idx = -1
		d.fail(fmt.Errorf("%d trailing bytes after the args", len(d.b)))
	}
	return d.err
}

func (d *decoder) ok() bool { return d.err == nil }

// isNil consumes a nil if there is one.
func (d *decoder) isNil() bool {
	if d.err == nil && len(d.b) > 0 && d.b[0] == 0xc0 {
		d.b = d.b[1:]
		return true
	}
	return false
}

func (d *decoder) u64v() uint64 {
	if d.err != nil {
		return 0
	}
	v, rest, err := msgp.ReadUint(d.b)
	if err != nil {
		d.fail(err)
		return 0
	}
	d.b = rest
	return v
}

// u64 reads a non-negative integer.
func (d *decoder) u64() uint64 { return d.u64v() }

func (d *decoder) u32() uint32 {
	if d.err != nil {
		return 0
	}
	v, rest, err := msgp.ReadUint32(d.b)
	if err != nil {
		d.fail(err)
		return 0
	}
	d.b = rest
	return v
}

func (d *decoder) u8() uint8 {
	v := d.u64()
	if v > math.MaxUint8 {
		d.fail(&msgp.OverflowError{What: "uint8"})
		return 0
	}
	return uint8(v)
}

func (d *decoder) ptid() uint64 {
	if d.isNil() {
		return NoPTid
	}
	return d.u64()
}

func (d *decoder) nid() NodeID {
	if d.isNil() || d.err != nil {
		return NoNode
	}
	v, rest, err := msgp.ReadInt32(d.b)
	if err != nil {
		d.fail(err)
		return NoNode
	}
	d.b = rest
	return NodeID(v)
}

func (d *decoder) boolean() bool {
	if d.err != nil {
		return false
	}
	v, rest, err := msgp.ReadBool(d.b)
	if err != nil {
		d.fail(err)
		return false
	}
	d.b = rest
	return v
}

func (d *decoder) float() float64 {
	if d.err != nil {
		return 0
	}
	v, rest, err := msgp.ReadFloat64(d.b)
	if err != nil {
		d.fail(err)
		return 0
	}
	d.b = rest
	return v
}

func (d *decoder) idTime() float64 {
	if d.isNil() {
		return NoIdTime
	}
	return d.float()
}

func (d *decoder) id64() uint64 {
	if d.err != nil {
		return 0
	}
	v, rest, err := msgp.ReadBin64(d.b)
	if err != nil {
		d.fail(err)
		return 0
	}
	d.b = rest
	return v
}

func (d *decoder) tid() zodb.Tid {
	if d.isNil() {
		return InvalidTid
	}
	return zodb.Tid(d.id64())
}

func (d *decoder) oid() zodb.Oid {
	if d.isNil() {
		return InvalidOid
	}
	return zodb.Oid(d.id64())
}

// bin reads a byte string, aliasing the input.
func (d *decoder) bin() []byte {
	if d.err != nil {
		return nil
	}
	v, rest, err := msgp.ReadBin(d.b)
	if err != nil {
		d.fail(err)
		return nil
	}
	d.b = rest
	return v
}

// optBin reads a byte string or nil (nil slice); a decoded byte string is
// never a nil slice.
func (d *decoder) optBin() []byte {
	if d.isNil() {
		return nil
	}
	return d.bin()
}

// str reads a byte string (or a text string) into a Go string.
func (d *decoder) str() string {
	if d.err != nil {
		return ""
	}
	v, rest, err := msgp.ReadBin(d.b)
	if err != nil {
		var err2 error
		v, rest, err2 = msgp.ReadStr(d.b)
		if err2 != nil {
			d.fail(err)
			return ""
		}
	}
	d.b = rest
	return string(v)
}

func (d *decoder) hash() (h [20]byte) {
	v := d.bin()
	if d.err != nil {
		return h
	}
	if len(v) != 20 {
		d.fail(fmt.Errorf("want a 20-byte hash, got %d bytes", len(v)))
		return h
	}
	copy(h[:], v)
	return h
}

func (d *decoder) enum(typ int8, max int, what string) int {
	if d.err != nil {
		return 0
	}
	v, rest, err := msgp.ReadEnum(d.b, typ)
	if err != nil {
		d.fail(err)
		return 0
	}
	if v < 0 || v > max {
		d.fail(fmt.Errorf("%s %d out of range", what, v))
		return 0
	}
	d.b = rest
	return v
}

func (d *decoder) nodeType() NodeType {
	return NodeType(d.enum(ExtNodeType, int(Admin), "node type"))
}

func (d *decoder) nodeState() NodeState {
	return NodeState(d.enum(ExtNodeState, int(NodePending), "node state"))
}

func (d *decoder) cellState() CellState {
	return CellState(d.enum(ExtCellState, int(Discarded), "cell state"))
}

func (d *decoder) clusterState() ClusterState {
	return ClusterState(d.enum(ExtClusterState, int(StoppingBackup), "cluster state"))
}

// array reads an array header of any length; the length is checked against
// the remaining bytes so that a hostile length cannot make us allocate.
func (d *decoder) array() int {
	if d.err != nil {
		return 0
	}
	n, rest, err := msgp.ReadArrayHeader(d.b)
	if err != nil {
		d.fail(err)
		return 0
	}
	if n > len(rest) {
		d.fail(msgp.ErrShort)
		return 0
	}
	d.b = rest
	return n
}

// arrayN reads an array header that must announce n elements.
func (d *decoder) arrayN(n int) {
	if got := d.array(); d.err == nil && got != n {
		d.fail(fmt.Errorf("want an array of %d, got %d", n, got))
	}
}

func (d *decoder) mapHeader() int {
	if d.err != nil {
		return 0
	}
	n, rest, err := msgp.ReadMapHeader(d.b)
	if err != nil {
		d.fail(err)
		return 0
	}
	if n > len(rest)/2 {
		d.fail(msgp.ErrShort)
		return 0
	}
	d.b = rest
	return n
}

func (d *decoder) raw() Raw {
	if d.err != nil {
		return nil
	}
	n, err := msgp.Len(d.b)
	if err != nil {
		d.fail(err)
		return nil
	}
	v := d.b[:n:n]
	d.b = d.b[n:]
	return Raw(v)
}

func (d *decoder) addr() Address {
	if d.isNil() {
		return Address{}
	}
	d.arrayN(2)
	host := d.str()
	port := d.u64()
	if d.err == nil && port > math.MaxUint16 {
		d.fail(fmt.Errorf("port %d out of range", port))
	}
	return Address{Host: host, Port: uint16(port)}
}

// u8OrNil reads a uint8 or nil (0).
func (d *decoder) u8OrNil() uint8 {
	if d.isNil() {
		return 0
	}
	return d.u8()
}

// index reads an index or nil (NoPrimary).
func (d *decoder) index() int {
	if d.isNil() {
		return NoPrimary
	}
	v := d.u32()
	if v > 1<<30 {
		d.fail(fmt.Errorf("primary index %d out of range", v))
	}
	return int(v)
}

func (d *decoder) optNodeType() NodeType {
	if d.isNil() {
		return NoNodeType
	}
	return d.nodeType()
}

// hostPort reads [host, port], which may not be nil.
func (d *decoder) hostPort() Address {
	d.arrayN(2)
	host := d.str()
	port := d.u64()
	if port > math.MaxUint16 {
		d.fail(fmt.Errorf("port %d out of range", port))
	}
	return Address{Host: host, Port: uint16(port)}
}
