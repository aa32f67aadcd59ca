package selfload

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/loadshed/loadshed/internal/testwait"
)

// fakeSched is a cumulative scheduling-latency histogram a test adds wake-ups to.
type fakeSched struct {
	counts []uint64
	bounds []float64
}

func newFakeSched() *fakeSched {
	return &fakeSched{counts: make([]uint64, 4), bounds: []float64{math.Inf(-1), 1e-6, 1e-3, 1e-2, math.Inf(1)}}
}

// add records n wake-ups in bucket i: 0 below 1 µs, 1 up to 1 ms, 2 up to 10 ms, 3 beyond.
func (f *fakeSched) add(i int, n uint64) { f.counts[i] += n }

func (f *fakeSched) read() ([]uint64, []float64) { return f.counts, f.bounds }

// fakeProc is the process's CPU time and the clock: each tick a test advances the clock by one
// tick and the CPU time by the busy share of it (one CPU).
type fakeProc struct {
	used time.Duration
	now  time.Time
}

func (p *fakeProc) tick(busy float64) {
	p.now = p.now.Add(Tick)
	p.used += time.Duration(busy * float64(Tick))
}

func (p *fakeProc) source(sched *fakeSched, cpu *fakeCPU) Source {
	return Source{Sched: sched.read, CPUStat: cpu.read, CPUTime: func() time.Duration { return p.used },
		Now: func() time.Time { return p.now }, Procs: func() int { return 1 }}
}

type fakeCPU struct {
	periods, throttled uint64
	time               time.Duration
	limit              bool
}

func (f *fakeCPU) read() (uint64, uint64, time.Duration, bool) {
	return f.periods, f.throttled, f.time, f.limit
}

func TestDelayIsHopsTimesTheMeanSchedulingLatencySmoothed(t *testing.T) {
	sched := newFakeSched()
	sched.add(1, 1000) // history before the monitor starts counts for nothing
	m := New(Config{}, Source{Sched: sched.read, CPUStat: (&fakeCPU{}).read})
	sched.add(2, 100) // 100 wake-ups of 1-10 ms: mean 5.5 ms
	r := m.Tick()
	if r.Wakeups != 100 || r.SchedMean != 5500*time.Microsecond || r.SchedP99 != 10*time.Millisecond {
		t.Fatalf("tick 1: %+v, want 100 wake-ups, mean 5.5ms, p99 10ms", r)
	}
	// Half of Hops x 5.5 ms after one tick (smoothing over about two ticks), then three quarters.
	if want := time.Duration(Hops) * 5500 * time.Microsecond / 2; r.Delay != want || !r.Saturated || m.Delay() != want || !m.Saturated() {
		t.Fatalf("tick 1: delay %v saturated %v, want %v and saturated", r.Delay, r.Saturated, want)
	}
	sched.add(2, 100)
	if want := time.Duration(Hops) * 5500 * time.Microsecond * 3 / 4; m.Tick().Delay != want {
		t.Fatalf("tick 2: delay %v, want %v", m.Delay(), want)
	}
	// Quick wake-ups only: the delay decays below the saturation threshold within a few ticks.
	for range 6 {
		sched.add(0, 1000)
		m.Tick()
	}
	if m.Delay() >= time.Millisecond || m.Saturated() {
		t.Fatalf("after quick ticks: delay %v saturated %v, want under 1ms and not saturated", m.Delay(), m.Saturated())
	}
	if got := m.Last(); got.Delay != m.Delay() {
		t.Fatalf("Last %+v disagrees with Delay %v", got, m.Delay())
	}
}

func TestShedGrowsAboveTheThresholdAndFadesBelowIt(t *testing.T) {
	sched, proc := newFakeSched(), &fakeProc{now: time.Unix(0, 0)}
	m := New(Config{ShedAbove: 5 * time.Millisecond}, proc.source(sched, &fakeCPU{}))
	var shares []float64
	for range 30 {
		sched.add(3, 100) // beyond 10 ms: the delay stays far above 5 ms
		proc.tick(0.97)
		r := m.Tick()
		if r.Busy < 0.96 || r.Busy > 0.98 {
			t.Fatalf("busy %v, want 0.97", r.Busy)
		}
		shares = append(shares, r.Shed)
	}
	if shares[0] != 0.05 || shares[1] != 0.1 {
		t.Fatalf("shares %v, want +0.05 per tick from the first tick above", shares[:3])
	}
	if got := shares[len(shares)-1]; got != maxShed || m.Shed() != maxShed {
		t.Fatalf("share %v after 30 ticks, want the cap %v", got, maxShed)
	}
	var ticks int
	for m.Shed() > 0 && ticks < 20 {
		sched.add(0, 100)
		proc.tick(0.97)
		m.Tick()
		ticks++
	}
	if m.Shed() != 0 || ticks > 10 {
		t.Fatalf("share %v after %d quiet ticks, want 0 within 10", m.Shed(), ticks)
	}
	off := New(Config{}, proc.source(sched, &fakeCPU{}))
	sched.add(3, 100)
	proc.tick(1)
	if off.Tick().Shed != 0 {
		t.Fatal("ShedAbove 0 must never shed")
	}
}

