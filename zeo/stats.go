package zeo

import (
	"maps"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/zodbd/zodbd/internal/opstats"
	"github.com/zodbd/zodbd/zodb"
)

// Stats is a snapshot of a server's figures, for metrics (cmd/zodbd
// exports them in the Prometheus format). Counters count since NewServer,
// the connections that ended included.
//
// Nothing here costs the requests a shared lock or atomic: each
// connection keeps its own figures (internal/opstats), summed by Stats
// under the locks that registering and closing connections take anyway.
type Stats struct {
	// Serving: Serve is accepting connections (on at least one listener)
	// and Close was not called.
	Serving bool
	// Methods are the figures of every method of the protocol, sorted by
	// name. Latency has an observation per call (its Count is the number
	// of calls), in nanoseconds (opstats.DurationShift): from the frame
	// read to the reply queued, for vote, tpc_finish and pack until their
	// goroutine queued the reply. Empty unless Config.Metrics.
	Methods []MethodStats
	// Accepted counts the connections accepted; Connections are the live
	// ones by client label ("" for those that gave none).
	Accepted    uint64
	Connections map[string]int
	// BytesIn counts the bytes of the frames received (after the
	// handshake), BytesOut those written to the connections.
	BytesIn, BytesOut uint64
	// Queued is the bytes of replies and invalidations queued on the
	// live connections and not written yet.
	Queued int64
	// Storages, by name.
	Storages []StorageStats
}

// MethodStats are one method's figures (Stats.Methods).
type MethodStats struct {
	Name    string
	Latency opstats.Snapshot
}

// StorageStats are one storage's figures (Stats.Storages), those of
// server_status and a few more.
type StorageStats struct {
	Name        string
	Connections int // registered on it
	Loads       int64
	Stores      int64
	Commits     int64
	Aborts      int64
	// Conflicts counts the conflicts returned to clients (at vote),
	// ConflictsByClass the same by the class of the object (the first
	// global of the record's pickle, "" when it cannot be told: deleted,
	// compressed or unusual records, read conflicts; past maxClasses
	// classes, new ones count as "other"); Resolved those the server
	// resolved itself.
	Conflicts        int64
	ConflictsByClass map[string]int64
	// ConflictsByOid counts the conflicts by object, for the maxOids
	// objects counted most (an object counted least is forgotten to make
	// room for a new one, so the counts of the objects that conflict
	// most are exact unless they started late).
	ConflictsByOid map[zodb.Oid]int64
	Resolved       int64
	// InvalidationQueue is the number of transactions in the queue kept
	// for getInvalidations.
	InvalidationQueue int
	// Objects and Size are get_info's length and size (0 when the
	// storage cannot tell).
	Objects int
	Size    int64
}

// maxLabels bounds the client labels Stats.Connections names: the labels
// come from the clients (set_client_label), any number of them, and each
// is a series in the metrics and a row of the status page.
const maxLabels = 100

// OtherLabel is the label of Stats.Connections that counts the
// connections of the labels past maxLabels.
const OtherLabel = "(other)"

// capLabels keeps the maxLabels labels with the most connections (the
// first in byte order among equals) and counts the others under
// OtherLabel.
func capLabels(conns map[string]int) {
	if len(conns) <= maxLabels {
		return
	}
	labels := slices.Collect(maps.Keys(conns))
	slices.SortFunc(labels, func(a, b string) int {
		if d := conns[b] - conns[a]; d != 0 {
			return d
		}
		return strings.Compare(a, b)
	})
	other := 0
	for _, l := range labels[maxLabels:] {
		other += conns[l]
		delete(conns, l)
	}
	conns[OtherLabel] += other
}

// Ready reports whether the server is serving (Stats().Serving, without
// the figures).
func (s *Server) Ready() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.servingLocked()
}

// servingLocked reports whether a Serve loop runs and Close was not
// called (s.mu held).
func (s *Server) servingLocked() bool { return s.serving > 0 && !s.closed }

