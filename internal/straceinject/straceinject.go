// Package straceinject makes system calls of a running process fail, for
// tests of what a program does after an I/O error it cannot provoke
// otherwise (an fsync that fails with EIO): strace attached to every
// thread of the process, with a fault injected into the named calls on
// one file. Tests that use it are skipped where strace is missing or
// cannot attach (no ptrace permission).
package straceinject

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// Attach attaches strace to every thread of process pid so that the calls
// of inject (strace's syntax after "inject=": "fsync,fdatasync:error=EIO",
// ":when=1" for the first call of each thread only) on the file at path
// fail, and returns once every thread is traced. detach stops it (strace
// detaches and exits); it is also called when tb ends. The test is skipped
// without strace, or when strace could not attach to every thread.
func Attach(tb testing.TB, pid int, path, inject string) (detach func()) {
	tb.Helper()
	strace, err := exec.LookPath("strace")
	if err != nil {
		tb.Skip("needs strace for the fault injection")
	}
	calls, _, _ := strings.Cut(inject, ":")
	cmd := exec.Command(strace, "-f", "-p", strconv.Itoa(pid), "-o", "/dev/null",
		"-P", path, "-e", "trace="+calls, "-e", "inject="+inject)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		tb.Fatal(err)
	}
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err := cmd.Start(); err != nil {
		tb.Skipf("strace: %v", err)
	}
	var once sync.Once
	detach = func() {
		once.Do(func() {
			cmd.Process.Signal(os.Interrupt)
			cmd.Wait()
		})
	}
	tb.Cleanup(detach)
	sc := bufio.NewScanner(stderr)
	attached := 0
	for attached < len(tasks) && sc.Scan() {
		line := sc.Text()
		tb.Logf("strace: %s", line)
		if i := strings.Index(line, "attached with "); i >= 0 {
			n, _ := strconv.Atoi(strings.Fields(line[i+len("attached with "):])[0])
			attached += n
		} else if strings.Contains(line, "attached") {
			attached++
		}
	}
	if attached < len(tasks) {
		detach()
		tb.Skipf("strace attached %d of %d threads", attached, len(tasks))
	}
	go func() {
		for sc.Scan() {
		}
	}()
	return detach
}
