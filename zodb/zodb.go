// Package zodb holds the types and interfaces that every zodbd storage engine,
// protocol server and client speaks: object and transaction identifiers, the
// read contract of a storage, iteration over its history, and the typed errors
// that cross those boundaries.
//
// The read model is the one of ZODB/go: a storage is a sequence of immutable
// database states, one per committed transaction, and every read names the
// state it is made against. Load(oid, at) returns the revision of oid that is
// current in the state produced by transaction at; there is no serial_next.
// ZODB/py's loadBefore(oid, tid) is Load at tid-1.
package zodb

import (
	"encoding/binary"
	"fmt"
	"strconv"
)

// Tid identifies a transaction and the database state it produced. Tids are
// 8-byte big-endian numbers that grow with commit time (see TimeStamp).
type Tid uint64

// Oid identifies an object. Oids are 8-byte big-endian numbers; oid 0 is the
// root object.
type Oid uint64

// TidMax is the largest tid. Load at TidMax means "the latest revision".
const TidMax Tid = 1<<63 - 1

// String formats tid as 16 lower-case hex digits, as ZODB's tools do.
func (tid Tid) String() string { return fmt.Sprintf("%016x", uint64(tid)) }

// String formats oid as 16 lower-case hex digits.
func (oid Oid) String() string { return fmt.Sprintf("%016x", uint64(oid)) }

// Bytes returns tid as the 8 big-endian bytes ZODB/py uses.
func (tid Tid) Bytes() [8]byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(tid))
	return b
}

// Bytes returns oid as the 8 big-endian bytes ZODB/py uses.
func (oid Oid) Bytes() [8]byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(oid))
	return b
}

// ParseTid parses 16 hex digits (an optional "0x" prefix is accepted).
func ParseTid(s string) (Tid, error) {
	v, err := parseHex64(s)
	if err != nil {
		return 0, fmt.Errorf("tid %q: %w", s, err)
	}
	return Tid(v), nil
}

// ParseOid parses an oid written in hex (16 digits or fewer; "0x" prefix accepted).
func ParseOid(s string) (Oid, error) {
	v, err := parseHex64(s)
	if err != nil {
		return 0, fmt.Errorf("oid %q: %w", s, err)
	}
	return Oid(v), nil
}

func parseHex64(s string) (uint64, error) {
	if len(s) > 2 && (s[:2] == "0x" || s[:2] == "0X") {
		s = s[2:]
	}
	if len(s) == 0 || len(s) > 16 {
		return 0, fmt.Errorf("want 1 to 16 hex digits")
	}
	return strconv.ParseUint(s, 16, 64)
}

// Xid names one revision of an object: the one of Oid that is current in the
// database state At (the revision with the greatest serial <= At).
type Xid struct {
	Oid Oid
	At  Tid
}

// String formats xid as "oid@at" in hex, the syntax `zodbd catobj` takes.
func (xid Xid) String() string { return xid.Oid.String() + "@" + xid.At.String() }

// ParseXid parses "OID" (meaning the latest revision) or "OID@TID".
func ParseXid(s string) (Xid, error) {
	for i := 0; i < len(s); i++ {
		if s[i] == '@' {
			oid, err := ParseOid(s[:i])
			if err != nil {
				return Xid{}, err
			}
			at, err := ParseTid(s[i+1:])
			if err != nil {
				return Xid{}, err
			}
			return Xid{oid, at}, nil
		}
	}
	oid, err := ParseOid(s)
	return Xid{oid, TidMax}, err
}