// TestADelayOthersCauseIsNotShedFor: goroutines wait long, but the process uses half its CPU
// (other processes hold the core): reported as saturation, no refusals.
func TestADelayOthersCauseIsNotShedFor(t *testing.T) {
	sched, proc := newFakeSched(), &fakeProc{now: time.Unix(0, 0)}
	m := New(Config{ShedAbove: 5 * time.Millisecond}, proc.source(sched, &fakeCPU{}))
	for range 10 {
		sched.add(3, 100)
		proc.tick(0.5)
		if r := m.Tick(); r.Shed != 0 || !r.Saturated {
			t.Fatalf("%+v: want saturated without refusals", r)
		}
	}
}

func TestThrottlingMarksSaturation(t *testing.T) {
	sched := newFakeSched()
	cpu := &fakeCPU{periods: 1000, throttled: 500, limit: true}
	m := New(Config{}, Source{Sched: sched.read, CPUStat: cpu.read})
	cpu.periods, cpu.throttled, cpu.time = 1010, 502, 30*time.Millisecond
	if r := m.Tick(); r.Throttled != 0.2 || !r.Saturated || r.ThrottledTime != 30*time.Millisecond {
		t.Fatalf("%+v: want 20%% of periods throttled, 30ms, saturated", r)
	}
	cpu.periods = 1020
	if r := m.Tick(); r.Throttled != 0 || r.Saturated {
		t.Fatalf("%+v: want no throttling and not saturated", r)
	}
}

func TestCgroupCPUStat(t *testing.T) {
	dir := t.TempDir()
	v2 := filepath.Join(dir, "v2")
	os.WriteFile(v2, []byte("usage_usec 100\nnr_periods 40\nnr_throttled 3\nthrottled_usec 1500\nnr_bursts 0\n"), 0o644)
	v1 := filepath.Join(dir, "v1")
	os.WriteFile(v1, []byte("nr_periods 7\nnr_throttled 2\nthrottled_time 2000000\n"), 0o644)
	p, th, tt, ok := cgroupCPUStat(v2)()
	if !ok || p != 40 || th != 3 || tt != 1500*time.Microsecond {
		t.Fatalf("v2: %d %d %v %v", p, th, tt, ok)
	}
	p, th, tt, ok = cgroupCPUStat(v1)()
	if !ok || p != 7 || th != 2 || tt != 2*time.Millisecond {
		t.Fatalf("v1: %d %d %v %v", p, th, tt, ok)
	}
	if _, _, _, ok := cgroupCPUStat(filepath.Join(dir, "missing"))(); ok {
		t.Fatal("a missing file must read as no limit")
	}
	if _, _, _, ok := cgroupCPUStat("")(); ok {
		t.Fatal("no path must read as no limit")
	}
}

// TestRuntimeSourceReadsAHistogram: the real runtime metric exists and ticks cleanly.
func TestRuntimeSourceReadsAHistogram(t *testing.T) {
	counts, bounds := runtimeSched()()
	if len(counts) == 0 || len(bounds) != len(counts)+1 {
		t.Fatalf("runtime histogram: %d counts, %d bounds", len(counts), len(bounds))
	}
	m := New(Config{}, Source{})
	if r := m.Tick(); r.Delay < 0 || r.Shed != 0 {
		t.Fatalf("%+v", r)
	}
}

