package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/zodbd/zodbd/blob"
	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/eventlog"
	"github.com/zodbd/zodbd/zeo"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zlibstorage"
	"github.com/zodbd/zodbd/zodb"
	"github.com/zodbd/zodbd/zodb/resolve"
)

func init() {
	register(&command{
		name:    "serve",
		summary: "run a ZEO server (runzeo's command line and zeo.conf)",
		run:     runServe,
	})
}

// sizeFlag is a byte size: a number with an optional unit (K, M, G,
// KB, MiB, ...: powers of 1024).
type sizeFlag int64

func (f *sizeFlag) String() string {
	n := int64(*f)
	for _, u := range []string{"GiB", "MiB", "KiB"} {
		k := int64(1) << (10 * (strings.Index("KMG", u[:1]) + 1))
		if n != 0 && n%k == 0 {
			return strconv.FormatInt(n/k, 10) + u
		}
	}
	return strconv.FormatInt(n, 10)
}

func (f *sizeFlag) Set(s string) error {
	num := strings.TrimRight(s, "KMGkmgiBb")
	unit := strings.ToUpper(strings.TrimSuffix(strings.TrimSuffix(s[len(num):], "B"), "i"))
	n, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
	shift := map[string]uint{"": 0, "K": 10, "M": 20, "G": 30}
	sh, ok := shift[unit]
	if err != nil || !ok || n < 0 || n > math.MaxInt64>>sh {
		return fmt.Errorf("bad size %q (want a number of bytes, or with K, M, G, KiB, MiB, GiB)", s)
	}
	*f = sizeFlag(n << sh)
	return nil
}

// multiFlag is a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(s string) error { *m = append(*m, s); return nil }

// Repeatable tells cli.Parse that -f may be given several times.
func (m *multiFlag) Repeatable() {}

