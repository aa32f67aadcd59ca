// Package selfload watches the sidecar's own CPU, so that its saturation is told apart from the
// upstream's.
//
// A sidecar whose core is busy (a fast upstream, a closed loop of many connections, a CPU limit
// that throttles the container) delays every request it handles: goroutines wait to run. Timed
// from outside, that delay looks like a slower upstream, and a latency-driven limit would shrink
// on its account — refusing work the upstream could do, which frees no CPU the sidecar needs.
// The monitor measures the delay from the Go runtime's scheduling latency (runtime/metrics
// /sched/latencies:seconds: how long runnable goroutines waited to run) and the container's CPU
// throttling (cgroup cpu.stat), once per tick:
//
//   - Delay is the sidecar's own delay per request: the waits for the CPU on a request's path
//     (Hops), each the tick's mean scheduling latency, except the wait of the goroutine that the
//     upstream's answer wakes: that one is measured by a probe (a byte through a pipe every
//     Tick/5, and the time until the goroutine reading it runs), because the scheduling latency
//     misses the time a ready connection waits for the network poller, which on a saturated
//     core is as long again. The probe runs only while the process used ProbeBusy or more of
//     its CPU in the last tick: below that its goroutines seldom wait behind each other, and
//     the probe's fifty wake-ups a second were two fifths of what an idle sidecar spent.
//     The gate takes the delay off each upstream latency sample, so the adaptive limit judges
//     the upstream alone.
//   - Saturated reports a delay of SaturatedAbove or more, or a throttled share of the tick's
//     CFS periods of a tenth or more (a gauge and an alert rule show it).
//   - Shed is the share of new requests to refuse at the door (503, reason sidecar_overload)
//     while the delay stays above ShedAbove and the process uses nearly all the CPU it may
//     (Busy, from its CPU time against GOMAXPROCS): under open-loop overload beyond the sidecar's
//     own capacity, answering some requests cheaply at once keeps the others' latency bounded
//     instead of letting every request wait for the CPU. (A delay that other processes cause,
//     while this one has CPU to spare, is not helped by refusing: it is only reported.) The
//     share grows by a twentieth per tick while both hold, halves once the delay is below half
//     of ShedAbove or the process is no longer busy, and never reaches 1 (critical_plus
//     requests are not refused by it at all: see the gate).
package selfload

import (
	"bufio"
	"bytes"
	"context"
	"math"
	"os"
	"runtime"
	"runtime/metrics"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
)

// Tick is how often the proxy measures: as often as the adaptive limit's shortest window.
const Tick = 100 * time.Millisecond

// Hops is the number of waits for the CPU on a forwarded request's path between its forwarding
// and its response headers, at most: through net/http's Transport its writer, its reader and the
// request's own goroutine are each woken once, and the reader's wake-up is the answer's I/O.
// (The proxy's own HTTP/1.1 client has only the I/O wake-up: for its exchanges the delay is
// overestimated, which errs towards not shrinking the limit while the sidecar is saturated.)
const Hops = 3

// ProbeBusy is the share of its CPU (GOMAXPROCS) the process must have used in a tick for the
// I/O probe to run in the next one.
const ProbeBusy = 0.25

// Config tunes the monitor.
type Config struct {
	// SaturatedAbove: a delay at least this marks the sidecar saturated (default 1 ms).
	SaturatedAbove time.Duration
	// ShedAbove: while the delay is above this the door refuses a growing share of new
	// requests; 0 never refuses.
	ShedAbove time.Duration
}

// Readings are what one tick measured.
type Readings struct {
	// Delay is the sidecar's own delay per request (smoothed).
	Delay time.Duration
	// SchedMean and SchedP99 summarise the tick's scheduling latencies; Wakeups counts them
	// (the runtime samples a share of goroutine wake-ups).
	SchedMean, SchedP99 time.Duration
	Wakeups             uint64
	// IOWait is the mean wait of the tick's I/O probes (0 with none): from a byte written to
	// the goroutine reading it running.
	IOWait time.Duration
	Probes uint64
	// Throttled is the share of the tick's CFS periods in which the container was throttled
	// (0 without a CPU limit), ThrottledTime the time it spent throttled.
	Throttled     float64
	ThrottledTime time.Duration
	// Busy is the share of the CPU the process may use (GOMAXPROCS) that it used in the tick.
	Busy      float64
	Saturated bool
	Shed      float64
}

