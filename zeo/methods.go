package zeo

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/zodbd/zodbd/internal/eventlog"
	"github.com/zodbd/zodbd/internal/opstats"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zodb"
)

// argError is a call whose arguments have the wrong number or types. A
// synchronous call gets a TypeError reply; a one-way call closes the
// connection.
type argError struct{ msg string }

func (e *argError) Error() string { return e.msg }

// args gives typed access to a call's positional arguments.
type args struct {
	name   string // the method's, for error messages
	v      []wire.Value
	err    error
	oneway bool // the call was made one-way
}

func (a *args) fail(i int, want string) {
	if a.err == nil {
		got := "nothing"
		if i < len(a.v) {
			got = a.v[i].Kind.String()
		}
		a.err = &argError{fmt.Sprintf("%s() argument %d: expected %s, got %s", a.name, i+1, want, got)}
	}
}

func (a *args) count(min, max int) bool {
	if len(a.v) < min || len(a.v) > max {
		if a.err == nil {
			a.err = &argError{fmt.Sprintf("%s() takes %d to %d arguments (%d given)", a.name, min, max, len(a.v))}
		}
		return false
	}
	return true
}

func (a *args) id8(i int) uint64 {
	// Old callers pass a str of 8 characters (ZODB's tests use
	// ZERO = '\0'*8): accept what is 8 bytes either way.
	if i >= len(a.v) || (a.v[i].Kind != wire.Bytes && a.v[i].Kind != wire.Str) || len(a.v[i].B) != 8 {
		a.fail(i, "8 bytes")
		return 0
	}
	return binary.BigEndian.Uint64(a.v[i].B)
}

func (a *args) oid(i int) zodb.Oid { return zodb.Oid(a.id8(i)) }
func (a *args) tid(i int) zodb.Tid { return zodb.Tid(a.id8(i)) }

// serial is a store's serial: 8 bytes, or None (taken as "new object",
// as the reference's FileStorage compares it only with an existing
// object's serial).
func (a *args) serial(i int) zodb.Tid {
	if i < len(a.v) && a.v[i].Kind == wire.None {
		return 0
	}
	return a.tid(i)
}

// tidOrNone returns 0 for None.
func (a *args) tidOrNone(i int) (zodb.Tid, bool) {
	if i < len(a.v) && a.v[i].Kind == wire.None {
		return 0, false
	}
	return a.tid(i), true
}

func (a *args) bytes(i int) []byte {
	if i >= len(a.v) || (a.v[i].Kind != wire.Bytes && a.v[i].Kind != wire.Str) {
		a.fail(i, "bytes")
		return nil
	}
	return a.v[i].B
}

// bytesOrNone returns nil, false for None.
func (a *args) bytesOrNone(i int) ([]byte, bool) {
	if i < len(a.v) && a.v[i].Kind == wire.None {
		return nil, false
	}
	return a.bytes(i), true
}

func (a *args) str(i int) string {
	if i >= len(a.v) || (a.v[i].Kind != wire.Str && a.v[i].Kind != wire.Bytes) {
		a.fail(i, "str")
		return ""
	}
	return string(a.v[i].B)
}

// tooBig refuses the int beyond 64 bits that argument i is, as Python's
// conversions do (OverflowError), and reports whether it is one.
func (a *args) tooBig(i int) bool {
	if i >= len(a.v) || a.v[i].Kind != wire.Int || a.v[i].B == nil {
		return false
	}
	if a.err == nil {
		a.err = &pyError{"builtins.OverflowError", fmt.Sprintf("%s() argument %d: int too large to convert", a.name, i+1)}
	}
	return true
}

func (a *args) int(i int) int64 {
	if a.tooBig(i) {
		return 0
	}
	if i >= len(a.v) || (a.v[i].Kind != wire.Int && a.v[i].Kind != wire.Bool) {
		a.fail(i, "int")
		return 0
	}
	return a.v[i].Int
}

func (a *args) float(i int) float64 {
	if i >= len(a.v) {
		a.fail(i, "float")
		return 0
	}
	switch a.v[i].Kind {
	case wire.Float:
		return a.v[i].Float
	case wire.Int:
		if !a.tooBig(i) {
			return float64(a.v[i].Int)
		}
		return 0
	}
	a.fail(i, "float")
	return 0
}

func (a *args) truth(i int) bool {
	if i >= len(a.v) {
		a.fail(i, "bool")
		return false
	}
	return a.v[i].Truth()
}

func (a *args) value(i int) *wire.Value {
	if i >= len(a.v) {
		a.fail(i, "a value")
		return &wire.Value{}
	}
	return &a.v[i]
}

