package main

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/neo/storage"
)

// neoCollector collects a NEO storage node's metrics (zodbd neo-storage
// --http-addr): the node's Stats, and for a FileStorage backend the
// FileStorage's (storage label: the backend as given on the command
// line).
type neoCollector struct {
	node *storage.Node
	name string           // the storage label
	fs   *fs1.FileStorage // nil for other backends
}

// ready reports whether the node serves clients (the cluster runs).
func (c *neoCollector) ready() bool { return c.node.Operational() }

func (c *neoCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descReady, descRequest, descConns, descAccepted, descBytesIn, descBytesOut,
		descQueued, descObjects, descSize, descIndexBytes, descPackRunning, descPackProgress, descLockWait, descLockHold,
		descFsync, descFsyncGroup} {
		ch <- d
	}
}

func (c *neoCollector) Collect(ch chan<- prometheus.Metric) {
	const proto = "neo"
	st := c.node.Stats()
	ch <- gauge(descReady, b2f(st.Operational))
	for i := range st.Requests {
		r := &st.Requests[i]
		ch <- duration(descRequest, &r.Latency, proto, r.Name)
	}
	ch <- gauge(descConns, float64(st.Connections), proto, "")
	ch <- counter(descAccepted, float64(st.Accepted), proto)
	ch <- counter(descBytesIn, float64(st.BytesIn), proto)
	ch <- counter(descBytesOut, float64(st.BytesOut), proto)
	ch <- gauge(descQueued, float64(st.Queued), proto)
	if c.fs != nil {
		fst := c.fs.Stats()
		ch <- gauge(descObjects, float64(fst.Objects), c.name)
		ch <- gauge(descSize, float64(fst.Size), c.name)
		fs1Metrics(ch, map[string]*fs1.FileStorage{c.name: c.fs})
	}
}
