package proto

import (
	"github.com/zodbd/zodbd/neo/msgp"
	"github.com/zodbd/zodbd/zodb"
)

// AskObject (0x20) loads an object: [oid, at, before]. At is the exact
// serial (loadSerial), Before the bound of loadBefore; InvalidTid for nil.
type AskObject struct {
	Oid    zodb.Oid
	At     zodb.Tid
	Before zodb.Tid
}

func (m *AskObject) AppendArgs(b []byte) []byte {
	b = append(b, 0x93)
	b = appendOid(b, m.Oid)
	b = appendTid(b, m.At)
	return appendTid(b, m.Before)
}

func (m *AskObject) DecodeArgs(args []byte) error {
	d := newDecoder("AskObject", args, 3)
	m.Oid = d.a("oid").oid()
	m.At = d.a("at").tid()
	m.Before = d.a("before").tid()
	return d.finish()
}

// AnswerObject (0x8020): [oid, serial, next_serial, compression, checksum,
// data, data_serial]. NextSerial and DataSerial are InvalidTid for nil.
// Data aliases the decoded buffer. A record without data has a zero
// Checksum and empty Data. A nil compression decodes as 0.
type AnswerObject struct {
	Oid         zodb.Oid
	Serial      zodb.Tid
	NextSerial  zodb.Tid
	Compression uint8
	Checksum    [20]byte
	Data        []byte
	DataSerial  zodb.Tid
}

func (m *AnswerObject) AppendArgs(b []byte) []byte {
	b = append(b, 0x97)
	b = appendOid(b, m.Oid)
	b = appendTid(b, m.Serial)
	b = appendTid(b, m.NextSerial)
	b = msgp.AppendUint(b, uint64(m.Compression))
	b = appendHash(b, &m.Checksum)
	b = msgp.AppendBin(b, m.Data)
	return appendTid(b, m.DataSerial)
}

func (m *AnswerObject) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerObject", args, 7)
	m.Oid = d.a("oid").oid()
	m.Serial = d.a("serial").tid()
	m.NextSerial = d.a("next_serial").tid()
	if d.a("compression").isNil() {
		m.Compression = 0
	} else {
		m.Compression = d.u8()
	}
	m.Checksum = d.a("checksum").hash()
	m.Data = d.a("data").bin()
	m.DataSerial = d.a("data_serial").tid()
	return d.finish()
}

// AskStoreObject (0x1c): [oid, serial, compression, checksum, data,
// data_serial, ttid]. Serial is the base serial (ZeroTid for a new object);
// DataSerial is InvalidTid for nil (set for undo). Data aliases the input.
type AskStoreObject struct {
	Oid         zodb.Oid
	Serial      zodb.Tid
	Compression uint8
	Checksum    [20]byte
	Data        []byte
	DataSerial  zodb.Tid
	TTid        zodb.Tid
}

func (m *AskStoreObject) AppendArgs(b []byte) []byte {
	b = append(b, 0x97)
	b = appendOid(b, m.Oid)
	b = appendTid(b, m.Serial)
	b = msgp.AppendUint(b, uint64(m.Compression))
	b = appendHash(b, &m.Checksum)
	b = msgp.AppendBin(b, m.Data)
	b = appendTid(b, m.DataSerial)
	return appendTid(b, m.TTid)
}

func (m *AskStoreObject) DecodeArgs(args []byte) error {
	d := newDecoder("AskStoreObject", args, 7)
	m.Oid = d.a("oid").oid()
	m.Serial = d.a("serial").tid()
	m.Compression = d.a("compression").u8()
	m.Checksum = d.a("checksum").hash()
	m.Data = d.a("data").bin()
	m.DataSerial = d.a("data_serial").tid()
	m.TTid = d.a("ttid").tid()
	return d.finish()
}

// HistoryEntry is one revision in AnswerObjectHistory: [serial, size].
type HistoryEntry struct {
	Serial zodb.Tid
	Size   uint64
}

// AnswerObjectHistory (0x8023): [oid, [[serial, size]...]], newest first.
type AnswerObjectHistory struct {
	Oid     zodb.Oid
	History []HistoryEntry
}

