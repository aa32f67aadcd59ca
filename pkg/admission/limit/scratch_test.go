package limit

import (
	"fmt"
	"testing"
	"time"
)

func TestScratch(t *testing.T) {
	type cand struct {
		name string
		a    func() Algorithm
	}
	var cs []cand
	for _, v := range []Gradient{
		{Buffer: 0.1, MinGradient: 0.5, MaxGradient: 1.5, HoldWhenAppLimited: true, DropBackoff: 0.9, Drain: true},
		{Buffer: 0.1, MinGradient: 0.5, MaxGradient: 1.5, Headroom: 1, HoldWhenAppLimited: true, DropBackoff: 0.9, Drain: true},
		{Buffer: 0.1, MinGradient: 0.5, MaxGradient: 2, SqrtHeadroom: 1, HoldWhenAppLimited: true, DropBackoff: 0.9, Drain: true},
		{Buffer: 0.25, MinGradient: 0.5, MaxGradient: 2, SqrtHeadroom: 1, HoldWhenAppLimited: true, DropBackoff: 0.9, Drain: true},
	} {
		v := v
		cs = append(cs, cand{fmt.Sprintf("grad %+v", v), func() Algorithm { a, _ := NewGradient(v); return a }})
	}
	for _, v := range []Gradient2{
		{Smoothing: 0.2, QueueSize: 4, LongWindow: 600, RTTTolerance: 1.1, Baseline: BaselineMinRTT, DropBackoff: 0.9, Drain: true},
		{Smoothing: 0.2, QueueSize: 4, LongWindow: 600, RTTTolerance: 1.5, Baseline: BaselineMinRTT, DropBackoff: 0.9, Drain: true},
		{Smoothing: 0.2, QueueSize: 1, LongWindow: 600, RTTTolerance: 1.1, Baseline: BaselineMinRTT, DropBackoff: 0.9, Drain: true},
	} {
		v := v
		cs = append(cs, cand{fmt.Sprintf("g2 %+v", v), func() Algorithm { a, _ := NewGradient2(v); return a }})
	}
	for _, g := range []Greed{{1.25, 0.75, 1, 1, 1, true}, {1.5, 0.75, 1, 1, 2, true}, {2, 0.5, 1, 1, 3, true}, {1.5, 0.5, 1, 1, 1, true}} {
		g := g
		cs = append(cs, cand{fmt.Sprintf("greed %+v", g), func() Algorithm { a, _ := NewGreed(g); return a }})
	}
	for _, c := range cs {
		for _, est := range []bool{false, true} {
			for _, w := range []int{1, 2, 4, 8, 16, 64} {
				m := model{W: w, S: 20 * time.Millisecond, Interval: 250 * time.Millisecond, MinLimit: 1, MaxLimit: 256}
				l0 := 4.0
				if est {
					m.Estimator = NewMinRTT(DefaultMinRTTWindows)
					l0 = 1
				}
				ls := m.run(c.a(), l0, 400, nil)
				t.Logf("%-50.50s est=%-5v W=%-3d %s | %s", c.name, est, w, summarise(ls[:200], 50, w), summarise(ls, 100, w))
			}
		}
	}
}
