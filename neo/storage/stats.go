package storage

import (
	"sort"

	"github.com/zodbd/zodbd/internal/opstats"
	"github.com/zodbd/zodbd/neo/proto"
)

// Stats is a snapshot of a node's figures for metrics (cmd/zodbd exports
// them in the Prometheus format), kept only after EnableStats. Counters
// count since then, the connections that ended included.
//
// As the ZEO server's, they cost the requests no shared lock or atomic:
// each connection keeps its own (internal/opstats), summed by Stats under
// the lock that registering and closing connections take anyway.
type Stats struct {
	// Operational: the node serves clients (the cluster is running).
	Operational bool
	// Requests are the figures of each request code received, sorted by
	// name: Latency has an observation per request (its Count is the
	// number of requests), in nanoseconds (opstats.DurationShift), from
	// the packet read to the answer queued.
	Requests []RequestStats
	// Accepted counts the connections accepted (clients and storages),
	// Connections the open ones.
	Accepted    uint64
	Connections int
	// BytesIn counts the bytes of the packets received after the
	// identification, BytesOut those written to the connections.
	BytesIn, BytesOut uint64
	// Queued is the bytes of answers queued and not written yet.
	Queued int64
}

// RequestStats are one request code's figures (Stats.Requests).
type RequestStats struct {
	Name    string
	Latency opstats.Snapshot
}

// nodeStats are a node's figures that outlive its connections; guarded
// by Node.peersMu.
type nodeStats struct {
	on       bool // EnableStats was called
	accepted uint64
	in, out  uint64
	latency  map[uint16]*opstats.Snapshot
}

// peerStats are one connection's figures, written by its reading
// goroutine (Observe, Add) and by the goroutines serving its requests
// (ObserveShared: each code is served either inline or on goroutines).
type peerStats struct {
	bytesIn opstats.Counter
	latency map[uint16]*opstats.Hist // by request code, filled by the reading goroutine only
	mu      chan struct{}            // a one-slot lock around latency's map for Stats and the serving goroutines
	t0      opstats.Stamp            // when the request being dispatched was read
	spawned bool                     // it went to a goroutine of its own (spawn)
}

// EnableStats makes the node keep the figures Stats returns; call it
// before Run. Without it no clock is read per request.
func (n *Node) EnableStats() {
	n.peersMu.Lock()
	n.stats.on = true
	n.peersMu.Unlock()
}

// newPeerStats returns the figures of a new connection, nil when the node
// keeps none. Called before the connection is in n.peers.
func (n *Node) newPeerStats() *peerStats {
	n.peersMu.Lock()
	defer n.peersMu.Unlock()
	if !n.stats.on {
		return nil
	}
	n.stats.accepted++
	s := &peerStats{latency: make(map[uint16]*opstats.Hist), mu: make(chan struct{}, 1)}
	return s
}

// retire keeps the figures of p, which ended. Called with n.peersMu held.
func (n *Node) retire(p *peer) {
	if p.stats == nil {
		return
	}
	p.stats.addTo(&n.stats.in, &n.stats.latency)
	n.stats.out += p.w.Written()
}

// addTo adds s's bytes received and latencies to in and lat.
func (s *peerStats) addTo(in *uint64, lat *map[uint16]*opstats.Snapshot) {
	*in += s.bytesIn.Load()
	if *lat == nil {
		*lat = make(map[uint16]*opstats.Snapshot)
	}
	s.mu <- struct{}{}
	for code, h := range s.latency {
		t := (*lat)[code]
		if t == nil {
			t = new(opstats.Snapshot)
			(*lat)[code] = t
		}
		h.AddTo(t)
	}
	<-s.mu
}

// otherCode is the key of the requests whose code is not a request of
// the protocol (counted together, as "other").
const otherCode = 0xffff

// hist returns the histogram of code, made on its first request (by the
// reading goroutine, the map's only writer).
func (s *peerStats) hist(code uint16) *opstats.Hist {
	if code&proto.AnswerBit != 0 || !proto.KnownCode(code) {
		code = otherCode
	}
	h := s.latency[code]
	if h == nil {
		h = new(opstats.Hist)
		s.mu <- struct{}{}
		s.latency[code] = h
		<-s.mu
	}
	return h
}

// timedDispatch is dispatch, counting the packet's bytes and timing the
// request: here when it is answered inline, by the goroutine that serves
// it otherwise (spawn, served).
func (p *peer) timedDispatch(id uint32, code uint16, args []byte) error {
	s := p.stats
	if s == nil {
		return p.dispatch(id, code, args)
	}
	s.bytesIn.Add(uint64(packetSize(id, code, len(args))))
	s.t0, s.spawned = opstats.Now(), false
	h := s.hist(code)
	err := p.dispatch(id, code, args)
	if !s.spawned {
		h.ObserveDuration(opstats.Now().Sub(s.t0))
	}
	return err
}

// spawn marks the request being dispatched as served by a goroutine of
// its own and returns what that goroutine passes to served.
func (s *peerStats) spawn(code uint16) (h *opstats.Hist, t0 opstats.Stamp) {
	if s == nil {
		return nil, 0
	}
	s.spawned = true
	return s.hist(code), s.t0
}

// served records, on the goroutine that served it, the time of a request
// that spawn handed to it.
func served(h *opstats.Hist, t0 opstats.Stamp) {
	if h != nil {
		h.ObserveDurationShared(opstats.Now().Sub(t0))
	}
}

// packetSize is the size on the wire of a packet (a msgpack array of the
// id, the code and the arguments, which are args bytes).
func packetSize(id uint32, code uint16, args int) int {
	uintLen := func(v uint32) int {
		switch {
		case v < 128:
			return 1
		case v < 256:
			return 2
		case v < 65536:
			return 3
		}
		return 5
	}
	return 1 + uintLen(id) + uintLen(uint32(code)) + args
}

// Stats returns the node's figures (zero unless EnableStats).
func (n *Node) Stats() Stats {
	out := Stats{Operational: n.Operational()}
	n.peersMu.Lock()
	defer n.peersMu.Unlock()
	if !n.stats.on {
		return out
	}
	out.Accepted = n.stats.accepted
	out.BytesIn, out.BytesOut = n.stats.in, n.stats.out
	lat := make(map[uint16]*opstats.Snapshot)
	for code, s := range n.stats.latency {
		c := *s
		lat[code] = &c
	}
	for p := range n.peers {
		out.Connections++
		if p.stats == nil {
			continue
		}
		p.stats.addTo(&out.BytesIn, &lat)
		out.BytesOut += p.w.Written()
		out.Queued += int64(p.w.Pending())
	}
	for code, s := range lat {
		name := proto.CodeName(code)
		if code == otherCode {
			name = "other"
		}
		out.Requests = append(out.Requests, RequestStats{Name: name, Latency: *s})
	}
	sort.Slice(out.Requests, func(i, j int) bool { return out.Requests[i].Name < out.Requests[j].Name })
	return out
}
