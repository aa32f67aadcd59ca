package lab

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Bounds on hop input.
const (
	// MaxHop is the largest hop or worker overhead a spec or file may give.
	MaxHop = time.Minute
	// MaxHopSamples bounds the rows of a hop file read into memory.
	MaxHopSamples = 1_000_000
)

// Hop is what each admitted request pays beyond the backend's service-time model on its way
// through the proxy to the backend and back. Far from capacity it is noise; near a utilisation
// of 1 it decides whether a standing queue builds. The zero value is no hop (the published
// scenario and every run that does not ask for one).
type Hop struct {
	// Path is drawn once per admitted request: the request reaches the backend that long after
	// it was admitted (the way through the proxy, the network, the backend's HTTP handling, and
	// the way back, lumped on the way in). It holds the strategy's permit, not a worker.
	Path HopDist
	// Worker is added to every service time: what the backend spends per request beyond its
	// service-time model while a worker is held (the timer's lateness, writing the answer,
	// handing the worker on). It lowers the backend's capacity to Servers / (mean + Worker).
	Worker time.Duration
}

// IsZero reports whether the hop costs nothing.
func (h Hop) IsZero() bool { return h.Path.IsZero() && h.Worker == 0 }

// String describes the hop for reports, in the syntax ParseHop reads (a file's samples are
// summarised).
func (h Hop) String() string {
	if h.IsZero() {
		return "none"
	}
	var parts []string
	if !h.Path.IsZero() {
		parts = append(parts, h.Path.String())
	}
	if h.Worker > 0 {
		parts = append(parts, "worker="+h.Worker.String())
	}
	return strings.Join(parts, ",")
}

// HopDist is a distribution of path hops: a constant, or the empirical distribution of measured
// samples (each admitted request draws one of them uniformly, from the run's seed).
type HopDist struct {
	// Const is the hop when Samples is empty.
	Const time.Duration
	// Samples, when not empty, are the measured hops (sorted); File names the file they were
	// read from ("" for samples measured in this run).
	Samples []time.Duration
	File    string
}

// IsZero reports whether every draw is 0.
func (d HopDist) IsZero() bool { return len(d.Samples) == 0 && d.Const == 0 }

// Mean is the distribution's mean.
func (d HopDist) Mean() time.Duration {
	if len(d.Samples) == 0 {
		return d.Const
	}
	var sum int64
	for _, s := range d.Samples {
		sum += int64(s)
	}
	return time.Duration(sum / int64(len(d.Samples)))
}

// Quantile returns the nearest-rank quantile q (0 < q <= 1) of the distribution.
func (d HopDist) Quantile(q float64) time.Duration {
	if len(d.Samples) == 0 {
		return d.Const
	}
	return Percentile(d.Samples, int(q*10000+0.5), 10000)
}

func (d HopDist) String() string {
	if len(d.Samples) == 0 {
		return "path=" + d.Const.String()
	}
	src := "measured"
	if d.File != "" {
		src = "file=" + d.File
	}
	return fmt.Sprintf("%s (%d samples, p50 %s, p99 %s)", src, len(d.Samples),
		d.Quantile(0.5).Round(time.Microsecond), d.Quantile(0.99).Round(time.Microsecond))
}

// hopSampler draws path hops for one run.
type hopSampler struct {
	d   HopDist
	rng *rand.Rand
}

func newHopSampler(d HopDist, seed uint64) *hopSampler {
	// Its own stream, so a hop never changes the service times or the jitter of a run.
	return &hopSampler{d: d, rng: rand.New(rand.NewPCG(seed, 0x40b0ca11ab1e))}
}

func (s *hopSampler) sample() time.Duration {
	if len(s.d.Samples) == 0 {
		return s.d.Const
	}
	return s.d.Samples[s.rng.IntN(len(s.d.Samples))]
}

