package lab

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/slowtail"
	"github.com/loadshed/loadshed/pkg/admission"
	"go.yaml.in/yaml/v3"
)

func TestParseStrategy(t *testing.T) {
	for _, c := range []struct {
		spec, name, core string
	}{
		{"none", "none", "none"},
		{"adaptive", "adaptive", "adaptive"},
		{"codel", "codel", "codel"},
		{"{strategy: inflight, inflight: {limit: 3}}", "inflight", "inflight"},
		{"strategy: token-bucket\ntokenBucket: {rate: 100, burst: 1}", "token-bucket", "token-bucket"},
		{"{strategy: leaky-bucket, leakyBucket: {rate: 50, depth: 3}}", "leaky-bucket", "leaky-bucket"},
		{"{strategy: bounded-queue, boundedQueue: {concurrency: 2, depth: 4, maxWait: 10ms}}", "bounded-queue", "bounded-queue"},
		{"{strategy: chain, chain: [{tokenBucket: {rate: 400, burst: 32}}, {boundedQueue: {concurrency: 8, depth: 32, maxWait: 80ms}}]}", "token-bucket+bounded-queue", "chain"},
		{"{strategy: adaptive, adaptive: {algorithm: vegas, initialLimit: 2, maxLimit: 64, queue: {depth: 4, maxWait: 20ms}}}", "adaptive", "adaptive"},
		{"{strategy: codel, codel: {concurrency: 8, target: 10ms, interval: 200ms, depth: 64}}", "codel", "codel"},
		{"{strategy: inflight, dryRun: true, inflight: {limit: 1}}", "inflight dry run", "none"},
	} {
		st, err := ParseStrategy(c.spec)
		if err != nil {
			t.Errorf("%s: %v", c.spec, err)
			continue
		}
		core, err := st.New()
		if err != nil {
			t.Errorf("%s: New: %v", c.spec, err)
			continue
		}
		if st.Name != c.name || core.Name() != c.core {
			t.Errorf("%s: name %q core %q, want %q %q", c.spec, st.Name, core.Name(), c.name, c.core)
		}
	}
}

func TestParseStrategySettingsReachTheCore(t *testing.T) {
	st := mustStrategy(t, "{strategy: bounded-queue, boundedQueue: {concurrency: 3, depth: 7, maxWait: 1s}}")
	core, err := st.New()
	if err != nil {
		t.Fatal(err)
	}
	if got := core.Stats(Base).Limit; got != 3 {
		t.Errorf("limit %v, want 3", got)
	}
	// Two runs get two cores: state never leaks between runs.
	other, _ := st.New()
	if core == other {
		t.Error("New returned the same core twice")
	}
}

// TestParseStrategyErrors: a spec is refused with the config's own messages, naming the field as
// the config file does.
func TestParseStrategyErrors(t *testing.T) {
	for _, c := range []struct{ spec, want string }{
		{"", "empty"},
		{"fifo", "unknown strategy"},
		{"[1, 2]", "admission: want a mapping"},
		{"{strategy: fifo}", `admission.strategy: unknown strategy "fifo"`},
		{"inflight", "admission.inflight: required by the selected strategy"},
		{"{strategy: inflight, inflight: {limt: 3}}", `admission.inflight.limt: unknown field (did you mean "limit"?)`},
		{"{strategy: inflight, inflight: {limit: x}}", "admission.inflight.limit: want an integer"},
		{"{strategy: inflight, inflight: {limit: 0}}", "admission.inflight.limit: must be at least 1"},
		{"{strategy: token-bucket, tokenBucket: {rate: -1, burst: 1}}", "admission.tokenBucket.rate: must be a positive number"},
		{"{strategy: bounded-queue, boundedQueue: {concurrency: 1, depth: 1, maxWait: soon}}", "admission.boundedQueue.maxWait: invalid duration"},
		{"{strategy: bounded-queue, boundedQueue: {concurrency: 1, depth: 1, maxWait: 0s}}", "admission.boundedQueue.maxWait: must be a positive duration"},
		{"{strategy: inflight, inflight: {limit: 1, limit: 2}}", "admission.inflight.limit: duplicate key"},
		{"{strategy: chain, chain: [{inflight: {limit: 1}, tokenBucket: {rate: 1, burst: 1}}]}", "admission.chain[0]: each chain element must hold exactly one"},
		{"{strategy: adaptive, adaptive: {algorithm: magic}}", "admission.adaptive.algorithm"},
		{"{strategy: adaptive, adaptive: {minLimit: 0}}", "admission.adaptive.minLimit"},
		{"{strategy: codel, codel: {target: 1s, interval: 10ms}}", "admission.codel.interval"},
	} {
		_, err := ParseStrategy(c.spec)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: err = %v, want it to contain %q", c.spec, err, c.want)
		}
	}
}

