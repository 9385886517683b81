//go:build zodbdtest

package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/zodbd/zodbd/neo/neotest"
)

func init() {
	register(&command{
		name:    "neo-master",
		summary: "(for tests and benchmarks) run the minimal NEO master of the test suite",
		run:     runNeoMaster,
	})
}

func runNeoMaster(args []string) int {
	fl := newFlags("neo-master", "usage: zodbd neo-master --cluster NAME [--bind ADDR] [--partitions N] [--replicas N] [--storages N]\n\n"+
		"Runs the minimal NEO master of the test suite (package neo/neotest): it\n"+
		"waits for --storages storage nodes, runs them through recovery,\n"+
		"verification and operation, then lets clients read and commit; with\n"+
		"--replicas, a lost node's cells are outdated and it replicates when it\n"+
		"comes back. It is what `make bench` and the demos use where NEO/py's\n"+
		"neomaster is not installed; it is not a replacement for neomaster (no\n"+
		"elections, no admin node: no neoctl). It prints its address on stdout\n"+
		"once it listens.\n\n")
	var cluster, bind string
	var np, nr, ns int
	fl.StringVar(&cluster, "cluster", "", "cluster name (required)")
	fl.StringVar(&bind, "bind", "127.0.0.1:0", "address to listen on")
	fl.IntVar(&np, "partitions", 1, "partitions of a new partition table (FileStorage: 1)")
	fl.IntVar(&nr, "replicas", 0, "replicas of a new partition table")
	fl.IntVar(&ns, "storages", 1, "storage nodes a new cluster waits for")
	if status, ok := parseFlags(fl, args); !ok {
		return status
	}
	if cluster == "" || fl.NArg() != 0 {
		fl.Usage()
		return 2
	}
	logger := log.New(os.Stderr, "", log.LstdFlags)
	m, err := neotest.NewMaster(neotest.MasterConfig{Cluster: cluster, Partitions: np, Replicas: nr, Storages: ns, Bind: bind, Logf: logger.Printf})
	if err != nil {
		return fatalf("neo-master", "%v", err)
	}
	fmt.Println(m.Addr())
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := m.Serve(ctx); err != nil {
		return fatalf("neo-master", "%v", err)
	}
	return 0
}
