package lab

import (
	"bytes"
	"context"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/loadshed/loadshed/internal/loadgen"
	"github.com/loadshed/loadshed/internal/slowtail"
	"github.com/loadshed/loadshed/pkg/admission"
)

// issueCallGraph is the case of issue 32: four services, each 4 workers with the bench's slow
// tail (20 ms mean, 5 ms stddev, 1% tail), behind an in-flight limit of 4; legs time out at 2 s.
func issueCallGraph(t *testing.T) FanoutScenario {
	t.Helper()
	st, err := ParseStrategy("{strategy: inflight, inflight: {limit: 4}}")
	if err != nil {
		t.Fatal(err)
	}
	sc := FanoutScenario{Timeout: 2 * time.Second, Seed: 1}
	for range 4 {
		sc.Services = append(sc.Services, FanoutService{Strategy: st, Service: slowtail.DefaultConfig(), Servers: 4})
	}
	return sc
}

func atLoad(sc FanoutScenario, load float64, d time.Duration, poisson bool) FanoutScenario {
	rate := load * FanoutCapacity(sc)
	sched := loadgen.ConstantRate(rate, d)
	if poisson {
		sched = loadgen.Poisson(rate, d, sc.Seed)
	}
	sc.Arrivals = ScheduleArrivals{Schedule: sched, Priority: admission.Critical}
	return sc
}

func runFanout(t *testing.T, sc FanoutScenario) *FanoutResult {
	t.Helper()
	r, err := RunFanout(sc)
	if err != nil {
		t.Fatal(err)
	}
	checkAccounting(t, sc, r)
	return r
}

// checkAccounting holds every run to its books: every leg ends one way, and every 2xx leg
// belongs to a successful user request or is wasted.
func checkAccounting(t *testing.T, sc FanoutScenario, r *FanoutResult) {
	t.Helper()
	var ok, admitted int64
	for _, l := range r.Legs {
		if l.Offered != r.Users || l.Admitted+l.Refused+l.Abandoned != l.Offered || l.OK+l.TimedOut != l.Admitted {
			t.Errorf("leg %s: %+v for %d users: legs unaccounted for", l.Name, l, r.Users)
		}
		ok += l.OK
		admitted += l.Admitted
	}
	if ok != int64(len(sc.Services))*r.OK+r.Wasted {
		t.Errorf("%d 2xx legs, want %d per successful user request (%d) plus %d wasted", ok, len(sc.Services), r.OK, r.Wasted)
	}
	if admitted != r.Admitted {
		t.Errorf("admitted %d, legs add up to %d", r.Admitted, admitted)
	}
}

// Two services by hand: A admits everything and answers in 10 ms; B has an in-flight limit of 1
// and answers in 10 ms. A user request every 5 ms finds B busy every other time, so half the
// user requests fail, and each failed one leaves A's 2xx leg wasted: 50 of 150 admitted legs.
func TestFanoutByHand(t *testing.T) {
	none, err := ParseStrategy("none")
	if err != nil {
		t.Fatal(err)
	}
	one, err := ParseStrategy("{strategy: inflight, inflight: {limit: 1}}")
	if err != nil {
		t.Fatal(err)
	}
	sc := FanoutScenario{Seed: 1, Services: []FanoutService{
		{Name: "a", Strategy: none, Service: slowtail.Constant(10 * time.Millisecond)},
		{Name: "b", Strategy: one, Service: slowtail.Constant(10 * time.Millisecond)},
	}, Arrivals: ScheduleArrivals{Schedule: loadgen.ConstantRate(200, 500*time.Millisecond)}}
	r := runFanout(t, sc)
	if r.Users != 100 || r.OK != 50 || r.Admitted != 150 || r.Wasted != 50 {
		t.Fatalf("users %d ok %d admitted %d wasted %d, want 100 50 150 50", r.Users, r.OK, r.Admitted, r.Wasted)
	}
	if r.Legs[0].Share() != 1 || r.Legs[1].Share() != 0.5 || r.Legs[1].Refusals[admission.ReasonConcurrencyLimit] != 50 {
		t.Errorf("legs %+v", r.Legs)
	}
	if least, at := r.LeastLeg(); least != 0.5 || at != 1 {
		t.Errorf("least leg %v at %d, want 0.5 at 1", least, at)
	}
	if r.P50 != 10*time.Millisecond || r.P99 != 10*time.Millisecond || math.Abs(r.WastedShare()-1.0/3) > 1e-12 {
		t.Errorf("p50 %s p99 %s wasted %v", r.P50, r.P99, r.WastedShare())
	}
}

