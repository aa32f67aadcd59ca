package limit

import (
	"slices"
	"time"
)

// DefaultMinRTTWindows is a suggested span for NewMinRTT, in update windows: 10 s at the
// adaptive strategy's 100 ms windows. The span trades two failures against each other: too
// short and a queue that stands for the whole span becomes the "no-load" latency (a controller
// that never drains its queue then climbs); too long and a backend that became permanently
// slower keeps looking overloaded, so the limit sits near its floor, for the whole span.
const DefaultMinRTTWindows = 100

// MinRTT estimates the upstream's no-load latency without probe windows that shed traffic: a
// low percentile (the 10th; the minimum while fewer than ten windows are known) of the
// statistics of the last N update windows, so an old low value ages out and the estimate follows
// a backend that became permanently slower.
//
// What to pass to Observe: the window's p50, the same statistic as Window.RTT, not the window's
// minimum sample. The algorithms compare Window.RTT with this estimate, so the two must measure
// the same thing: with a minimum, a backend whose service times merely spread (20 ms +- 5 ms)
// looks 2.5x "overloaded" at no load, because the fastest of a hundred samples is far below the
// median. A minimum is also set by a single lucky sample (a fast error path, a cached reply)
// and then holds for N windows, whereas scheduler noise on a busy node only ever adds latency
// and moves a median little unless it hits most of a window's samples. The cost of the median
// is its sampling noise: the minimum of N medians sits below the typical one, more so with few
// samples per window or a noisy node, and then ordinary windows read as queued and the limit
// drains to its floor. The 10th percentile of the windows is robust to that and still below
// every window that carried a real queue.
//
// Each Observe call is one window and advances the ring, whether or not it carries a value: a
// low below MinMeaningfulRTT (including 0, "no samples") is recorded as an empty slot, so values
// still age by window count. Value is 0 while every slot is empty. A MinRTT is not safe for
// concurrent use; the enforcing limiter calls it under its own lock. The zero value and a nil
// pointer are unusable for Observe but report Value 0.
type MinRTT struct {
	floor time.Duration   // a value below it is an empty slot (MinMeaningfulRTT)
	ring  []time.Duration // 0 marks an empty slot
	next  int             // slot the next Observe writes
	min   time.Duration   // current estimate over non-empty slots, 0 if none
	// sorted is scratch space for the percentile.
	sorted []time.Duration
}

// NewMinRTT returns an estimator spanning the last windows windows (at least 1).
func NewMinRTT(windows int) *MinRTT {
	return &MinRTT{floor: MinMeaningfulRTT, ring: make([]time.Duration, max(windows, 1))}
}

// NewMinNoise returns the same estimator for the windows' RTTNoise (MedianNoise of each window's
// samples): the low percentile of the recent windows' noise is the noise of a window median
// without a queue (a queue that comes and goes within a window widens its spread). Any
// positive value counts; 0 is an empty slot.
func NewMinNoise(windows int) *MinRTT {
	return &MinRTT{floor: 1, ring: make([]time.Duration, max(windows, 1))}
}

// Observe takes one window's low statistic and returns the estimate including it.
func (m *MinRTT) Observe(low time.Duration) time.Duration {
	if m == nil || len(m.ring) == 0 {
		return 0
	}
	m.ring[m.next] = m.clean(low)
	m.next = (m.next + 1) % len(m.ring)
	m.min = m.estimate(-1, 0)
	return m.min
}

// Peek returns the estimate Observe(low) would return, without recording the window: the
// caller decides afterwards whether the window teaches the estimator (see QueueKeeper).
func (m *MinRTT) Peek(low time.Duration) time.Duration {
	if m == nil || len(m.ring) == 0 {
		return 0
	}
	return m.estimate(m.next, m.clean(low))
}

// clean turns a statistic below the floor into an empty slot.
func (m *MinRTT) clean(low time.Duration) time.Duration {
	if low < m.floor {
		return 0
	}
	return low
}

// estimate is the low percentile of the ring's non-empty slots, with slot (if in the ring)
// read as v.
func (m *MinRTT) estimate(slot int, v time.Duration) time.Duration {
	// The estimate is a low percentile of the remembered windows, not their minimum: a window
	// median varies with scheduler noise and arrival luck, and the single luckiest window of the
	// span would make every ordinary window look queued. With fewer than ten windows it is the
	// minimum.
	m.sorted = m.sorted[:0]
	for i, r := range m.ring {
		if i == slot {
			r = v
		}
		if r != 0 {
			m.sorted = append(m.sorted, r)
		}
	}
	if len(m.sorted) == 0 {
		return 0
	}
	slices.Sort(m.sorted)
	return m.sorted[len(m.sorted)/10]
}

func (m *MinRTT) Value() time.Duration {
	if m == nil {
		return 0
	}
	return m.min
}

// Reset forgets every window, for example when the upstream changes.
func (m *MinRTT) Reset() {
	if m == nil {
		return
	}
	clear(m.ring)
	m.next, m.min = 0, 0
}