// handle processes one message. It returns false when the connection must
// be closed.
// A method is one entry of the server's method table: what a call of it
// may pass, whether the client calls it one-way, and its handler.
type method struct {
	name string // its key in the table
	idx  int    // its index in methodNames (per-method figures, stats.go)
	// async: the call may reply from a goroutine of its own (it calls
	// conn.spawn), which records the call's latency when the reply is
	// queued; its histogram is updated with ObserveDurationShared.
	async    bool
	min, max int // arguments accepted; max < 0: not checked (runzeo ignores them)
	// oneway: the client calls it one-way, so it has no reply of its own;
	// called synchronously (ZODB's tests do), it is answered None.
	oneway bool
	// call runs the method on the call's arguments, already counted. It
	// writes its own reply (or none); an error it returns, or one left in
	// a, is the call's exception reply (or, one-way, closes the connection).
	call func(c *conn, id *wire.Value, a *args) error
}

// methods is the server's method table: every ZEO 5 method a client may
// call, by name. Filled in init (the handlers refer to the table's users).
var methods map[string]*method

// anyArgs marks a method whose arguments are not checked.
const anyArgs = -1

func init() {
	noArgs := func(f func(c *conn, id *wire.Value)) func(*conn, *wire.Value, *args) error {
		return func(c *conn, id *wire.Value, _ *args) error { f(c, id); return nil }
	}
	// record appends one operation to the open transaction's log (the
	// one-way calls of the commit); txnArg is the index of its txn id.
	record := func(txnArg int, mk func(a *args) (op, []byte)) func(*conn, *wire.Value, *args) error {
		return func(c *conn, _ *wire.Value, a *args) error {
			o, data := mk(a)
			return c.record(a.int(txnArg), o, data, a)
		}
	}
	// txnCall runs f on the call's transaction id.
	txnCall := func(f func(c *conn, id *wire.Value, txnID int64)) func(*conn, *wire.Value, *args) error {
		return func(c *conn, id *wire.Value, a *args) error {
			if txnID := a.int(0); a.err == nil {
				f(c, id, txnID)
			}
			return nil
		}
	}
	// window reads undoLog's and undoInfo's (first, last) with their
	// defaults, as FileStorage's undoLog takes any Python numbers: a
	// negative last is first - last, and entry i is in when first <= i <
	// last (so a fraction rounds up). The result is in [0, MaxInt32].
	window := func(a *args) (int, int) {
		first, last := 0.0, -20.0
		if len(a.v) > 0 {
			first = a.float(0)
		}
		if len(a.v) > 1 {
			last = a.float(1)
		}
		if last < 0 {
			last = first - last
		}
		bound := func(x float64) int {
			return int(max(0, min(math.Ceil(x), math.MaxInt32)))
		}
		return bound(first), bound(last)
	}
	blobCall := func(c *conn, id *wire.Value, a *args) error { return c.blobCall(id, a.name, a, a.oneway) } // blob.go
	newOids := func(c *conn, id *wire.Value, a *args) error {
		n := int64(100)
		if len(a.v) == 1 {
			n = a.int(0)
		}
		if a.err != nil {
			return nil
		}
		return c.newOids(id, n, a.name == "new_oid")
	}

	methods = map[string]*method{
		// Loads.
		"loadBefore": {min: 2, max: 2, call: func(c *conn, id *wire.Value, a *args) error {
			if oid, tid := a.oid(0), a.tid(1); a.err == nil {
				c.loadBefore(id, oid, tid)
			}
			return nil
		}},
		"loadSerial": {min: 2, max: 2, call: func(c *conn, id *wire.Value, a *args) error {
			if oid, serial := a.oid(0), a.tid(1); a.err == nil {
				return c.loadSerial(id, oid, serial)
			}
			return nil
		}},
		"getTid": {min: 1, max: 1, call: func(c *conn, id *wire.Value, a *args) error {
			if oid := a.oid(0); a.err == nil {
				return c.getTid(id, oid)
			}
			return nil
		}},
		"history": {min: 1, max: 2, call: func(c *conn, id *wire.Value, a *args) error {
			oid, size := a.oid(0), int64(1)
			if len(a.v) == 2 {
				size = a.int(1)
			}
			if a.err != nil {
				return nil
			}
			return c.history(id, oid, int(size))
		}},
		"record_iternext": {min: 0, max: 1, call: func(c *conn, id *wire.Value, a *args) error {
			var next zodb.Oid // (None: from the start)
			if len(a.v) > 0 && !a.v[0].IsNone() {
				next = a.oid(0)
			}
			if a.err != nil {
				return nil
			}
			return c.recordIternext(id, next)
		}},

		// The session.
		"register": {min: 2, max: 2, call: func(c *conn, id *wire.Value, a *args) error {
			return c.register(id, a.str(0), a.truth(1), a)
		}},
		"get_info": {min: 0, max: anyArgs, call: noArgs(func(c *conn, id *wire.Value) {
			c.reply(id, func(e *wire.Encoder) { c.encodeInfo(e, true) })
		})},
		"lastTransaction": {min: 0, max: anyArgs, call: func(c *conn, id *wire.Value, _ *args) error {
			last, err := c.st.st.LastTid(c.ctx)
			if err == nil {
				c.reply(id, func(e *wire.Encoder) { e.Oid8(uint64(last)) })
			}
			return err
		}},
		"ping": {min: 0, max: anyArgs, call: noArgs(func(c *conn, id *wire.Value) {
			c.reply(id, func(e *wire.Encoder) { e.None() })
		})},
		"server_status": {min: 0, max: anyArgs, call: noArgs(func(c *conn, id *wire.Value) {
			c.reply(id, func(e *wire.Encoder) { encodeDict(e, c.srv.status(c.st)) })
		})},
		"set_client_label": {min: 1, max: 1, oneway: true, call: func(c *conn, _ *wire.Value, a *args) error {
			c.setLabel(a.str(0))
			return nil
		}},
		"getInvalidations": {min: 1, max: 1, call: func(c *conn, id *wire.Value, a *args) error {
			if tid := a.tid(0); a.err == nil {
				c.getInvalidations(id, tid)
			}
			return nil
		}},
		"new_oids": {min: 0, max: 1, call: newOids},
		"new_oid":  {min: 0, max: 1, call: newOids},

		// Two-phase commit: the one-way calls are recorded, vote replays them.
		"tpc_begin": {min: 6, max: 6, oneway: true, call: func(c *conn, _ *wire.Value, a *args) error {
			return c.tpcBegin(a)
		}},
		"storea": {min: 4, max: 4, oneway: true, call: record(3, func(a *args) (op, []byte) {
			return op{kind: opStore, oid: a.oid(0), serial: a.serial(1)}, a.bytes(2)
		})},
		"deleteObject": {min: 3, max: 3, oneway: true, call: record(2, func(a *args) (op, []byte) {
			return op{kind: opDelete, oid: a.oid(0), serial: a.tid(1)}, nil
		})},
		"checkCurrentSerialInTransaction": {min: 3, max: 3, oneway: true, call: record(2, func(a *args) (op, []byte) {
			return op{kind: opCheck, oid: a.oid(0), serial: a.tid(1)}, nil
		})},
		"restorea": {min: 5, max: 5, oneway: true, call: record(4, func(a *args) (op, []byte) {
			data, hasData := a.bytesOrNone(2)
			if hasData && data == nil {
				data = []byte{}
			}
			prev, _ := a.tidOrNone(3)
			return op{kind: opRestore, oid: a.oid(0), serial: a.tid(1), prev: prev}, data
		})},
		"undoa": {min: 2, max: 2, oneway: true, call: record(1, func(a *args) (op, []byte) {
			// A malformed id fails the vote (as FileStorage's undo
			// does, the connection kept): tid 0 names no transaction.
			tid, _ := decodeUndoID(a.bytes(0))
			return op{kind: opUndo, serial: tid}, nil
		})},
		"vote":       {min: 1, max: 1, async: true, call: txnCall((*conn).vote)},
		"tpc_finish": {min: 1, max: 1, async: true, call: txnCall((*conn).tpcFinish)},
		"tpc_abort":  {min: 1, max: 1, call: txnCall((*conn).tpcAbort)},

		// Undo and pack.
		"undoLog": {min: 0, max: 2, call: func(c *conn, id *wire.Value, a *args) error {
			first, last := window(a)
			if a.err != nil {
				return nil
			}
			return c.undoLog(id, first, last, nil)
		}},
		"undoInfo": {min: 0, max: 3, call: func(c *conn, id *wire.Value, a *args) error {
			first, last := window(a)
			var spec *wire.Value
			if len(a.v) > 2 && a.v[2].Kind == wire.Dict {
				spec = &a.v[2]
			}
			if a.err != nil {
				return nil
			}
			return c.undoLog(id, first, last, spec)
		}},
		"pack": {min: 1, max: 3, async: true, call: func(c *conn, id *wire.Value, a *args) error {
			t, wait := a.float(0), true
			if len(a.v) >= 2 {
				wait = a.truth(len(a.v) - 1)
			}
			if a.err == nil {
				c.pack(id, t, wait)
			}
			return nil
		}},

		// Iteration.
		"iterator_start": {min: 2, max: 2, call: func(c *conn, id *wire.Value, a *args) error {
			start, _ := a.tidOrNone(0)
			stop, hasStop := a.tidOrNone(1)
			if !hasStop {
				stop = zodb.TidMax
			}
			if a.err == nil {
				return c.iteratorStart(id, start, stop)
			}
			return nil
		}},
		"iterator_next": {min: 1, max: 1, call: func(c *conn, id *wire.Value, a *args) error {
			if iid := a.int(0); a.err == nil {
				return c.iteratorNext(id, iid)
			}
			return nil
		}},
		"iterator_record_start": {min: 2, max: 2, call: func(c *conn, id *wire.Value, a *args) error {
			if iid, tid := a.int(0), a.tid(1); a.err == nil {
				return c.iteratorRecordStart(id, iid, tid)
			}
			return nil
		}},
		"iterator_record_next": {min: 1, max: 1, call: func(c *conn, id *wire.Value, a *args) error {
			if riid := a.int(0); a.err == nil {
				return c.iteratorRecordNext(id, riid)
			}
			return nil
		}},
		"iterator_gc": {min: 1, max: 1, oneway: true, call: func(c *conn, _ *wire.Value, a *args) error {
			ids := a.value(0)
			for i := range ids.Items {
				if ids.Items[i].Kind == wire.Int && ids.Items[i].B == nil {
					delete(c.iters, ids.Items[i].Int)
				}
			}
			return nil
		}},

		// Blobs (blob.go).
		"sendBlob":        {min: 0, max: anyArgs, call: blobCall},
		"storeBlobStart":  {min: 0, max: anyArgs, call: blobCall},
		"storeBlobChunk":  {min: 0, max: anyArgs, call: blobCall},
		"storeBlobEnd":    {min: 0, max: anyArgs, call: blobCall},
		"storeBlobShared": {min: 0, max: anyArgs, call: blobCall},
	}
	for name, m := range methods {
		m.name = name
		methodNames = append(methodNames, name)
	}
	sort.Strings(methodNames)
	for i, name := range methodNames {
		methods[name].idx = i
	}
}