// Stats returns the server's figures.
func (s *Server) Stats() Stats {
	var out Stats
	var live []*conn
	s.mu.Lock()
	out.Serving = s.servingLocked()
	t := s.retired.copy()
	for c := range s.conns {
		live = append(live, c)
	}
	s.mu.Unlock()
	out.Accepted = t.conns + uint64(len(live))
	out.Connections = make(map[string]int)
	for _, c := range live {
		t.addFigures(c)
		label := ""
		if l := c.metricLabel.Load(); l != nil {
			label = *l
		}
		out.Connections[label]++
		out.Queued += int64(c.out.Pending())
	}
	capLabels(out.Connections)
	out.BytesIn, out.BytesOut = t.in, t.out
	if s.cfg.Metrics {
		out.Methods = make([]MethodStats, len(methodNames))
		for i, name := range methodNames {
			out.Methods[i] = MethodStats{Name: name, Latency: t.latency[i]}
		}
	}
	names := make([]string, 0, len(s.storages))
	for name := range s.storages {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		out.Storages = append(out.Storages, s.storages[name].figures())
	}
	return out
}

// figures returns the storage's StorageStats.
func (st *storage) figures() StorageStats {
	objects, size := st.storageSize()
	ss := StorageStats{Name: st.name, Objects: objects, Size: size}
	st.mu.Lock()
	for c := range st.conns {
		ss.Loads += c.loads.Load()
		ss.Stores += c.stores.Load()
	}
	ss.Connections = len(st.conns)
	s := &st.stats
	ss.Loads += s.loads
	ss.Stores += s.stores
	ss.Commits, ss.Aborts, ss.Conflicts, ss.Resolved = s.commits, s.aborts, s.conflicts, s.resolved
	ss.ConflictsByClass = make(map[string]int64, len(s.byClass))
	for k, v := range s.byClass {
		ss.ConflictsByClass[k] = v
	}
	ss.ConflictsByOid = make(map[zodb.Oid]int64, len(s.byOid))
	for k, v := range s.byOid {
		ss.ConflictsByOid[k] = v
	}
	ss.InvalidationQueue = st.invq.len()
	st.mu.Unlock()
	return ss
}

// connTotals sums the figures of connections (Server.retired: those that
// ended; guarded by Server.mu).
type connTotals struct {
	conns   uint64
	in, out uint64
	latency []opstats.Snapshot // by method idx; nil until a connection with figures ended
}

// add adds the figures of c, which ended.
func (t *connTotals) add(c *conn) {
	t.conns++
	t.addFigures(c)
}

// addFigures adds c's byte counts and latencies to t.
func (t *connTotals) addFigures(c *conn) {
	t.in += c.bytesIn.Load()
	t.out += c.out.Written()
	if c.latency != nil {
		if t.latency == nil {
			t.latency = make([]opstats.Snapshot, len(methodNames))
		}
		for i := range c.latency {
			c.latency[i].AddTo(&t.latency[i])
		}
	}
}

// copy returns a copy of t that addFigures may change.
func (t *connTotals) copy() connTotals {
	u := *t
	u.latency = make([]opstats.Snapshot, len(methodNames))
	copy(u.latency, t.latency)
	return u
}

// spawn marks the call being handled (an async method's) as replying from
// a goroutine of its own, and returns what that goroutine calls with the
// function that queues its reply (exactly once, whatever the outcome): it
// records the call's latency, then queues the reply. The connection's figures are retired (the totals of
// the server's ended connections) after every such call replied, so that
// none is lost when the client goes before its reply.
func (c *conn) spawn() (reply func(send func())) {
	c.spawned = true
	c.calls.Add(1)
	if c.latency == nil {
		return func(send func()) {
			send()
			c.calls.Done()
		}
	}
	h, t0 := &c.latency[c.callIdx], c.t0
	return func(send func()) {
		// Counted before the reply goes: a client that reads it and
		// asks for the figures finds the call in them.
		h.ObserveDurationShared(opstats.Now().Sub(t0))
		send()
		c.calls.Done()
	}
}

// maxClasses bounds the classes a storage counts conflicts by.
const maxClasses = 200