func (m *AnswerObjectHistory) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 2)
	b = appendOid(b, m.Oid)
	b = msgp.AppendArrayHeader(b, len(m.History))
	for _, h := range m.History {
		b = msgp.AppendArrayHeader(b, 2)
		b = appendTid(b, h.Serial)
		b = msgp.AppendUint(b, h.Size)
	}
	return b
}

func (m *AnswerObjectHistory) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerObjectHistory", args, 2)
	m.Oid = d.a("oid").oid()
	m.History = nil
	if n := d.a("history_list").array(); n > 0 {
		m.History = makeList[HistoryEntry](&d, n)
		for i := range m.History {
			d.arrayN(2)
			m.History[i].Serial = d.tid()
			m.History[i].Size = d.u64()
		}
	}
	return d.finish()
}

// UndoSerial is one entry of AnswerObjectUndoSerial:
// oid: [current_serial, undo_serial, is_current]. UndoSerial is InvalidTid
// for nil.
type UndoSerial struct {
	Oid           zodb.Oid
	CurrentSerial zodb.Tid
	UndoSerial    zodb.Tid
	IsCurrent     bool
}

// AnswerObjectUndoSerial (0x802f): [{oid: [current_serial, undo_serial,
// is_current]}], kept in wire order.
type AnswerObjectUndoSerial struct {
	ObjectTidDict []UndoSerial
}

func (m *AnswerObjectUndoSerial) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = msgp.AppendMapHeader(b, len(m.ObjectTidDict))
	for _, e := range m.ObjectTidDict {
		b = appendOid(b, e.Oid)
		b = msgp.AppendArrayHeader(b, 3)
		b = appendTid(b, e.CurrentSerial)
		b = appendTid(b, e.UndoSerial)
		b = msgp.AppendBool(b, e.IsCurrent)
	}
	return b
}

func (m *AnswerObjectUndoSerial) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerObjectUndoSerial", args, 1)
	m.ObjectTidDict = nil
	if n := d.a("object_tid_dict").mapHeader(); n > 0 {
		m.ObjectTidDict = makeList[UndoSerial](&d, n)
		for i := range m.ObjectTidDict {
			e := &m.ObjectTidDict[i]
			e.Oid = d.oid()
			d.arrayN(3)
			e.CurrentSerial = d.tid()
			e.UndoSerial = d.tid()
			e.IsCurrent = d.boolean()
		}
	}
	return d.finish()
}

// PackRequest is the optional pack argument of AskFinishTransaction and
// AskStoreTransaction: [oids or nil, pack_tid]. OidsSet false encodes nil
// (a full pack).
type PackRequest struct {
	Oids    []zodb.Oid
	OidsSet bool
	PackTid zodb.Tid
}

func appendPackRequest(b []byte, p *PackRequest) []byte {
	if p == nil {
		return msgp.AppendNil(b)
	}
	b = msgp.AppendArrayHeader(b, 2)
	b = appendOptOids(b, p.Oids, p.OidsSet)
	return appendTid(b, p.PackTid)
}

func (d *decoder) packRequest() *PackRequest {
	if d.isNil() || d.err != nil {
		return nil
	}
	p := new(PackRequest)
	d.arrayN(2)
	p.Oids, p.OidsSet = d.optOids()
	p.PackTid = d.tid()
	return p
}

// AskFinishTransaction (0x14): [ttid, oid_list, deleted, checked, pack].
// Deleted and Checked are partition numbers; Pack is nil for nil.
type AskFinishTransaction struct {
	TTid    zodb.Tid
	Oids    []zodb.Oid
	Deleted []uint32
	Checked []uint32
	Pack    *PackRequest
}

func (m *AskFinishTransaction) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 5)
	b = appendTid(b, m.TTid)
	b = appendOids(b, m.Oids)
	b = appendU32s(b, m.Deleted)
	b = appendU32s(b, m.Checked)
	return appendPackRequest(b, m.Pack)
}