func runServe(args []string) (status int) {
	fl := newFlags("serve", "usage: zodbd serve [-C zeo.conf] [-a ADDRESS] [-f Data.fs]... [options]\n\n"+
		"Serves FileStorage files to ZEO clients (ZEO.ClientStorage), like runzeo.\n"+
		"ADDRESS is PORT, HOST:PORT or a Unix socket path (default 127.0.0.1:8100);\n"+
		"a bare PORT listens on all interfaces, as with runzeo.\n"+
		"Storages given with -f are named 1, 2, ... in order. Command-line options\n"+
		"override the configuration file. $ZEO_MSGPACK (non-empty) selects msgpack\n"+
		"when the configuration does not say.\n\n"+
		"Signals: SIGTERM/SIGINT stop cleanly (transactions aborted, commit lock\n"+
		"released, index saved); SIGHUP/SIGUSR2 reopen the log file.\n\n")
	var files multiFlag
	var addr, conf, pidFile, logPath, cpus, debugAddr, httpAddr string
	var readOnly, msgpack, create bool
	var timeout float64
	var maxFrame, gomaxprocs, invq int
	var invAge string
	maxQueued, maxQueuedTotal := sizeFlag(zeo.DefaultMaxQueued), sizeFlag(zeo.DefaultMaxQueuedTotal)
	var maxTxnBytes sizeFlag
	maxFramesTotal := sizeFlag(zeo.DefaultMaxFramesTotal)
	for _, n := range []string{"a", "address"} {
		fl.StringVar(&addr, n, "", "address to listen on")
	}
	for _, n := range []string{"f", "filename"} {
		fl.Var(&files, n, "FileStorage file to serve (repeatable)")
	}
	for _, n := range []string{"C", "configure"} {
		fl.StringVar(&conf, n, "", "runzeo configuration file (zeo.conf)")
	}
	for _, n := range []string{"r", "read-only"} {
		fl.BoolVar(&readOnly, n, false, "serve read-only")
	}
	for _, n := range []string{"t", "timeout"} {
		fl.Float64Var(&timeout, n, 0, "transaction timeout in seconds (default: none)")
	}
	fl.StringVar(&pidFile, "pid-file", "", "write the process id to this file")
	fl.BoolVar(&msgpack, "msgpack", false, "announce msgpack (M5) instead of pickle (Z5)")
	fl.BoolVar(&create, "create", false, "make the -f files anew (each removed, then created empty)")
	fl.StringVar(&logPath, "log", "", "log file, instead of zeo.conf's <logfile>s (default: standard error)")
	fl.IntVar(&maxFrame, "max-frame", wire.DefaultMaxFrame, "largest request frame accepted, in bytes")
	fl.Var(&maxTxnBytes, "max-txn-bytes", "bytes of data (records and blob uploads) one transaction may send before its vote (in memory up to a bound, the rest in unlinked files of $TMPDIR): past it the rest is dropped and the vote fails (0: no bound, as runzeo; 1GiB, ...)")
	fl.Var(&maxQueued, "max-queued", "bytes of replies and invalidations a client may leave unread: past half its requests wait, past the whole it is disconnected (64MiB, 1GiB, ...)")
	fl.Var(&maxQueuedTotal, "max-queued-total", "the same for all clients together (0: no bound)")
	fl.Var(&maxFramesTotal, "max-frames-total", "memory the request frames being received may hold on all connections together, beyond 1MiB each: a frame past it closes its connection (0: no bound)")
	fl.IntVar(&invq, "invalidation-queue-size", 0, "transactions remembered for getInvalidations (default 100)")
	fl.StringVar(&invAge, "invalidation-age", "0", "a client older than the invalidation queue but younger than this many seconds gets its invalidations by iteration (0: never)")
	fl.IntVar(&gomaxprocs, "gomaxprocs", 0, "set GOMAXPROCS (0: Go's default, the number of usable CPUs)")
	fl.StringVar(&cpus, "cpus", "", "pin the process to these CPUs (e.g. 0-7,16-23)")
	fl.StringVar(&debugAddr, "debug-addr", "", "serve Go's profiler (net/http/pprof) at http://`HOST:PORT`/debug/pprof/ (keep it private)")
	fl.StringVar(&httpAddr, "http-addr", "", "serve metrics (Prometheus) at http://`HOST:PORT`/metrics, the probes /live and /ready and a live status page at /; also http-addr in <zeo>")
	var busyPoll busyPollFlag
	fl.Var(&busyPoll, "busy-poll", busyPollUsage)
	if status, ok := parseFlags(fl, args); !ok {
		return status
	}
	if fl.NArg() != 0 {
		return misusef("serve", "unexpected argument %q (storages are given with -f FILE or -C zeo.conf)", fl.Arg(0))
	}
	set := map[string]bool{}
	fl.Visit(func(f *flag.Flag) { set[f.Name] = true })
	// A value that cannot be honoured is refused, not replaced: a usage
	// error (exit status 2, as a flag error).
	var age float64
	var ageErr error
	if set["invalidation-age"] {
		age, ageErr = zeo.ParseInvalidationAge(invAge)
	}
	switch {
	case conf == "" && len(files) == 0:
		return misusef("serve", "no storage: give -f FILE or -C zeo.conf")
	case create && len(files) == 0:
		return misusef("serve", "--create applies to -f files (with -C, create true in a <filestorage>)")
	case invq < 0 || set["invalidation-queue-size"] && invq == 0:
		return misusef("serve", "--invalidation-queue-size %d: want at least 1", invq)
	case maxFrame <= 0:
		return misusef("serve", "--max-frame %d: want a positive size", maxFrame)
	case gomaxprocs < 0:
		return misusef("serve", "--gomaxprocs %d: want 0 (Go's default) or more", gomaxprocs)
	case (set["t"] || set["timeout"]) && timeout == 0:
		return misusef("serve", "--timeout 0 would time out every transaction as it takes the commit lock (as runzeo -t 0 does); leave it out for no timeout")
	case !(timeout >= 0 && timeout <= float64(math.MaxInt64/int64(time.Second))): // NaN too
		return misusef("serve", "--timeout %v: want more than 0 seconds, at most %d", timeout, math.MaxInt64/int64(time.Second))
	case addr != "" && zeo.CheckAddress(addr) != nil:
		return misusef("serve", "--address: %v", zeo.CheckAddress(addr))
	case ageErr != nil:
		return misusef("serve", "--invalidation-age: %v", ageErr)
	case set["http-addr"] && zeo.CheckHTTPAddr(httpAddr) != nil:
		return misusef("serve", "--http-addr: %v", zeo.CheckHTTPAddr(httpAddr))
	case maxQueued <= 0:
		return misusef("serve", "--max-queued must be more than 0")
	case maxTxnBytes < 0:
		return misusef("serve", "--max-txn-bytes must not be negative")
	}
	// A log reader that goes away (a pipe to logger, restarted) must not
	// kill the server, as SIGPIPE does by default for a write to fd 1 or
	// 2 (runzeo's Python ignores it); the write's error is reported.
	signal.Ignore(syscall.SIGPIPE)

	// Scheduling knobs first, so that every thread started later inherits.
	if cpus != "" {
		if err := pinCPUs(cpus); err != nil {
			return fatalf("serve", "--cpus %s: %v", cpus, err)
		}
	}
	if gomaxprocs > 0 {
		runtime.GOMAXPROCS(gomaxprocs)
	}

	fc := &zeo.FileConfig{InvalidationQueueSize: 100}
	var replaced []string // zeo.conf's storages replaced by -f
	if conf != "" {
		var err error
		if fc, err = zeo.ParseConfigFile(conf); err != nil {
			return fatalf("serve", "%v", err)
		}
	}
	if addr != "" {
		fc.Address = addr
	}
	if fc.Address == "" {
		fc.Address = "127.0.0.1:8100"
	}
	if len(files) > 0 {
		if len(fc.Storages) > 0 {
			// As runzeo: -f replaces the storages of zeo.conf. Said, so
			// that a blob directory or a zlib section that no longer
			// applies is not lost without a word (logged below).
			for _, st := range fc.Storages {
				replaced = append(replaced, fmt.Sprintf("%s (%s)", st.Name, st.Path))
			}
		}
		fc.Storages = nil
		for i, f := range files {
			fc.Storages = append(fc.Storages, zeo.FileStorageConfig{Name: strconv.Itoa(i + 1), Path: f, Create: create, PackGC: true, PackKeepOld: true})
		}
	}
	if len(fc.Storages) == 0 {
		return fatalf("serve", "no storage: give -f FILE or -C zeo.conf")
	}
	if set["r"] || set["read-only"] {
		fc.ReadOnly = readOnly
	}
	if set["t"] || set["timeout"] {
		fc.TransactionTimeout = time.Duration(timeout * float64(time.Second))
	}
	if set["pid-file"] {
		fc.PidFile = pidFile
	}
	if set["invalidation-age"] {
		fc.InvalidationAge = age
	}
	if invq > 0 {
		fc.InvalidationQueueSize = invq
	}
	useMsgpack := os.Getenv("ZEO_MSGPACK") != ""
	if fc.Msgpack != nil {
		useMsgpack = *fc.Msgpack
	}
	if set["msgpack"] {
		useMsgpack = msgpack
	}
	if set["http-addr"] {
		fc.HTTPAddr = httpAddr
	}
	if fc.BusyPoll != "" && !set["busy-poll"] {
		busyPoll.Set(fc.BusyPoll) // checked by ParseConfigFile
	}

	el, err := openEventLog(fc.EventLog, logPath)
	if err != nil {
		return fatalf("serve", "log: %v", err)
	}
	defer el.Close()
	logf := func(lv eventlog.Level, f string, a ...any) { el.Logf(lv, "ZEO.runzeo", f, a...) }
	if len(replaced) > 0 {
		logf(eventlog.Warning, "-f replaces the storages of %s: %s not served", conf, strings.Join(replaced, ", "))
	}
	if debugAddr != "" {
		d, err := startDebugServer(debugAddr, func(f string, a ...any) { logf(eventlog.Info, f, a...) })
		if err != nil {
			return fatalf("serve", "--debug-addr: %v", err)
		}
		defer d.Close()
	}
	// The metrics listener before the storages open: /live answers and
	// /ready says 503 while a big index is read.
	var metrics *metricsServer
	collector := &zeoCollector{}
	if fc.HTTPAddr != "" {
		if metrics, err = startMetricsServer(fc.HTTPAddr, func(f string, a ...any) { logf(eventlog.Info, f, a...) }); err != nil {
			return fatalf("serve", "http-addr: %v", err)
		}
		defer metrics.Close()
		metrics.Register(collector)
	}

	cfg := zeo.Config{
		ReadOnly:              fc.ReadOnly,
		InvalidationQueueSize: fc.InvalidationQueueSize,
		InvalidationAge:       time.Duration(fc.InvalidationAge * float64(time.Second)),
		TransactionTimeout:    fc.TransactionTimeout,
		MaxFrame:              maxFrame,
		MaxQueued:             int(maxQueued),
		MaxTxnBytes:           int64(maxTxnBytes),
		MaxQueuedTotal:        int(maxQueuedTotal),
		MaxFramesTotal:        int(maxFramesTotal),
		Marshal:               wire.Pickle,
		Log:                   el,
		BusyPoll:              busyPoll.poller(),
		Metrics:               metrics != nil,
	}
	if p := cfg.BusyPoll; p != nil {
		logf(eventlog.Info, "busy-polling: a connection's reader spins up to %v before parking, at most %d at once",
			p.Spin(), p.MaxSpinners())
	}
	if maxQueuedTotal == 0 {
		cfg.MaxQueuedTotal = -1
	}
	if maxFramesTotal == 0 {
		cfg.MaxFramesTotal = -1
	}
	if useMsgpack {
		cfg.Marshal = wire.Msgpack
	}
	// runzeo resolves conflicts on the server unless told to leave them
	// to the clients; zodbd resolves the classes zodb/resolve knows.
	if !fc.ClientConflictResolution {
		cfg.Resolve = resolve.Resolve
	}
	if fc.SSL != nil {
		if cfg.TLS, err = fc.SSL.TLSConfig(); err != nil {
			return fatalf("serve", "%v", err)
		}
	}

	// Signals are caught from here on: the socket is bound before the
	// storages are open, and a signal arriving meanwhile (a SIGHUP from
	// logrotate) must not end the process. Until the server is made,
	// startSignals handles them (SIGTERM and SIGINT stop the start, and
	// end the process if the storages take longer to open, as they end
	// runzeo's: an index read or a scan may take minutes); from then on,
	// the loop at the end.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR2)
	var ownSocket atomic.Bool // a Unix socket this process made
	startStopping, stopStartSignals := startSignals(sigs, el, logf, func() {
		if ownSocket.Load() {
			os.Remove(fc.Address)
		}
	})
	defer stopStartSignals()

	// The socket first: a server that cannot listen must not create or
	// lock its storages' files.
	ln, err := listen(fc.Address)
	if err != nil {
		return fatalf("serve", "%v", err)
	}
	unixSocket := strings.Contains(fc.Address, "/")
	ownSocket.Store(unixSocket)
	serving := false
	defer func() {
		if !serving {
			ln.Close()
		}
		if unixSocket {
			os.Remove(fc.Address)
		}
	}()

	var opened []io.Closer
	pidFileWritten := ""
	defer func() {
		for _, c := range opened {
			if err := c.Close(); err != nil {
				// A storage's I/O error (commits since may be lost):
				// the run ended badly, whatever stopped it.
				logf(eventlog.Error, "close: %v", err)
				if status == 0 {
					status = 1
				}
			}
		}
		// Once the storages are closed and their locks released (as
		// runzeo): a supervisor that waits for the pid file to go may
		// start the next server at once.
		if pidFileWritten != "" {
			os.Remove(pidFileWritten)
		}
	}()
	fslog := func(f string, a ...any) { el.Logf(eventlog.Warning, "ZODB.FileStorage", f, a...) }
	fsByName := map[string]*fs1.FileStorage{} // for the metrics
	for _, sc := range fc.Storages {
		// As runzeo: the storage is opened as its own section says; the
		// server's read-only (<zeo> read-only, -r) only refuses the
		// clients' writes, so a storage that is not read-only itself is
		// opened for writing (and created when missing) all the same.
		if startStopping() {
			break // the storages opened are closed (deferred)
		}
		st, fs, err := openServedStorage(sc, fslog)
		if err != nil {
			return fatalf("serve", "storage %s: %v", sc.Name, err)
		}
		opened = append(opened, st)
		if sc.BlobDir != "" && !sc.BlobWrapper && sc.Create && !sc.ReadOnly {
			// As ZODB/py's FileStorage(create=True, blob_dir=...): a new
			// storage starts with an empty blob directory, emptied once
			// the storage's lock is held (a second server started on it
			// stops at the lock, before it touches the first one's blobs).
			// A <blobstorage>'s directory is not emptied (BlobStorage
			// never does).
			if err := os.RemoveAll(sc.BlobDir); err != nil {
				return fatalf("serve", "storage %s: blob-dir: %v", sc.Name, err)
			}
		}
		fsByName[sc.Name] = fs
		served := zodb.Storage(st)
		if sc.BlobDir != "" {
			// The blob directory is a wrapper around the storage: the
			// server's blob calls, commits and packs go through it.
			d, err := blob.Open(sc.BlobDir, "")
			if err != nil {
				return fatalf("serve", "storage %s: %v", sc.Name, err)
			}
			if !sc.ReadOnly {
				// This process holds the storage's lock: the uploads in
				// the blob directory's tmp are those of an earlier run
				// that was killed or lost power in a transaction.
				n, size, err := d.RemoveUploads()
				if err != nil {
					logf(eventlog.Warning, "storage %s: blob-dir: uploads left by an earlier run: %v", sc.Name, err)
				} else if n > 0 {
					logf(eventlog.Warning, "storage %s: blob-dir: removed %d uploads (%d bytes) an earlier run left in %s", sc.Name, n, size, d.TempDir())
				}
			}
			bs := blob.Wrap(st, d)
			bs.KeepOld = sc.PackKeepOld // DIR.old beside Data.fs.old, as ZODB/py
			served = bs
		}
		ro := sc.ReadOnly || fc.ReadOnly
		cfg.Storages = append(cfg.Storages, zeo.StorageConfig{Name: sc.Name, Storage: served, ReadOnly: ro,
			Resolve: storageResolver(sc, cfg.Resolve)})
		logf(eventlog.Info, "storage %s: %s (%s)", sc.Name, sc.Path, map[bool]string{true: "read-only", false: "read-write"}[ro])
		if sc.Quota > 0 {
			logf(eventlog.Info, "storage %s: quota %d bytes", sc.Name, sc.Quota)
		}
		if sc.BlobDir != "" {
			logf(eventlog.Info, "storage %s: blob directory %s", sc.Name, sc.BlobDir)
		}
		switch {
		case sc.Zlib == "zlibstorage" && sc.ZlibCompress:
			logf(eventlog.Info, "storage %s: <zlibstorage>: records compressed on store, decompressed on load", sc.Name)
		case sc.Zlib == "zlibstorage":
			logf(eventlog.Info, "storage %s: <zlibstorage> compress false: records decompressed on load", sc.Name)
		case sc.Zlib == "serverzlibstorage" && sc.ZlibCompress:
			logf(eventlog.Info, "storage %s: <serverzlibstorage>: records pass as the clients compress them; conflicts resolved here stored compressed", sc.Name)
		case sc.Zlib == "serverzlibstorage":
			logf(eventlog.Info, "storage %s: <serverzlibstorage> compress false: records pass as the clients compress them; conflicts resolved here stored uncompressed", sc.Name)
		}
	}
	// A signal from now on waits for the loop at the end.
	if stopStartSignals() {
		logf(eventlog.Info, "stopped before serving (a signal came while starting)")
		return 0
	}
	srv, err := zeo.NewServer(cfg)
	if err != nil {
		return fatalf("serve", "%v", err)
	}
	if fc.PidFile != "" {
		// Read-only too (runzeo skips it there, without a word, and a
		// supervisor waits for it), but a read-only server may run
		// where it cannot write: then the failure is a warning.
		if err := writePidFile(fc.PidFile); err == nil {
			pidFileWritten = fc.PidFile
		} else if fc.ReadOnly {
			logf(eventlog.Warning, "pid file (read-only server): %v", err)
		} else {
			return fatalf("serve", "pid file: %v", err)
		}
	}
	where := ""
	if ta, ok := ln.Addr().(*net.TCPAddr); ok && ta.IP.IsUnspecified() {
		where = "all interfaces, "
	}
	el.Logf(eventlog.Info, "ZEO.asyncio.server", "listening on %s (%s%s, GOMAXPROCS=%d)", ln.Addr(), where,
		map[wire.Marshal]string{wire.Pickle: "Z5 pickle", wire.Msgpack: "M5 msgpack"}[cfg.Marshal], runtime.GOMAXPROCS(0))

	// The collector has the server before it serves: a client whose
	// request was answered finds itself in the next scrape.
	if metrics != nil {
		collector.setServer(srv, fsByName)
		metrics.SetReady(collector.ready)
		metrics.SetStatus(collector)
	}
	serveErr := make(chan error, 1)
	serving = true
	go func() { serveErr <- srv.Serve(ln) }()
	for {
		select {
		case err := <-serveErr:
			if err != nil {
				logf(eventlog.Critical, "%v", err)
				return 1
			}
			return 0
		case sig := <-sigs:
			switch sig {
			case syscall.SIGHUP, syscall.SIGUSR2:
				if err := el.Reopen(); err != nil {
					logf(eventlog.Error, "reopen log: %v", err)
				} else {
					logf(eventlog.Info, "log reopened (%v)", sig)
				}
			default:
				logf(eventlog.Info, "%v: shutting down", sig)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				if err := srv.Shutdown(ctx); err != nil {
					logf(eventlog.Error, "shutdown: %v", err)
				}
				cancel()
				return 0
			}
		}
	}
}