// Source reads the raw counters; tests substitute fakes.
type Source struct {
	// Sched returns the cumulative scheduling-latency histogram (bucket counts and their
	// boundaries, in seconds).
	Sched func() (counts []uint64, bounds []float64)
	// CPUStat returns the cgroup's cumulative CFS periods, throttled periods and throttled time;
	// ok false when there is no CPU limit to read.
	CPUStat func() (periods, throttled uint64, throttledTime time.Duration, ok bool)
	// CPUTime returns the process's cumulative CPU time (user and system), Now the time, and
	// Procs the CPUs it may use at once (GOMAXPROCS).
	CPUTime func() time.Duration
	Now     func() time.Time
	Procs   func() int
	// IOWait returns the I/O probes' cumulative wait and count (nil: a probe that Run starts).
	IOWait func() (total time.Duration, n uint64)
}

// Monitor holds the sidecar's self-load estimate. Its accessors are safe for concurrent use and
// cost an atomic load.
type Monitor struct {
	cfg Config
	src Source

	delay atomic.Int64  // nanoseconds
	shed  atomic.Uint64 // float64 bits
	sat   atomic.Bool
	last  atomic.Pointer[Readings]

	// Tick state (Tick is not called concurrently).
	prevCounts, delta         []uint64
	prevPeriods, prevThrottle uint64
	prevThrottledTime         time.Duration
	havePrevCPU               bool
	prevUsed                  time.Duration
	prevAt                    time.Time
	smoothed                  float64
	prevIO                    time.Duration
	prevProbes                uint64

	probe *ioProbe // the default IOWait source, run by Run
}

// New returns a monitor reading src (zero fields: the Go runtime and this process's cgroup).
func New(cfg Config, src Source) *Monitor {
	if cfg.SaturatedAbove <= 0 {
		cfg.SaturatedAbove = time.Millisecond
	}
	if src.Sched == nil {
		src.Sched = runtimeSched()
	}
	if src.CPUStat == nil {
		src.CPUStat = cgroupCPUStat(cgroupCPUStatPath())
	}
	if src.CPUTime == nil {
		src.CPUTime = processCPUTime
	}
	if src.Now == nil {
		src.Now = time.Now
	}
	if src.Procs == nil {
		src.Procs = func() int { return runtime.GOMAXPROCS(0) }
	}
	var probe *ioProbe
	if src.IOWait == nil {
		probe = &ioProbe{kick: make(chan struct{}, 1)}
		src.IOWait = probe.read
	}
	m := &Monitor{cfg: cfg, src: src, probe: probe}
	m.last.Store(&Readings{})
	m.prevCounts, _ = src.Sched()
	m.prevCounts = append([]uint64(nil), m.prevCounts...)
	if p, t, tt, ok := src.CPUStat(); ok {
		m.prevPeriods, m.prevThrottle, m.prevThrottledTime, m.havePrevCPU = p, t, tt, true
	}
	m.prevUsed, m.prevAt = src.CPUTime(), src.Now()
	m.prevIO, m.prevProbes = src.IOWait()
	return m
}

// Delay is the sidecar's own delay per forwarded request, as last measured.
func (m *Monitor) Delay() time.Duration {
	if m == nil {
		return 0
	}
	return time.Duration(m.delay.Load())
}

// Shed is the share of new requests the door should refuse now (0 almost always).
func (m *Monitor) Shed() float64 {
	if m == nil {
		return 0
	}
	return math.Float64frombits(m.shed.Load())
}

// Saturated reports whether the sidecar's own CPU was its bottleneck in the last tick.
func (m *Monitor) Saturated() bool { return m != nil && m.sat.Load() }

// Last returns the readings of the last tick.
func (m *Monitor) Last() Readings { return *m.last.Load() }

// Run ticks every interval until ctx ends.
func (m *Monitor) Run(ctx context.Context, every time.Duration) {
	if m.probe != nil {
		go m.probe.run(ctx, every/5)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.Tick()
		}
	}
}