// methodNames are the names of the method table, sorted; a method's idx
// is its index here.
var methodNames []string

// handle runs one call: the checks every call passes (message id,
// arguments, register first), then its entry of the method table. It
// returns false when the connection must close.
func (c *conn) handle(m *wire.Message) bool {
	if m.ID.Kind == wire.Int && m.ID.Int == -1 {
		return true // heartbeat
	}
	if !validMsgid(&m.ID) {
		c.logProto(eventlog.Error, "%s: message id is not an int or a short tuple (%s); closing", logName(m.Name), logName([]byte(fmt.Sprint(m.ID))))
		return false
	}
	oneway := m.Flags.Truth()
	if m.Args.Kind != wire.Tuple && m.Args.Kind != wire.List {
		c.logProto(eventlog.Error, "%s: arguments are a %s, not a tuple; closing", logName(m.Name), m.Args.Kind)
		return false
	}
	if c.st == nil && string(m.Name) != "register" {
		c.logProto(eventlog.Error, "%s called before register; closing", logName(m.Name))
		return false
	}
	mt := methods[string(m.Name)]
	if mt == nil {
		c.logProto(eventlog.Error, "Invalid method, %s; closing", logName(m.Name))
		return false
	}
	id := &m.ID
	// The connection's args, reused: a handler called through the table
	// would make a fresh one escape to the heap on every request.
	a := &c.args
	*a = args{name: mt.name, v: m.Args.Items, oneway: oneway}
	var err error
	c.callIdx, c.spawned = mt.idx, false
	if mt.max < 0 || a.count(mt.min, mt.max) {
		err = mt.call(c, id, a)
	}
	if err == nil && a.err != nil {
		err = a.err
	}
	a.v = nil // the frame's values: not kept past the call
	if c.latency != nil && !c.spawned {
		c.tEnd, c.ended = opstats.Now(), true
		if mt.async {
			c.latency[mt.idx].ObserveDurationShared(c.tEnd.Sub(c.t0))
		} else {
			c.latency[mt.idx].ObserveDuration(c.tEnd.Sub(c.t0))
		}
	}
	if err == nil && !oneway && mt.oneway {
		// A method the client normally calls one-way, called
		// synchronously (ZODB's tests do): answer None.
		c.reply(id, func(e *wire.Encoder) { e.None() })
	}
	if err != nil {
		if oneway {
			c.logProto(eventlog.Error, "async `%s` raised exception: %v; closing (a one-way call has no reply to carry the error)", m.Name, err)
			return false
		}
		c.replyError(id, err)
	}
	return true
}

