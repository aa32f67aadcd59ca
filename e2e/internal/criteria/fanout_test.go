package criteria

import (
	"math"
	"strings"
	"testing"
)

// fanRun builds a run of users user requests of which ok succeeded, where service i answered
// shares[i] of its legs 2xx and refused the rest.
func fanRun(cohorts bool, users, ok float64, shares ...float64) FanoutRun {
	r := FanoutRun{Cohorts: cohorts, UsersOK: ok, UsersFailed: users - ok, Legs: map[string]Legs{}, Measured: true,
		Load:   Load{Valid: true, OfferedRPS: 400, Offered: int(users), Success: int(ok), Shed: int(users - ok)},
		Levels: map[string][]float64{}}
	for i, s := range shares {
		svc := string(rune('a' + i))
		admitted := math.Round(s * users)
		r.Legs[svc] = Legs{OK: ok, Wasted: admitted - ok, Refused: users - admitted}
		if cohorts {
			r.Levels[svc] = []float64{1.4, 1.45}
		}
	}
	if cohorts {
		r.Levels["frontend"] = []float64{4, 4}
	}
	return r
}

// goodFanout is a pair of runs like the issue's: independent sidecars at 5% end to end and 87%
// of the admitted legs wasted; with cohorts 28% end to end, 0.78x the least leg's 36%.
func goodFanout() (off, on FanoutRun) {
	return fanRun(false, 12000, 600, 0.40, 0.38, 0.42, 0.36), fanRun(true, 12000, 3360, 0.40, 0.38, 0.42, 0.36)
}

func TestFanoutFigures(t *testing.T) {
	off, on := goodFanout()
	if got := on.Success(); got != 0.28 {
		t.Errorf("success %v, want 3360/12000 = 0.28", got)
	}
	if svc, share := on.LeastLeg(); svc != "d" || share != 0.36 {
		t.Errorf("least leg %s %v, want d 0.36", svc, share)
	}
	// Legs answered 2xx: 4800 + 4560 + 5040 + 4320 = 18720, of which 4 x 3360 served a user.
	if got, want := on.WastedShare(), (18720.0-4*3360)/18720; math.Abs(got-want) > 1e-12 {
		t.Errorf("wasted %v, want %v", got, want)
	}
	if got, want := off.WastedShare(), (18720.0-4*600)/18720; math.Abs(got-want) > 1e-12 {
		t.Errorf("wasted without cohorts %v, want %v", got, want)
	}
	if off.Name() != "cohorts off" || on.Name() != "cohorts on" {
		t.Errorf("names %q, %q", off.Name(), on.Name())
	}
	if !math.IsNaN((FanoutRun{}).Success()) || !math.IsNaN((Legs{}).Share()) {
		t.Error("an empty run has a success share")
	}
}

func TestFanoutChecks(t *testing.T) {
	l := DefaultFanoutLimits()
	off, on := goodFanout()
	checks := FanoutChecks(off, on, l)
	if failed := Failed(checks); len(failed) != 0 {
		t.Fatalf("a good pair of runs failed %v", failed)
	}
	if len(checks) != 13 {
		t.Errorf("%d checks, want 5 per run and 3 on cohorts", len(checks))
	}
	cases := map[string]func(off, on *FanoutRun){
		"least-served leg": func(_, on *FanoutRun) { *on = fanRun(true, 12000, 1800, 0.40, 0.38, 0.42, 0.36) },
		"independent sidecars'": func(off, _ *FanoutRun) {
			*off = fanRun(false, 12000, 2400, 0.40, 0.38, 0.42, 0.36)
		},
		// One service serves a fifth, the others four fifths: success follows the least leg,
		// but most of the other services' work is wasted.
		"wasted legs": func(_, on *FanoutRun) { *on = fanRun(true, 12000, 2160, 0.2, 0.8, 0.8, 0.8) },
		"cohorts off: load valid": func(off, _ *FanoutRun) {
			off.Load.Valid, off.Load.InvalidReason = false, "late starts"
		},
		"cohorts on: load valid":                  func(_, on *FanoutRun) { on.Measured = false },
		"cohorts on: every user request answered": func(_, on *FanoutRun) { on.Load.Timeouts = 200 },
		"cohorts off: every user request answered": func(off, _ *FanoutRun) {
			off.Load.Errors = 121
		},
		"cohorts on: one leg per service": func(_, on *FanoutRun) {
			l := on.Legs["b"]
			l.Refused -= 500
			on.Legs["b"] = l
		},
		"cohorts off: one leg per service": func(off, _ *FanoutRun) { delete(off.Legs, "c") },
		"cohorts off: every service overloaded": func(off, _ *FanoutRun) {
			*off = fanRun(false, 12000, 600, 0.40, 0.38, 0.95, 0.36)
		},
		"cohorts on: cohort metrics present":  func(_, on *FanoutRun) { delete(on.Levels, "frontend") },
		"cohorts off: cohort metrics present": func(off, _ *FanoutRun) { off.Levels["a"] = []float64{3} },
	}
	for name, spoil := range cases {
		off, on := goodFanout()
		spoil(&off, &on)
		failed := Failed(FanoutChecks(off, on, l))
		if !strings.Contains(strings.Join(failed, "; "), name) {
			t.Errorf("%s: failed %v, want the check on %s to fail", name, failed, name)
		}
	}
	// No success at all with cohorts is no improvement, even over an independent run at zero.
	off, on = goodFanout()
	off = fanRun(false, 12000, 0, 0.40, 0.38, 0.42, 0.36)
	on = fanRun(true, 12000, 0, 0.40, 0.38, 0.42, 0.36)
	if failed := strings.Join(Failed(FanoutChecks(off, on, l)), "; "); !strings.Contains(failed, "independent sidecars'") {
		t.Errorf("zero against zero passed as an improvement: failed %s", failed)
	}
}