// Tick takes one measurement: the scheduling latencies and throttling since the previous tick.
func (m *Monitor) Tick() Readings {
	var r Readings
	counts, bounds := m.src.Sched()
	var sum float64
	var n uint64
	m.delta = append(m.delta[:0], make([]uint64, len(counts))...)
	delta := m.delta
	for i, c := range counts {
		if i < len(m.prevCounts) && c >= m.prevCounts[i] {
			delta[i] = c - m.prevCounts[i]
		} else {
			delta[i] = c
		}
		n += delta[i]
		sum += float64(delta[i]) * mid(bounds, i)
	}
	m.prevCounts = append(m.prevCounts[:0], counts...)
	if n > 0 {
		r.Wakeups = n
		r.SchedMean = seconds(sum / float64(n))
		r.SchedP99 = seconds(quantile(delta, bounds, n, 0.99))
	}
	ioTotal, probes := m.src.IOWait()
	if probes > m.prevProbes {
		r.Probes = probes - m.prevProbes
		r.IOWait = (ioTotal - m.prevIO) / time.Duration(r.Probes)
	}
	m.prevIO, m.prevProbes = ioTotal, probes
	// The answer's wake-up: measured when a probe came through in the tick, else taken as one
	// more scheduling wait.
	answer := r.SchedMean
	if r.Probes > 0 {
		answer = r.IOWait
	}
	// Smooth over about two ticks: one busy tick (a GC cycle) is not saturation.
	m.smoothed = 0.5*m.smoothed + 0.5*(float64(Hops-1)*float64(r.SchedMean)+float64(answer))
	r.Delay = time.Duration(m.smoothed)

	if p, t, tt, ok := m.src.CPUStat(); ok {
		if m.havePrevCPU && p > m.prevPeriods {
			r.Throttled = float64(t-min(t, m.prevThrottle)) / float64(p-m.prevPeriods)
			r.ThrottledTime = max(tt-m.prevThrottledTime, 0)
		}
		m.prevPeriods, m.prevThrottle, m.prevThrottledTime, m.havePrevCPU = p, t, tt, true
	}
	r.Saturated = r.Delay >= m.cfg.SaturatedAbove || r.Throttled >= 0.1

	used, now := m.src.CPUTime(), m.src.Now()
	if wall := now.Sub(m.prevAt); wall > 0 {
		r.Busy = float64(used-m.prevUsed) / (float64(wall) * float64(max(m.src.Procs(), 1)))
	}
	m.prevUsed, m.prevAt = used, now
	if m.probe != nil {
		m.probe.enable(r.Busy >= ProbeBusy)
	}

	shed := m.Shed()
	switch above := m.cfg.ShedAbove; {
	case above <= 0:
		shed = 0
	case r.Delay > above && r.Busy >= busyToShed:
		shed = min(shed+0.05, maxShed)
	case r.Delay < above/2 || r.Busy < busyToShed*0.8:
		shed /= 2
		if shed < 0.01 {
			shed = 0
		}
	}
	r.Shed = shed
	m.delay.Store(int64(r.Delay))
	m.shed.Store(math.Float64bits(shed))
	m.sat.Store(r.Saturated)
	m.last.Store(&r)
	return r
}

// ioProbe measures the wait a goroutine woken by I/O has before it runs, as the goroutine that
// reads an upstream's answer has: a byte is written to a pipe, and the goroutine blocked reading
// it notes how long it took to run. On an idle core that is microseconds; on a saturated one it
// includes the time until the scheduler next polls the network, which the scheduling-latency
// histogram does not count.
type ioProbe struct {
	total atomic.Int64 // nanoseconds
	n     atomic.Uint64
	on    atomic.Bool   // probes are sent (Tick sets it from the process's busy share)
	kick  chan struct{} // tells run that on changed (buffered: one pending kick is enough)
}