// reply writes a normal reply whose value body writes.
func (c *conn) reply(id *wire.Value, body func(e *wire.Encoder)) {
	c.enc.BeginReply(id, 0)
	body(&c.enc)
	c.enc.EndMessage()
}

func (c *conn) register(id *wire.Value, name string, readOnly bool, a *args) error {
	if a.err != nil {
		return a.err
	}
	if c.st != nil {
		return &pyError{"builtins.ValueError", "Already registered"}
	}
	st := c.srv.storages[name]
	if st == nil {
		return &pyError{"builtins.ValueError", fmt.Sprintf("unknown storage: %s", name)}
	}
	if !readOnly && st.readOnly {
		return zodb.ErrReadOnly
	}
	c.st = st
	c.readOnly = readOnly || st.readOnly
	c.iters = make(map[int64]*iterState)
	// Registered and the last tid read together (see storage.register):
	// every commit after that tid reaches this connection.
	last, err := st.register(c.ctx, c)
	if err != nil {
		c.st = nil
		return err
	}
	c.reply(id, func(e *wire.Encoder) { e.Oid8(uint64(last)) })
	return nil
}

// encodeInfo writes get_info's dict (or info's, with fewer keys).
func (c *conn) encodeInfo(e *wire.Encoder, full bool) {
	st := c.st
	length, size := st.storageSize()
	n := 2
	if full {
		n = 6
	}
	e.BeginDict(n)
	e.Str("length")
	e.Int(int64(length))
	e.Str("size")
	e.Int(size)
	if full {
		e.Str("name")
		e.Str(st.st.URL())
		e.Str("supportsUndo")
		e.Bool(st.undoer != nil)
		iterOids := st.oids != nil
		e.Str("supports_record_iternext")
		e.Bool(iterOids)
		e.Str("interfaces")
		ifaces := [][2]string{}
		if st.blobs != nil {
			ifaces = append(ifaces, [2]string{"ZODB.interfaces", "IBlobStorageRestoreable"}, [2]string{"ZODB.interfaces", "IBlobStorage"})
		}
		if st.ws != nil {
			ifaces = append(ifaces, [2]string{"ZODB.interfaces", "IStorageRestoreable"})
		}
		ifaces = append(ifaces, [2]string{"ZODB.interfaces", "IStorageIteration"})
		if st.undoer != nil {
			ifaces = append(ifaces, [2]string{"ZODB.interfaces", "IStorageUndoable"})
		}
		if iterOids {
			ifaces = append(ifaces, [2]string{"ZODB.interfaces", "IStorageCurrentRecordIteration"})
		}
		if st.ws != nil {
			ifaces = append(ifaces, [2]string{"ZODB.interfaces", "IExternalGC"})
		}
		ifaces = append(ifaces, [2]string{"ZODB.interfaces", "IStorage"}, [2]string{"zope.interface", "Interface"})
		e.BeginTuple(len(ifaces))
		for _, i := range ifaces {
			e.BeginTuple(2)
			e.Str(i[0])
			e.Str(i[1])
			e.EndTuple(2)
		}
		e.EndTuple(len(ifaces))
	}
	e.EndDict(n)
}