// A leg not answered within the timeout fails: queued, it is withdrawn; admitted, its permit is
// released and its backend works on.
func TestFanoutLegTimeout(t *testing.T) {
	q, err := ParseStrategy("{strategy: leaky-bucket, leakyBucket: {rate: 10, depth: 10}}")
	if err != nil {
		t.Fatal(err)
	}
	sc := FanoutScenario{Seed: 1, Timeout: 50 * time.Millisecond, Services: []FanoutService{
		{Strategy: q, Service: slowtail.Constant(100 * time.Millisecond), Servers: 1},
	}, Arrivals: ScheduleArrivals{Schedule: loadgen.ConstantRate(100, 50*time.Millisecond)}}
	r := runFanout(t, sc)
	l := r.Legs[0]
	// Arrivals at 0, 10, 20, 30, 40 ms: the first is admitted at once and not answered by 50 ms;
	// the bucket drips the others at 100 ms intervals, after their timeouts.
	if r.Users != 5 || r.OK != 0 || l.OK != 0 || l.Admitted != 1 || l.TimedOut != 1 || l.Abandoned != 4 {
		t.Errorf("users %d ok %d, leg %+v: want 1 timed out after admission and 4 withdrawn", r.Users, r.OK, l)
	}
}

func TestFanoutSameSeedSameOutput(t *testing.T) {
	sc := atLoad(issueCallGraph(t), 2, 3*time.Second, true)
	csvOf := func(sc FanoutScenario) []byte {
		r := runFanout(t, sc)
		var b bytes.Buffer
		if err := WriteFanoutCSV(&b, []FanoutRow{{Load: 2, Lab: *r}}); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	a, b := csvOf(sc), csvOf(sc)
	if !bytes.Equal(a, b) {
		t.Fatalf("same seed, different output:\n%s\n%s", a, b)
	}
	other := sc
	other.Seed = 2
	other = atLoad(other, 2, 3*time.Second, true)
	if bytes.Equal(a, csvOf(other)) {
		t.Error("another seed gave the same output")
	}
}

// Without cohorts every sidecar sheds on its own. With evenly spaced user requests nothing but
// the draw of service times decides a leg, so legs fail independently and end-to-end success is
// the product of the leg shares. Poisson user requests arrive in bursts that every service sees
// at once, which correlates the legs: end-to-end success lies above the product (the live run of
// the issue shows the same), and still far below the least-served leg's share.
func TestFanoutIndependentSidecars(t *testing.T) {
	base := issueCallGraph(t)
	for _, load := range FanoutLoads {
		r := runFanout(t, atLoad(base, load, 10*time.Second, false))
		if e, p := r.Success(), r.ProductOfLegs(); math.Abs(e-p) > 0.15*p+0.003 {
			t.Errorf("even arrivals at %gx: end-to-end %.4f, product of legs %.4f: want them equal within 15%%", load, e, p)
		}
		r = runFanout(t, atLoad(base, load, 10*time.Second, true))
		least, _ := r.LeastLeg()
		if e, p := r.Success(), r.ProductOfLegs(); e < p || e > 0.5*least {
			t.Errorf("Poisson at %gx: end-to-end %.4f, want between the product of legs %.4f and half the least leg %.4f", load, e, p, least)
		}
		if r.WastedShare() < 0.5 {
			t.Errorf("Poisson at %gx: wasted %.3f of admitted legs, want most of them", load, r.WastedShare())
		}
	}
}

func TestFanoutValidate(t *testing.T) {
	st, _ := ParseStrategy("none")
	err := FanoutScenario{Timeout: -1, MaxRequests: -1, Cohorts: &Cohorts{Ranks: 1},
		Services: []FanoutService{{Strategy: st, Service: slowtail.Config{}, Servers: -1}, {}}}.Validate()
	for _, want := range []string{"arrivals: required", "maxRequests", "timeout", "cohorts.count", "services[0].service: slowtail: fanout", "services[0].servers: must be in", "services[1].strategy: required"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v: want it to name %q", err, want)
		}
	}
	if err := (FanoutScenario{Arrivals: ScheduleArrivals{}}).Validate(); err == nil || !strings.Contains(err.Error(), "services: want 1 to 64, got 0") {
		t.Errorf("no services: %v", err)
	}
}

func TestParseCohorts(t *testing.T) {
	for spec, want := range map[string]Cohorts{
		"":   {Ranks: 128},
		"on": {Ranks: 128},
		"count=64,strategyShare=0.05,waitFraction=1,maxWait=50ms,window=500ms": {Ranks: 64, StrategyShare: 0.05, WaitFraction: 1, MaxWait: 50 * time.Millisecond, Window: 500 * time.Millisecond},
	} {
		got, err := ParseCohorts(spec)
		if err != nil || got != want {
			t.Errorf("%q: %+v, %v; want %+v", spec, got, err, want)
		}
		if back, err := ParseCohorts(got.String()); err != nil || back != got {
			t.Errorf("%q: String %q parses to %+v, %v", spec, got.String(), back, err)
		}
	}
	for spec, want := range map[string]string{
		"count=1":       "count: must be in [2, 4096]",
		"count=x":       "count: \"x\" is not an integer",
		"ranks=8":       "ranks: unknown key",
		"maxWait=soon":  "maxWait: \"soon\" is not a duration",
		"waitFraction=": "waitFraction: \"\" is not a number",
	} {
		if _, err := ParseCohorts(spec); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", spec, err, want)
		}
	}
}