// countClass counts a conflict on an object of class. Called with st.mu
// held. Past maxClasses classes, a new one takes the place of the class
// with the fewest conflicts, which is forgotten: the classes are named by
// the clients' records, and the first ones seen (a client's made up
// classes) must not keep the places of those that conflict often. Each
// count is a Prometheus counter: the forgotten one's series ends, and
// starts again from 1 if its class comes back (a counter reset, which
// rate and increase expect); its count is not moved to another series,
// whose increase would count those conflicts again.
func (s *storageStats) countClass(class string) {
	if s.byClass == nil {
		s.byClass = make(map[string]int64)
	}
	if _, ok := s.byClass[class]; !ok && len(s.byClass) >= maxClasses {
		least, n := "", int64(0)
		for c, k := range s.byClass {
			if least == "" || k < n || k == n && c < least {
				least, n = c, k
			}
		}
		delete(s.byClass, least)
	}
	s.byClass[class]++
}

// maxOids bounds the objects a storage counts conflicts by.
const maxOids = 256

// countOid counts a conflict on oid. When maxOids objects are counted
// already, one of those counted least is forgotten first (an O(maxOids)
// search: conflicts are rare, and a vote that has one is slow anyway).
// Called with st.mu held.
func (s *storageStats) countOid(oid zodb.Oid) {
	if s.byOid == nil {
		s.byOid = make(map[zodb.Oid]int64)
	}
	if _, ok := s.byOid[oid]; !ok && len(s.byOid) >= maxOids {
		var least zodb.Oid
		n := int64(-1)
		for o, c := range s.byOid {
			if n < 0 || c < n || c == n && o < least {
				least, n = o, c
			}
		}
		delete(s.byOid, least)
	}
	s.byOid[oid]++
}

// conflictClass returns "module.name", the class of the object whose
// record is data: the first global of its first pickle (the class
// metadata ZODB writes first), read without decoding the pickle. It
// understands the forms ZODB/py writes (protocols 1 to 3: GLOBAL, after an
// optional PROTO and MARKs or EMPTY_TUPLE; protocol 4: a FRAME, two short
// unicode strings, memoized or not, and STACK_GLOBAL) and returns "" for anything
// else (an empty record, zlibstorage's compressed records, names that are
// not printable UTF-8 or longer than 128 bytes).
func conflictClass(data []byte) string {
	if len(data) >= 2 && data[0] == 0x80 { // PROTO n
		data = data[2:]
	}
	if len(data) >= 9 && data[0] == 0x95 { // FRAME n (protocol 4)
		data = data[9:]
	}
	for len(data) > 0 && (data[0] == '(' || data[0] == ')') { // MARK, EMPTY_TUPLE
		data = data[1:]
	}
	if len(data) == 0 {
		return ""
	}
	var mod, name []byte
	switch data[0] {
	case 'c': // GLOBAL module\nname\n
		data = data[1:]
		var ok bool
		if mod, data, ok = cutLine(data); !ok {
			return ""
		}
		if name, _, ok = cutLine(data); !ok {
			return ""
		}
	case 0x8c: // SHORT_BINUNICODE module, SHORT_BINUNICODE name, STACK_GLOBAL
		var ok bool
		if mod, data, ok = shortUnicode(data); !ok {
			return ""
		}
		if name, data, ok = shortUnicode(data); !ok {
			return ""
		}
		if len(data) == 0 || data[0] != 0x93 {
			return ""
		}
	default:
		return ""
	}
	if !printable(mod) || !printable(name) {
		return ""
	}
	return string(mod) + "." + string(name)
}

// cutLine returns the bytes before the first newline of b (at most 128)
// and those after it.
func cutLine(b []byte) (line, rest []byte, ok bool) {
	for i := 0; i < len(b) && i <= 128; i++ {
		if b[i] == '\n' {
			return b[:i], b[i+1:], true
		}
	}
	return nil, nil, false
}

// shortUnicode reads a SHORT_BINUNICODE at the start of b and an optional
// MEMOIZE after it.
func shortUnicode(b []byte) (s, rest []byte, ok bool) {
	if len(b) < 2 || b[0] != 0x8c || len(b) < 2+int(b[1]) {
		return nil, nil, false
	}
	s, rest = b[2:2+int(b[1])], b[2+int(b[1]):]
	if len(rest) > 0 && rest[0] == 0x94 { // MEMOIZE
		rest = rest[1:]
	}
	return s, rest, true
}

// printable reports whether b is a non-empty name of printable UTF-8 of
// at most 128 bytes.
func printable(b []byte) bool {
	if len(b) == 0 || len(b) > 128 || !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if r < 0x20 || r == 0x7f {
			return false
		}
	}
	return true
}