// recordIternext answers record_iternext(next): the current record of the
// smallest oid >= next (0 when next is None: start) and the oid after it
// (None at the end), from the storage's current index.
func (c *conn) recordIternext(id *wire.Value, next zodb.Oid) error {
	ol := c.st.oids
	if ol == nil {
		return &pyError{"ZODB.POSException.StorageError", "record_iternext is not supported by this storage"}
	}
	// The current index, at each call, as FileStorage's record_iternext
	// (index.minKey): objects created meanwhile are found, and nothing is
	// kept on the connection.
	oids := ol.OidsFrom(next, 2)
	if len(oids) == 0 {
		return &pyError{"builtins.ValueError", "no more objects"}
	}
	oid := oids[0]
	data, serial, err := c.st.st.Load(c.ctx, zodb.Xid{Oid: oid, At: zodb.TidMax})
	if err != nil {
		return err
	}
	c.reply(id, func(e *wire.Encoder) {
		e.BeginTuple(4)
		e.Oid8(uint64(oid))
		e.Oid8(uint64(serial))
		e.Bytes(data)
		if len(oids) > 1 {
			e.Oid8(uint64(oids[1]))
		} else {
			e.None()
		}
		e.EndTuple(4)
	})
	return nil
}

func (c *conn) getInvalidations(id *wire.Value, tid zodb.Tid) {
	last, oids, ok := c.st.invalidationsSince(c.ctx, tid)
	if !ok {
		last, oids, ok = c.st.invalidationsByIteration(c.ctx, tid)
	}
	c.reply(id, func(e *wire.Encoder) {
		if !ok || last == 0 {
			// (An empty storage: ZEO/py's queue is empty, and it
			// answers None.)
			e.None()
			return
		}
		e.BeginTuple(2)
		e.Oid8(uint64(last))
		e.BeginList(len(oids))
		for _, oid := range oids {
			e.Oid8(uint64(oid))
		}
		e.EndList(len(oids))
		e.EndTuple(2)
	})
}

