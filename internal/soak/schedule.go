package soak

import (
	"encoding/json"
	"math"
	"time"
)

// Phase is one setting of the backend: how many workers, and their mean service time (the
// spread is a quarter of the mean; the slow tail keeps the backend's defaults).
type Phase struct {
	Workers int
	Mean    time.Duration
}

// patch is the backend admin endpoint's body for this phase.
func (p Phase) patch() []byte {
	b, _ := json.Marshal(map[string]any{"workers": p.Workers, "mean": p.Mean.String(), "stddev": (p.Mean / 4).String()})
	return b
}

// BackendCycle returns the phases the backend goes through, in order and repeatedly: nominal,
// half the workers, twice the workers at half the service time (4x capacity), nominal workers
// at twice the service time.
func BackendCycle(workers int, service time.Duration) []Phase {
	return []Phase{
		{workers, service},
		{max(workers/2, 1), service},
		{2 * workers, service / 2},
		{workers, 2 * service},
	}
}

// CycleLength is how long one pass through the cycle takes: each third of the run holds a whole
// number of cycles (about 40 s each, at least one per third), so the thirds compared for growth
// see the same mix of backend settings.
func CycleLength(d time.Duration) time.Duration {
	third := d / 3
	k := max(1, int(math.Round(third.Seconds()/40)))
	return third / time.Duration(k)
}

// PhaseAt returns the phase the backend is in at elapsed time t.
func PhaseAt(cycle []Phase, length, t time.Duration) Phase {
	step := length / time.Duration(len(cycle))
	i := int((t % length) / step)
	return cycle[min(i, len(cycle)-1)]
}
