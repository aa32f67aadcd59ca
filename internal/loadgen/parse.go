package loadgen

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ParsePhases parses phases written as comma-separated rate:duration pairs, for example
// "200:10s,2000:30s,200:20s" (rates in requests per second, durations as Go durations).
func ParsePhases(spec string) ([]Phase, error) {
	var phases []Phase
	for i, part := range strings.Split(spec, ",") {
		rate, dur, ok := strings.Cut(strings.TrimSpace(part), ":")
		if !ok {
			return nil, fmt.Errorf("phase %d %q: want rate:duration", i+1, part)
		}
		r, err := strconv.ParseFloat(rate, 64)
		if err != nil {
			return nil, fmt.Errorf("phase %d %q: rate: %w", i+1, part, err)
		}
		d, err := time.ParseDuration(dur)
		if err != nil {
			return nil, fmt.Errorf("phase %d %q: duration: %w", i+1, part, err)
		}
		phases = append(phases, Phase{Rate: r, Duration: d})
	}
	if err := Phases(phases...).Validate(); err != nil {
		return nil, err
	}
	return phases, nil
}

// ParseMix builds a Prepare function from a weighted list of values of one header, written as
// comma-separated value=weight pairs, for example "critical=30,sheddable=70" with header
// "X-Loadshed-Priority". Each request carries the header with the value picked for it and is
// tagged with that value. base, when not nil, is merged into every request's headers.
func ParseMix(header, spec string, base http.Header, seed uint64) (func(i int) Request, error) {
	if header == "" {
		return nil, fmt.Errorf("mix: header name required")
	}
	var choices []Choice
	for i, part := range strings.Split(spec, ",") {
		value, weight, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || value == "" {
			return nil, fmt.Errorf("mix entry %d %q: want value=weight", i+1, part)
		}
		w, err := strconv.ParseFloat(weight, 64)
		if err != nil {
			return nil, fmt.Errorf("mix entry %d %q: weight: %w", i+1, part, err)
		}
		h := base.Clone()
		if h == nil {
			h = http.Header{}
		}
		h.Set(header, value)
		choices = append(choices, Choice{Weight: w, Request: Request{Header: h, Tag: value}})
	}
	return Mix(seed, choices...)
}
