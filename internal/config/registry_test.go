package config

import (
	"testing"
	"time"
)

// TestSizedByLittlesLaw: the sizing an operator who knows the backend would write.
func TestSizedByLittlesLaw(t *testing.T) {
	b := Backend{Workers: 8, Service: 20 * time.Millisecond, SLO: 100 * time.Millisecond}
	if c := b.Capacity(); c != 400 {
		t.Fatalf("capacity = %v, want 400", c)
	}
	for _, k := range Kinds() {
		a := Sized(&k, b)
		if a.Strategy != k.Name {
			t.Errorf("%s: sized block selects %q", k.Name, a.Strategy)
		}
		var errs Problems
		a.validate(&errs, "admission")
		if len(errs.List) > 0 {
			t.Errorf("%s: sized block is invalid: %v", k.Name, &errs)
		}
		if _, err := a.Build(); err != nil {
			t.Errorf("%s: sized block does not build: %v", k.Name, err)
		}
	}
	a := Sized(kindNamed(StrategyBoundedQueue), b)
	if q := BlockOf[*BoundedQueue](&a); q.Concurrency != 8 || q.Depth != 32 || q.MaxWait.D() != 80*time.Millisecond {
		t.Errorf("bounded queue sized %+v, want 8 / 32 / 80ms", q)
	}
	a = Sized(kindNamed(StrategyTokenBucket), b)
	if tb := BlockOf[*TokenBucket](&a); tb.Rate != 360 || tb.Burst != 8 {
		t.Errorf("token bucket sized %+v, want 360/s burst 8", tb)
	}
}

// TestToldCapacityIsWhatSizedWrites: a kind is told the backend's capacity exactly when Sized
// writes it settings (the bench marks its targets by it).
func TestToldCapacityIsWhatSizedWrites(t *testing.T) {
	b := Backend{Workers: 8, Service: 20 * time.Millisecond, SLO: 100 * time.Millisecond}
	for _, k := range Kinds() {
		a := Sized(&k, b)
		if wrote := len(a.blocks) > 0 || len(a.Chain) > 0; k.ToldCapacity() != wrote {
			t.Errorf("%s: ToldCapacity() = %v, but Sized wrote settings: %v", k.Name, k.ToldCapacity(), wrote)
		}
	}
	for _, name := range []string{StrategyNone, StrategyAdaptive, StrategyCoDel} {
		if kindNamed(name).ToldCapacity() {
			t.Errorf("%s is told the capacity; it finds its limit (or has none) by itself", name)
		}
	}
}