// TestLabAndProxyAcceptTheSameConfigurations: every admission block of the config's testdata,
// valid or invalid, is accepted by the lab exactly when the proxy's configuration accepts it,
// and builds the same strategy.
func TestLabAndProxyAcceptTheSameConfigurations(t *testing.T) {
	// From the config's directory, so the files that name a secret (cohorts) find it: a secret
	// the machine lacks is not a property of the block.
	t.Chdir("../config")
	files, err := filepath.Glob("testdata/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no config testdata: %v", err)
	}
	blocks := 0
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var doc struct {
			Admission yaml.Node `yaml:"admission"`
		}
		if yaml.Unmarshal(data, &doc) != nil || doc.Admission.Kind == 0 {
			continue // no admission block, or not YAML at all
		}
		block, err := yaml.Marshal(&doc.Admission)
		if err != nil {
			t.Fatal(err)
		}
		blocks++
		proxyFile := "upstream: http://127.0.0.1:1\nadmission:\n" + indentLines(string(block))
		_, proxyErr := config.Parse([]byte(proxyFile))
		st, labErr := ParseStrategy(string(block))
		if onlySecret(proxyErr) && labErr == nil {
			continue // only the secret's file is wrong: the lab draws ranks itself and reads no secret
		}
		if (proxyErr == nil) != (labErr == nil) {
			t.Errorf("%s: the proxy says %v, the lab says %v", filepath.Base(f), proxyErr, labErr)
			continue
		}
		if labErr != nil {
			continue
		}
		core, err := st.New()
		if err != nil {
			t.Errorf("%s: the lab accepts it but cannot build it: %v", filepath.Base(f), err)
			continue
		}
		cfg, _ := config.Parse([]byte(proxyFile))
		want, err := cfg.Admission.Build()
		if err != nil || core.Name() != want.Name() {
			t.Errorf("%s: the lab built %s, the proxy %v (%v)", filepath.Base(f), core.Name(), want, err)
		}
	}
	if blocks < 10 {
		t.Fatalf("only %d admission blocks found in the config testdata", blocks)
	}
}

func indentLines(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = "  " + l
	}
	return strings.Join(lines, "\n") + "\n"
}

func TestParseStrategiesNamesClashingSpecs(t *testing.T) {
	four, eight := "{strategy: inflight, inflight: {limit: 4}}", "{strategy: inflight, inflight: {limit: 8}}"
	sts, err := ParseStrategies([]string{four, eight, "none"})
	if err != nil {
		t.Fatal(err)
	}
	got := []string{sts[0].Name, sts[1].Name, sts[2].Name}
	if want := []string{four, eight, "none"}; !reflect.DeepEqual(got, want) {
		t.Errorf("names %v, want %v", got, want)
	}
	if _, err := ParseStrategies([]string{"none", "none"}); err == nil {
		t.Error("the same strategy twice was accepted")
	}
}

// TestScenarioStrategiesAreSizedForTheScenario: the lab's default strategies are the scenario's
// own sizing (Little's law from its servers and mean service time), and build.
func TestScenarioStrategiesAreSizedForTheScenario(t *testing.T) {
	sc := Scenario{Service: slowtail.Constant(20 * time.Millisecond), Servers: 8}
	sts, err := ScenarioStrategies(sc, []string{"none", "token-bucket", "bounded-queue", "inflight", "adaptive"})
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range sts {
		core, err := st.New()
		if err != nil {
			t.Errorf("%s: %v", st.Name, err)
			continue
		}
		if st.Name == "inflight" && core.Stats(Base).Limit != 8 {
			t.Errorf("inflight sized to %v, want the 8 workers", core.Stats(Base).Limit)
		}
		if st.Name == "bounded-queue" && !strings.Contains(st.Spec, "depth: 32") {
			t.Errorf("bounded queue sized %q, want a depth of C x (SLO - S) = 32", st.Spec)
		}
	}
	if _, err := ScenarioStrategies(Scenario{Service: slowtail.Constant(time.Millisecond)}, []string{"inflight"}); err == nil {
		t.Error("a scenario without servers has nothing to size from, yet was sized")
	}
}

