package benchenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCountList(t *testing.T) {
	for s, want := range map[string]int{"0": 1, "0-15": 16, "0-3,8-9": 6, "0,2,4": 3} {
		if n, err := countList(s); n != want || err != nil {
			t.Errorf("%q: %d %v, want %d", s, n, err, want)
		}
	}
}

// TestFakeSys reads a made-up /proc and /sys.
func TestFakeSys(t *testing.T) {
	root := t.TempDir()
	write := func(p, s string) {
		p = filepath.Join(root, p)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("proc/cpuinfo", "processor\t: 0\nmodel name\t: Test CPU @ 3GHz\n")
	write("sys/devices/system/cpu/online", "0-7\n")
	write("sys/devices/system/cpu/cpu0/cpufreq/scaling_governor", "performance\n")
	write("sys/devices/system/cpu/cpu1/cpufreq/scaling_governor", "performance\n")
	write("sys/devices/system/cpu/intel_pstate/no_turbo", "1\n")
	for i, st := range []struct{ name, disable string }{{"POLL", "0"}, {"C1", "0"}, {"C6", "1"}} {
		d := filepath.Join("sys/devices/system/cpu/cpu0/cpuidle", "state"+string(rune('0'+i)))
		write(filepath.Join(d, "name"), st.name+"\n")
		write(filepath.Join(d, "disable"), st.disable+"\n")
	}
	old := sysRoot
	sysRoot = root
	defer func() { sysRoot = old }()
	e := Collect("zeo://127.0.0.1:1")
	if e.CPU != "Test CPU @ 3GHz" || e.Cores != 8 || e.Governor != "performance" || e.Boost != "off" ||
		strings.Join(e.IdleStates, ",") != "POLL,C1" || e.Server != "same-host(loopback)" {
		t.Errorf("%+v", e)
	}
	if s := e.String(); !strings.HasPrefix(s, `env: cpu="Test CPU @ 3GHz" cores=8`) || !strings.Contains(s, "idle=POLL,C1") {
		t.Errorf("%s", s)
	}
}

func TestServerLocation(t *testing.T) {
	for target, want := range map[string]string{
		"data/Data.fs":                     "local-file",
		"file:///x/Data.fs":                "local-file",
		"zeo:///tmp/zeo.sock":              "same-host(unix)",
		"zeo://127.0.0.1:8100":             "same-host(loopback)",
		"zeo://localhost:8100":             "same-host(loopback)",
		"zeo://[::1]:8100":                 "same-host(loopback)",
		"neo://db@127.0.0.1:1,127.0.0.2:2": "same-host(loopback)",
		"zeo://192.0.2.1:8100":             "remote", // TEST-NET-1, never local
	} {
		if got := ServerLocation(target); got != want {
			t.Errorf("%s: %s, want %s", target, got, want)
		}
	}
	t.Log(Collect("zeo://127.0.0.1:8100"))
}