func (m *AskFinishTransaction) DecodeArgs(args []byte) error {
	d := newDecoder("AskFinishTransaction", args, 5)
	m.TTid = d.a("ttid").tid()
	m.Oids = d.a("oid_list").oids()
	m.Deleted = d.a("deleted").u32s()
	m.Checked = d.a("checked").u32s()
	m.Pack = d.a("pack").packRequest()
	return d.finish()
}

// AskStoreTransaction (0x1e): [ttid, user, description, extension,
// oid_list, pack]. Implies the vote.
type AskStoreTransaction struct {
	TTid        zodb.Tid
	User        []byte
	Description []byte
	Extension   []byte
	Oids        []zodb.Oid
	Pack        *PackRequest
}

func (m *AskStoreTransaction) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 6)
	b = appendTid(b, m.TTid)
	b = msgp.AppendBin(b, m.User)
	b = msgp.AppendBin(b, m.Description)
	b = msgp.AppendBin(b, m.Extension)
	b = appendOids(b, m.Oids)
	return appendPackRequest(b, m.Pack)
}

func (m *AskStoreTransaction) DecodeArgs(args []byte) error {
	d := newDecoder("AskStoreTransaction", args, 6)
	m.TTid = d.a("ttid").tid()
	m.User = d.a("user").bin()
	m.Description = d.a("description").bin()
	m.Extension = d.a("extension").bin()
	m.Oids = d.a("oid_list").oids()
	m.Pack = d.a("pack").packRequest()
	return d.finish()
}

// RelockConflict is the non-nil answer of AskRelockObject:
// [serial, conflict_tid, [compression, checksum, data] or nil].
// HasData false encodes nil data.
type RelockConflict struct {
	Serial      zodb.Tid
	ConflictTid zodb.Tid
	HasData     bool
	Compression uint8
	Checksum    [20]byte
	Data        []byte
}

// AnswerRelockObject (0x801b): [conflict or nil].
type AnswerRelockObject struct {
	Conflict *RelockConflict
}

func (m *AnswerRelockObject) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	c := m.Conflict
	if c == nil {
		return msgp.AppendNil(b)
	}
	b = msgp.AppendArrayHeader(b, 3)
	b = appendTid(b, c.Serial)
	b = appendTid(b, c.ConflictTid)
	if !c.HasData {
		return msgp.AppendNil(b)
	}
	b = msgp.AppendArrayHeader(b, 3)
	b = msgp.AppendUint(b, uint64(c.Compression))
	b = appendHash(b, &c.Checksum)
	return msgp.AppendBin(b, c.Data)
}

func (m *AnswerRelockObject) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerRelockObject", args, 1)
	m.Conflict = nil
	if !d.a("conflict").isNil() && d.ok() {
		c := new(RelockConflict)
		d.arrayN(3)
		c.Serial = d.tid()
		c.ConflictTid = d.tid()
		if !d.isNil() {
			c.HasData = true
			d.arrayN(3)
			c.Compression = d.u8()
			c.Checksum = d.hash()
			c.Data = d.bin()
		}
		m.Conflict = c
	}
	return d.finish()
}

// TxnPack is the pack argument of AddTransaction for a pack transaction:
// [approved or nil, partial, oids or nil, pack_tid].
type TxnPack struct {
	Approved    bool
	ApprovedSet bool
	Partial     bool
	Oids        []zodb.Oid
	OidsSet     bool
	PackTid     zodb.Tid
}

// AddTransaction (0x43), sent during replication with the msg_id of the
// AskFetchTransactions it serves: [tid, user, description, extension,
// packed, ttid, oid_list, pack]. Pack is nil for nil.
type AddTransaction struct {
	Tid         zodb.Tid
	User        []byte
	Description []byte
	Extension   []byte
	Packed      bool
	TTid        zodb.Tid
	Oids        []zodb.Oid
	Pack        *TxnPack
}