func (c *conn) loadSerial(id *wire.Value, oid zodb.Oid, serial zodb.Tid) error {
	data, got, err := c.st.st.Load(c.ctx, zodb.Xid{Oid: oid, At: serial})
	if err != nil {
		return err
	}
	if got != serial {
		return &pyError{"ZODB.POSException.POSKeyError", oidBytes(oid)}
	}
	c.reply(id, func(e *wire.Encoder) { e.Bytes(data) })
	return nil
}

func (c *conn) getTid(id *wire.Value, oid zodb.Oid) error {
	_, serial, err := c.st.raw.Load(c.ctx, zodb.Xid{Oid: oid, At: zodb.TidMax})
	if err != nil {
		return err
	}
	c.reply(id, func(e *wire.Encoder) { e.Oid8(uint64(serial)) })
	return nil
}

func (c *conn) newOids(id *wire.Value, n int64, one bool) error {
	if c.readOnly {
		return zodb.ErrReadOnly
	}
	n = min(max(n, 1), 100)
	if one {
		n = 1
	}
	oids, err := c.st.ws.NewOids(c.ctx, int(n))
	if err != nil {
		return err
	}
	c.reply(id, func(e *wire.Encoder) {
		if one {
			e.Oid8(uint64(oids[0]))
			return
		}
		e.BeginList(len(oids))
		for _, oid := range oids {
			e.Oid8(uint64(oid))
		}
		e.EndList(len(oids))
	})
	return nil
}

func (c *conn) history(id *wire.Value, oid zodb.Oid, size int) error {
	hist, err := c.st.st.History(c.ctx, oid, max(size, 1))
	if err != nil {
		return err
	}
	if size <= 0 {
		hist = nil // FileStorage's history returns [] (after the lookup)
	}
	c.reply(id, func(e *wire.Encoder) {
		e.BeginList(len(hist))
		for i := range hist {
			h := &hist[i]
			ext := decodeExtension(h.Extension)
			n := 5 + ext.Len()
			e.BeginDict(n)
			// The extension first: the record's keys win (a dict's
			// last value for a key does).
			for j := range ext.Items {
				e.Value(&ext.Items[j])
			}
			e.Str("time")
			e.Float(tidTime(h.Tid))
			e.Str("user_name")
			e.Bytes(h.User)
			e.Str("description")
			e.Bytes(h.Description)
			e.Str("tid")
			e.Oid8(uint64(h.Tid))
			e.Str("size")
			e.Int(int64(h.Size))
			e.EndDict(n)
		}
		e.EndList(len(hist))
	})
	return nil
}

// tidTime is ZODB's TimeStamp(tid).timeTime(): seconds since the epoch,
// computed as persistent's C code does, to the last bit: the seconds
// since 1900 of the minute's start, plus the seconds (as doubles), less
// those from 1900 to 1970.
func tidTime(tid zodb.Tid) float64 {
	const from1900 = 2208988800 // 1900-01-01 to 1970-01-01, in seconds
	ts := tid.TimeStamp()
	minute := time.Date(ts.Year, time.Month(ts.Month), ts.Day, ts.Hour, ts.Minute, 0, 0, time.UTC)
	return (float64(minute.Unix()+from1900) + ts.Second) - from1900
}

// decodeExtension decodes a stored (pickled) extension dict, ints beyond
// 64 bits included; an empty or undecodable one gives an empty dict.
func decodeExtension(b []byte) wire.Value {
	if len(b) == 0 {
		return wire.Value{Kind: wire.Dict}
	}
	d := wire.NewDecoder(wire.Pickle)
	d.BigInts, d.Py2Text = true, true // as ZODB/py's loads of a stored pickle
	v, err := d.Decode(b)
	if err != nil || v.Kind != wire.Dict {
		return wire.Value{Kind: wire.Dict}
	}
	return v
}

// encodeUndoID makes FileStorage's undo id: base64 of the tid, without the
// trailing newline.
func encodeUndoID(tid zodb.Tid) []byte {
	b := tid.Bytes()
	return []byte(base64.StdEncoding.EncodeToString(b[:]))
}

func decodeUndoID(id []byte) (zodb.Tid, error) {
	b, err := base64.StdEncoding.DecodeString(string(id))
	if err != nil || len(b) != 8 {
		return 0, fmt.Errorf("bad undo id %q", id)
	}
	return zodb.Tid(binary.BigEndian.Uint64(b)), nil
}

