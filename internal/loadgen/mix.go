package loadgen

import (
	"errors"
	"fmt"
	"math"
)

// Choice is one kind of request in a Mix, with a relative weight.
type Choice struct {
	Weight  float64
	Request Request
}

// Mix returns a Prepare function that picks one of choices for each request, each with
// probability proportional to its weight. The pick for request i depends only on seed and i, so
// a run is reproducible and the function is safe for concurrent use. For example, 30% critical
// and 70% sheddable requests:
//
//	prepare, err := loadgen.Mix(1,
//		loadgen.Choice{Weight: 30, Request: loadgen.Request{Tag: "critical",
//			Header: http.Header{"X-Loadshed-Priority": {"critical"}}}},
//		loadgen.Choice{Weight: 70, Request: loadgen.Request{Tag: "sheddable",
//			Header: http.Header{"X-Loadshed-Priority": {"sheddable"}}}})
func Mix(seed uint64, choices ...Choice) (func(i int) Request, error) {
	if len(choices) == 0 {
		return nil, errors.New("Mix: at least one choice is required")
	}
	cum := make([]float64, len(choices))
	total := 0.0
	for k, ch := range choices {
		if math.IsNaN(ch.Weight) || math.IsInf(ch.Weight, 0) || ch.Weight < 0 {
			return nil, fmt.Errorf("Mix: choices[%d].Weight: must be a finite number >= 0, got %v", k, ch.Weight)
		}
		total += ch.Weight
		cum[k] = total
	}
	if total == 0 {
		return nil, errors.New("Mix: the weights sum to 0")
	}
	choices = append([]Choice(nil), choices...)
	return func(i int) Request {
		u := unitFloat(seed, uint64(i)) * total
		for k, c := range cum {
			if u < c {
				return choices[k].Request
			}
		}
		return choices[len(choices)-1].Request
	}, nil
}

// unitFloat returns a uniform value in [0, 1) derived from seed and i with the splitmix64 mixer.
func unitFloat(seed, i uint64) float64 {
	z := seed + (i+1)*0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return float64(z>>11) / (1 << 53)
}
