package limit

import (
	"math"
	"testing"
	"time"
)

func TestMinRTTWindowedMinimum(t *testing.T) {
	m := NewMinRTT(3)
	if m.Value() != 0 {
		t.Fatalf("fresh estimator: %v, want 0 (unknown)", m.Value())
	}
	steps := []struct {
		low, want time.Duration
	}{
		{30 * ms, 30 * ms},
		{20 * ms, 20 * ms},
		{25 * ms, 20 * ms},
		{40 * ms, 20 * ms}, // ring now 25, 40 and the 20 from two windows ago
		{40 * ms, 25 * ms}, // 20 aged out after 3 windows
		{45 * ms, 40 * ms}, // 25 aged out: the estimate follows a slower backend
		{50 * ms, 40 * ms},
		{60 * ms, 45 * ms},
		{10 * ms, 10 * ms}, // a faster window takes over at once
	}
	for i, s := range steps {
		if got := m.Observe(s.low); got != s.want {
			t.Fatalf("step %d: Observe(%v) = %v, want %v", i, s.low, got, s.want)
		}
		if m.Value() != s.want {
			t.Fatalf("step %d: Value = %v, want %v", i, m.Value(), s.want)
		}
	}
}

func TestMinRTTIgnoresTinyAndEmptyWindows(t *testing.T) {
	m := NewMinRTT(2)
	if got := m.Observe(99 * time.Microsecond); got != 0 {
		t.Fatalf("99µs counted: %v", got)
	}
	if got := m.Observe(100 * time.Microsecond); got != 100*time.Microsecond {
		t.Fatalf("100µs ignored: %v", got)
	}
	m.Reset()
	m.Observe(20 * ms)
	// Windows below the threshold, empty (0) or negative still age the ring.
	if got := m.Observe(50 * time.Microsecond); got != 20*ms {
		t.Fatalf("after a tiny window: %v, want 20ms", got)
	}
	if got := m.Observe(0); got != 0 {
		t.Fatalf("after two windows without a value the estimate is %v, want 0 (unknown)", got)
	}
	if got := m.Observe(-time.Second); got != 0 {
		t.Fatalf("negative low counted: %v", got)
	}
	if got := m.Observe(30 * ms); got != 30*ms {
		t.Fatalf("relearning: %v, want 30ms", got)
	}
}

func TestMinRTTEdges(t *testing.T) {
	var nilM *MinRTT
	if nilM.Value() != 0 || nilM.Observe(time.Second) != 0 {
		t.Fatal("nil estimator must report 0")
	}
	nilM.Reset()
	var zero MinRTT
	if zero.Observe(time.Second) != 0 || zero.Value() != 0 {
		t.Fatal("zero estimator must report 0")
	}
	one := NewMinRTT(0) // clamped to one window
	one.Observe(20 * ms)
	if got := one.Observe(30 * ms); got != 30*ms {
		t.Fatalf("one-window estimator: %v, want 30ms", got)
	}
	// Equal minima: evicting one copy keeps the other.
	m := NewMinRTT(2)
	m.Observe(20 * ms)
	m.Observe(20 * ms)
	if got := m.Observe(30 * ms); got != 20*ms {
		t.Fatalf("equal minima: %v, want 20ms", got)
	}
}

// TestMinRTTMatchesBruteForce compares the incremental minimum with a direct scan over a long
// pseudo-random sequence.
func TestMinRTTMatchesBruteForce(t *testing.T) {
	const span = 5
	m := NewMinRTT(span)
	var hist []time.Duration
	x := uint32(12345)
	for i := range 2000 {
		x = x*1664525 + 1013904223
		low := time.Duration(x>>20) * time.Microsecond // 0 .. 4 ms, some below 100 µs
		got := m.Observe(low)
		if low < MinMeaningfulRTT {
			low = 0
		}
		hist = append(hist, low)
		var want time.Duration
		for _, v := range hist[max(0, len(hist)-span):] {
			if v != 0 && (want == 0 || v < want) {
				want = v
			}
		}
		if got != want {
			t.Fatalf("step %d: %v, want %v", i, got, want)
		}
	}
}