// TestTheAnswersWakeUpIsMeasuredByTheProbe: when I/O probes came through in a tick, the wait of
// the goroutine the upstream's answer wakes is their mean, in place of one scheduling wait.
func TestTheAnswersWakeUpIsMeasuredByTheProbe(t *testing.T) {
	sched := newFakeSched()
	var ioTotal time.Duration
	var probes uint64
	m := New(Config{}, Source{Sched: sched.read, CPUStat: (&fakeCPU{}).read,
		IOWait: func() (time.Duration, uint64) { return ioTotal, probes }})
	sched.add(2, 100)                          // mean scheduling latency 5.5 ms
	ioTotal, probes = 5*12*time.Millisecond, 5 // five probes of 12 ms: the poller's wait included
	r := m.Tick()
	if r.Probes != 5 || r.IOWait != 12*time.Millisecond {
		t.Fatalf("tick 1: %d probes of %v, want 5 of 12ms", r.Probes, r.IOWait)
	}
	// Smoothed over about two ticks: half of (Hops-1) x 5.5 ms + 12 ms after the first.
	if want := (time.Duration(Hops-1)*5500*time.Microsecond + 12*time.Millisecond) / 2; r.Delay != want {
		t.Fatalf("tick 1: delay %v, want %v", r.Delay, want)
	}
	// A tick without a probe falls back to a scheduling wait for the answer too.
	sched.add(2, 100)
	r = m.Tick()
	if want := (time.Duration(Hops-1)*5500*time.Microsecond+12*time.Millisecond)/4 + time.Duration(Hops)*5500*time.Microsecond/2; r.Probes != 0 || r.Delay != want {
		t.Fatalf("tick 2: %d probes, delay %v, want 0 and %v", r.Probes, r.Delay, want)
	}
}

// busySwitch is a process whose CPU time runs at the wall clock's pace while busy is set (one
// CPU fully used) and stands still otherwise; it counts the ticks that read it.
type busySwitch struct {
	mu    sync.Mutex
	busy  bool
	used  time.Duration
	last  time.Time
	ticks int
}

func (b *busySwitch) cpuTime() time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	if b.busy && !b.last.IsZero() {
		b.used += now.Sub(b.last)
	}
	b.last = now
	b.ticks++
	return b.used
}

func (b *busySwitch) set(busy bool) {
	b.cpuTime()
	b.mu.Lock()
	b.busy = busy
	b.ticks = 0
	b.mu.Unlock()
}

func (b *busySwitch) ticked() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ticks
}

// TestTheProbeRunsWhileTheProcessIsBusy: Run's probe sends bytes through its pipe and counts
// them while the process is busy, sends none while it is idle (its wake-ups would be most of an
// idle sidecar's CPU), and stops when the context ends.
func TestTheProbeRunsWhileTheProcessIsBusy(t *testing.T) {
	proc := &busySwitch{}
	m := New(Config{}, Source{Sched: newFakeSched().read, CPUStat: (&fakeCPU{}).read, CPUTime: proc.cpuTime,
		Procs: func() int { return 1 }})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); m.Run(ctx, 10*time.Millisecond) }()

	// Idle: ten ticks, in which a probe every 2 ms would have sent dozens.
	testwait.Until(t, 10*time.Second, "ten idle ticks", func() bool { return proc.ticked() >= 10 })
	if _, n := m.probe.read(); n != 0 {
		t.Fatalf("idle: %d probes, want none", n)
	}
	proc.set(true)
	testwait.Until(t, 10*time.Second, "three probes while busy", func() bool { _, n := m.probe.read(); return n >= 3 })
	if total, n := m.probe.read(); total < 0 || n < 3 {
		t.Fatalf("probes: %d totalling %v", n, total)
	}
	// Idle again: after the tick that sees it, at most the probe already on its way comes
	// through (two ticks, so the second is wholly after the probes were turned off).
	proc.set(false)
	testwait.Until(t, 10*time.Second, "two idle ticks", func() bool { return proc.ticked() >= 2 })
	_, before := m.probe.read()
	testwait.Until(t, 10*time.Second, "ten more idle ticks", func() bool { return proc.ticked() >= 12 })
	if _, n := m.probe.read(); n > before+1 {
		t.Fatalf("idle again: %d probes after %d, want at most one more", n, before)
	}
	cancel()
	<-done
}

// TestTickTurnsTheProbeOnAboveProbeBusy: the probe follows the last tick's busy share.
func TestTickTurnsTheProbeOnAboveProbeBusy(t *testing.T) {
	proc, sched, cpu := &fakeProc{now: time.Unix(1000, 0)}, newFakeSched(), &fakeCPU{}
	m := New(Config{}, proc.source(sched, cpu)) // no IOWait: the monitor's own probe
	for i, step := range []struct {
		busy float64
		on   bool
	}{{0.05, false}, {ProbeBusy, true}, {0.9, true}, {ProbeBusy - 0.01, false}, {0, false}, {1, true}} {
		proc.tick(step.busy)
		m.Tick()
		if got := m.probe.on.Load(); got != step.on {
			t.Fatalf("tick %d at %.2f busy: probe on %v, want %v", i, step.busy, got, step.on)
		}
	}
}