// enable turns the probes on or off.
func (p *ioProbe) enable(on bool) {
	if p.on.Swap(on) != on {
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
}

func (p *ioProbe) read() (time.Duration, uint64) {
	return time.Duration(p.total.Load()), p.n.Load()
}

// run sends a probe every interval (while none is on its way, and while the probes are on)
// until ctx ends.
func (p *ioProbe) run(ctx context.Context, every time.Duration) {
	r, w, err := os.Pipe()
	if err != nil {
		return // no probe: the delay falls back to scheduling latencies alone
	}
	base := time.Now()
	var sent atomic.Int64 // since base, when the pending probe was written; 0: none pending
	go func() {
		defer r.Close()
		var b [1]byte
		for {
			if _, err := r.Read(b[:]); err != nil {
				return // the writer closed: ctx ended
			}
			if at := sent.Swap(0); at != 0 {
				p.total.Add(int64(time.Since(base)) - at)
				p.n.Add(1)
			}
		}
	}()
	defer w.Close()
	t := time.NewTicker(every)
	defer t.Stop()
	if !p.on.Load() {
		t.Stop()
	}
	one := []byte{0}
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
			if p.on.Load() {
				t.Reset(every)
			} else {
				t.Stop()
			}
		case <-t.C:
			if !p.on.Load() {
				continue // due as the probes were turned off
			}
			if sent.Load() != 0 {
				continue // the last one has not been read yet: it is still being measured
			}
			sent.Store(max(int64(time.Since(base)), 1))
			if _, err := w.Write(one); err != nil {
				return
			}
		}
	}
}

// busyToShed is how much of its CPU the process must be using for its delay to be its own doing.
const busyToShed = 0.9

// maxShed: the door never refuses every request; the rest still finds out whether the
// overload has passed.
const maxShed = 0.95

// mid is a bucket's representative value in seconds: its midpoint, or its finite edge for the
// open-ended first and last buckets.
func mid(bounds []float64, i int) float64 {
	if i+1 >= len(bounds) {
		return 0
	}
	lo, hi := bounds[i], bounds[i+1]
	switch {
	case math.IsInf(lo, -1):
		return max(hi, 0)
	case math.IsInf(hi, 1):
		return lo
	}
	return (lo + hi) / 2
}

// quantile returns the q-quantile (the upper bound of the bucket it falls in) of n weights.
func quantile(delta []uint64, bounds []float64, n uint64, q float64) float64 {
	target := uint64(math.Ceil(q * float64(n)))
	var acc uint64
	for i, c := range delta {
		acc += c
		if acc >= target && i+1 < len(bounds) {
			if math.IsInf(bounds[i+1], 1) {
				return bounds[i]
			}
			return bounds[i+1]
		}
	}
	return 0
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// runtimeSched reads the Go runtime's scheduling-latency histogram.
func runtimeSched() func() ([]uint64, []float64) {
	sample := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	return func() ([]uint64, []float64) {
		metrics.Read(sample)
		if sample[0].Value.Kind() != metrics.KindFloat64Histogram {
			return nil, nil
		}
		h := sample[0].Value.Float64Histogram()
		return h.Counts, h.Buckets
	}
}

// processCPUTime is this process's CPU time so far, user and system.
func processCPUTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// cgroupCPUStatPath is the cpu.stat of this process's cgroup: the unified hierarchy's (v2), or
// the cpu controller's (v1).
func cgroupCPUStatPath() string {
	for _, p := range []string{"/sys/fs/cgroup/cpu.stat", "/sys/fs/cgroup/cpu,cpuacct/cpu.stat", "/sys/fs/cgroup/cpu/cpu.stat"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return ""
}

// cgroupCPUStat reads CFS throttling from a cpu.stat file: nr_periods, nr_throttled, and
// throttled_usec (v2) or throttled_time in nanoseconds (v1). ok is false without the file or
// without a CPU limit (no periods).
func cgroupCPUStat(path string) func() (uint64, uint64, time.Duration, bool) {
	return func() (periods, throttled uint64, throttledTime time.Duration, ok bool) {
		if path == "" {
			return 0, 0, 0, false
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return 0, 0, 0, false
		}
		sc := bufio.NewScanner(bytes.NewReader(data))
		for sc.Scan() {
			key, val, found := bytes.Cut(sc.Bytes(), []byte{' '})
			if !found {
				continue
			}
			v, err := strconv.ParseUint(string(bytes.TrimSpace(val)), 10, 64)
			if err != nil {
				continue
			}
			switch string(key) {
			case "nr_periods":
				periods, ok = v, true
			case "nr_throttled":
				throttled = v
			case "throttled_usec":
				throttledTime = time.Duration(v) * time.Microsecond
			case "throttled_time":
				throttledTime = time.Duration(v)
			}
		}
		return periods, throttled, throttledTime, ok
	}
}
