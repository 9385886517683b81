package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/zeo"
	"github.com/zodbd/zodbd/zeo/wire"
	"github.com/zodbd/zodbd/zlibstorage"
	"github.com/zodbd/zodbd/zodb"
)

func init() {
	register(&command{
		name:    "serve",
		summary: "run a ZEO server (runzeo's command line and zeo.conf)",
		run:     runServe,
	})
}

// multiFlag is a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(s string) error { *m = append(*m, s); return nil }

func runServe(args []string) int {
	fl := flag.NewFlagSet("serve", flag.ContinueOnError)
	fl.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: zodbd serve [-C zeo.conf] [-a ADDRESS] [-f Data.fs]... [options]\n\n"+
			"Serves FileStorage files to ZEO clients (ZEO.ClientStorage), like runzeo.\n"+
			"ADDRESS is PORT, HOST:PORT or a Unix socket path (default 127.0.0.1:8100).\n"+
			"Storages given with -f are named 1, 2, ... in order. Command-line options\n"+
			"override the configuration file. $ZEO_MSGPACK (non-empty) selects msgpack\n"+
			"when the configuration does not say.\n\n"+
			"Signals: SIGTERM/SIGINT stop cleanly (transactions aborted, commit lock\n"+
			"released, index saved); SIGHUP/SIGUSR2 reopen the log file.\n\n")
		fl.PrintDefaults()
	}
	var files multiFlag
	var addr, conf, pidFile, logPath, cpus, debugAddr string
	var readOnly, msgpack, create bool
	var timeout float64
	var maxFrame, gomaxprocs, invq int
	var invAge string
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
		fl.Float64Var(&timeout, n, 0, "transaction timeout in seconds (0: none)")
	}
	fl.StringVar(&pidFile, "pid-file", "", "write the process id to this file")
	fl.BoolVar(&msgpack, "msgpack", false, "announce msgpack (M5) instead of pickle (Z5)")
	fl.BoolVar(&create, "create", false, "create the -f files (truncating them)")
	fl.StringVar(&logPath, "log", "", "log file (default: stderr)")
	fl.IntVar(&maxFrame, "max-frame", wire.DefaultMaxFrame, "largest request frame accepted, in bytes")
	fl.IntVar(&invq, "invalidation-queue-size", 0, "transactions remembered for getInvalidations (default 100)")
	fl.StringVar(&invAge, "invalidation-age", "0", "a client older than the invalidation queue but younger than this many seconds gets its invalidations by iteration (0: never)")
	fl.IntVar(&gomaxprocs, "gomaxprocs", 0, "set GOMAXPROCS (0: Go's default, the number of usable CPUs)")
	fl.StringVar(&cpus, "cpus", "", "pin the process to these CPUs (e.g. 0-7,16-23)")
	fl.StringVar(&debugAddr, "debug-addr", "", "serve Go's profiler (net/http/pprof) at http://`HOST:PORT`/debug/pprof/ (keep it private)")
	if err := fl.Parse(args); err != nil {
		return 2
	}
	if fl.NArg() != 0 {
		fl.Usage()
		return 2
	}
	set := map[string]bool{}
	fl.Visit(func(f *flag.Flag) { set[f.Name] = true })

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
	if set["log"] {
		fc.LogPath = logPath
	}
	if set["invalidation-age"] {
		age, err := zeo.ParseInvalidationAge(invAge)
		if err != nil {
			return fatalf("serve", "--invalidation-age: %v", err)
		}
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

	lw, err := openLog(fc.LogPath)
	if err != nil {
		return fatalf("serve", "log: %v", err)
	}
	defer lw.Close()
	logger := log.New(lw, "", log.LstdFlags|log.Lmicroseconds)
	if debugAddr != "" {
		d, err := startDebugServer(debugAddr, func(f string, a ...any) { logger.Printf("zodbd serve: "+f, a...) })
		if err != nil {
			return fatalf("serve", "--debug-addr: %v", err)
		}
		defer d.Close()
	}

	cfg := zeo.Config{
		ReadOnly:              fc.ReadOnly,
		InvalidationQueueSize: fc.InvalidationQueueSize,
		InvalidationAge:       time.Duration(fc.InvalidationAge * float64(time.Second)),
		TransactionTimeout:    fc.TransactionTimeout,
		MaxFrame:              maxFrame,
		Marshal:               wire.Pickle,
		Logf:                  logger.Printf,
	}
	if useMsgpack {
		cfg.Marshal = wire.Msgpack
	}
	if fc.SSL != nil {
		if cfg.TLS, err = fc.SSL.TLSConfig(); err != nil {
			return fatalf("serve", "%v", err)
		}
	}
	var opened []io.Closer
	defer func() {
		for _, c := range opened {
			if err := c.Close(); err != nil {
				logger.Printf("zodbd serve: close: %v", err)
			}
		}
	}()
	for _, sc := range fc.Storages {
		ro := sc.ReadOnly || fc.ReadOnly
		if sc.BlobDir != "" && sc.Create && !ro {
			// As ZODB/py's FileStorage(create=True, blob_dir=...): a new
			// storage starts with an empty blob directory.
			if err := os.RemoveAll(sc.BlobDir); err != nil {
				return fatalf("serve", "storage %s: blob-dir: %v", sc.Name, err)
			}
		}
		st, err := openServedStorage(sc, ro, logger.Printf)
		if err != nil {
			return fatalf("serve", "storage %s: %v", sc.Name, err)
		}
		opened = append(opened, st)
		cfg.Storages = append(cfg.Storages, zeo.StorageConfig{Name: sc.Name, Storage: st, ReadOnly: ro, BlobDir: sc.BlobDir})
		logger.Printf("zodbd serve: storage %s: %s (%s)", sc.Name, sc.Path, map[bool]string{true: "read-only", false: "read-write"}[ro])
		if sc.BlobDir != "" {
			logger.Printf("zodbd serve: storage %s: blob directory %s", sc.Name, sc.BlobDir)
		}
		switch {
		case sc.Zlib == "zlibstorage" && sc.ZlibCompress:
			logger.Printf("zodbd serve: storage %s: <zlibstorage>: records compressed on store, decompressed on load", sc.Name)
		case sc.Zlib == "zlibstorage":
			logger.Printf("zodbd serve: storage %s: <zlibstorage> compress false: records decompressed on load", sc.Name)
		case sc.Zlib == "serverzlibstorage":
			logger.Printf("zodbd serve: storage %s: <serverzlibstorage>: records pass as the clients compress them", sc.Name)
		}
	}
	srv, err := zeo.NewServer(cfg)
	if err != nil {
		return fatalf("serve", "%v", err)
	}
	ln, err := listen(fc.Address)
	if err != nil {
		return fatalf("serve", "%v", err)
	}
	if fc.PidFile != "" && !fc.ReadOnly {
		if err := os.WriteFile(fc.PidFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
			return fatalf("serve", "pid file: %v", err)
		}
		defer os.Remove(fc.PidFile)
	}
	logger.Printf("zodbd serve: listening on %s (%s, GOMAXPROCS=%d)", ln.Addr(), map[wire.Marshal]string{wire.Pickle: "Z5 pickle", wire.Msgpack: "M5 msgpack"}[cfg.Marshal], runtime.GOMAXPROCS(0))

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR2)
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	for {
		select {
		case err := <-serveErr:
			if err != nil {
				logger.Printf("zodbd serve: %v", err)
				return 1
			}
			return 0
		case sig := <-sigs:
			switch sig {
			case syscall.SIGHUP, syscall.SIGUSR2:
				if err := lw.Reopen(); err != nil {
					logger.Printf("zodbd serve: reopen log: %v", err)
				} else {
					logger.Printf("zodbd serve: log reopened (%v)", sig)
				}
			default:
				logger.Printf("zodbd serve: %v: shutting down", sig)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				if err := srv.Shutdown(ctx); err != nil {
					logger.Printf("zodbd serve: shutdown: %v", err)
				}
				cancel()
				if strings.HasPrefix(fc.Address, "/") || strings.Contains(fc.Address, "/") {
					os.Remove(fc.Address)
				}
				return 0
			}
		}
	}
}

