package main

import (
	"context"
	"crypto/tls"
	"errors"
	"log"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/zodbd/zodbd/neo/link"
	"github.com/zodbd/zodbd/neo/storage"
	"github.com/zodbd/zodbd/neo/storage/fs1backend"
	"github.com/zodbd/zodbd/neo/storage/sqlitebackend"
	"github.com/zodbd/zodbd/neosqlite"
	"github.com/zodbd/zodbd/zeo"
)

func init() {
	register(&command{
		name:    "neo-storage",
		summary: "run a NEO storage node on a FileStorage or a NEO/py SQLite DB (read-only unless --read-write)",
		run:     runNeoStorage,
	})
}

func runNeoStorage(args []string) (status int) {
	fl := newFlags("neo-storage", "usage: zodbd neo-storage --cluster NAME --masters HOST:PORT[,...] [--bind ADDR] [--ca CA --cert CERT --key KEY] [--gomaxprocs N] [--cpus LIST] [--debug-addr ADDR] [--http-addr ADDR] [--read-write] BACKEND\n\n"+
		"Joins the NEO cluster NAME as a storage node and serves NEO clients, read-only\n"+
		"unless --read-write is given (then NEO clients commit through it).\n"+
		"BACKEND is a FileStorage file (the cluster must have 1 partition: neomaster -p 1;\n"+
		"other storage nodes may replicate from it) or sqlite:PATH, the SQLite database of\n"+
		"a NEO/py storage node.\n"+
		"See docs/neo.md.\n\n")
	var clusterName, masters, bind, advertise, ca, cert, key string
	var gomaxprocs int
	var cpus, debugAddr, httpAddr string
	fl.StringVar(&clusterName, "cluster", "", "cluster name (required)")
	fl.StringVar(&masters, "masters", "", "master addresses, comma-separated (required)")
	fl.StringVar(&bind, "bind", "127.0.0.1:0", "address to listen on for clients")
	fl.StringVar(&advertise, "advertise", "", "address announced to the master (default: the bound one)")
	fl.StringVar(&ca, "ca", "", "CA certificate (PEM) for TLS; with --cert and --key")
	fl.StringVar(&cert, "cert", "", "node certificate (PEM)")
	fl.StringVar(&key, "key", "", "node private key (PEM)")
	maxQueued, maxQueuedTotal := sizeFlag(64<<20), sizeFlag(1<<30)
	fl.Var(&maxQueued, "max-queued", "bytes of answers a client may leave unread before the node waits for it (64MiB, 1GiB, ...)")
	fl.Var(&maxQueuedTotal, "max-queued-total", "the same for all clients together (0: no bound)")
	maxFramesTotal := sizeFlag(1 << 30)
	fl.Var(&maxFramesTotal, "max-frames-total", "memory the packets being received may hold on all connections together, beyond 1MiB each: a packet past it closes its connection (0: no bound)")
	var maxTxnBytes sizeFlag
	fl.Var(&maxTxnBytes, "max-txn-bytes", "bytes of object data the transactions of one client connection may hold until their vote (--read-write; in memory up to a bound, the rest in unlinked files of $TMPDIR); past it the connection is closed (0: no bound; 512MiB, 2GiB, ...)")
	fl.IntVar(&gomaxprocs, "gomaxprocs", 0, "set GOMAXPROCS (0: Go's default)")
	fl.StringVar(&cpus, "cpus", "", "pin the process to these CPUs (e.g. 0-7,16-23)")
	fl.StringVar(&debugAddr, "debug-addr", "", "serve Go's profiler (net/http/pprof) at http://`HOST:PORT`/debug/pprof/ (keep it private)")
	fl.StringVar(&httpAddr, "http-addr", "", "serve metrics (Prometheus) at http://`HOST:PORT`/metrics, the probes /live and /ready and a live status page at /")
	var busyPoll busyPollFlag
	fl.Var(&busyPoll, "busy-poll", busyPollUsage)
	var noChecksum bool
	fl.BoolVar(&noChecksum, "no-checksum", false, "for benchmarks only: send zero checksums instead of sha1(data) (FileStorage backend); only clients that skip their check (neo://...?verify=0) can read from such a node")
	var readWrite bool
	fl.BoolVar(&readWrite, "read-write", false, "take commits (FileStorage: PATH.neo beside it keeps the final tids of NEO's transactions, the node id and the partition table; SQLite: written as NEO/py's storage writes it)")
	var withMaster string
	fl.StringVar(&withMaster, "with-master", "", "test build only (bin/zodbd-test), for tests, demos and benchmarks: also run the test master (zodbd-test neo-master) in this process, listening on `ADDR`, and join it (then --masters is not needed)")
	if status, ok := parseFlags(fl, args); !ok {
		return status
	}
	if withMaster != "" && masters == "" {
		masters = withMaster
	}
	if maxQueuedTotal == 0 {
		maxQueuedTotal = -1
	}
	if maxFramesTotal == 0 {
		maxFramesTotal = -1
	}
	// Usage errors: exit status 2, before anything is opened or bound.
	switch {
	case maxTxnBytes < 0:
		return misusef("neo-storage", "--max-txn-bytes must not be negative")
	case !readWrite && isSet(fl, "max-txn-bytes"):
		return misusef("neo-storage", "--max-txn-bytes bounds the transactions of a node that takes commits: it goes with --read-write")
	case maxQueued <= 0:
		return misusef("neo-storage", "--max-queued must be more than 0")
	case gomaxprocs < 0:
		return misusef("neo-storage", "--gomaxprocs must not be negative")
	case clusterName == "":
		return misusef("neo-storage", "--cluster NAME is required")
	case masters == "":
		return misusef("neo-storage", "--masters HOST:PORT[,...] is required (or --with-master, test build)")
	case fl.NArg() != 1:
		fl.Usage()
		return 2
	case withMaster != "" && !haveTestMaster:
		return misusef("neo-storage", "--with-master is in the test build of zodbd only (make build-test: bin/zodbd-test)")
	case (ca != "" || cert != "" || key != "") && (ca == "" || cert == "" || key == ""):
		return misusef("neo-storage", "TLS needs --ca, --cert and --key together")
	}
	for _, a := range []struct{ flag, addr string }{{"--bind", bind}, {"--advertise", advertise}, {"--http-addr", httpAddr}, {"--with-master", withMaster}} {
		if a.addr != "" {
			if err := zeo.CheckHTTPAddr(a.addr); err != nil {
				return misusef("neo-storage", "%s: %v", a.flag, err)
			}
		}
	}
	for _, m := range strings.Split(masters, ",") {
		if err := zeo.CheckHTTPAddr(m); err != nil {
			return misusef("neo-storage", "--masters: %v", err)
		}
	}
	// Scheduling knobs first, so that every thread started later inherits.
	if cpus != "" {
		if err := pinCPUs(cpus); err != nil {
			return fatalf("neo-storage", "--cpus %s: %v", cpus, err)
		}
	}
	if gomaxprocs > 0 {
		runtime.GOMAXPROCS(gomaxprocs)
	}
	if debugAddr != "" {
		d, err := startDebugServer(debugAddr, func(f string, a ...any) { log.Printf("zodbd neo-storage: "+f, a...) })
		if err != nil {
			return fatalf("neo-storage", "--debug-addr: %v", err)
		}
		defer d.Close()
	}
	// The metrics listener before the backend opens (/live answers, /ready
	// says 503 until the node is operational).
	var metrics *metricsServer
	if httpAddr != "" {
		var err error
		if metrics, err = startMetricsServer(httpAddr, func(f string, a ...any) { log.Printf("zodbd neo-storage: "+f, a...) }); err != nil {
			return fatalf("neo-storage", "--http-addr: %v", err)
		}
		defer metrics.Close()
		metrics.Register(notReady{})
	}
	var tlsConf *tls.Config
	if ca != "" || cert != "" || key != "" {
		var err error
		if tlsConf, err = link.NodeTLSConfig(ca, cert, key); err != nil {
			return fatalf("neo-storage", "%v", err)
		}
	}
	signal.Ignore(syscall.SIGPIPE) // as serve: a log reader gone must not kill the node
	// SIGTERM and SIGINT end ctx, and so stop the node; while the backend
	// opens (an index read or a scan may take minutes, a hung file
	// system for ever), they wait up to startGrace for it, as serve's.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var sigGot atomic.Value // the signal that ended ctx
	go func() {
		select {
		case s := <-sigs:
			sigGot.Store(s)
			cancel()
		case <-ctx.Done():
		}
	}()
	arg := fl.Arg(0)
	type opened struct {
		be      storage.Backend
		closeDB func() error // a read-only SQLite DB's, after be's
		err     error
	}
	openDone := make(chan opened, 1)
	go func() {
		var o opened
		if p, ok := strings.CutPrefix(arg, "sqlite:"); ok {
			p = strings.TrimPrefix(p, "//")
			if readWrite {
				o.be, o.err = sqlitebackend.Open(ctx, p)
			} else {
				// Read-only, with NEO/py's storage lock all the same.
				var db *neosqlite.DB
				if db, o.err = neosqlite.OpenExclusive(ctx, p); o.err == nil {
					o.be, o.closeDB = sqlitebackend.New(db), db.Close
				}
			}
		} else if readWrite {
			o.be, o.err = fs1backend.OpenWriter(arg, nil)
		} else {
			o.be, o.err = fs1backend.Open(arg)
		}
		openDone <- o
	}()
	var o opened
	select {
	case o = <-openDone:
	case <-ctx.Done():
		sig := sigGot.Load().(os.Signal)
		log.Printf("zodbd neo-storage: %v while the backend opens: stopping once it is open (at most %v)", sig, startGrace)
		select {
		case o = <-openDone:
			if o.err == nil {
				o.be.Close()
				if o.closeDB != nil {
					o.closeDB()
				}
			}
			return 0
		case <-time.After(startGrace):
			log.Printf("zodbd neo-storage: %v: the backend is still opening after %v: exiting", sig, startGrace)
			dieBy(sig)
		}
	}
	if o.err != nil {
		return fatalf("neo-storage", "%v", o.err)
	}
	be := o.be
	if o.closeDB != nil {
		defer o.closeDB()
	}
	defer func() {
		// A backend's I/O error reported at close (commits since may
		// be lost): the run ended badly, whatever stopped it.
		if err := be.Close(); err != nil {
			log.Printf("zodbd neo-storage: close: %v", err)
			if status == 0 {
				status = 1
			}
		}
	}()
	if noChecksum {
		if fb, ok := be.(*fs1backend.Backend); ok {
			fb.SkipChecksums()
			log.Printf("zodbd neo-storage: --no-checksum: zero checksums are sent; only clients with verify=0 can read")
		} else {
			log.Printf("zodbd neo-storage: --no-checksum ignored: this backend sends the checksums it stores, which cost nothing")
		}
	}
	if withMaster != "" {
		if err := startTestMaster(ctx, clusterName, withMaster, tlsConf); err != nil {
			return fatalf("neo-storage", "master: %v", err)
		}
	}
	n, err := storage.New(storage.Config{
		Cluster:   clusterName,
		Masters:   strings.Split(masters, ","),
		Bind:      bind,
		Advertise: advertise,
		Backend:   be,
		TLS:       tlsConf,
		Logger:    log.New(os.Stderr, "", log.LstdFlags|log.Lmicroseconds),

		MaxTxnBytes:    int(maxTxnBytes),
		MaxQueued:      int(maxQueued),
		MaxQueuedTotal: int(maxQueuedTotal),
		MaxFramesTotal: int(maxFramesTotal),
		BusyPoll:       busyPoll.poller(),
	})
	if err != nil {
		return fatalf("neo-storage", "%v", err)
	}
	if metrics != nil {
		n.EnableStats()
		// The storage label, as given (a path need not be UTF-8, which
		// metrics refuse).
		c := &neoCollector{node: n, name: strings.ToValidUTF8(arg, "\uFFFD")}
		if fb, ok := be.(*fs1backend.Backend); ok {
			c.fs = fb.FileStorage()
		}
		metrics.Replace(notReady{}, c)
		metrics.SetReady(c.ready)
		metrics.SetStatus(c)
	}
	log.Printf("zodbd neo-storage: serving %s on %s for cluster %q", arg, n.Addr(), clusterName)
	if busyPoll.spin > 0 {
		log.Printf("zodbd neo-storage: busy-polling: a connection's reader spins up to %v before parking", busyPoll.spin)
	}
	if err := n.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return fatalf("neo-storage", "%v", err)
	}
	return 0
}
