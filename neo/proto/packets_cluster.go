package proto

import (
	"github.com/zodbd/zodbd/neo/msgp"
	"github.com/zodbd/zodbd/zodb"
)

// NotifyPartitionChanges (0x0b): [ptid, num_replicas, [[offset, nid,
// state]...]].
type NotifyPartitionChanges struct {
	PTid        uint64 // NoPTid for nil
	NumReplicas uint32
	Changes     []CellChange
}

func (m *NotifyPartitionChanges) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 3)
	b = appendPTid(b, m.PTid)
	b = msgp.AppendUint(b, uint64(m.NumReplicas))
	b = msgp.AppendArrayHeader(b, len(m.Changes))
	for _, c := range m.Changes {
		b = msgp.AppendArrayHeader(b, 3)
		b = msgp.AppendUint(b, uint64(c.Offset))
		b = appendNID(b, c.NID)
		b = msgp.AppendEnum(b, ExtCellState, int(c.State))
	}
	return b
}

func (m *NotifyPartitionChanges) DecodeArgs(args []byte) error {
	d := newDecoder("NotifyPartitionChanges", args, 3)
	m.PTid = d.a("ptid").ptid()
	m.NumReplicas = d.a("num_replicas").u32()
	m.Changes = nil
	if n := d.a("cell_list").array(); n > 0 {
		m.Changes = makeList[CellChange](&d, n)
		for i := range m.Changes {
			c := &m.Changes[i]
			d.arrayN(3)
			c.Offset = d.u32()
			c.NID = d.nid()
			c.State = d.cellState()
		}
	}
	return d.finish()
}

// LockedTxn is one entry of AnswerLockedTransactions: ttid -> tid, Tid
// InvalidTid when the transaction is only voted (nil).
type LockedTxn struct {
	TTid zodb.Tid
	Tid  zodb.Tid
}

// AnswerLockedTransactions (0x800f): [{ttid: tid or nil}], kept in wire
// order.
type AnswerLockedTransactions struct {
	TidDict []LockedTxn
}

func (m *AnswerLockedTransactions) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = msgp.AppendMapHeader(b, len(m.TidDict))
	for _, e := range m.TidDict {
		b = appendTid(b, e.TTid)
		b = appendTid(b, e.Tid)
	}
	return b
}

func (m *AnswerLockedTransactions) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerLockedTransactions", args, 1)
	m.TidDict = nil
	if n := d.a("tid_dict").mapHeader(); n > 0 {
		m.TidDict = makeList[LockedTxn](&d, n)
		for i := range m.TidDict {
			m.TidDict[i].TTid = d.tid()
			m.TidDict[i].Tid = d.tid()
		}
	}
	return d.finish()
}

// AskLockInformation (0x15): [ttid, tid, pack]. Pack is the auto-approval
// of a pack order carried by the transaction (false if none); PackSet false
// encodes nil.
type AskLockInformation struct {
	TTid    zodb.Tid
	Tid     zodb.Tid
	Pack    bool
	PackSet bool
}

func (m *AskLockInformation) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 3)
	b = appendTid(b, m.TTid)
	b = appendTid(b, m.Tid)
	return appendOptBool(b, m.Pack, m.PackSet)
}

func (m *AskLockInformation) DecodeArgs(args []byte) error {
	d := newDecoder("AskLockInformation", args, 3)
	m.TTid = d.a("ttid").tid()
	m.Tid = d.a("tid").tid()
	m.Pack, m.PackSet = d.a("pack").optBool()
	return d.finish()
}

// AnswerPackOrders (0x8033): [[pack order...]].
type AnswerPackOrders struct {
	Orders []PackOrder
}

func (m *AnswerPackOrders) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	b = msgp.AppendArrayHeader(b, len(m.Orders))
	for i := range m.Orders {
		o := &m.Orders[i]
		b = msgp.AppendArrayHeader(b, 5)
		b = appendTid(b, o.PackID)
		b = appendOptBool(b, o.Approved, o.ApprovedSet)
		b = msgp.AppendBool(b, o.Partial)
		b = appendOptOids(b, o.Oids, o.OidsSet)
		b = appendTid(b, o.PackTid)
	}
	return b
}

func (m *AnswerPackOrders) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerPackOrders", args, 1)
	m.Orders = nil
	if n := d.a("pack_list").array(); n > 0 {
		m.Orders = makeList[PackOrder](&d, n)
		for i := range m.Orders {
			o := &m.Orders[i]
			d.arrayN(5)
			o.PackID = d.tid()
			o.Approved, o.ApprovedSet = d.optBool()
			o.Partial = d.boolean()
			o.Oids, o.OidsSet = d.optOids()
			o.PackTid = d.tid()
		}
	}
	return d.finish()
}

// CheckPartition (0x37): [partition, [upstream_name, source addr or nil],
// min_tid, max_tid]. An empty UpstreamName and zero Source mean "compare
// with the other replicas".
type CheckPartition struct {
	Partition    uint32
	UpstreamName string
	Source       Address
	MinTid       zodb.Tid
	MaxTid       zodb.Tid
}

func (m *CheckPartition) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 4)
	b = msgp.AppendUint(b, uint64(m.Partition))
	b = msgp.AppendArrayHeader(b, 2)
	b = appendStrBin(b, m.UpstreamName)
	b = appendAddr(b, m.Source)
	b = appendTid(b, m.MinTid)
	return appendTid(b, m.MaxTid)
}

