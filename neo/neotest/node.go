package neotest

import (
	"context"
	"io"
	"log"
	"os"
	"testing"
	"time"

	"github.com/zodbd/zodbd/neo/storage"
)

// StartNode runs a master of cluster and a storage node serving be, both
// on 127.0.0.1, until the test ends, and returns them once the cluster is
// operational; done receives what the node's Run returned when it stops
// (the test's end, or the master's Stop). The node logs to Logger. The
// cleanup stops the node, waits for its Run
// to return and closes the master; it does not close be.
func StartNode(tb testing.TB, cluster string, be storage.Backend) (m *Master, n *storage.Node, done <-chan error) {
	tb.Helper()
	m, err := NewMaster(MasterConfig{Cluster: cluster})
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go m.Serve(ctx)
	n, err = storage.New(storage.Config{
		Cluster: cluster, Masters: []string{m.Addr()}, Bind: "127.0.0.1:0", Backend: be,
		Logger: Logger(), RetryInterval: 50 * time.Millisecond, IdentifyTimeout: time.Second,
	})
	if err != nil {
		cancel()
		m.Close()
		tb.Fatal(err)
	}
	res, stopped := make(chan error, 1), make(chan struct{})
	go func() {
		res <- n.Run(ctx)
		close(stopped)
	}()
	tb.Cleanup(func() {
		cancel()
		<-stopped
		m.Close()
	})
	select {
	case <-m.Running():
	case err := <-res:
		tb.Fatalf("storage node stopped: %v", err)
	case <-time.After(10 * time.Second):
		tb.Fatal("cluster did not start")
	}
	for !n.Operational() {
		time.Sleep(time.Millisecond)
	}
	return m, n, res
}

// Logger is the log of a node under test: stderr under go test -v, else
// nowhere.
func Logger() *log.Logger {
	if testing.Verbose() {
		return log.New(os.Stderr, "", log.Lmicroseconds)
	}
	return log.New(io.Discard, "", 0)
}