func (m *AddTransaction) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 8)
	b = appendTid(b, m.Tid)
	b = msgp.AppendBin(b, m.User)
	b = msgp.AppendBin(b, m.Description)
	b = msgp.AppendBin(b, m.Extension)
	b = msgp.AppendBool(b, m.Packed)
	b = appendTid(b, m.TTid)
	b = appendOids(b, m.Oids)
	if p := m.Pack; p == nil {
		b = msgp.AppendNil(b)
	} else {
		b = msgp.AppendArrayHeader(b, 4)
		b = appendOptBool(b, p.Approved, p.ApprovedSet)
		b = msgp.AppendBool(b, p.Partial)
		b = appendOptOids(b, p.Oids, p.OidsSet)
		b = appendTid(b, p.PackTid)
	}
	return b
}

func (m *AddTransaction) DecodeArgs(args []byte) error {
	d := newDecoder("AddTransaction", args, 8)
	m.Tid = d.a("tid").tid()
	m.User = d.a("user").bin()
	m.Description = d.a("description").bin()
	m.Extension = d.a("extension").bin()
	m.Packed = d.a("packed").boolean()
	m.TTid = d.a("ttid").tid()
	m.Oids = d.a("oid_list").oids()
	m.Pack = nil
	if !d.a("pack").isNil() && d.ok() {
		p := new(TxnPack)
		d.arrayN(4)
		p.Approved, p.ApprovedSet = d.optBool()
		p.Partial = d.boolean()
		p.Oids, p.OidsSet = d.optOids()
		p.PackTid = d.tid()
		m.Pack = p
	}
	return d.finish()
}

// SerialOids is one entry of a {serial: [oid...]} map (AskFetchObjects,
// AnswerFetchObjects), kept in wire order.
type SerialOids struct {
	Serial zodb.Tid
	Oids   []zodb.Oid
}

func appendSerialOids(b []byte, l []SerialOids) []byte {
	b = msgp.AppendMapHeader(b, len(l))
	for _, e := range l {
		b = appendTid(b, e.Serial)
		b = appendOids(b, e.Oids)
	}
	return b
}

func (d *decoder) serialOids() []SerialOids {
	n := d.mapHeader()
	if n == 0 {
		return nil
	}
	l := makeList[SerialOids](d, n)
	for i := range l {
		l[i].Serial = d.tid()
		l[i].Oids = d.oids()
	}
	return l
}

// AskFetchObjects (0x42): [partition, length, min_tid, max_tid, min_oid,
// {serial: [oid...]} known].
type AskFetchObjects struct {
	Partition  uint32
	Length     uint32
	MinTid     zodb.Tid
	MaxTid     zodb.Tid
	MinOid     zodb.Oid
	ObjectDict []SerialOids
}

func (m *AskFetchObjects) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 6)
	b = msgp.AppendUint(b, uint64(m.Partition))
	b = msgp.AppendUint(b, uint64(m.Length))
	b = appendTid(b, m.MinTid)
	b = appendTid(b, m.MaxTid)
	b = appendOid(b, m.MinOid)
	return appendSerialOids(b, m.ObjectDict)
}

func (m *AskFetchObjects) DecodeArgs(args []byte) error {
	d := newDecoder("AskFetchObjects", args, 6)
	m.Partition = d.a("partition").u32()
	m.Length = d.a("length").u32()
	m.MinTid = d.a("min_tid").tid()
	m.MaxTid = d.a("max_tid").tid()
	m.MinOid = d.a("min_oid").oid()
	m.ObjectDict = d.a("object_dict").serialOids()
	return d.finish()
}

// AnswerFetchObjects (0x8042): [next_tid, next_oid, {serial: [oid...]}
// to delete]. NextTid/NextOid are InvalidTid/InvalidOid for nil.
type AnswerFetchObjects struct {
	NextTid    zodb.Tid
	NextOid    zodb.Oid
	ObjectDict []SerialOids
}

func (m *AnswerFetchObjects) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 3)
	b = appendTid(b, m.NextTid)
	b = appendOid(b, m.NextOid)
	return appendSerialOids(b, m.ObjectDict)
}

func (m *AnswerFetchObjects) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerFetchObjects", args, 3)
	m.NextTid = d.a("next_tid").tid()
	m.NextOid = d.a("next_oid").oid()
	m.ObjectDict = d.a("object_dict").serialOids()
	return d.finish()
}
