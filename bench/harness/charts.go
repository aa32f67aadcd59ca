package harness

import (
	"fmt"
	"math"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// writeCharts draws one PNG per figure (median vs load, a line per target) and the spike's
// recovery time per target.
func (r *Result) writeCharts(dir string, cells map[string]map[string]*Cell) error {
	ov := r.overloadScenarios()
	if len(ov) > 0 {
		for _, f := range Figures {
			if err := r.figureChart(filepath.Join(dir, f.Key+".png"), f, ov, cells); err != nil {
				return fmt.Errorf("chart %s: %w", f.Key, err)
			}
		}
	}
	for _, sc := range r.Scenarios {
		if sc.Script == "spike.js" {
			if err := r.recoveryChart(filepath.Join(dir, "spike_recovery_s.png"), sc, cells); err != nil {
				return fmt.Errorf("chart spike_recovery_s: %w", err)
			}
		}
	}
	return nil
}

func (r *Result) figureChart(path string, f Figure, ov []Scenario, cells map[string]map[string]*Cell) error {
	p := plot.New()
	p.Title.Text = f.Title
	if f.Unit != "" {
		p.Y.Label.Text = f.Unit
	}
	p.X.Label.Text = fmt.Sprintf("offered load / capacity (C = %.0f rps)", r.Limits.CapacityRPS)
	// Explicit ranges keep the log scales valid even with a single load or a single value.
	minLoad, maxLoad := math.Inf(1), 0.0
	for _, sc := range ov {
		minLoad, maxLoad = math.Min(minLoad, sc.Load), math.Max(maxLoad, sc.Load)
	}
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = loadTicks(ov)
	logY := f.LogY
	minY, maxY := math.Inf(1), math.Inf(-1)
	// The legend sits in an empty band right of the last load, clear of the lines.
	p.Legend.Top = true
	p.Legend.Left = false
	p.Add(plotter.NewGrid())
	drawn := 0
	for i, t := range r.Targets {
		var pts plotter.XYs
		for _, sc := range ov {
			st := cells[t.Name][sc.Name].Stats[f.Key]
			if st.N == 0 || math.IsNaN(st.Median) || math.IsInf(st.Median, 0) || (logY && st.Median <= 0) {
				continue
			}
			pts = append(pts, plotter.XY{X: sc.Load, Y: st.Median})
			minY, maxY = math.Min(minY, st.Median), math.Max(maxY, st.Median)
		}
		if len(pts) == 0 {
			continue
		}
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		line.Color = plotutil.Color(i)
		line.Dashes = plotutil.Dashes(i / 7)
		line.Width = vg.Points(1.5)
		points.Color = plotutil.Color(i)
		points.Shape = plotutil.Shape(i)
		p.Add(line, points)
		p.Legend.Add(t.Name, line, points)
		drawn++
	}
	if drawn == 0 {
		return nil
	}
	p.X.Min, p.X.Max = minLoad/1.25, maxLoad*5
	if logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
		p.Y.Min, p.Y.Max = minY/1.5, maxY*1.5
	}
	if f.Better == Higher && f.Unit == "" {
		p.Y.Min = 0
		p.Y.Max = math.Max(1.05, p.Y.Max)
	}
	return p.Save(11*vg.Inch, 5.5*vg.Inch, path)
}

// loadTicks marks each load point on the log x axis.
type loadTicks []Scenario

func (lt loadTicks) Ticks(min, max float64) []plot.Tick {
	var out []plot.Tick
	for _, s := range lt {
		out = append(out, plot.Tick{Value: s.Load, Label: s.Name})
	}
	return out
}

func (r *Result) recoveryChart(path string, sc Scenario, cells map[string]map[string]*Cell) error {
	ceiling := r.Config.SpikeAfter.Seconds()
	var vals plotter.Values
	var names []string
	for _, t := range r.Targets {
		st := cells[t.Name][sc.Name].Stats[recoveryFigure.Key]
		if st.N == 0 {
			continue
		}
		x := st.Median
		if math.IsInf(x, 1) || x > ceiling {
			x = ceiling
		}
		vals = append(vals, x)
		names = append(names, t.Name)
	}
	if len(vals) == 0 {
		return nil
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("recovery after a 5x spike (bar at %.0f s = not recovered within the run)", ceiling)
	p.Y.Label.Text = "s"
	bars, err := plotter.NewBarChart(vals, vg.Points(20))
	if err != nil {
		return err
	}
	bars.Color = plotutil.Color(0)
	p.Add(bars, plotter.NewGrid())
	p.NominalX(names...)
	p.X.Tick.Label.Rotation = math.Pi / 6
	p.X.Tick.Label.XAlign = draw.XRight
	p.Y.Min = 0
	return p.Save(9*vg.Inch, 5.5*vg.Inch, path)
}