// startGrace is how long a SIGTERM or SIGINT that comes while the
// storages open waits for them before it ends the process.
const startGrace = 2 * time.Second

// dieBy ends the process by sig with the signal's default action, as a
// process without a handler for it ends (runzeo's while it opens its
// storages, NEO/py's neostorage): the exit status says which signal.
func dieBy(sig os.Signal) {
	signal.Reset(sig)
	syscall.Kill(os.Getpid(), sig.(syscall.Signal))
	select {} // the signal ends the process
}

// startSignals handles the signals that arrive on sigs while the server
// starts, until stop is called: SIGHUP and SIGUSR2 reopen el's files;
// SIGTERM and SIGINT ask the start to stop (stopping reports it), and
// end the process by that signal if the start has not stopped within
// startGrace, or at a second one, as they end runzeo's while it opens its
// storages (an index read or a scan may take minutes, a hung file system
// for ever). cleanup runs first. Nothing is written while storages open
// that a restart does not redo: they keep their files as a kill leaves
// them. stop reports whether a stop was asked; it may be called more than
// once.
func startSignals(sigs <-chan os.Signal, el *eventlog.Logger, logf func(eventlog.Level, string, ...any), cleanup func()) (stopping func() bool, stop func() bool) {
	quit, done := make(chan struct{}), make(chan struct{})
	var asked atomic.Bool
	go func() {
		defer close(done)
		var sig os.Signal
		var grace <-chan time.Time
		die := func() {
			cleanup()
			dieBy(sig)
		}
		for {
			select {
			case <-quit:
				return
			case <-grace:
				logf(eventlog.Info, "%v: the storages are still opening after %v: exiting", sig, startGrace)
				die()
			case s := <-sigs:
				switch s {
				case syscall.SIGHUP, syscall.SIGUSR2:
					if err := el.Reopen(); err != nil {
						logf(eventlog.Error, "reopen log: %v", err)
					}
				default:
					if asked.Load() {
						logf(eventlog.Info, "%v again while starting: exiting", s)
						sig = s
						die()
					}
					sig = s
					asked.Store(true)
					logf(eventlog.Info, "%v while starting: stopping once the storages are open (at most %v)", s, startGrace)
					grace = time.After(startGrace)
				}
			}
		}
	}()
	var once sync.Once
	return asked.Load, func() bool {
		once.Do(func() { close(quit) })
		<-done
		return asked.Load()
	}
}

