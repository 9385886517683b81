package wrk

import (
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Topic is the default name of a run in benchmark lines: the URL's scheme
// ("zeo", "file", ...), with "-cache" when loads were answered from a
// client cache (not wrk's default, which measures the server).
func Topic(rawurl string, cacheOn bool) string {
	t := "file"
	if u, err := url.Parse(rawurl); err == nil && strings.Contains(rawurl, "://") {
		t = u.Scheme
	}
	if cacheOn {
		t += "-cache"
	}
	return t
}

func us(d time.Duration) float64 { return float64(d) / 1e3 }

// noun is what an operation of the run is: "loads" or "commits".
func (r *Result) noun() string {
	if r.Commit {
		return "commits"
	}
	return "loads"
}

// LoadsPerSec returns the throughput: loads, or commits, per second.
func (r *Result) LoadsPerSec() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Ops) / r.Elapsed.Seconds()
}

// cpuPerOp returns the client process's CPU time per load.
func (r *Result) cpuPerOp() time.Duration {
	if r.Ops == 0 {
		return 0
	}
	return r.CPU / time.Duration(r.Ops)
}

// WriteTable writes the human-readable summary.
func (r *Result) WriteTable(w io.Writer) error {
	cache := "on"
	if r.CacheOff {
		cache = "off"
	}
	h := &r.Latency
	noun := r.noun()
	var sb strings.Builder
	if r.Commit {
		fmt.Fprintf(&sb, "%s: %d committers, %.2fs, cache %s, %d objects of %d bytes\n",
			r.URL, r.Clients, r.Elapsed.Seconds(), cache, r.Objects, r.Bytes)
	} else {
		inflight := ""
		if r.Inflight > 1 {
			inflight = fmt.Sprintf(" (%d loads in flight each)", r.Inflight)
		}
		fmt.Fprintf(&sb, "%s: %d clients%s, %.2fs, cache %s, %d objects (%d bytes) at %s\n",
			r.URL, r.Clients, inflight, r.Elapsed.Seconds(), cache, r.Objects, r.Bytes, r.At)
	}
	fmt.Fprintf(&sb, "  %-12s %d (%.0f %s/s)\n", noun, r.Ops, r.LoadsPerSec(), noun)
	if r.AnsweredBy != "" {
		fmt.Fprintf(&sb, "  answered by  %s\n", r.AnsweredBy)
	}
	fmt.Fprintf(&sb, "  errors       %d", r.Errors)
	if r.FirstErr != nil {
		fmt.Fprintf(&sb, " (first: %v)", r.FirstErr)
	}
	sb.WriteString("\n")
	fmt.Fprintf(&sb, "  latency µs   mean %.1f  p50 %.1f  p90 %.1f  p99 %.1f  p99.9 %.1f  max %.1f\n",
		us(h.Mean()), us(h.Quantile(.50)), us(h.Quantile(.90)), us(h.Quantile(.99)), us(h.Quantile(.999)), us(h.Max()))
	fmt.Fprintf(&sb, "  client CPU   %.2fs (%.2f cores, %.2f µs/%s)\n",
		r.CPU.Seconds(), r.CPU.Seconds()/max(r.Elapsed.Seconds(), 1e-9), us(r.cpuPerOp()), strings.TrimSuffix(noun, "s"))
	if r.Clients > 1 {
		lo, hi := r.PerClient[0], r.PerClient[0]
		for _, n := range r.PerClient {
			lo, hi = min(lo, n), max(hi, n)
		}
		fmt.Fprintf(&sb, "  per client   %d..%d %s\n", lo, hi, noun)
	}
	_, err := io.WriteString(w, sb.String())
	return err
}

