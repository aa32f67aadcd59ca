//go:build nocharts

package lab

import "errors"

// ChartsAvailable reports whether this build draws charts.
const ChartsAvailable = false

// errNoCharts: this build (the container image's, built with -tags nocharts to stay small)
// leaves the plotting library out. The CSV files carry every figure the charts would show.
var errNoCharts = errors.New("lab: this build draws no charts (built with -tags nocharts); the CSV files hold the figures")

// WriteCharts reports that this build draws no charts.
func WriteCharts(dir, title string, results []Named) ([]string, error) { return nil, errNoCharts }

// WriteSweepCharts reports that this build draws no charts.
func WriteSweepCharts(dir string, points []SweepPoint) ([]string, error) { return nil, errNoCharts }
