package live

import (
	"runtime"
	"testing"
)

func TestCPUMeter(t *testing.T) {
	m := StartCPUMeter()
	// Some work of this process's own, which the meter must not count as the others'.
	x := 0
	for i := range 20_000_000 {
		x += i % 7
	}
	others, ok := m.Others()
	if runtime.GOOS != "linux" {
		if ok {
			t.Errorf("%s: the meter claims to know (%v)", runtime.GOOS, others)
		}
		return
	}
	if !ok || others < 0 || others > 1 || m.CPUs() != runtime.NumCPU() {
		t.Errorf("others %v (known %v) of %d cores, want a share in [0, 1] of %d (work %d)", others, ok, m.CPUs(), runtime.NumCPU(), x)
	}
}
