package main

import (
	"sort"
	"strconv"

	"github.com/zodbd/zodbd/internal/opstats"

	"github.com/zodbd/zodbd/zodb"
)

// The servers' figures for the status page (status.go): the collectors
// of /metrics are the status page's sources too.

var (
	_ statusSource = (*zeoCollector)(nil)
	_ statusSource = (*neoCollector)(nil)
)

func (c *zeoCollector) statusCounters() statusCounters {
	c.mu.Lock()
	srv := c.srv
	c.mu.Unlock()
	var out statusCounters
	if srv == nil {
		return out
	}
	st := srv.Stats()
	for _, n := range st.Connections {
		out.Conns += n
	}
	out.Methods = make(map[string]opstats.Snapshot, len(st.Methods))
	for _, m := range st.Methods {
		if m.Latency.Count() > 0 {
			out.Methods[m.Name] = m.Latency
		}
	}
	out.BytesIn, out.BytesOut, out.Queued = st.BytesIn, st.BytesOut, st.Queued
	for _, s := range st.Storages {
		out.Loads += s.Loads
		out.Stores += s.Stores
		out.Commits += s.Commits
		out.Aborts += s.Aborts
		out.Conflict += s.Conflicts
		out.Resolved += s.Resolved
	}
	return out
}

func (c *zeoCollector) statusState() statusState {
	c.mu.Lock()
	srv, files := c.srv, c.files
	c.mu.Unlock()
	out := statusState{Protocol: "zeo", Clients: []statusClients{}, Storages: []statusStorage{}}
	if srv == nil {
		return out
	}
	st := srv.Stats()
	out.Ready = st.Serving
	for label, n := range st.Connections {
		out.Clients = append(out.Clients, statusClients{label, n})
	}
	sort.Slice(out.Clients, func(i, j int) bool { return out.Clients[i].Label < out.Clients[j].Label })
	for _, s := range st.Storages {
		ss := statusStorage{Name: s.Name, Objects: s.Objects, Size: s.Size, InvQueue: s.InvalidationQueue,
			Commits: s.Commits, Conflicts: s.Conflicts, Resolved: s.Resolved,
			ByClass: topCounts(s.ConflictsByClass, func(k string) string {
				if k == "" {
					return "unknown"
				}
				return k
			}),
			ByOid: topCounts(s.ConflictsByOid, oidName)}
		if fs := files[s.Name]; fs != nil {
			fs1State(&ss, fs)
		}
		out.Storages = append(out.Storages, ss)
	}
	return out
}

func (c *neoCollector) statusCounters() statusCounters {
	st := c.node.Stats()
	out := statusCounters{Conns: st.Connections, BytesIn: st.BytesIn, BytesOut: st.BytesOut, Queued: st.Queued,
		Methods: make(map[string]opstats.Snapshot, len(st.Requests))}
	for _, r := range st.Requests {
		out.Methods[r.Name] = r.Latency
	}
	return out
}

func (c *neoCollector) statusState() statusState {
	out := statusState{Protocol: "neo", Ready: c.node.Operational(), Clients: []statusClients{},
		Storages: []statusStorage{}}
	if n := c.node.Stats().Connections; n > 0 {
		out.Clients = append(out.Clients, statusClients{"", n})
	}
	if c.fs != nil {
		ss := statusStorage{Name: c.name, ByClass: []statusCount{}, ByOid: []statusCount{}}
		fs1State(&ss, c.fs)
		out.Storages = append(out.Storages, ss)
	}
	return out
}

// oidName formats an oid as the page shows it (0x hex, as ZODB's
// oid_repr).
func oidName(o zodb.Oid) string { return "0x" + strconv.FormatUint(uint64(o), 16) }
