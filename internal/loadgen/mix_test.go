package loadgen

import (
	"math"
	"net/http"
	"strings"
	"testing"
)

func TestMix(t *testing.T) {
	crit := Request{Tag: "critical", Header: http.Header{"X-Loadshed-Priority": {"critical"}}}
	shed := Request{Tag: "sheddable", Header: http.Header{"X-Loadshed-Priority": {"sheddable"}}}
	prepare, err := Mix(1, Choice{30, crit}, Choice{70, shed}, Choice{0, Request{Tag: "never"}})
	if err != nil {
		t.Fatal(err)
	}
	const n = 20000
	counts := map[string]int{}
	for i := 0; i < n; i++ {
		counts[prepare(i).Tag]++
	}
	// Binomial: 30% of 20000 is 6000 with σ ≈ 65.
	if got := counts["critical"]; math.Abs(float64(got)-0.3*n) > 4*math.Sqrt(n*0.3*0.7) {
		t.Errorf("critical picked %d times of %d, want about 30%%", got, n)
	}
	if counts["never"] != 0 || counts["critical"]+counts["sheddable"] != n {
		t.Errorf("counts = %v", counts)
	}
	if got := prepare(7).Header.Get("X-Loadshed-Priority"); got != prepare(7).Tag {
		t.Errorf("request 7 has header %q and tag %q", got, prepare(7).Tag)
	}

	again, _ := Mix(1, Choice{30, crit}, Choice{70, shed})
	other, _ := Mix(2, Choice{30, crit}, Choice{70, shed})
	differ := 0
	for i := 0; i < 1000; i++ {
		if again(i).Tag != prepare(i).Tag {
			t.Fatalf("same seed, request %d: %q then %q", i, prepare(i).Tag, again(i).Tag)
		}
		if other(i).Tag != prepare(i).Tag {
			differ++
		}
	}
	if differ == 0 {
		t.Error("seeds 1 and 2 picked the same 1000 requests")
	}
}

func TestMixRefusesBadWeights(t *testing.T) {
	cases := map[string][]Choice{
		"at least one choice": nil,
		"Weight":              {{Weight: -1}},
		"NaN Weight":          {{Weight: math.NaN()}},
		"sum to 0":            {{Weight: 0}, {Weight: 0}},
	}
	for want, choices := range cases {
		_, err := Mix(1, choices...)
		if err == nil {
			t.Errorf("%s: accepted", want)
			continue
		}
		key := strings.TrimPrefix(want, "NaN ")
		if !strings.Contains(err.Error(), key) {
			t.Errorf("%s: error %q", want, err)
		}
	}
}
