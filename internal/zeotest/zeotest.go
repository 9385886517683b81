// Package zeotest starts real ZEO servers for tests: runzeo from the
// project's Python venv, and zodbd's own server in process. Tests take the
// server as a parameter (Servers), so that every client test runs against
// each implementation.
package zeotest

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/zodbd/zodbd/fs1"
	"github.com/zodbd/zodbd/internal/datasets"
	"github.com/zodbd/zodbd/zeo"
	"github.com/zodbd/zodbd/zeo/wire"
)

// Server is a ZEO server implementation under test.
type Server struct {
	Name string
	// Start serves the FileStorage file at path (read-write, as storage
	// "1") until the test ends and returns the address to dial (TCP,
	// 127.0.0.1). With msgpack the server announces M5, else Z5.
	Start func(tb testing.TB, path string, msgpack bool) string
}

// Servers lists the implementations every client test runs against.
var Servers = []Server{
	{"runzeo", StartRunzeo},
	{"zodbd", StartZodbd},
}

// skipOrFail skips the test, or fails it when $CI is set (CI must have
// every prerequisite).
func skipOrFail(tb testing.TB, format string, args ...interface{}) {
	tb.Helper()
	if os.Getenv("CI") != "" {
		tb.Fatalf(format, args...)
	}
	tb.Skipf(format, args...)
}

// VenvBin returns the project venv's bin directory (.venv/bin); it skips
// the test when the venv is missing (fails under CI).
func VenvBin(tb testing.TB) string {
	tb.Helper()
	bin := filepath.Join(datasets.RepoRoot(tb), ".venv", "bin")
	if _, err := os.Stat(filepath.Join(bin, "runzeo")); err != nil {
		skipOrFail(tb, "zeotest: no %s/runzeo (run make venv)", bin)
	}
	return bin
}

// FreePort returns a TCP port of 127.0.0.1 that was free a moment ago.
func FreePort(tb testing.TB) int {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// StartRunzeo runs `runzeo -a 127.0.0.1:PORT -f path` from the venv
// (ZEO_MSGPACK=1 for msgpack) until the test ends.
func StartRunzeo(tb testing.TB, path string, msgpack bool) string {
	tb.Helper()
	bin := VenvBin(tb)
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "ZEO_MSGPACK=") {
			env = append(env, kv)
		}
	}
	if msgpack {
		env = append(env, "ZEO_MSGPACK=1")
	}
	return startProcess(tb, "runzeo", env, func(addr string) []string {
		return []string{filepath.Join(bin, "runzeo"), "-a", addr, "-f", path}
	})
}

// StartZodbdProcess runs `zodbd serve -a 127.0.0.1:PORT -f path`
// (--msgpack for msgpack) in its own process until the test ends, for
// measurements that must not share the test's Go runtime with the server.
// The binary is built from this checkout once per test binary.
func StartZodbdProcess(tb testing.TB, path string, msgpack bool) string {
	tb.Helper()
	zodbd := zodbdBinary(tb)
	return startProcess(tb, "zodbd serve", os.Environ(), func(addr string) []string {
		args := []string{zodbd, "serve", "-a", addr, "-f", path}
		if msgpack {
			args = append(args, "--msgpack")
		}
		return args
	})
}

var zodbdBin struct {
	once sync.Once
	path string
	err  error
}

// zodbdBinary builds cmd/zodbd into a temporary directory, once.
func zodbdBinary(tb testing.TB) string {
	tb.Helper()
	root := datasets.RepoRoot(tb)
	zodbdBin.once.Do(func() {
		dir, err := os.MkdirTemp("", "zeotest-zodbd")
		if err != nil {
			zodbdBin.err = err
			return
		}
		zodbdBin.path = filepath.Join(dir, "zodbd")
		out, err := exec.Command("go", "build", "-C", root, "-o", zodbdBin.path, "./cmd/zodbd").CombinedOutput()
		if err != nil {
			zodbdBin.err = fmt.Errorf("go build ./cmd/zodbd: %v\n%s", err, out)
		}
	})
	if zodbdBin.err != nil {
		tb.Fatal(zodbdBin.err)
	}
	return zodbdBin.path
}

// startProcess runs the server argv(addr) on a free port of 127.0.0.1
// until the test ends and returns the address, once it accepts
// connections.
func startProcess(tb testing.TB, name string, env []string, argv func(addr string) []string) string {
	tb.Helper()
	var log bytes.Buffer
	for try := 0; ; try++ {
		addr := fmt.Sprintf("127.0.0.1:%d", FreePort(tb))
		args := argv(addr)
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Env = env
		log.Reset()
		cmd.Stdout = &syncWriter{w: &log}
		cmd.Stderr = cmd.Stdout
		if err := cmd.Start(); err != nil {
			tb.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		if err := waitListening(addr, exited, 30*time.Second); err != nil {
			cmd.Process.Kill()
			if try < 2 && strings.Contains(log.String(), "in use") {
				continue
			}
			tb.Fatalf("%s %v: %v\n%s", name, args[1:], err, log.String())
		}
		tb.Cleanup(func() {
			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
				cmd.Process.Kill()
				<-exited
			}
		})
		return addr
	}
}

type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}

func waitListening(addr string, exited <-chan error, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			return fmt.Errorf("exited: %v", err)
		default:
		}
		nc, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			nc.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("not listening on %s after %v", addr, timeout)
}

// StartZodbd serves path with zodbd's ZEO server (package zeo) in this
// process, on a random port of 127.0.0.1, until the test ends.
func StartZodbd(tb testing.TB, path string, msgpack bool) string {
	tb.Helper()
	fs, err := fs1.Open(path, &fs1.Options{ReadWrite: true, Logf: tb.Logf})
	if err != nil {
		tb.Fatal(err)
	}
	m := wire.Pickle
	if msgpack {
		m = wire.Msgpack
	}
	srv, err := zeo.NewServer(zeo.Config{
		Storages: []zeo.StorageConfig{{Name: "1", Storage: fs}},
		Marshal:  m,
		Logf:     func(string, ...interface{}) {},
	})
	if err != nil {
		fs.Close()
		tb.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	done := make(chan struct{})
	go func() { srv.Serve(ln); close(done) }()
	tb.Cleanup(func() {
		srv.Close()
		<-done
		fs.Close()
	})
	return ln.Addr().String()
}

// Fixture returns a writable copy of fs1/testdata/NAME.fs.
func Fixture(tb testing.TB, name string) string {
	tb.Helper()
	return datasets.CopyFile(tb, filepath.Join(datasets.RepoRoot(tb), "fs1", "testdata", name+".fs"))
}

// Dataset returns a writable copy of benchmark dataset NAME (e.g.
// "prod1-1024"; package datasets makes it when missing) and the reference
// hash lines of testdata/datasets/NAME.hash.
func Dataset(tb testing.TB, name string) (path string, hashes []string) {
	tb.Helper()
	return datasets.CopyFile(tb, datasets.Path(tb, name)), datasets.Hashes(tb, name)
}

// Python runs the venv's python with script (a program text) and args,
// and returns its standard output; it fails the test when python fails.
func Python(tb testing.TB, script string, args ...string) string {
	tb.Helper()
	bin := VenvBin(tb)
	cmd := exec.Command(filepath.Join(bin, "python"), append([]string{"-c", script}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		tb.Fatalf("python: %v\n%s\n%s", err, out, stderr.String())
	}
	return string(out)
}
