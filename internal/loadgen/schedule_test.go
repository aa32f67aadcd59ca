package loadgen

import (
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestConstantRateOffsets(t *testing.T) {
	offs, err := ConstantRate(400, 8*time.Second).Offsets()
	if err != nil {
		t.Fatal(err)
	}
	if len(offs) != 3200 {
		t.Fatalf("offered %d, want 3200", len(offs))
	}
	for i, o := range offs {
		if want := time.Duration(i) * 2500 * time.Microsecond; o != want {
			t.Fatalf("offset[%d] = %s, want %s", i, o, want)
		}
	}
}

func TestConstantRateFractionalCount(t *testing.T) {
	// 2.5 arrivals in one second: offsets 0, 0.4 s, 0.8 s.
	offs, err := ConstantRate(2.5, time.Second).Offsets()
	if err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{0, 400 * time.Millisecond, 800 * time.Millisecond}
	if !slices.Equal(offs, want) {
		t.Fatalf("offsets %v, want %v", offs, want)
	}
}

func TestPhasesOffsets(t *testing.T) {
	// A spike: 200 rps for 2 s, 2000 rps for 1 s, 200 rps for 2 s.
	s := Spike(200, 2000, 2*time.Second, time.Second, 2*time.Second)
	if got := s.Duration(); got != 5*time.Second {
		t.Fatalf("Duration = %s", got)
	}
	if got := s.PeakRate(); got != 2000 {
		t.Fatalf("PeakRate = %v", got)
	}
	offs, err := s.Offsets()
	if err != nil {
		t.Fatal(err)
	}
	if len(offs) != 400+2000+400 {
		t.Fatalf("offered %d, want 2800", len(offs))
	}
	count := func(from, to time.Duration) int {
		n := 0
		for _, o := range offs {
			if o >= from && o < to {
				n++
			}
		}
		return n
	}
	if n := count(0, 2*time.Second); n != 400 {
		t.Errorf("phase 1 has %d arrivals, want 400", n)
	}
	if n := count(2*time.Second, 3*time.Second); n != 2000 {
		t.Errorf("phase 2 has %d arrivals, want 2000", n)
	}
	if n := count(3*time.Second, 5*time.Second); n != 400 {
		t.Errorf("phase 3 has %d arrivals, want 400", n)
	}
	// Spacing follows the phase: 5 ms, then 0.5 ms, then 5 ms again.
	checkGap := func(i int, want time.Duration) {
		t.Helper()
		if got := offs[i+1] - offs[i]; got != want {
			t.Errorf("gap after offset[%d] (%s) = %s, want %s", i, offs[i], got, want)
		}
	}
	checkGap(0, 5*time.Millisecond)
	checkGap(399, 5*time.Millisecond) // last of phase 1 to first of phase 2 at exactly 2 s
	if offs[400] != 2*time.Second {
		t.Errorf("first arrival of phase 2 at %s, want 2s", offs[400])
	}
	checkGap(400, 500*time.Microsecond)
	checkGap(2400, 5*time.Millisecond)
}

func TestSilentPhase(t *testing.T) {
	offs, err := Phases(Phase{10, time.Second}, Phase{0, time.Second}, Phase{10, time.Second}).Offsets()
	if err != nil {
		t.Fatal(err)
	}
	if len(offs) != 20 {
		t.Fatalf("offered %d, want 20", len(offs))
	}
	for _, o := range offs {
		if o >= time.Second && o < 2*time.Second {
			t.Fatalf("arrival at %s inside the silent phase", o)
		}
	}
	if offs[10] != 2*time.Second {
		t.Fatalf("first arrival after the silence at %s, want 2s", offs[10])
	}
}

func TestPoissonMeanAndShape(t *testing.T) {
	const rate, secs = 1000.0, 20
	s := Poisson(rate, secs*time.Second, 42)
	offs, err := s.Offsets()
	if err != nil {
		t.Fatal(err)
	}
	mean := rate * secs
	if d := math.Abs(float64(len(offs)) - mean); d > 4*math.Sqrt(mean) {
		t.Fatalf("offered %d, want %v ± 4σ", len(offs), mean)
	}
	if !slices.IsSorted(offs) {
		t.Fatal("offsets not sorted")
	}
	if offs[0] < 0 || offs[len(offs)-1] >= s.Duration() {
		t.Fatalf("offsets outside [0, %s): first %s last %s", s.Duration(), offs[0], offs[len(offs)-1])
	}
	// Exponential gaps: about 1 - 1/e of them are shorter than the mean gap.
	short := 0
	for i := 1; i < len(offs); i++ {
		if offs[i]-offs[i-1] < time.Second/rate {
			short++
		}
	}
	share := float64(short) / float64(len(offs)-1)
	if want := 1 - 1/math.E; math.Abs(share-want) > 0.02 {
		t.Fatalf("share of gaps below the mean = %.3f, want %.3f ± 0.02", share, want)
	}

	again, _ := s.Offsets()
	if !slices.Equal(offs, again) {
		t.Fatal("the same seed gave different offsets")
	}
	other, _ := Poisson(rate, secs*time.Second, 43).Offsets()
	if slices.Equal(offs, other) {
		t.Fatal("different seeds gave the same offsets")
	}
}

func TestPoissonFollowsPhases(t *testing.T) {
	s := Spike(100, 1000, 5*time.Second, 5*time.Second, 5*time.Second).WithPoisson(7)
	offs, err := s.Offsets()
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range []float64{500, 5000, 500} {
		from, to := time.Duration(k)*5*time.Second, time.Duration(k+1)*5*time.Second
		n := 0
		for _, o := range offs {
			if o >= from && o < to {
				n++
			}
		}
		if math.Abs(float64(n)-want) > 4*math.Sqrt(want) {
			t.Errorf("phase %d has %d arrivals, want %v ± 4σ", k, n, want)
		}
	}
}

func TestScheduleValidate(t *testing.T) {
	cases := []struct {
		name string
		s    Schedule
		want []string
	}{
		{"empty", Schedule{}, []string{"Schedule.Phases: at least one"}},
		{"negative rate", ConstantRate(-1, time.Second), []string{"Schedule.Phases[0].Rate"}},
		{"NaN rate", ConstantRate(math.NaN(), time.Second), []string{"Schedule.Phases[0].Rate"}},
		{"infinite rate", ConstantRate(math.Inf(1), time.Second), []string{"Schedule.Phases[0].Rate"}},
		{"zero duration", Phases(Phase{1, time.Second}, Phase{1, 0}), []string{"Schedule.Phases[1].Duration"}},
		{"both", Phases(Phase{-1, -time.Second}), []string{"Phases[0].Rate", "Phases[0].Duration"}},
		{"too many", ConstantRate(1e6, 10*time.Second), []string{"exceed the limit"}},
		{"too long", ConstantRate(0, 25*time.Hour), []string{"exceeds 24h"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.s.Validate()
			if err == nil {
				t.Fatal("Validate accepted an invalid schedule")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if _, err := tc.s.Offsets(); err == nil {
				t.Error("Offsets accepted an invalid schedule")
			}
		})
	}
	if err := Spike(1, 2, time.Second, time.Second, time.Second).Validate(); err != nil {
		t.Fatalf("valid schedule refused: %v", err)
	}
}