func (c *conn) undoLog(id *wire.Value, first, last int, spec *wire.Value) error {
	if c.st.undoer == nil {
		c.reply(id, func(e *wire.Encoder) { e.BeginTuple(0); e.EndTuple(0) })
		return nil
	}
	var entries []zodb.UndoEntry
	var err error
	if spec == nil || len(spec.Items) == 0 {
		entries, err = c.st.undoer.UndoLog(c.ctx, first, last)
	} else {
		// Filtered as the log is walked, as FileStorage's undoLog
		// does: only the entries returned are held.
		entries, err = zodb.FilterUndoLog(c.ctx, c.st.undoer, first, last, func(u *zodb.UndoEntry) bool { return undoMatches(u, spec) })
	}
	if err != nil {
		return err
	}
	c.reply(id, func(e *wire.Encoder) {
		e.BeginList(len(entries))
		for i := range entries {
			encodeUndoEntry(e, &entries[i])
		}
		e.EndList(len(entries))
	})
	return nil
}

func encodeUndoEntry(e *wire.Encoder, u *zodb.UndoEntry) {
	ext := decodeExtension(u.Extension)
	n := 5 + ext.Len()
	e.BeginDict(n)
	e.Str("id")
	e.Bytes(encodeUndoID(u.Tid))
	e.Str("time")
	e.Float(tidTime(u.Tid))
	e.Str("user_name")
	e.Bytes(u.User)
	e.Str("description")
	e.Bytes(u.Description)
	e.Str("size")
	e.Int(u.Size)
	for j := range ext.Items {
		e.Value(&ext.Items[j])
	}
	e.EndDict(n)
}

// undoMatches applies an undoInfo specification as FileStorage's filter
// does (desc.get(k) != v rejects): every key of spec must have an equal
// value, in Python's sense, in the entry's dict (id, time, user_name,
// description, size, then the extension's keys, which override them); an
// absent key is None. A str never equals bytes, as on Python 3 (runzeo's):
// user names and descriptions are bytes, so {'user_name': 'alice'}
// matches nothing and {'user_name': b'alice'} matches.
func undoMatches(u *zodb.UndoEntry, spec *wire.Value) bool {
	ext := decodeExtension(u.Extension)
	id := encodeUndoID(u.Tid)
	std := [...]struct {
		k string
		v wire.Value
	}{
		{"id", wire.Value{Kind: wire.Bytes, B: id}},
		{"time", wire.Value{Kind: wire.Float, Float: tidTime(u.Tid)}},
		{"user_name", wire.Value{Kind: wire.Bytes, B: u.User}},
		{"description", wire.Value{Kind: wire.Bytes, B: u.Description}},
		{"size", wire.Value{Kind: wire.Int, Int: u.Size}},
	}
	for i := 0; i+1 < len(spec.Items); i += 2 {
		k, want := &spec.Items[i], &spec.Items[i+1]
		got := &wire.Value{Kind: wire.None}
		if k.Kind == wire.Str {
			for j := range std {
				if string(k.B) == std[j].k {
					got = &std[j].v
				}
			}
		}
		for j := 0; j+1 < len(ext.Items); j += 2 {
			if pyEqual(&ext.Items[j], k) {
				got = &ext.Items[j+1]
			}
		}
		if !pyEqual(got, want) {
			return false
		}
	}
	return true
}

// pyEqual is Python's a == b for decoded plain values: numbers compare
// by value across bool, int and float; str with str and bytes with bytes
// by content (a str never equals bytes); tuples and lists item by item (a
// tuple never equals a list); dicts as sets of pairs.
func pyEqual(a, b *wire.Value) bool {
	num := func(v *wire.Value) (float64, bool) {
		switch {
		case v.Kind == wire.Float:
			return v.Float, true
		case (v.Kind == wire.Int || v.Kind == wire.Bool) && v.B == nil:
			return float64(v.Int), true
		}
		return 0, false
	}
	if x, ok := num(a); ok {
		y, ok := num(b)
		if a.Kind != wire.Float && b.Kind != wire.Float {
			return ok && a.Int == b.Int
		}
		return ok && x == y
	}
	switch a.Kind {
	case wire.None:
		return b.Kind == wire.None
	case wire.Int: // beyond 64 bits
		return b.Kind == wire.Int && b.B != nil && string(a.B) == string(b.B)
	case wire.Str, wire.Bytes:
		return b.Kind == a.Kind && string(a.B) == string(b.B)
	case wire.Tuple, wire.List:
		if b.Kind != a.Kind || a.Int != b.Int || len(a.Items) != len(b.Items) {
			return false
		}
		for i := range a.Items {
			if !pyEqual(&a.Items[i], &b.Items[i]) {
				return false
			}
		}
		return true
	case wire.Dict:
		if b.Kind != wire.Dict || len(a.Items) != len(b.Items) {
			return false
		}
	next:
		for i := 0; i+1 < len(a.Items); i += 2 {
			for j := 0; j+1 < len(b.Items); j += 2 {
				if pyEqual(&a.Items[i], &b.Items[j]) {
					if pyEqual(&a.Items[i+1], &b.Items[j+1]) {
						continue next
					}
					return false
				}
			}
			return false
		}
		return true
	}
	return false
}