// fakeFanoutLive answers every run with the lab's own prediction, moved by shift percentage
// points on every share, and p99 scaled; the first `invalid` runs are invalid.
type fakeFanoutLive struct {
	shift   float64
	p99     float64
	invalid int
	calls   int
	cal     *Calibration
	seen    []FanoutScenario
}

func (f *fakeFanoutLive) RunFanoutLive(_ context.Context, sc FanoutScenario, sched loadgen.Schedule) (FanoutLiveResult, error) {
	f.calls++
	f.seen = append(f.seen, sc)
	if got, want := sched.Duration(), sc.Arrivals.Span(); got != want {
		return FanoutLiveResult{}, errors.New("the schedule is not the lab's")
	}
	r, err := RunFanout(sc)
	if err != nil {
		return FanoutLiveResult{}, err
	}
	move := func(n, of int64) int64 { return n + int64(math.Round(f.shift/100*float64(of))) }
	r.OK = move(r.OK, r.Users)
	r.Wasted = move(r.Wasted, r.Admitted)
	for i := range r.Legs {
		r.Legs[i].OK = move(r.Legs[i].OK, r.Legs[i].Offered)
	}
	r.P99 = time.Duration(float64(r.P99) * f.p99)
	out := FanoutLiveResult{FanoutResult: *r}
	if f.calls <= f.invalid {
		out.Invalid = "behind"
	}
	return out, nil
}

type fakeCalibratingFanoutLive struct{ *fakeFanoutLive }

func (f fakeCalibratingFanoutLive) Calibrate(context.Context, Scenario) (Calibration, error) {
	return *f.cal, nil
}

func TestCompareFanoutWithAFakeLiveHalf(t *testing.T) {
	base := issueCallGraph(t)
	cfg := FanoutConfig{Scenario: base, Loads: []float64{2}, Duration: 10 * time.Second, Variants: []bool{false}}
	for _, c := range []struct {
		shift, p99 float64
		within     bool
		misses     string
	}{
		{0, 1, true, ""},
		{4, 1.2, true, ""},
		{-6, 1, false, "end-to-end, least leg, wasted, leg 1, leg 2, leg 3, leg 4"},
		{0, 1.5, false, "p99"},
	} {
		live := &fakeFanoutLive{shift: c.shift, p99: c.p99}
		cmp, err := CompareFanout(context.Background(), cfg, live, nil)
		if err != nil {
			t.Fatal(err)
		}
		row := cmp.Rows[0]
		if row.Live == nil || row.Within() != c.within || strings.Join(row.Misses(), ", ") != c.misses {
			t.Errorf("shift %+v pp, p99 x%v: within %v, misses %q; want %v, %q", c.shift, c.p99, row.Within(), row.Misses(), c.within, c.misses)
		}
		var table bytes.Buffer
		if err := WriteFanoutTable(&table, cmp.Rows); err != nil {
			t.Fatal(err)
		}
		want := "| yes |"
		if !c.within {
			want = "| no: " + c.misses + " |"
		}
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	// The live half gets the lab's seeds for its backends, and an invalid run is run again.
	live := &fakeFanoutLive{p99: 1, invalid: 1}
	cmp, err := CompareFanout(context.Background(), cfg, live, nil)
	if err != nil {
		t.Fatal(err)
	}
	if live.calls != 2 || cmp.Rows[0].Live.Invalid != "" || !cmp.Rows[0].Within() {
		t.Errorf("after one invalid run: %d calls, row %+v", live.calls, cmp.Rows[0].Live.Invalid)
	}
	for i, s := range live.seen[0].Services {
		if s.ServiceSeed != FanoutServiceSeed(base.Seed, i) {
			t.Errorf("service %d seeded %d, want %d", i, s.ServiceSeed, FanoutServiceSeed(base.Seed, i))
		}
	}
	// A calibrating live half's hop goes into every service.
	hop := Hop{Path: HopDist{Const: time.Millisecond}, Worker: time.Millisecond}
	cal := fakeCalibratingFanoutLive{&fakeFanoutLive{p99: 1, cal: &Calibration{Workers: 4, Service: 20 * time.Millisecond, Loaded: hop.Path, Throughput: 4 / 0.021}}}
	cfg.Calibrate = true
	cmp, err = CompareFanout(context.Background(), cfg, cal, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cmp.Hop.String() != hop.String() || cmp.Calibration == nil {
		t.Errorf("hop %s, want %s", cmp.Hop, hop)
	}
	for i, s := range cal.seen[0].Services {
		if s.Hop.String() != hop.String() {
			t.Errorf("service %d: hop %s, want %s", i, s.Hop, hop)
		}
	}
}