// storageResolver is the conflict resolver of the storage sc given the
// server's, resolve (nil: conflicts are left to the clients, nil too):
// under <serverzlibstorage> with compress true, its default, what resolve
// merges is stored compressed, as zc.zlibstorage's ServerZlibStorage
// stores it (FileStorage's conflict resolution transforms the merge with
// the wrapper's compress).
func storageResolver(sc zeo.FileStorageConfig, resolve zodb.Resolver) zodb.Resolver {
	if resolve != nil && sc.Zlib == "serverzlibstorage" && sc.ZlibCompress {
		return zlibstorage.CompressResolved(resolve)
	}
	return resolve
}

// writePidFile writes this process's pid to path, as runzeo's
// pid-filename. A file already there is replaced only if it holds a pid
// (a server's left after a crash, or nothing): anything else — a path
// mistyped as a database's — is an error and stays as it is, since the
// file is also removed when the server stops.
func writePidFile(path string) error {
	if b, err := os.ReadFile(path); err == nil {
		if s := strings.TrimSpace(string(b)); s != "" {
			if _, err := strconv.ParseUint(s, 10, 31); err != nil || len(b) > 32 {
				return fmt.Errorf("%s exists and does not hold a pid (not overwritten)", path)
			}
		}
	} else if !os.IsNotExist(err) {
		return err
	}
	return os.WriteFile(path, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644)
}

