package lab

import (
	"bytes"
	"context"
	"encoding/csv"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/loadshed/loadshed/internal/loadgen"
	"github.com/loadshed/loadshed/internal/slowtail"
)

func TestCapacity(t *testing.T) {
	sc := Scenario{Service: slowtail.Constant(20 * time.Millisecond), Servers: 8}
	if got := Capacity(sc); math.Abs(got-400) > 1e-9 {
		t.Errorf("capacity %v, want 400", got)
	}
	sc.Servers = 0
	if got := Capacity(sc); got != 0 {
		t.Errorf("unlimited servers: capacity %v, want 0 (unknown)", got)
	}
	// The slow tail costs throughput: 1% of requests take about 330 ms instead of 20 ms.
	sc = Scenario{Service: slowtail.DefaultConfig(), Servers: 8}
	if got := Capacity(sc); got < 320 || got > 370 {
		t.Errorf("slow-tail capacity %v, want about 345", got)
	}
}

func TestSweepShowsTheTradeOff(t *testing.T) {
	base := Scenario{Service: slowtail.DefaultConfig(), Servers: 8, Seed: 3,
		Client: Client{Timeout: time.Second}, SLO: 500 * time.Millisecond}
	sts, err := ParseStrategies([]string{"none", "{strategy: inflight, inflight: {limit: 8}}"})
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	points, capacity, err := Sweep(SweepConfig{Base: base, Loads: []float64{0.5, 4}, Duration: 5 * time.Second}, sts,
		func(done, total int, st string, load float64) { seen = append(seen, st) })
	if err != nil {
		t.Fatal(err)
	}
	if len(points) != 4 || len(seen) != 4 {
		t.Fatalf("%d points, %d progress calls, want 4 and 4", len(points), len(seen))
	}
	at := func(st string, load float64) SweepPoint {
		for _, p := range points {
			if p.Strategy == st && p.Load == load {
				return p
			}
		}
		t.Fatalf("no point for %s at %v", st, load)
		return SweepPoint{}
	}
	for _, st := range []string{"none", "inflight"} {
		p := at(st, 0.5)
		if p.Offered != capacity*0.5 {
			t.Errorf("%s: offered %v, want %v", st, p.Offered, capacity*0.5)
		}
		// Below capacity every strategy serves nearly everything within the SLO.
		if g := p.Summary.GoodputRPS(); g < 0.95*p.Summary.OfferedRPS() {
			t.Errorf("%s at 0.5x: goodput %.1f of %.1f offered", st, g, p.Summary.OfferedRPS())
		}
	}
	// At 4x the unprotected backend queues without bound: its goodput collapses below the
	// shedder's and its tail is many times longer.
	none, shed := at("none", 4).Summary, at("inflight", 4).Summary
	if none.GoodputRPS() >= shed.GoodputRPS()/2 {
		t.Errorf("4x: none goodput %.1f, inflight %.1f; want none below half", none.GoodputRPS(), shed.GoodputRPS())
	}
	if none.P99 < 3*shed.P99 {
		t.Errorf("4x: none p99 %s, inflight %s; want none at least 3x longer", none.P99, shed.P99)
	}

	var buf bytes.Buffer
	if err := WriteSweepCSV(&buf, points); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&buf).ReadAll()
	if err != nil || len(rows) != 5 || rows[0][0] != "strategy" || rows[1][1] != "0.5" {
		t.Fatalf("sweep.csv: %v rows %v", err, rows)
	}

	dir := t.TempDir()
	files, err := WriteSweepCharts(dir, points)
	if !ChartsAvailable {
		if err == nil {
			t.Fatal("a nocharts build must say it draws nothing")
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	checkPNGs(t, files)
}

func checkPNGs(t *testing.T, files []string) {
	t.Helper()
	if len(files) == 0 {
		t.Fatal("no charts written")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(b, []byte("\x89PNG\r\n\x1a\n")) || len(b) < 2000 {
			t.Errorf("%s is not a plausible PNG (%d bytes)", filepath.Base(f), len(b))
		}
	}
}

func TestWriteChartsOfRun(t *testing.T) {
	files, err := WriteCharts(t.TempDir(), "backpressure", runBackpressure(t))
	if !ChartsAvailable {
		if err == nil {
			t.Fatal("a nocharts build must say it draws nothing")
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 3 {
		t.Errorf("%d charts, want 3", len(files))
	}
	checkPNGs(t, files)
}

// fakeLive stands in for the real proxy: it reports what the test tells it and records what it
// was asked to run.
type fakeLive struct {
	scheds []loadgen.Schedule
	result func(st Strategy) LiveResult
}

func (f *fakeLive) RunLive(_ context.Context, _ Scenario, sched loadgen.Schedule, st Strategy) (LiveResult, error) {
	f.scheds = append(f.scheds, sched)
	return f.result(st), nil
}

func TestCompare(t *testing.T) {
	sts, err := DefaultCompareStrategies()
	if err != nil {
		t.Fatal(err)
	}
	cfg := CompareConfig{
		Scenario: Scenario{Service: slowtail.DefaultConfig(), Servers: 8, Seed: 5, Client: Client{Timeout: 2 * time.Second}},
		Load:     2, Duration: 3 * time.Second,
	}
	// Lab only: the live columns are empty.
	rows, capacity, err := Compare(context.Background(), cfg, sts, nil)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteCompareTable(&buf, rows); err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 || !strings.Contains(buf.String(), "| inflight | ") || !strings.Contains(buf.String(), "| - | - |") {
		t.Fatalf("lab-only table:\n%s", buf.String())
	}
	labOf := map[string]Summary{}
	for _, r := range rows {
		labOf[r.Strategy] = r.Lab
	}

	// A live half that measures what the lab predicted for two strategies and something far
	// off for the third.
	live := &fakeLive{result: func(st Strategy) LiveResult {
		s := labOf[st.Name]
		if st.Name == "bounded-queue" {
			return LiveResult{Incoming: s.Incoming, Accepted: s.Accepted * 8 / 10, P99: s.P99}
		}
		return LiveResult{Incoming: s.Incoming, Accepted: s.Accepted, P99: s.P99 * 11 / 10}
	}}
	rows, _, err = Compare(context.Background(), cfg, sts, live)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if want := r.Strategy != "bounded-queue"; r.Within() != want {
			t.Errorf("%s: within %v, want %v (diff %.1f pp, ratio %.2f)", r.Strategy, r.Within(), want, r.AcceptanceDiffPP(), r.P99Ratio())
		}
	}
	// The live half is given the very schedule the lab ran.
	want := cfg.Schedule(capacity)
	offs, err := want.Offsets()
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range live.scheds {
		got, _ := s.Offsets()
		if len(got) != len(offs) || int64(len(got)) != rows[i].Lab.Requests {
			t.Errorf("live run %d: %d arrivals, lab %d", i, len(got), rows[i].Lab.Requests)
		}
	}
	buf.Reset()
	if err := WriteCompareTable(&buf, rows); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "| yes |") || !strings.Contains(buf.String(), "| no |") {
		t.Errorf("table does not show both verdicts:\n%s", buf.String())
	}
}
