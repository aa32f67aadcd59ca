package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/loadshed/loadshed/bench/k6summary"
	"github.com/loadshed/loadshed/internal/loadgen"
)

// A loadgen run at 2x of 100 rps for 8 s: 1600 offered, 760 served (750 within the SLO), 800
// refused with Retry-After, 20 answered 500, 10 timed out, 10 failed to connect.
func loadgenRun() *loadgen.Result {
	return &loadgen.Result{
		Offered: 1600, Sent: 1600, Completed: 1580,
		Codes:    map[int]int{200: 760, 503: 790, 429: 10, 500: 20},
		Timeouts: 10, TransportErrors: 10,
		Success: 760, Goodput: 750, OfferedRPS: 200, GoodputRPS: 93.75,
		SuccessLatency:     loadgen.Latency{Count: 760, P50: 41 * time.Millisecond, P90: 55 * time.Millisecond, P99: 62500 * time.Microsecond, P999: 90 * time.Millisecond, Max: 120 * time.Millisecond},
		ShedLatencyP99:     3 * time.Millisecond,
		RetryAfterEligible: 800, RetryAfterPresent: 800, RetryAfterCoverage: 1,
		LatenessP99: 2 * time.Millisecond, Valid: true,
	}
}

func TestLoadgenSummary(t *testing.T) {
	l := testLimits(t)
	cfg := Config{ClientTimeout: time.Second, MaxLateMs: 100}
	s := loadgenSummary(loadgenRun(), "http://127.0.0.1:1/", l, cfg, 200, 8*time.Second)
	// The summary must be one the report reads: through the same parser as k6's.
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	got, err := k6summary.Parse(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("summary does not parse: %v", err)
	}
	if !got.Valid || got.LoadFactor != 2 || got.DurationS != 8 || got.SLOMs != 100 {
		t.Fatalf("valid %v, load %v, duration %v, SLO %v; want true, 2, 8, 100", got.Valid, got.LoadFactor, got.DurationS, got.SLOMs)
	}
	if r := k6summary.Value(got.GoodputRatio); math.Abs(r-0.9375) > 1e-9 {
		t.Errorf("goodput ratio %v, want 93.75/min(200, 100) = 0.9375", r)
	}
	if got.OK != 760 || got.Goodput != 750 || got.Slow != 10 {
		t.Errorf("ok %d goodput %d slow %d; want 760, 750, 10", got.OK, got.Goodput, got.Slow)
	}
	if got.Shed != 800 || got.ShedByStatus["503"] != 790 || got.ShedByStatus["429"] != 10 || got.ShedShare != 0.5 {
		t.Errorf("shed %d %v share %v; want 800 (503: 790, 429: 10), 0.5", got.Shed, got.ShedByStatus, got.ShedShare)
	}
	if got.Unexpected != 30 || got.Timeouts != 10 {
		t.Errorf("unexpected %d timeouts %d; want 30 (20 x 500 + 10 transport), 10", got.Unexpected, got.Timeouts)
	}
	if p := k6summary.Value(got.AdmittedMs.P99); p != 62.5 {
		t.Errorf("admitted p99 %v ms, want 62.5", p)
	}
	if p := k6summary.Value(got.RejectionMs.P99); p != 3 {
		t.Errorf("rejection p99 %v ms, want 3", p)
	}
	if c := k6summary.Value(got.RetryAfterCoverage); c != 1 {
		t.Errorf("Retry-After coverage %v, want 1", c)
	}
}

func TestLoadgenSummaryInvalid(t *testing.T) {
	l := testLimits(t)
	late := loadgenRun()
	late.LatenessP99 = 150 * time.Millisecond
	s := loadgenSummary(late, "u", l, Config{ClientTimeout: time.Second, MaxLateMs: 100}, 200, 8*time.Second)
	if s.Valid || !strings.Contains(s.InvalidReason, "150.0 ms late") {
		t.Errorf("requests 150 ms late: valid %v (%q), want invalid naming the lateness", s.Valid, s.InvalidReason)
	}
	own := loadgenRun()
	own.Valid, own.InvalidReason = false, "12 of 1600 requests dropped"
	s = loadgenSummary(own, "u", l, Config{ClientTimeout: time.Second, MaxLateMs: 100}, 200, 8*time.Second)
	if s.Valid || s.InvalidReason != "12 of 1600 requests dropped" {
		t.Errorf("loadgen's own verdict lost: valid %v (%q)", s.Valid, s.InvalidReason)
	}
	empty := &loadgen.Result{Valid: true}
	s = loadgenSummary(empty, "u", l, Config{ClientTimeout: time.Second}, 200, 8*time.Second)
	if s.AdmittedMs.P99 != nil || s.RejectionMs.P99 != nil || s.GoodputRatio != nil {
		t.Errorf("nothing answered: admitted p99 %v, rejection p99 %v, goodput ratio %v; want all unknown", s.AdmittedMs.P99, s.RejectionMs.P99, s.GoodputRatio)
	}
}