// BenchLine returns the run as a line of Go's benchmark format, which
// benchstat reads:
//
//	BenchmarkZwrk/zeo/c=4  123456  16201 ns/op  61728 loads/s  58.0 p50-µs ...
//
// ns/op is wall time per load (the inverse of the throughput); the
// latency quantiles are per load; cpu-µs/op is this process's CPU time
// per load. The commit workload's line is BenchmarkZwrkCommit, with
// commits/s, and its quantiles are those of whole commits.
func (r *Result) BenchLine(topic string) string {
	h := &r.Latency
	nsop := 0.0
	if r.Ops > 0 {
		nsop = float64(r.Elapsed.Nanoseconds()) / float64(r.Ops)
	}
	name := "Zwrk"
	if r.Commit {
		name = "ZwrkCommit"
	}
	return fmt.Sprintf("Benchmark%s/%s/c=%d\t%d\t%.1f ns/op\t%.0f %s/s\t%s p50-µs\t%s p90-µs\t%s p99-µs\t%s p99.9-µs\t%s max-µs\t%s cpu-µs/op\t%d errors",
		name, topic, r.Clients, r.Ops, nsop, r.LoadsPerSec(), r.noun(),
		num(us(h.Quantile(.50))), num(us(h.Quantile(.90))), num(us(h.Quantile(.99))), num(us(h.Quantile(.999))), num(us(h.Max())),
		num(us(r.cpuPerOp())), r.Errors)
}

// num formats v with 4 significant digits, without an exponent.
func num(v float64) string {
	switch {
	case v >= 1000:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strconv.FormatFloat(v, 'f', 3, 64)
}

// WriteBench writes the benchmark-format header lines (goos, goarch, cpu)
// and the run's line.
func (r *Result) WriteBench(w io.Writer, topic, cpu string) error {
	_, err := fmt.Fprintf(w, "goos: %s\ngoarch: %s\ncpu: %s\n%s\n", runtime.GOOS, runtime.GOARCH, cpu, r.BenchLine(topic))
	return err
}

// jsonResult is the --json form. Key names follow bench/pingpong's
// (ops_per_s, latency_ns, histogram_ns), so that scripts read both.
type jsonResult struct {
	Tool         string      `json:"tool"`
	Workload     string      `json:"workload"` // "loads" or "commits"
	URL          string      `json:"url"`
	Clients      int         `json:"clients"`
	Inflight     int         `json:"inflight"`
	Cache        string      `json:"cache"`
	AnsweredBy   string      `json:"answered_by,omitempty"`
	At           string      `json:"at"`
	Objects      int         `json:"objects"`
	Bytes        int64       `json:"bytes"`
	DurationS    float64     `json:"duration_s"`
	Ops          uint64      `json:"ops"`
	OpsPerS      float64     `json:"ops_per_s"`
	Errors       uint64      `json:"errors"`
	FirstError   string      `json:"first_error,omitempty"`
	CPUS         float64     `json:"cpu_s"`
	CPUNsPerOp   float64     `json:"cpu_ns_per_op"`
	LatencyNs    latency     `json:"latency_ns"`
	PerClientOps []uint64    `json:"per_client_ops"`
	Env          interface{} `json:"env,omitempty"`
	Benchfmt     string      `json:"benchfmt"`
	HistogramNs  [][3]uint64 `json:"histogram_ns"`
}

type latency struct {
	Mean float64 `json:"mean"`
	Min  float64 `json:"min"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	P999 float64 `json:"p99.9"`
	Max  float64 `json:"max"`
}

// JSON returns the run as one line of JSON; env (may be nil) is included
// as is.
func (r *Result) JSON(topic string, env interface{}) ([]byte, error) {
	h := &r.Latency
	cache := "on"
	if r.CacheOff {
		cache = "off"
	}
	j := jsonResult{
		Tool: "zodbd wrk", Workload: r.noun(), URL: r.URL, Clients: r.Clients, Inflight: max(r.Inflight, 1), Cache: cache, AnsweredBy: r.AnsweredBy, At: r.At.String(),
		Objects: r.Objects, Bytes: r.Bytes, DurationS: r.Elapsed.Seconds(),
		Ops: r.Ops, OpsPerS: r.LoadsPerSec(), Errors: r.Errors,
		CPUS: r.CPU.Seconds(), CPUNsPerOp: float64(r.cpuPerOp()),
		LatencyNs: latency{
			Mean: float64(h.Mean()), Min: float64(h.Min()),
			P50: float64(h.Quantile(.50)), P90: float64(h.Quantile(.90)), P99: float64(h.Quantile(.99)),
			P999: float64(h.Quantile(.999)), Max: float64(h.Max()),
		},
		PerClientOps: r.PerClient,
		Env:          env,
		Benchfmt:     r.BenchLine(topic),
		HistogramNs:  h.Buckets(),
	}
	if r.FirstErr != nil {
		j.FirstError = r.FirstErr.Error()
	}
	return json.Marshal(j)
}