// listen opens the server socket: a Unix socket for an address with a "/"
// (removing a stale socket that nobody answers on; anything else already
// at that path is an error, never removed), else TCP. A bare port (8100,
// or :8100) listens on all interfaces, as runzeo does.
func listen(addr string) (net.Listener, error) {
	if strings.Contains(addr, "/") {
		if fi, err := os.Lstat(addr); err == nil {
			if fi.Mode()&os.ModeSocket == 0 {
				return nil, fmt.Errorf("%s: exists and is not a socket (a Unix socket address names a new file; nothing was removed)", addr)
			}
			if c, err := net.Dial("unix", addr); err == nil {
				c.Close()
				return nil, fmt.Errorf("%s: a server is already listening there", addr)
			}
			if err := os.Remove(addr); err != nil {
				return nil, fmt.Errorf("%s: stale socket: %w", addr, err)
			}
		}
		return net.Listen("unix", addr)
	}
	if _, err := strconv.Atoi(addr); err == nil {
		addr = ":" + addr
	}
	return net.Listen("tcp", addr)
}

// openEventLog opens the event log zeo.conf's <eventlog> describes; with
// --log (logPath), one file with the default format replaces its handlers.
// Without either, as runzeo: standard error, level INFO, the default format.
func openEventLog(cfg *zeo.EventLogConfig, logPath string) (*eventlog.Logger, error) {
	if cfg == nil {
		cfg = &zeo.EventLogConfig{Level: eventlog.Info, Handlers: []eventlog.HandlerConfig{{Path: "STDERR"}}}
	}
	hcs := cfg.Handlers
	if logPath != "" {
		hcs = []eventlog.HandlerConfig{{Path: logPath}}
	}
	var hs []*eventlog.Handler
	for _, hc := range hcs {
		h, err := eventlog.NewHandler(hc)
		if err != nil {
			for _, h := range hs {
				eventlog.New(0, h).Close()
			}
			return nil, fmt.Errorf("%s: %w", hc.Path, err)
		}
		hs = append(hs, h)
	}
	return eventlog.New(cfg.Level, hs...), nil
}