// ParseHop parses a --hop spec:
//
//	none | 0                          no hop
//	1.2ms                             every request pays 1.2 ms on the path (path=1.2ms)
//	path=1.2ms,worker=1ms             a constant path hop, and 1 ms more per request in a worker
//	file=hop.csv,worker=1ms           path hops drawn from measured samples (lab calibrate --out)
func ParseHop(spec string) (Hop, error) {
	spec = strings.TrimSpace(spec)
	var h Hop
	switch spec {
	case "", "none", "0":
		return h, nil
	}
	if !strings.Contains(spec, "=") {
		spec = "path=" + spec
	}
	kv, err := parseKV(spec, []string{"path", "file", "worker"})
	if err != nil {
		return h, fmt.Errorf("hop %q: %w", spec, err)
	}
	dur := func(key string) (time.Duration, error) {
		d, err := durKey(kv, key)
		if err == nil && (d < 0 || d > MaxHop) {
			err = fmt.Errorf("%s: must be in [0, %s], got %s", key, MaxHop, d)
		}
		return d, err
	}
	_, hasPath := kv["path"]
	file, hasFile := kv["file"]
	if hasPath && hasFile {
		return h, fmt.Errorf("hop %q: path and file: give one (a constant or measured samples)", spec)
	}
	if hasPath {
		if h.Path.Const, err = dur("path"); err != nil {
			return h, fmt.Errorf("hop %q: %w", spec, err)
		}
	}
	if hasFile {
		if file == "" {
			return h, fmt.Errorf("hop %q: file: empty (want the CSV lab calibrate --out writes)", spec)
		}
		f, err := os.Open(file)
		if err != nil {
			return h, fmt.Errorf("hop %q: file: %w", spec, err)
		}
		defer f.Close()
		samples, err := ReadHopSamples(f)
		if err != nil {
			return h, fmt.Errorf("hop %q: file %s: %w", spec, file, err)
		}
		h.Path = HopDist{Samples: samples, File: file}
	}
	if _, ok := kv["worker"]; ok {
		if h.Worker, err = dur("worker"); err != nil {
			return h, fmt.Errorf("hop %q: %w", spec, err)
		}
	}
	return h, nil
}

// A hop file is CSV with a header row and one column, hop_ms: one measured path hop per row,
// in milliseconds with up to 6 decimals.
//
//	hop_ms
//	0.734
//	1.102

// WriteHopSamples writes samples as a hop file.
func WriteHopSamples(w io.Writer, samples []time.Duration) error {
	cw := csv.NewWriter(w)
	if err := cw.Write([]string{"hop_ms"}); err != nil {
		return err
	}
	for _, s := range samples {
		if err := cw.Write([]string{strconv.FormatFloat(float64(s)/1e6, 'f', 3, 64)}); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// ReadHopSamples reads a hop file and returns its samples, sorted.
func ReadHopSamples(r io.Reader) ([]time.Duration, error) {
	cr := csv.NewReader(r)
	cr.TrimLeadingSpace = true
	header, err := cr.Read()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("empty file (want a header row hop_ms)")
		}
		return nil, err
	}
	if len(header) != 1 || strings.TrimSpace(header[0]) != "hop_ms" {
		return nil, fmt.Errorf("header %q: want the one column hop_ms", strings.Join(header, ","))
	}
	var out []time.Duration
	for line := 2; ; line++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if len(out) == MaxHopSamples {
			return nil, fmt.Errorf("more than %d samples", MaxHopSamples)
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rec[0]), 64)
		if err != nil || !(v >= 0) || v > float64(MaxHop/time.Millisecond) {
			return nil, fmt.Errorf("line %d: hop_ms: %q is not a number of milliseconds in [0, %d]", line, rec[0], MaxHop/time.Millisecond)
		}
		out = append(out, time.Duration(v*1e6+0.5))
	}
	if len(out) == 0 {
		return nil, errors.New("no samples")
	}
	slices.Sort(out)
	return out, nil
}
