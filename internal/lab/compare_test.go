package lab

import (
	"bytes"
	"context"
	"encoding/csv"
	"strings"
	"testing"
	"time"

	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/loadgen"
	"github.com/loadshed/loadshed/internal/slowtail"
)

func TestFragile(t *testing.T) {
	for _, c := range []struct {
		lo, hi time.Duration
		want   bool
	}{
		{20 * ms1, 22 * ms1, false},   // the body of a normal distribution
		{300 * ms1, 480 * ms1, false}, // deep in an exponential tail: 1.6x
		{25 * ms1, 240 * ms1, true},   // p98.5 in the body, p99.5 in the tail
		{100 * ms1, 170 * ms1, true},  // 1.7x: no figure is within 25% of both
		{0, 0, false},
	} {
		if got := Fragile(Summary{P99Lo: c.lo, P99Hi: c.hi}); got != c.want {
			t.Errorf("p98.5 %s, p99.5 %s: fragile %v, want %v", c.lo, c.hi, got, c.want)
		}
	}
}

func TestWithinTheBandAndTheFragileRange(t *testing.T) {
	lab := Summary{Incoming: 1000, Accepted: 500, P99: 100 * ms1, P99Lo: 90 * ms1, P99Hi: 110 * ms1}
	row := CompareRow{Strategy: "s", Lab: lab, Live: &LiveResult{Incoming: 1000, Accepted: 440, P99: 200 * ms1}}
	if row.Within() || row.PointWithin() {
		t.Fatal("6 points and 2x off, no band: within")
	}
	// Capacity -5% admits 45% and takes 170 ms; +5% admits 55% and takes 80 ms.
	row.Band = &Band{Slow: Summary{Incoming: 1000, Accepted: 450, P99: 170 * ms1}, Fast: Summary{Incoming: 1000, Accepted: 550, P99: 80 * ms1}}
	if lo, hi := row.AcceptanceRange(); lo != 45 || hi != 55 {
		t.Errorf("acceptance range %v..%v, want 45..55", lo, hi)
	}
	if lo, hi := row.P99Range(); lo != 80*ms1 || hi != 170*ms1 {
		t.Errorf("p99 range %s..%s, want 80ms..170ms", lo, hi)
	}
	// 44% is within 5 points of 45%; 200 ms within 25% of 170 ms (170/200 = 0.85).
	if !row.Within() || row.PointWithin() {
		t.Errorf("in the band: within %v, point within %v; want true, false", row.Within(), row.PointWithin())
	}
	if f := flags(row); !strings.Contains(f, "band") || !strings.Contains(f, "judged on the range") {
		t.Errorf("flags %q", f)
	}
	row.Live.P99 = 230 * ms1 // 170/230 = 0.74
	if row.Within() {
		t.Error("p99 beyond the band's tolerance: within")
	}
	row.Live.P99, row.Live.Accepted = 200*ms1, 390 // 39% is 6 points below the band
	if row.Within() {
		t.Error("acceptance beyond the band's tolerance: within")
	}

	// A fragile p99 is judged against its neighbours.
	row = CompareRow{Strategy: "s", Lab: Summary{Incoming: 1000, Accepted: 500, P99: 60 * ms1, P99Lo: 25 * ms1, P99Hi: 240 * ms1},
		Live: &LiveResult{Incoming: 1000, Accepted: 500, P99: 230 * ms1}}
	if !row.Fragile() || !row.Within() || row.PointWithin() {
		t.Errorf("fragile: fragile %v, within %v, point %v", row.Fragile(), row.Within(), row.PointWithin())
	}
	if f := flags(row); !strings.Contains(f, "fragile p99 (p98.5 25.0, p99.5 240.0)") {
		t.Errorf("flags %q", f)
	}
	row.Live.Invalid = "the load generator fell behind"
	if row.Within() || !strings.Contains(flags(row), "live invalid") {
		t.Errorf("an invalid live run is within bounds, or not flagged: %q", flags(row))
	}
}

// calibratingLive is a live half that also calibrates, and whose first run of each strategy is
// invalid.
type calibratingLive struct {
	fakeLive
	calibrations int
	runs         map[string]int
}

func (c *calibratingLive) Calibrate(_ context.Context, sc Scenario) (Calibration, error) {
	c.calibrations++
	// 8 workers x 20 ms served 380 answers/s: 1.053 ms more per request in a worker.
	return Calibration{Workers: sc.Servers, Service: 20 * ms1, Throughput: 380,
		Loaded: HopDist{Samples: []time.Duration{ms1, ms1, 2 * ms1}}}, nil
}

func (c *calibratingLive) RunLive(ctx context.Context, sc Scenario, sched loadgen.Schedule, st Strategy) (LiveResult, error) {
	c.runs[st.Name]++
	r, err := c.fakeLive.RunLive(ctx, sc, sched, st)
	if c.runs[st.Name] == 1 {
		r.Invalid = "fell behind"
	}
	return r, err
}