// openServedStorage opens a FileStorage for the server: read-write (taking
// its lock file, cutting a torn tail) unless sc.ReadOnly; create truncates
// it. pack-gc, pack-keep-old and quota become fs1's PackNoGC,
// PackDiscardOld and Quota; a
// <zlibstorage> around it wraps it in zlibstorage.Storage. It also
// returns the FileStorage itself (for the metrics).
func openServedStorage(sc zeo.FileStorageConfig, logf func(string, ...interface{})) (interface {
	zodb.Storage
	io.Closer
}, *fs1.FileStorage, error) {
	if sc.Create && sc.ReadOnly {
		return nil, nil, errors.New("create and read-only together")
	}
	fs, err := fs1.Open(sc.Path, &fs1.Options{Logf: logf, ReadWrite: !sc.ReadOnly, Create: sc.Create,
		PackNoGC: !sc.PackGC, PackDiscardOld: !sc.PackKeepOld, Quota: sc.Quota})
	if err != nil {
		return nil, nil, err
	}
	if sc.Zlib == "zlibstorage" {
		// zc.zlibstorage's ZlibStorage: the server compresses and
		// decompresses. <serverzlibstorage> needs nothing: records pass
		// as they are, and pack reads compressed ones by itself.
		return zlibstorage.Wrap(fs, sc.ZlibCompress), fs, nil
	}
	return fs, fs, nil
}
