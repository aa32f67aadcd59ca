package limit

import (
	"testing"
	"time"
)

// BenchmarkUpdate measures one Update per algorithm (sidecar defaults) over a cycle of windows
// that takes every branch: unloaded, queueing, a drop, app-limited.
func BenchmarkUpdate(b *testing.B) {
	windows := []Window{
		win(20*ms, 20*ms, 8),
		win(26*ms, 20*ms, 10),
		{Samples: 40, Dropped: 2, RTT: 20 * ms, MinRTT: 20 * ms, MaxInFlight: 8},
		win(20*ms, 20*ms, 2),
	}
	for _, name := range Names() {
		b.Run(name, func(b *testing.B) {
			a := mustNew(b, name, DefaultParams())
			l := 8.0
			i := 0
			for b.Loop() {
				l = a.Update(l, windows[i&3])
				l = min(max(l, 1), 256)
				i++
			}
		})
	}
}

// BenchmarkMinRTTObserve measures one window's Observe at the suggested span, including the
// rescans when the minimum ages out.
func BenchmarkMinRTTObserve(b *testing.B) {
	m := NewMinRTT(DefaultMinRTTWindows)
	d := 20 * time.Millisecond
	i := 0
	for b.Loop() {
		m.Observe(d + time.Duration(i%7)*time.Millisecond)
		i++
	}
}