// listen opens the server socket: a Unix socket for an address with a "/"
// (removing a stale socket file that nobody answers on), else TCP; a bare
// port listens on 127.0.0.1.
func listen(addr string) (net.Listener, error) {
	if strings.Contains(addr, "/") {
		if _, err := os.Stat(addr); err == nil {
			if c, err := net.Dial("unix", addr); err == nil {
				c.Close()
				return nil, fmt.Errorf("%s: a server is already listening there", addr)
			}
			os.Remove(addr)
		}
		return net.Listen("unix", addr)
	}
	if _, err := strconv.Atoi(addr); err == nil {
		addr = "127.0.0.1:" + addr
	}
	if strings.HasPrefix(addr, ":") {
		addr = "127.0.0.1" + addr
	}
	return net.Listen("tcp", addr)
}

// reopenWriter is the log output: a file reopened on SIGHUP/SIGUSR2 (for
// logrotate), or stderr.
type reopenWriter struct {
	mu   sync.Mutex
	path string
	f    *os.File
}

func openLog(path string) (*reopenWriter, error) {
	w := &reopenWriter{path: path}
	if path == "" {
		w.f = os.Stderr
		return w, nil
	}
	return w, w.Reopen()
}

func (w *reopenWriter) Reopen() error {
	if w.path == "" {
		return nil
	}
	f, err := os.OpenFile(w.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	w.mu.Lock()
	old := w.f
	w.f = f
	w.mu.Unlock()
	if old != nil {
		old.Close()
	}
	return nil
}

func (w *reopenWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.f.Write(b)
}

func (w *reopenWriter) Close() error {
	if w.path == "" {
		return nil
	}
	return w.f.Close()
}

// openServedStorage opens a FileStorage for the server: read-write (taking
// its lock file, cutting a torn tail) unless readOnly; create truncates it.
// pack-gc and pack-keep-old become fs1's PackNoGC and PackDiscardOld; a
// <zlibstorage> around it wraps it in zlibstorage.Storage.
func openServedStorage(sc zeo.FileStorageConfig, readOnly bool, logf func(string, ...interface{})) (interface {
	zodb.Storage
	io.Closer
}, error) {
	if sc.Create && readOnly {
		return nil, errors.New("create and read-only together")
	}
	fs, err := fs1.Open(sc.Path, &fs1.Options{Logf: logf, ReadWrite: !readOnly, Create: sc.Create,
		PackNoGC: !sc.PackGC, PackDiscardOld: !sc.PackKeepOld})
	if err != nil {
		return nil, err
	}
	if sc.Zlib == "zlibstorage" {
		// zc.zlibstorage's ZlibStorage: the server compresses and
		// decompresses. <serverzlibstorage> needs nothing: records pass
		// as they are, and pack reads compressed ones by itself.
		return zlibstorage.Wrap(fs, sc.ZlibCompress), nil
	}
	return fs, nil
}
