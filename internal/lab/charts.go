//go:build !nocharts

package lab

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

const (
	chartWidth  = 9 * vg.Inch
	chartHeight = 4.5 * vg.Inch
)

// ChartsAvailable reports whether this build draws charts (see charts_none.go).
const ChartsAvailable = true

// WriteCharts draws the charts of a set of results into dir: latency percentiles per strategy,
// acceptance (and goodput) per strategy, and the p99 of each elapsed second. It returns the
// files written.
func WriteCharts(dir, title string, results []Named) ([]string, error) {
	var files []string
	for _, c := range []struct {
		name string
		draw func(string, []Named) (*plot.Plot, error)
	}{
		{ChartLatency, latencyChart},
		{ChartAcceptance, acceptanceChart},
		{ChartTimeline, timelineChart},
	} {
		p, err := c.draw(title, results)
		if err != nil {
			return files, fmt.Errorf("chart %s: %w", c.name, err)
		}
		path := filepath.Join(dir, c.name)
		if err := p.Save(chartWidth, chartHeight, path); err != nil {
			return files, fmt.Errorf("chart %s: %w", c.name, err)
		}
		files = append(files, path)
	}
	return files, nil
}

func names(results []Named) []string {
	out := make([]string, len(results))
	for i, r := range results {
		out[i] = r.Strategy
	}
	return out
}

// groupedBars adds one bar series per entry of series, side by side within each strategy.
func groupedBars(p *plot.Plot, labels []string, series [][]float64) error {
	n := len(series)
	width := vg.Points(math.Max(8, math.Min(28, 300/float64(n*max(len(labels), 1)))))
	for i, vals := range series {
		b, err := plotter.NewBarChart(plotter.Values(vals), width)
		if err != nil {
			return err
		}
		b.LineStyle.Width = 0
		b.Color = plotutil.Color(i)
		b.Offset = width * vg.Length(float64(i)-float64(n-1)/2)
		p.Add(b)
		p.Legend.Add(labels[i], b)
	}
	p.Legend.Top = true
	return nil
}

func latencyChart(title string, results []Named) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title + ": admitted latency per strategy"
	p.Y.Label.Text = "latency (ms)"
	var p50, p99, p999 []float64
	for _, r := range results {
		p50 = append(p50, msFloat(r.Summary.P50))
		p99 = append(p99, msFloat(r.Summary.P99))
		p999 = append(p999, msFloat(r.Summary.P999))
	}
	if err := groupedBars(p, []string{"p50", "p99", "p99.9"}, [][]float64{p50, p99, p999}); err != nil {
		return nil, err
	}
	p.NominalX(names(results)...)
	p.Add(plotter.NewGrid())
	p.Y.Min = 0
	p.Y.Max = headroom(slices.Max(append(slices.Clone(p999), 1)))
	return p, nil
}

// headroom leaves space above the tallest bar for the legend.
func headroom(top float64) float64 { return top * 1.25 }

func acceptanceChart(title string, results []Named) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title + ": acceptance and goodput per strategy"
	p.Y.Label.Text = "% of offered"
	p.Y.Min, p.Y.Max = 0, headroom(100)
	var acc, good []float64
	for _, r := range results {
		acc = append(acc, r.Summary.AcceptancePct())
		g := 0.0
		if r.Summary.Requests > 0 {
			g = 100 * float64(r.Summary.Good) / float64(r.Summary.Requests)
		}
		good = append(good, g)
	}
	if err := groupedBars(p, []string{"accepted % of attempts", "good % of requests"}, [][]float64{acc, good}); err != nil {
		return nil, err
	}
	p.NominalX(names(results)...)
	p.Add(plotter.NewGrid())
	return p, nil
}