func TestRunLoadgenScenarioRefusesOtherScripts(t *testing.T) {
	cfg := Config{Generator: GeneratorLoadgen, ClientTimeout: time.Second}
	err := runLoad(context.Background(), cfg, testLimits(t), Binaries{Loadgen: "/nonexistent"}, -1,
		Scenario{Script: "spike.js", Env: map[string]string{"K": "5", "DURATION": "1s"}}, "u", "s.json", "l.log")
	if err == nil || !strings.Contains(err.Error(), "spike.js") {
		t.Fatalf("spike.js with loadgen: err %v, want a refusal naming the script", err)
	}
	err = runLoad(context.Background(), cfg, testLimits(t), Binaries{Loadgen: "/nonexistent"}, -1,
		Scenario{Script: "overload.js", Env: map[string]string{"K": "x", "DURATION": "1s"}}, "u", "s.json", "l.log")
	if err == nil || !strings.Contains(err.Error(), "K:") {
		t.Fatalf("K=x: err %v, want an error naming K", err)
	}
}

// cmd/loadgen exits 1 after printing the result of an invalid run: that is a result to report
// as invalid, not a failure; output that is no result is an error naming the exit.
func TestExecLoadgenKeepsInvalidRuns(t *testing.T) {
	dir := t.TempDir()
	script := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	invalid := script("invalid", `echo '{"offered": 10, "valid": false, "invalidReason": "late"}'; echo 'late starts' >&2; exit 1`)
	out := filepath.Join(dir, "sub", "r.json")
	r, err := execLoadgen(context.Background(), []string{invalid}, out, filepath.Join(dir, "log"))
	if err != nil || r.Valid || r.InvalidReason != "late" || r.Offered != 10 {
		t.Fatalf("invalid run: %+v, %v; want the result with its reason", r, err)
	}
	if b, err := os.ReadFile(out); err != nil || !strings.Contains(string(b), `"late"`) {
		t.Errorf("result not kept at %s: %q, %v", out, b, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "log")); string(b) != "late starts\n" {
		t.Errorf("stderr not kept: %q", b)
	}
	broken := script("broken", `echo 'no such flag' >&2; exit 2`)
	if _, err := execLoadgen(context.Background(), []string{broken}, out, filepath.Join(dir, "log2")); err == nil || !strings.Contains(err.Error(), "no such flag") {
		t.Errorf("failed run: err %v, want one quoting its stderr", err)
	}
}

// A warm-up with the loadgen generator is the measured run's first part: one run of warm-up
// plus duration with --warmup, measuring called while it is under way (the script waits for
// it), and the summary's duration the measured part only.
func TestRunLoadgenScenarioWarmsInTheSameRun(t *testing.T) {
	dir := t.TempDir()
	args, mark := filepath.Join(dir, "args"), filepath.Join(dir, "measuring")
	fake := filepath.Join(dir, "loadgen")
	body := "#!/bin/sh\necho \"$@\" > " + args + "\n" +
		"i=0; until [ -e " + mark + " ]; do i=$((i+1)); [ $i -gt 1000 ] && exit 3; sleep 0.01; done\n" +
		`echo '{"offered": 40, "sent": 40, "success": 40, "goodput": 40, "offeredRps": 100, "goodputRps": 100, "valid": true}'` + "\n"
	if err := os.WriteFile(fake, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Generator: GeneratorLoadgen, ClientTimeout: time.Second}
	sc := Scenario{Script: "overload.js", Warmup: 20 * time.Millisecond, Env: map[string]string{"K": "1", "DURATION": "400ms"}}
	if !warmsInRun(cfg, sc) || warmsInRun(Config{ClientTimeout: time.Second}, sc) {
		t.Fatal("warmsInRun: want true for loadgen with a warm-up only")
	}
	calls := 0
	measuring := func() {
		calls++
		if err := os.WriteFile(mark, nil, 0o644); err != nil {
			t.Error(err)
		}
	}
	summary := filepath.Join(dir, "s.json")
	if err := runLoadgenScenario(context.Background(), cfg, testLimits(t), Binaries{Loadgen: fake}, -1, sc, "http://u", summary, filepath.Join(dir, "l.log"), measuring); err != nil {
		t.Fatal(err)
	}
	if calls != 1 {
		t.Errorf("measuring called %d times, want 1", calls)
	}
	got, _ := os.ReadFile(args)
	for _, want := range []string{"--duration 420ms", "--warmup 20ms"} {
		if !strings.Contains(string(got), want) {
			t.Errorf("loadgen args %q: want %q", got, want)
		}
	}
	s, err := k6summary.Read(summary)
	if err != nil {
		t.Fatal(err)
	}
	if s.DurationS != 0.4 {
		t.Errorf("summary duration %v s, want the measured 0.4", s.DurationS)
	}
}

// A run that ends before its warm-up does never reports its window as measured.
func TestExecLoadgenAtEndsEarly(t *testing.T) {
	dir := t.TempDir()
	fake := filepath.Join(dir, "loadgen")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho '{\"valid\": true}'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	called := false
	if _, err := execLoadgenAt(context.Background(), []string{fake}, filepath.Join(dir, "r.json"), filepath.Join(dir, "log"), time.Hour, func() { called = true }); err != nil {
		t.Fatal(err)
	}
	if called {
		t.Error("at called for a run that ended before it")
	}
}
