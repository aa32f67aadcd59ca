package limit

import "time"

// DefaultMinRTTWindows is a suggested span for NewMinRTT, in update windows: 10 s at the
// adaptive strategy's 100 ms windows. The span trades two failures against each other: too
// short and a queue that stands for the whole span becomes the "no-load" latency (a controller
// that never drains its queue then climbs); too long and a backend that became permanently
// slower keeps looking overloaded, so the limit sits near its floor, for the whole span.
const DefaultMinRTTWindows = 100

// MinRTT estimates the upstream's no-load latency without probe windows that shed traffic: a
// windowed minimum over the last N update windows (a ring of per-window low statistics), so an
// old low value ages out and the estimate follows a backend that became permanently slower.
//
// What to pass to Observe: the window's p50, the same statistic as Window.RTT, not the window's
// minimum sample. The algorithms compare Window.RTT with this estimate, so the two must measure
// the same thing: with a minimum, a backend whose service times merely spread (20 ms +- 5 ms)
// looks 2.5x "overloaded" at no load, because the fastest of a hundred samples is far below the
// median. A minimum is also set by a single lucky sample (a fast error path, a cached reply)
// and then holds for N windows, whereas scheduler noise on a busy node only ever adds latency
// and moves a median little unless it hits most of a window's samples. The cost of the median
// is its sampling noise: the minimum of N medians sits a little below the typical one, more so
// with few samples per window, which is why the algorithms' sidecar defaults allow 10% over
// MinRTT and why windows should hold a few dozen samples.
//
// Each Observe call is one window and advances the ring, whether or not it carries a value: a
// low below MinMeaningfulRTT (including 0, "no samples") is recorded as an empty slot, so values
// still age by window count. Value is 0 while every slot is empty. A MinRTT is not safe for
// concurrent use; the enforcing limiter calls it under its own lock. The zero value and a nil
// pointer are unusable for Observe but report Value 0.
type MinRTT struct {
	ring []time.Duration // 0 marks an empty slot
	next int             // slot the next Observe writes
	min  time.Duration   // current minimum over non-empty slots, 0 if none
}

// NewMinRTT returns an estimator spanning the last windows windows (at least 1).
func NewMinRTT(windows int) *MinRTT {
	return &MinRTT{ring: make([]time.Duration, max(windows, 1))}
}

// Observe takes one window's low statistic and returns the estimate including it.
func (m *MinRTT) Observe(low time.Duration) time.Duration {
	if m == nil || len(m.ring) == 0 {
		return 0
	}
	if low < MinMeaningfulRTT {
		low = 0
	}
	evicted := m.ring[m.next]
	m.ring[m.next] = low
	m.next = (m.next + 1) % len(m.ring)
	switch {
	case low != 0 && (m.min == 0 || low <= m.min):
		m.min = low
	case evicted != 0 && evicted == m.min:
		m.min = 0
		for _, v := range m.ring {
			if v != 0 && (m.min == 0 || v < m.min) {
				m.min = v
			}
		}
	}
	return m.min
}

// Value returns the current estimate, 0 when no window in the span had a value.
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
