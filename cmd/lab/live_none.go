//go:build nolive

package main

import (
	"context"
	"errors"
	"time"

	"github.com/loadshed/loadshed/internal/lab"
	"github.com/loadshed/loadshed/internal/loadgen"
)

// errNoLive: this build (the container image's, built with -tags nolive to stay small) leaves
// out the in-process proxy and backend that the live half of "lab compare" and "lab calibrate"
// start. The lab's own predictions are all there.
var errNoLive = errors.New("lab: this build runs nothing live (built with -tags nolive, as in the container image): use --lab-only, or run the lab from the repository (go run ./cmd/lab)")

func newLive() lab.Live { return liveRunner{} }

type liveRunner struct {
	unloaded, loaded time.Duration
}

func (liveRunner) RunLive(context.Context, lab.Scenario, loadgen.Schedule, lab.Strategy) (lab.LiveResult, error) {
	return lab.LiveResult{}, errNoLive
}

func (liveRunner) Calibrate(context.Context, lab.Scenario) (lab.Calibration, error) {
	return lab.Calibration{}, errNoLive
}

func newFanoutLive() lab.FanoutLive { return fanoutLiveRunner{} }

type fanoutLiveRunner struct{}

func (fanoutLiveRunner) RunFanoutLive(context.Context, lab.FanoutScenario, loadgen.Schedule) (lab.FanoutLiveResult, error) {
	return lab.FanoutLiveResult{}, errNoLive
}