func TestCompareAllCalibratesAndRetriesInvalidRuns(t *testing.T) {
	sts, err := ParseStrategies([]string{"{strategy: inflight, inflight: {limit: 8}}", "{strategy: token-bucket, tokenBucket: {rate: 200, burst: 8}}"})
	if err != nil {
		t.Fatal(err)
	}
	live := &calibratingLive{runs: map[string]int{}}
	live.result = func(Strategy) LiveResult { return LiveResult{Incoming: 100, Accepted: 50, P99: 25 * ms1} }
	cfg := CompareConfig{
		Scenario: Scenario{Service: slowtail.Constant(20 * ms1), Servers: 8, Seed: 3, Client: Client{Timeout: time.Second}},
		Loads:    []float64{1.5, 3}, Duration: 2 * time.Second, Calibrate: true,
	}
	cmp, err := CompareAll(context.Background(), cfg, sts, live, nil)
	if err != nil {
		t.Fatal(err)
	}
	if live.calibrations != 1 || cmp.Calibration == nil {
		t.Errorf("%d calibrations, want 1", live.calibrations)
	}
	if cmp.Hop.Worker != 1053*time.Microsecond || len(cmp.Hop.Path.Samples) != 3 {
		t.Errorf("hop %s, want the calibration's samples and worker=1.053ms", cmp.Hop)
	}
	if cmp.Capacity != 400 || cmp.Effective < 379.9 || cmp.Effective > 380.1 {
		t.Errorf("capacity %v, effective %v; want 400 and 380", cmp.Capacity, cmp.Effective)
	}
	if len(cmp.Rows) != 4 || cmp.Rows[0].Load != 1.5 || cmp.Rows[3].Load != 3 {
		t.Fatalf("rows %+v", cmp.Rows)
	}
	for _, r := range cmp.Rows {
		if r.Live == nil || r.Live.Invalid != "" {
			t.Errorf("%s at %gx: the invalid first run was not run again", r.Strategy, r.Load)
		}
	}
	if live.runs["inflight"] != 3 { // invalid, again, then the second load
		t.Errorf("inflight ran %d times, want 3", live.runs["inflight"])
	}
	// The in-flight limit at 3x admits about the effective capacity: it gets a band. The token
	// bucket at half the capacity does not.
	byName := map[string]CompareRow{}
	for _, r := range cmp.Rows[2:] {
		byName[r.Strategy] = r
	}
	if byName["inflight"].Band == nil || byName["token-bucket"].Band != nil {
		t.Errorf("bands: inflight %v, token bucket %v; want one for the in-flight limit only", byName["inflight"].Band, byName["token-bucket"].Band)
	}

	// Without Calibrate the scenario's own hop is used.
	cfg.Calibrate = false
	cfg.Scenario.Hop = Hop{Worker: 5 * ms1}
	cmp, err = CompareAll(context.Background(), cfg, sts, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if live.calibrations != 1 || cmp.Hop.Worker != 5*ms1 || cmp.Effective != 320 {
		t.Errorf("given hop: %d calibrations, hop %s, effective %v; want 1, worker=5ms, 320", live.calibrations, cmp.Hop, cmp.Effective)
	}

	var buf bytes.Buffer
	if err := WriteCompareCSV(&buf, cmp.Rows); err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 5 || strings.Join(recs[0], ",") != strings.Join(CompareColumns, ",") {
		t.Fatalf("csv: %v", recs)
	}
	col := map[string]int{}
	for i, c := range recs[0] {
		col[c] = i
	}
	if recs[3][col["strategy"]] != "inflight" || recs[3][col["near_capacity"]] != "true" || recs[3][col["live_p99_ms"]] != "" {
		t.Errorf("csv row %v", recs[3])
	}
}

func TestMatrixStrategies(t *testing.T) {
	sc := Scenario{Service: slowtail.Constant(20 * ms1), Servers: 8}
	sts, err := MatrixStrategies(sc)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range sts {
		names = append(names, s.Name)
		if _, err := s.New(); err != nil {
			t.Errorf("%s: %v", s.Name, err)
		}
	}
	if got := strings.Join(names, ", "); got != "inflight, token-bucket 0.9x, token-bucket 1.1x, leaky-bucket 1.0x, bounded-queue, token-bucket 1.0x+bounded-queue" {
		t.Errorf("strategies: %s", got)
	}
	for _, want := range []struct {
		i    int
		spec string
	}{
		{0, "limit: 8"}, {1, "rate: 360"}, {2, "rate: 440"}, {3, "rate: 400"},
		{4, "concurrency: 8"}, {4, "depth: 32"}, {4, "maxWait: 80ms"}, {5, "rate: 400"}, {5, "depth: 32"},
	} {
		if !strings.Contains(sts[want.i].Spec, want.spec) {
			t.Errorf("%s: spec %q lacks %q", sts[want.i].Name, sts[want.i].Spec, want.spec)
		}
	}
	if sts[5].Admission.Strategy != config.StrategyChain {
		t.Errorf("the last is not a chain: %s", sts[5].Admission.Strategy)
	}
	if _, err := MatrixStrategies(Scenario{Service: slowtail.Constant(20 * ms1)}); err == nil {
		t.Error("no servers: no error")
	}
}