func (c *conn) pack(id *wire.Value, t float64, wait bool) {
	p := c.st.packer
	if p == nil {
		c.replyError(id, &pyError{"ZODB.POSException.StorageError", "this storage cannot be packed"})
		return
	}
	if err := zodb.CheckUnix(t); err != nil {
		// As ZODB/py's FileStorage, whose TimeStamp (or time.gmtime)
		// raises: a pack time that no tid encodes would have
		// wrapped around to one far in the future.
		c.replyError(id, &pyError{"builtins.ValueError", fmt.Sprintf("pack time: %v", err)})
		return
	}
	at := zodb.TidFromUnix(t)
	c.srv.work.Add(1) // run is called once, on a goroutine of its own
	run := func() error {
		defer c.srv.work.Done()
		ctx := c.srv.packContext()
		c.st.fillSeeded(ctx)
		err := p.Pack(ctx, at, true)
		if err != nil {
			c.log(eventlog.Error, "pack of storage %s to %s failed: %v", c.st.name, at, err)
			return err
		}
		c.st.afterPack()
		return nil
	}
	if !wait {
		go run()
		c.reply(id, func(e *wire.Encoder) { e.None() })
		return
	}
	idc := cloneValue(id)
	reply := c.spawn()
	go func() {
		err := run()
		e := wire.Encoder{M: c.srv.cfg.Marshal}
		if err != nil {
			encodeError(&e, &idc, err)
		} else {
			e.BeginReply(&idc, 0)
			e.None()
			e.EndMessage()
		}
		reply(func() { c.out.Send(e.Buf, 0) })
	}()
}

// status is server_status's dict for storage st.
func (s *Server) status(st *storage) map[string]interface{} {
	var loads, stores, conns int64
	st.mu.Lock()
	for c := range st.conns {
		loads += c.loads.Load()
		stores += c.stores.Load()
		conns++
	}
	stats := st.stats
	loads += stats.loads
	stores += stats.stores
	last := st.lastTid
	st.mu.Unlock()
	var lockTime interface{}
	if stats.lockSince != 0 {
		lockTime = float64(stats.lockSince) / 1e9
	}
	waiting := stats.waiting // the votes under way, without a lock's count
	if st.lockWaiter != nil {
		waiting = int64(st.lockWaiter.CommitWaiting())
	}
	timeout := interface{}("stub")
	if s.cfg.TransactionTimeout > 0 {
		timeout = true
	}
	return map[string]interface{}{
		"start":                   s.start.Format(time.ANSIC),
		"loads":                   loads,
		"stores":                  stores,
		"commits":                 stats.commits,
		"aborts":                  stats.aborts,
		"active_txns":             stats.active,
		"conflicts":               stats.conflicts,
		"conflicts_resolved":      stats.resolved,
		"connections":             conns,
		"waiting":                 waiting,
		"lock_time":               lockTime,
		"timeout-thread-is-alive": timeout,
		"last-transaction":        last.String(),
	}
}

// encodeDict writes a map of plain Go values (server_status).
func encodeDict(e *wire.Encoder, m map[string]interface{}) {
	e.BeginDict(len(m))
	for k, v := range m {
		e.Str(k)
		switch v := v.(type) {
		case nil:
			e.None()
		case bool:
			e.Bool(v)
		case int64:
			e.Int(v)
		case float64:
			e.Float(v)
		case string:
			e.Str(v)
		default:
			e.Str(fmt.Sprint(v))
		}
	}
	e.EndDict(len(m))
}

func clone(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append(make([]byte, 0, len(b)), b...)
}

// cloneValue deep-copies v out of the decoder's buffers.
func cloneValue(v *wire.Value) wire.Value {
	w := *v
	w.B = clone(v.B)
	if v.Items != nil {
		w.Items = make([]wire.Value, len(v.Items))
		for i := range v.Items {
			w.Items[i] = cloneValue(&v.Items[i])
		}
	}
	return w
}

func oidBytes(oid zodb.Oid) []byte {
	b := oid.Bytes()
	return b[:]
}
