package soak

import (
	"fmt"
	"strings"
	"time"
)

// Trend compares a resource's middle and last thirds and reports its peak against its ceiling.
type Trend struct {
	Metric string  `json:"metric"`
	Middle float64 `json:"middleMean"`
	Last   float64 `json:"lastMean"`
	// Growth is Last/Middle - 1 (0 when the middle third's mean is 0).
	Growth  float64 `json:"growth"`
	Peak    float64 `json:"peak"`
	Ceiling float64 `json:"ceiling"`
	// Checked says whether growth is judged (memory, goroutines, descriptors) or only the
	// ceiling (in-flight follows the load, not a leak).
	Checked bool `json:"growthChecked"`
}

// Judge checks the samples against the ceilings and the growth bound. It returns a trend per
// resource and the problems found (none: the samples pass).
func Judge(samples []Sample, c Ceilings, maxGrowth float64) ([]Trend, []string) {
	var problems []string
	if len(samples) < 3 {
		return nil, []string{fmt.Sprintf("only %d samples: a soak needs at least three", len(samples))}
	}
	metrics := []struct {
		name    string
		ceiling float64
		growth  bool
		value   func(Sample) float64
	}{
		{"rss_bytes", float64(c.RSSBytes), true, func(s Sample) float64 { return float64(s.RSSBytes) }},
		{"goroutines", float64(c.Goroutines), true, func(s Sample) float64 { return float64(s.Goroutines) }},
		{"open_fds", float64(c.FDs), true, func(s Sample) float64 { return float64(s.FDs) }},
		{"inflight", c.InFlight, false, func(s Sample) float64 { return s.InFlight }},
	}
	n := len(samples)
	middle, last := samples[n/3:2*n/3], samples[2*n/3:]
	var trends []Trend
	for _, m := range metrics {
		tr := Trend{Metric: m.name, Ceiling: m.ceiling, Checked: m.growth, Middle: mean(middle, m.value), Last: mean(last, m.value)}
		if tr.Middle > 0 {
			tr.Growth = tr.Last/tr.Middle - 1
		}
		crossed := 0
		var first Sample
		for _, s := range samples {
			v := m.value(s)
			tr.Peak = max(tr.Peak, v)
			if v > m.ceiling {
				if crossed == 0 {
					first = s
				}
				crossed++
			}
		}
		if crossed > 0 {
			problems = append(problems, fmt.Sprintf("%s crossed its ceiling %g in %d samples (first at %s: %g)",
				m.name, m.ceiling, crossed, first.Elapsed.Round(time.Second), m.value(first)))
		}
		if m.growth && tr.Growth > maxGrowth {
			problems = append(problems, fmt.Sprintf("%s grew %.1f%% from the middle third (mean %.0f) to the last (mean %.0f), over the %.0f%% allowed",
				m.name, 100*tr.Growth, tr.Middle, tr.Last, 100*maxGrowth))
		}
		trends = append(trends, tr)
	}
	return trends, problems
}

func mean(s []Sample, f func(Sample) float64) float64 {
	if len(s) == 0 {
		return 0
	}
	sum := 0.0
	for _, x := range s {
		sum += f(x)
	}
	return sum / float64(len(s))
}

// Requests totals what the clients saw.
type Requests struct {
	// Offered by the schedule; Sent of them; Dropped not sent because the generator's in-flight
	// cap was reached (the generator's limit, not the proxy's).
	Offered, Sent, Dropped int
	// OK are 2xx-3xx answers; Shed refusals naming their reason, by reason.
	OK   int64            `json:"ok"`
	Shed map[string]int64 `json:"shed"`
	// Failures of admitted requests: Unexpected statuses (a 5xx that is not a shed, any other
	// status), TransportErrors and Timeouts.
	Unexpected      int64 `json:"unexpected"`
	TransportErrors int   `json:"transportErrors"`
	Timeouts        int   `json:"timeouts"`
	// FailureSamples holds the first few failures, described.
	FailureSamples []string `json:"failureSamples,omitempty"`
	// LateStarts counts requests the generator sent late (its own lag, not the proxy's).
	LateStarts int `json:"lateStarts"`
	// AdmittedP99 is the highest per-chunk p99 latency of admitted answers.
	AdmittedP99 time.Duration `json:"admittedP99"`
}

// Failed is the number of failed admitted requests.
func (r Requests) Failed() int64 {
	return r.Unexpected + int64(r.TransportErrors) + int64(r.Timeouts)
}

// Summary is the outcome of a soak.
type Summary struct {
	Duration   time.Duration `json:"duration"`
	Load       float64       `json:"load"`
	NominalRPS float64       `json:"nominalRps"`
	Admission  string        `json:"admission"`
	Ceilings   Ceilings      `json:"ceilings"`
	MaxGrowth  float64       `json:"maxGrowth"`
	Samples    int           `json:"samples"`
	Trends     []Trend       `json:"trends"`
	Requests   Requests      `json:"requests"`
	// InFlightAfter is what the proxy held once the load had stopped and settled.
	InFlightAfter float64 `json:"inFlightAfter"`
	// ProxyExit is the proxy's exit after SIGTERM ("exit status 0" is clean).
	ProxyExit string   `json:"proxyExit"`
	Pass      bool     `json:"pass"`
	Problems  []string `json:"problems,omitempty"`
	CSV       string   `json:"csv"`
}

// Text renders the summary for a terminal.
func (s *Summary) Text() string {
	var b strings.Builder
	verdict := "PASS"
	if !s.Pass {
		verdict = "FAIL"
	}
	fmt.Fprintf(&b, "soak %s: %s at %gx of %.0f rps (%.0f rps offered), %d samples\n",
		verdict, s.Duration, s.Load, s.NominalRPS, s.Load*s.NominalRPS, s.Samples)
	fmt.Fprintf(&b, "%-11s %14s %14s %8s %14s %14s\n", "resource", "middle mean", "last mean", "growth", "peak", "ceiling")
	for _, t := range s.Trends {
		growth := fmt.Sprintf("%+.1f%%", 100*t.Growth)
		if !t.Checked {
			growth = "-"
		}
		fmt.Fprintf(&b, "%-11s %14.1f %14.1f %8s %14.0f %14.0f\n", t.Metric, t.Middle, t.Last, growth, t.Peak, t.Ceiling)
	}
	r := s.Requests
	var shed int64
	for _, n := range r.Shed {
		shed += n
	}
	fmt.Fprintf(&b, "requests: %d offered, %d sent, %d ok, %d shed %v, %d failed (%d unexpected status, %d transport errors, %d timeouts); generator: %d late, %d not sent; admitted p99 (worst chunk) %s\n",
		r.Offered, r.Sent, r.OK, shed, r.Shed, r.Failed(), r.Unexpected, r.TransportErrors, r.Timeouts, r.LateStarts, r.Dropped, r.AdmittedP99)
	fmt.Fprintf(&b, "in flight after the load: %g; proxy exit: %s\n", s.InFlightAfter, s.ProxyExit)
	for _, f := range r.FailureSamples {
		fmt.Fprintf(&b, "  failure: %s\n", f)
	}
	for _, p := range s.Problems {
		fmt.Fprintf(&b, "problem: %s\n", p)
	}
	return b.String()
}