func (m *CheckPartition) DecodeArgs(args []byte) error {
	d := newDecoder("CheckPartition", args, 4)
	m.Partition = d.a("partition").u32()
	d.a("source").arrayN(2)
	m.UpstreamName = d.str()
	m.Source = d.addr()
	m.MinTid = d.a("min_tid").tid()
	m.MaxTid = d.a("max_tid").tid()
	return d.finish()
}

// PartitionAddr is one entry of Replicate's {offset: addr or nil} map.
type PartitionAddr struct {
	Partition uint32
	Addr      Address
}

// Replicate (0x3f), backup clusters only: [tid, upstream_name, {offset:
// addr or nil}].
type Replicate struct {
	Tid          zodb.Tid
	UpstreamName string
	SourceDict   []PartitionAddr
}

func (m *Replicate) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 3)
	b = appendTid(b, m.Tid)
	b = appendStrBin(b, m.UpstreamName)
	b = msgp.AppendMapHeader(b, len(m.SourceDict))
	for _, e := range m.SourceDict {
		b = msgp.AppendUint(b, uint64(e.Partition))
		b = appendAddr(b, e.Addr)
	}
	return b
}

func (m *Replicate) DecodeArgs(args []byte) error {
	d := newDecoder("Replicate", args, 3)
	m.Tid = d.a("tid").tid()
	m.UpstreamName = d.a("upstream_name").str()
	m.SourceDict = nil
	if n := d.a("source_dict").mapHeader(); n > 0 {
		m.SourceDict = makeList[PartitionAddr](&d, n)
		for i := range m.SourceDict {
			m.SourceDict[i].Partition = d.u32()
			m.SourceDict[i].Addr = d.addr()
		}
	}
	return d.finish()
}

// PartitionNode is one entry of CheckReplicas' {offset: nid or nil} map.
type PartitionNode struct {
	Partition uint32
	NID       NodeID // NoNode for nil
}

// CheckReplicas (0x36), answered by Error only: [{offset: nid or nil},
// min_tid, max_tid or nil].
type CheckReplicas struct {
	PartitionDict []PartitionNode
	MinTid        zodb.Tid
	MaxTid        zodb.Tid
}

func (m *CheckReplicas) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 3)
	b = msgp.AppendMapHeader(b, len(m.PartitionDict))
	for _, e := range m.PartitionDict {
		b = msgp.AppendUint(b, uint64(e.Partition))
		b = appendNID(b, e.NID)
	}
	b = appendTid(b, m.MinTid)
	return appendTid(b, m.MaxTid)
}

func (m *CheckReplicas) DecodeArgs(args []byte) error {
	d := newDecoder("CheckReplicas", args, 3)
	m.PartitionDict = nil
	if n := d.a("partition_dict").mapHeader(); n > 0 {
		m.PartitionDict = makeList[PartitionNode](&d, n)
		for i := range m.PartitionDict {
			m.PartitionDict[i].Partition = d.u32()
			m.PartitionDict[i].NID = d.nid()
		}
	}
	m.MinTid = d.a("min_tid").tid()
	m.MaxTid = d.a("max_tid").tid()
	return d.finish()
}

// AskNodeList (0x25): [node_type or nil]; NoNodeType for nil (all types).
type AskNodeList struct {
	NodeType NodeType
}

func (m *AskNodeList) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 1)
	if m.NodeType == NoNodeType {
		return msgp.AppendNil(b)
	}
	return msgp.AppendEnum(b, ExtNodeType, int(m.NodeType))
}

func (m *AskNodeList) DecodeArgs(args []byte) error {
	d := newDecoder("AskNodeList", args, 1)
	if d.a("node_type").isNil() {
		m.NodeType = NoNodeType
	} else {
		m.NodeType = d.nodeType()
	}
	return d.finish()
}

// AnswerMonitorInformation (0x8047): [[bin or nil...], [bin or nil...],
// summary]. A nil entry is a nil slice; a decoded bin is never a nil slice.
type AnswerMonitorInformation struct {
	Warnings [][]byte
	Errors   [][]byte
	Summary  []byte
}

func appendOptBins(b []byte, l [][]byte) []byte {
	b = msgp.AppendArrayHeader(b, len(l))
	for _, v := range l {
		if v == nil {
			b = msgp.AppendNil(b)
		} else {
			b = msgp.AppendBin(b, v)
		}
	}
	return b
}

func (d *decoder) optBins() [][]byte {
	n := d.array()
	if n == 0 {
		return nil
	}
	l := makeList[[]byte](d, n)
	for i := range l {
		l[i] = d.optBin()
	}
	return l
}

func (m *AnswerMonitorInformation) AppendArgs(b []byte) []byte {
	b = msgp.AppendArrayHeader(b, 3)
	b = appendOptBins(b, m.Warnings)
	b = appendOptBins(b, m.Errors)
	return msgp.AppendBin(b, m.Summary)
}

func (m *AnswerMonitorInformation) DecodeArgs(args []byte) error {
	d := newDecoder("AnswerMonitorInformation", args, 3)
	m.Warnings = d.a("warning").optBins()
	m.Errors = d.a("error").optBins()
	m.Summary = d.a("summary").bin()
	return d.finish()
}