func TestParseService(t *testing.T) {
	for _, c := range []struct {
		spec string
		want slowtail.Config
	}{
		{"constant:10ms", slowtail.Constant(10 * time.Millisecond)},
		{"constant:mean=10ms", slowtail.Constant(10 * time.Millisecond)},
		{"slowtail", slowtail.DefaultConfig()},
		{"exponential:20ms", slowtail.Config{TailProb: 1, TailMean: 20 * time.Millisecond, TailMax: slowtail.MaxDuration, Fanout: 1}},
	} {
		got, err := ParseService(c.spec)
		if err != nil || got != c.want {
			t.Errorf("%s: %+v, %v; want %+v", c.spec, got, err, c.want)
		}
	}
	got, err := ParseService("slowtail:fanout=5,tailProb=0.02,mean=30ms")
	want := slowtail.DefaultConfig()
	want.Fanout, want.TailProb, want.Mean = 5, 0.02, 30*time.Millisecond
	if err != nil || got != want {
		t.Errorf("slowtail with settings: %+v, %v; want %+v", got, err, want)
	}
	for _, bad := range []string{"", "gamma:1", "constant", "constant:fast", "slowtail:fanout=0", "slowtail:tailProb=2", "slowtail:speed=1"} {
		if _, err := ParseService(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParseArrivals(t *testing.T) {
	count := func(spec string, d time.Duration) int {
		t.Helper()
		a, err := ParseArrivals(spec, d)
		if err != nil {
			t.Fatalf("%s: %v", spec, err)
		}
		recs, err := CollectArrivals(a, 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		for i := 1; i < len(recs); i++ {
			if recs[i].At < recs[i-1].At {
				t.Fatalf("%s: arrival %d before %d", spec, i, i-1)
			}
		}
		if n := len(recs); n > 0 && recs[n-1].At >= d {
			t.Fatalf("%s: arrival at %s past the duration %s", spec, recs[n-1].At, d)
		}
		return len(recs)
	}
	if n := count("constant:rate=200", 5*time.Second); n != 1000 {
		t.Errorf("constant: %d arrivals, want 1000", n)
	}
	if n := count("constant:50", time.Second); n != 50 {
		t.Errorf("constant shorthand: %d arrivals, want 50", n)
	}
	// Poisson: the mean is 2000; five standard deviations is about 224.
	if n := count("poisson:rate=200", 10*time.Second); n < 1776 || n > 2224 {
		t.Errorf("poisson: %d arrivals, want about 2000", n)
	}
	// A linear ramp from 0 to 200 over 10 s offers the area under it: 1000.
	if n := count("ramp:from=0,to=200", 10*time.Second); n < 995 || n > 1005 {
		t.Errorf("ramp: %d arrivals, want about 1000", n)
	}
	// 100/s for 9 s plus 1000/s for 1 s.
	if n := count("spike:base=100,peak=1000,at=2s,for=1s", 10*time.Second); n != 1900 {
		t.Errorf("spike: %d arrivals, want 1900", n)
	}
	for _, bad := range []struct{ spec, want string }{
		{"constant", "rate: required"},
		{"constant:rate=-1", "must be a finite rate"},
		{"burst:rate=1", "unknown kind"},
		{"spike:base=1,peak=2,at=9s,for=2s", "must lie within"},
		{"ramp:from=1,to=2,steps=0", "steps"},
		{"trace:", "needs a file"},
		{"trace:/nonexistent/arrivals.csv", "no such file"},
		{"poisson:rate=10,poisson=maybe", "poisson"},
	} {
		_, err := ParseArrivals(bad.spec, 10*time.Second)
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: err = %v, want it to contain %q", bad.spec, err, bad.want)
		}
	}
}

func TestTraceRoundTrip(t *testing.T) {
	a, err := ParseArrivals("poisson:rate=300", 3*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	recs, err := CollectArrivals(a, 9, 0)
	if err != nil {
		t.Fatal(err)
	}
	recs[1].Priority, recs[2].Cost = admission.Sheddable, 3
	var buf bytes.Buffer
	if err := WriteTrace(&buf, recs); err != nil {
		t.Fatal(err)
	}
	back, err := ReadTrace(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, recs) {
		t.Fatalf("trace did not round-trip: %d records back, want %d", len(back), len(recs))
	}
	// Running the recorded trace gives exactly what running the process gives (recs[1] and
	// recs[2] restored, since the generator does not set them).
	back[1].Priority, back[2].Cost = recs[0].Priority, recs[0].Cost
	path := filepath.Join(t.TempDir(), "arrivals.csv")
	var file bytes.Buffer
	if err := WriteTrace(&file, back); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, file.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	fromFile, err := ParseArrivals("trace:"+path, 0)
	if err != nil {
		t.Fatal(err)
	}
	base := Scenario{Service: slowtail.DefaultConfig(), Servers: 4, Seed: 9}
	live, replay := base, base
	live.Arrivals, replay.Arrivals = a, fromFile
	x, y := mustRun(t, live, "{strategy: inflight, inflight: {limit: 6}}").Summary, mustRun(t, replay, "{strategy: inflight, inflight: {limit: 6}}").Summary
	x.Span, y.Span = 0, 0 // a trace's span is rounded to whole seconds
	if !reflect.DeepEqual(x, y) {
		t.Errorf("replayed trace gives %+v, the process %+v", y, x)
	}
}

func TestReadTrace(t *testing.T) {
	got, err := ReadTrace(strings.NewReader("note,arrival_s,cost\nfirst,0,1\n,0.5,2\nx,1.000000001,\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []Arrival{
		{At: 0, Priority: admission.Critical, Cost: 1},
		{At: 500 * time.Millisecond, Priority: admission.Critical, Cost: 2},
		{At: time.Second + 1, Priority: admission.Critical, Cost: 1},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
	for _, bad := range []struct{ text, want string }{
		{"", "empty file"},
		{"time\n1\n", "no arrival_s column"},
		{"arrival_s\n1\n0.5\n", "line 3"},
		{"arrival_s\n-1\n", "line 2: arrival_s"},
		{"arrival_s\n0.0000000001\n", "more than 9 fractional digits"},
		{"arrival_s\n1e3\n", "not a non-negative decimal"},
		{"arrival_s,priority\n1,urgent\n", "priority"},
		{"arrival_s,cost\n1,0\n", "cost"},
	} {
		_, err := ReadTrace(strings.NewReader(bad.text))
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%q: err = %v, want it to contain %q", bad.text, err, bad.want)
		}
	}
}

func TestStrategyFromConfig(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "proxy.yaml")
	yaml := "upstream: \"http://127.0.0.1:8080\"\nupstreamTimeout: 2s\nadmission:\n  strategy: inflight\n  inflight: {limit: 5}\n"
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	cs, err := StrategyFromConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if cs.UpstreamTimeout != 2*time.Second || cs.Strategy.Name != "inflight (proxy.yaml)" {
		t.Errorf("got %+v", cs)
	}
	// The config's policy behaves exactly like the same spec.
	c := BackpressureCases()[3] // load-shedder: inflight limit 5
	fromFile, err := Run(c.Scenario, cs.Strategy, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fromSpec, err := Run(c.Scenario, c.Strategy, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if fromFile.Summary.Accepted != fromSpec.Summary.Accepted || fromFile.Summary.P99 != fromSpec.Summary.P99 {
		t.Errorf("config run %+v differs from spec run %+v", fromFile.Summary, fromSpec.Summary)
	}

	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("upstream: \"http://127.0.0.1:8080\"\nadmission:\n  strategy: inflight\n  inflight: {limit: 0}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := StrategyFromConfig(bad); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Errorf("bad config: err = %v, want one naming the limit", err)
	}
}

// TestEveryStrategyRunsInTheLab walks the strategy registry: the lab sizes, builds and reads
// back every strategy the proxy accepts, so a strategy added to the registry is in the lab at
// once (the chart and the docs are checked over the same registry in deploy/).
func TestEveryStrategyRunsInTheLab(t *testing.T) {
	sc := Scenario{Service: slowtail.Constant(20 * time.Millisecond), Servers: 8}
	for _, k := range config.Kinds() {
		sts, err := ScenarioStrategies(sc, []string{k.Name})
		if err != nil {
			t.Errorf("%s: the lab cannot size it: %v", k.Name, err)
			continue
		}
		if _, err := sts[0].New(); err != nil {
			t.Errorf("%s: the lab cannot build it: %v", k.Name, err)
		}
		again, err := ParseStrategy(sts[0].Spec)
		if err != nil {
			t.Errorf("%s: the lab cannot read back its own spec %q: %v", k.Name, sts[0].Spec, err)
			continue
		}
		sc := sc
		sc.Arrivals = arrivalsAt(0, ms1)
		if _, err := Run(sc, again, RunOptions{}); err != nil {
			t.Errorf("%s: the lab cannot run it: %v", k.Name, err)
		}
	}
}

// onlySecret reports whether every problem of a configuration error is about a cohort secret's
// file.
func onlySecret(err error) bool {
	var p *config.Problems
	if !errors.As(err, &p) || len(p.List) == 0 {
		return false
	}
	for _, x := range p.List {
		if !strings.HasSuffix(x.Field, "cohorts.secretFile") {
			return false
		}
	}
	return true
}