func timelineChart(title string, results []Named) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title + ": p99 of requests arriving in each second"
	p.X.Label.Text = "elapsed (s)"
	p.Y.Label.Text = "p99 latency (ms)"
	top := 1.0
	for i, r := range results {
		var xys plotter.XYs
		for _, s := range r.Seconds {
			if s.Samples > 0 {
				xys = append(xys, plotter.XY{X: float64(s.Elapsed), Y: msFloat(s.P99)})
				top = max(top, msFloat(s.P99))
			}
		}
		if len(xys) == 0 {
			continue
		}
		l, pts, err := plotter.NewLinePoints(xys)
		if err != nil {
			return nil, err
		}
		l.Color, pts.Color = plotutil.Color(i), plotutil.Color(i)
		pts.Shape = plotutil.Shape(i)
		p.Add(l, pts)
		p.Legend.Add(r.Strategy, l, pts)
	}
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	p.Y.Min, p.Y.Max = 0, headroom(top)+0.1*top
	return p, nil
}

func msFloat(d interface{ Seconds() float64 }) float64 { return d.Seconds() * 1000 }

// WriteSweepCharts draws goodput and p99 against offered load (as a multiple of capacity), one
// line per strategy, into dir.
func WriteSweepCharts(dir string, points []SweepPoint) ([]string, error) {
	var order []string
	byStrategy := map[string]plotter.XYs{}
	p99s := map[string]plotter.XYs{}
	for _, pt := range points {
		if _, ok := byStrategy[pt.Strategy]; !ok {
			order = append(order, pt.Strategy)
		}
		byStrategy[pt.Strategy] = append(byStrategy[pt.Strategy], plotter.XY{X: pt.Load, Y: pt.Summary.GoodputRPS()})
		// A log axis cannot show 0: a strategy that admitted nothing is left out of that point.
		if pt.Summary.Accepted > 0 {
			p99s[pt.Strategy] = append(p99s[pt.Strategy], plotter.XY{X: pt.Load, Y: math.Max(msFloat(pt.Summary.P99), 0.1)})
		}
	}
	var files []string
	for _, c := range []struct {
		name, title, y string
		data           map[string]plotter.XYs
		logY           bool
	}{
		{ChartGoodput, "goodput versus offered load", "goodput (requests/s within SLO)", byStrategy, false},
		{ChartSweepP99, "admitted p99 versus offered load", "p99 latency (ms, log scale)", p99s, true},
	} {
		p := plot.New()
		p.Title.Text = c.title
		p.X.Label.Text = "offered load (x capacity, log scale)"
		p.Y.Label.Text = c.y
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = oneTwoFive{}
		if c.logY {
			p.Y.Scale = plot.LogScale{}
			p.Y.Tick.Marker = oneTwoFive{}
		}
		top := 1.0
		for i, name := range order {
			xys := c.data[name]
			if len(xys) == 0 {
				continue
			}
			for _, xy := range xys {
				top = max(top, xy.Y)
			}
			l, pts, err := plotter.NewLinePoints(xys)
			if err != nil {
				return files, fmt.Errorf("chart %s: %w", c.name, err)
			}
			l.Color, pts.Color = plotutil.Color(i), plotutil.Color(i)
			pts.Shape = plotutil.Shape(i)
			p.Add(l, pts)
			p.Legend.Add(name, l, pts)
		}
		// Room above the data for the legend.
		p.Legend.Top = true
		if c.logY {
			p.Y.Max = top * 4
		} else {
			p.Y.Min, p.Y.Max = 0, top*1.6
		}
		p.Add(plotter.NewGrid())
		path := filepath.Join(dir, c.name)
		if err := p.Save(chartWidth, chartHeight, path); err != nil {
			return files, fmt.Errorf("chart %s: %w", c.name, err)
		}
		files = append(files, path)
	}
	return files, nil
}

// oneTwoFive marks 1, 2 and 5 times each power of ten within the range: readable ticks for a
// log axis (gonum's LogTicks marks powers of ten only).
type oneTwoFive struct{}

func (oneTwoFive) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	if !(lo > 0) || !(hi > lo) {
		return ticks
	}
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if v >= lo*(1-1e-9) && v <= hi*(1+1e-9) {
				ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', -1, 64)})
			}
		}
	}
	return ticks
}