// MedianNoise reads the median's standard error from the spread below the median: samples
// spread evenly over 16..24 ms, 64 of them, give 1.2533 x (p50 - p10)/1.2816/8; a constant
// backend none, even with requests queued above the median.
func TestMedianNoise(t *testing.T) {
	s := make([]time.Duration, 64)
	for i := range s {
		s[i] = 16*time.Millisecond + time.Duration(i)*8*time.Millisecond/64
	}
	lower := float64(s[32] - s[6])
	if got, want := MedianNoise(s), time.Duration(1.2533*lower/1.2816/8); got != want {
		t.Errorf("spread: %v, want %v", got, want)
	}
	// A constant 20 ms with a third of the requests queued for a whole service time (a limit
	// a third above the upstream's workers): the queue is not noise.
	q := make([]time.Duration, 60)
	for i := range q {
		q[i] = 20 * time.Millisecond
		if i >= 40 {
			q[i] = 40 * time.Millisecond
		}
	}
	if got := MedianNoise(q); got != 0 {
		t.Errorf("constant with a third queued: %v, want 0", got)
	}
	c := []time.Duration{20 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond, 900 * time.Millisecond}
	if got := MedianNoise(c); got != 0 {
		t.Errorf("constant with one slow sample: %v, want 0", got)
	}
	if got := MedianNoise(s[:3]); got != 0 {
		t.Errorf("3 samples: %v, want 0 (unknown)", got)
	}
	// The noise estimator keeps values below MinMeaningfulRTT, unlike MinRTT.
	n := NewMinNoise(10)
	if got := n.Observe(50 * time.Microsecond); got != 50*time.Microsecond {
		t.Errorf("NewMinNoise dropped a small value: %v", got)
	}
}

func TestMinRTTPeekRecordsNothing(t *testing.T) {
	m := NewMinRTT(2)
	m.Observe(20 * ms)
	m.Observe(30 * ms)
	// Observe(40ms) would evict the 20 ms window: the estimate would be 30 ms.
	if got := m.Peek(40 * ms); got != 30*ms {
		t.Fatalf("Peek(40ms) = %v, want 30ms, what Observe would return", got)
	}
	if got := m.Peek(10 * ms); got != 10*ms {
		t.Fatalf("Peek(10ms) = %v, want 10ms", got)
	}
	if got := m.Peek(50 * time.Microsecond); got != 30*ms {
		t.Fatalf("Peek of a tiny window = %v, want 30ms (an empty slot)", got)
	}
	if m.Value() != 20*ms {
		t.Fatalf("Value after Peek = %v, want 20ms unchanged", m.Value())
	}
	// The ring did not move: the next Observe still evicts the 20 ms window.
	if got := m.Observe(40 * ms); got != 30*ms {
		t.Fatalf("Observe(40ms) after Peek = %v, want 30ms", got)
	}
	var nilM *MinRTT
	if nilM.Peek(ms) != 0 {
		t.Fatal("nil estimator must peek 0")
	}
}

// TestWander: the spread of window medians is read only from consecutive windows run under the
// same whole limit, each at least the second under it, whose upstream served what the limit let
// in; a stall now and then leaves it, a steady queue is no wander at all.
func TestWander(t *testing.T) {
	var v wander
	// Windows under a changing limit, or the first two under each, or that held a queue, teach
	// nothing.
	for i := range 40 {
		v.observe(float64(4+i%2), 0.020+0.001*float64(i%2), true)
		v.observe(6, 0.025+0.002*float64(i%3), false)
	}
	if v.n != 0 || v.sigma() != 0 {
		t.Fatalf("no steady clean pair was given; read %d pairs, sigma %v", v.n, v.sigma())
	}
	// Under a steady 8: medians alternating 20.0 and 20.3 ms, and one stall of 40 ms in sixty.
	for i := range 60 {
		rtt := 0.020 + 0.0003*float64(i%2)
		if i == 30 {
			rtt = 0.040
		}
		v.observe(8, rtt, true)
	}
	if got := v.sigma(); math.Abs(got-0.0003/0.954) > 1e-6 {
		t.Errorf("sigma %v, want the alternation's 0.3 ms / 0.954 = %v (the stall is two pairs of 58)", got, 0.0003/0.954)
	}
	// Windows without a pair (the limit no longer whole, a queue) for two rings' worth: the
	// pairs are forgotten, so a spread read once does not hold the limit off the knee for ever.
	for i := range wanderStale {
		if v.observe(8.5, 0.020, false); i < wanderStale-1 && v.sigma() == 0 {
			t.Fatalf("forgot the pairs after %d windows without one, want %d", i+1, wanderStale)
		}
	}
	if v.sigma() != 0 {
		t.Errorf("after %d windows without a pair sigma is still %v", wanderStale, v.sigma())
	}
	// A queue standing under a steady limit raises every median alike: no wander.
	var q wander
	for range 30 {
		q.observe(9, 0.0225, true)
	}
	if q.sigma() != 0 {
		t.Errorf("a steady median read as wander %v", q.sigma())
	}
}
