package soak

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// Sample is the state of the proxy process at one moment, with the requests answered since the
// previous sample.
type Sample struct {
	Elapsed    time.Duration
	RSSBytes   int64
	Goroutines int
	FDs        int
	InFlight   float64
	QueueDepth float64
	Limit      float64
	Backend    Phase
	// Answers since the previous sample: served, shed, failed (unexpected status or transport
	// error seen by the client).
	OK, Shed, Failed int64
}

// readRSS returns a process's resident set size from /proc/PID/status (VmRSS, in kB).
func readRSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	return parseVmRSS(b)
}

func parseVmRSS(status []byte) (int64, error) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("VmRSS: unexpected %q", rest)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("VmRSS: %w", err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("no VmRSS line")
}

// countFDs returns how many file descriptors a process has open (/proc/PID/fd).
func countFDs(pid int) (int, error) {
	entries, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0, err
	}
	return len(entries), nil
}

// metricSums reads a Prometheus text exposition and returns, for each wanted metric name, the
// sum of its samples (all label sets), and whether it was present.
func metricSums(r io.Reader, names ...string) (map[string]float64, error) {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name := line
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name = line[:i]
		}
		if !want[name] {
			continue
		}
		rest := line[len(name):]
		if strings.HasPrefix(rest, "{") {
			rest = rest[strings.LastIndexByte(rest, '}')+1:]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		out[name] += v
	}
	return out, sc.Err()
}

// scrape reads the proxy's admin /metrics.
func scrape(ctx context.Context, client *http.Client, admin string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, admin+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	res, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/metrics: status %d", res.StatusCode)
	}
	m, err := metricSums(res.Body, "go_goroutines", "loadshed_inflight", "loadshed_queue_depth", "loadshed_limit")
	if err != nil {
		return nil, err
	}
	if _, ok := m["go_goroutines"]; !ok {
		return nil, fmt.Errorf("/metrics: no go_goroutines")
	}
	return m, nil
}

// csvHeader names the columns of samples.csv.
const csvHeader = "elapsed_s,rss_bytes,goroutines,open_fds,inflight,queue_depth,limit,backend_workers,backend_mean_ms,ok,shed,failed"

func (s Sample) csvRow() string {
	return fmt.Sprintf("%.1f,%d,%d,%d,%g,%g,%g,%d,%g,%d,%d,%d",
		s.Elapsed.Seconds(), s.RSSBytes, s.Goroutines, s.FDs, s.InFlight, s.QueueDepth, s.Limit,
		s.Backend.Workers, float64(s.Backend.Mean)/float64(time.Millisecond), s.OK, s.Shed, s.Failed)
}
