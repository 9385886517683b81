// Package benchenv describes the machine a benchmark tool runs on, so that
// its results can be read in context: CPU model, cores online, GOMAXPROCS,
// the cpufreq governor and boost state, the enabled CPU idle states, the
// kernel, and whether the server under test runs on the same host.
//
// Every fact is best effort: what cannot be read (another OS, a container
// without /sys) is reported as "?".
package benchenv

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
)

// Env is the environment of a benchmark run.
type Env struct {
	CPU        string   `json:"cpu"`         // model name
	Cores      int      `json:"cores"`       // CPUs online
	GOMAXPROCS int      `json:"gomaxprocs"`  // of this process
	Governor   string   `json:"governor"`    // cpufreq scaling governor(s), "?" if unknown
	Boost      string   `json:"boost"`       // "on", "off" or "?"
	IdleStates []string `json:"idle_states"` // enabled cpuidle states of cpu0; nil if unknown
	Kernel     string   `json:"kernel"`      // uname: sysname release machine
	Server     string   `json:"server"`      // where the server is, relative to this host
}

// Collect gathers the environment; target is the URL of the storage or
// server under test (see ServerLocation).
func Collect(target string) Env {
	return Env{
		CPU:        cpuModel(),
		Cores:      coresOnline(),
		GOMAXPROCS: runtime.GOMAXPROCS(0),
		Governor:   governor(),
		Boost:      boost(),
		IdleStates: idleStates(),
		Kernel:     kernel(),
		Server:     ServerLocation(target),
	}
}

// String formats e as one line:
//
//	env: cpu="AMD EPYC" cores=2 gomaxprocs=2 governor=? boost=? idle=? kernel="Linux 6.1 x86_64" server=same-host(loopback)
func (e Env) String() string {
	idle := "?"
	if e.IdleStates != nil {
		idle = strings.Join(e.IdleStates, ",")
		if idle == "" {
			idle = "none"
		}
	}
	return fmt.Sprintf("env: cpu=%q cores=%d gomaxprocs=%d governor=%s boost=%s idle=%s kernel=%q server=%s",
		e.CPU, e.Cores, e.GOMAXPROCS, e.Governor, e.Boost, idle, e.Kernel, e.Server)
}

// sysRoot is where /proc and /sys are read from (tests change it).
var sysRoot = "/"

func readTrim(path string) (string, bool) {
	b, err := os.ReadFile(filepath.Join(sysRoot, path))
	if err != nil {
		return "", false
	}
	return strings.TrimSpace(string(b)), true
}

func cpuModel() string {
	b, err := os.ReadFile(filepath.Join(sysRoot, "proc/cpuinfo"))
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch strings.TrimSpace(k) {
		case "model name", "Model", "cpu model", "Hardware":
			if v = strings.TrimSpace(v); v != "" {
				return v
			}
		}
	}
	return "?"
}

// coresOnline counts the CPUs in /sys/devices/system/cpu/online ("0-3,8").
func coresOnline() int {
	s, ok := readTrim("sys/devices/system/cpu/online")
	if !ok {
		return runtime.NumCPU()
	}
	n, err := countList(s)
	if err != nil {
		return runtime.NumCPU()
	}
	return n
}

func countList(s string) (int, error) {
	n := 0
	for _, part := range strings.Split(s, ",") {
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return 0, err
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil {
				return 0, err
			}
		}
		n += b - a + 1
	}
	return n, nil
}

// governor reports the distinct scaling governors of the CPUs.
func governor() string {
	paths, _ := filepath.Glob(filepath.Join(sysRoot, "sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor"))
	seen := map[string]bool{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err == nil {
			seen[strings.TrimSpace(string(b))] = true
		}
	}
	if len(seen) == 0 {
		return "?"
	}
	var g []string
	for k := range seen {
		g = append(g, k)
	}
	sort.Strings(g)
	return strings.Join(g, ",")
}

func boost() string {
	if s, ok := readTrim("sys/devices/system/cpu/cpufreq/boost"); ok {
		return onOff(s == "1")
	}
	if s, ok := readTrim("sys/devices/system/cpu/intel_pstate/no_turbo"); ok {
		return onOff(s == "0")
	}
	return "?"
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// idleStates lists the names of cpu0's enabled idle states.
func idleStates() []string {
	dirs, _ := filepath.Glob(filepath.Join(sysRoot, "sys/devices/system/cpu/cpu0/cpuidle/state[0-9]*"))
	if len(dirs) == 0 {
		return nil
	}
	sort.Slice(dirs, func(i, j int) bool {
		a, _ := strconv.Atoi(strings.TrimPrefix(filepath.Base(dirs[i]), "state"))
		b, _ := strconv.Atoi(strings.TrimPrefix(filepath.Base(dirs[j]), "state"))
		return a < b
	})
	states := []string{}
	for _, d := range dirs {
		name, err := os.ReadFile(filepath.Join(d, "name"))
		if err != nil {
			continue
		}
		if dis, err := os.ReadFile(filepath.Join(d, "disable")); err == nil && strings.TrimSpace(string(dis)) != "0" {
			continue
		}
		states = append(states, strings.TrimSpace(string(name)))
	}
	return states
}

// ServerLocation says where the storage named by target (a storage URL or
// a file path) is relative to this host:
//
//	local-file                  a file (no server)
//	same-host(unix)             a Unix socket
//	same-host(loopback)         every host address is a loopback address
//	same-host(interface)        every host address is one of this host's
//	remote                      some address is not local
//	?(reason)                   unknown (the name does not resolve, ...)
//
// A URL may name several hosts separated by commas (a NEO cluster's
// masters); all must be local for same-host.
func ServerLocation(target string) string {
	if !strings.Contains(target, "://") {
		return "local-file"
	}
	u, err := url.Parse(target)
	if err != nil {
		return "?(bad URL)"
	}
	if u.Scheme == "file" {
		return "local-file"
	}
	if u.Host == "" {
		return "same-host(unix)"
	}
	local := map[string]bool{}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				local[ipn.IP.String()] = true
			}
		}
	}
	kind := "loopback"
	for _, hp := range strings.Split(u.Host, ",") {
		host := hp
		if h, _, err := net.SplitHostPort(hp); err == nil {
			host = h
		}
		host = strings.Trim(host, "[]")
		ips, err := net.LookupIP(host)
		if err != nil || len(ips) == 0 {
			return "?(cannot resolve " + host + ")"
		}
		for _, ip := range ips {
			switch {
			case ip.IsLoopback():
			case local[ip.String()]:
				kind = "interface"
			default:
				return "remote"
			}
		}
	}
	return "same-host(" + kind + ")"
}
