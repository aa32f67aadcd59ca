package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loadshed/loadshed/internal/lab"
)

func runLab(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err := run(context.Background(), args, &out, &errOut)
	return out.String(), errOut.String(), err
}

func TestBackpressureCommand(t *testing.T) {
	dir := t.TempDir()
	out, _, err := runLab(t, "backpressure", "--out", dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| strategy | incoming | accepted | rejected | acceptance % | p50 ms | p99 ms | max buffered |",
		"| token-bucket | 1000 | 599 | 401 | 59.9 | 10.0 | 10.0 | 0 |",
		"| bounded-queue | 1000 | 549 | 451 | 54.9 | 500.0 | 500.0 | 50 |",
		"| leaky-bucket | 1000 | 524 | 476 | 52.4 | 250.0 | 250.0 | 25 |",
		"| load-shedder | 1000 | 500 | 500 | 50.0 | 50.0 | 50.0 | 5 |",
		"| rate-limiter | 1000 | 500 | 500 | 50.0 | 10.0 | 10.0 | 0 |",
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	// The files are the golden ones.
	for _, name := range []string{"summary.csv", "snapshots.csv"} {
		got, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		want, err := os.ReadFile(filepath.Join("..", "..", "internal", "lab", "testdata", "golden", name))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from the golden file", name)
		}
	}
	for _, name := range []string{"latency.png", "acceptance.png", "timeline.png"} {
		if !lab.ChartsAvailable {
			break // a -tags nocharts build writes the CSVs only
		}
		if st, err := os.Stat(filepath.Join(dir, name)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func TestRunCommandWithTraceAndConfig(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "arrivals.csv")
	if _, _, err := runLab(t, "trace", "--arrivals", "spike:base=100,peak=800,at=1s,for=1s", "--duration", "3s", "--out", trace); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "proxy.yaml")
	yaml := "upstream: \"http://127.0.0.1:8080\"\nadmission:\n  strategy: bounded-queue\n  boundedQueue: {concurrency: 4, depth: 8, maxWait: 50ms}\n"
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	outDir := filepath.Join(dir, "out")
	out, _, err := runLab(t, "run", "--arrivals", "trace:"+trace, "--config", cfg, "--strategy", "{strategy: inflight, inflight: {limit: 4}}",
		"--servers", "4", "--timeout", "500ms", "--retries", "2", "--jitter", "--out", outDir, "--quiet")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "| inflight | ") {
		t.Errorf("no inflight row:\n%s", out)
	}
	if !strings.Contains(out, "| bounded-queue (proxy.yaml) |") {
		t.Errorf("no row for the config file:\n%s", out)
	}
	sum, err := os.ReadFile(filepath.Join(outDir, "summary.csv"))
	if err != nil {
		t.Fatal(err)
	}
	head := strings.SplitN(string(sum), "\n", 2)[0]
	if !strings.HasPrefix(head, "strategy,incoming,accepted,rejected,acceptance_pct,p50_ms,p99_ms,max_buffered,") ||
		!strings.Contains(head, "goodput_rps") {
		t.Errorf("summary.csv header %q", head)
	}
}

func TestSweepCommand(t *testing.T) {
	dir := t.TempDir()
	out, _, err := runLab(t, "sweep", "--strategy", "{strategy: inflight, inflight: {limit: 8}}", "--strategy", "none", "--loads", "0.5,3",
		"--duration", "2s", "--out", dir, "--quiet")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "| strategy | 0.5x | 3x |") || !strings.Contains(out, "| none |") {
		t.Errorf("sweep table:\n%s", out)
	}
	for _, name := range []string{"sweep.csv", "sweep-goodput.png", "sweep-p99.png"} {
		if !lab.ChartsAvailable && strings.HasSuffix(name, ".png") {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			t.Error(err)
		}
	}
}

func TestCompareCommandLabHalf(t *testing.T) {
	out, _, err := runLab(t, "compare", "--lab-only", "--duration", "2s")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"| strategy | lab acceptance % | live acceptance % |", "| inflight |", "| token-bucket |", "| bounded-queue |"} {
		if !strings.Contains(out, want) {
			t.Errorf("compare output lacks %q:\n%s", want, out)
		}
	}
}

func TestCompareMatrixLabHalf(t *testing.T) {
	dir := t.TempDir()
	out, _, err := runLab(t, "compare", "--lab-only", "--matrix", "--loads", "3", "--duration", "2s", "--hop", "path=1ms,worker=1ms", "--out", dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"service constant:20ms", "service slowtail:tailProb=0.02", "service slowtail:tailProb=0.05",
		"Hop modelled: path=1ms,worker=1ms; effective capacity 381.0 rps.", "| token-bucket 1.1x | ", "| token-bucket 1.0x+bounded-queue | "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// The in-flight limit at 3x admits about the capacity: its prediction is a band.
	if !strings.Contains(out, "| inflight | ") || !strings.Contains(out, "| band |") {
		t.Errorf("no band near capacity:\n%s", out)
	}
	b, err := os.ReadFile(filepath.Join(dir, "compare.csv"))
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(string(b)), "\n"); len(lines) != 1+3*6 || !strings.HasPrefix(lines[0], "strategy,service,load,") {
		t.Errorf("compare.csv: %d lines, header %q", len(lines), lines[0])
	}
}

func TestBadInvocations(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "no command"},
		{[]string{"simulate"}, "unknown command"},
		{[]string{"run", "--strategy", "fifo"}, "unknown strategy"},
		{[]string{"run", "--arrivals", "poisson"}, "rate: required"},
		{[]string{"run", "--service", "constant:soon"}, "--service"},
		{[]string{"run", "--retry-on", "always"}, "--retry-on"},
		{[]string{"run", "--config", "/nonexistent/proxy.yaml"}, "--config"},
		{[]string{"run", "extra"}, "unexpected argument"},
		{[]string{"sweep", "--loads", "1,x"}, "--loads"},
		{[]string{"sweep", "--servers", "0"}, "capacity"},
		{[]string{"backpressure", "--bogus"}, "flag provided but not defined"},
		{[]string{"run", "--hop", "soon"}, "--hop"},
		{[]string{"run", "--node", "spread=x"}, "--node"},
		{[]string{"run", "--node", "stall=2"}, "node.stall"},
		{[]string{"run", "--duration", "5s", "--warmup", "5s"}, "warmup"},
		{[]string{"compare", "--lab-only", "--node", "busy"}, "--node"},
		{[]string{"compare", "--lab-only", "--hop", "path=1ms,file=x.csv"}, "give one"},
		{[]string{"compare", "--lab-only", "--matrix", "--strategy", "none"}, "drop --strategy"},
		{[]string{"compare", "--lab-only", "--loads", "2,x"}, "--loads"},
		{[]string{"calibrate", "--servers", "0"}, "--servers"},
		{[]string{"calibrate", "--loaded", "1h"}, "--loaded"},
	} {
		_, _, err := runLab(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: err = %v, want it to contain %q", c.args, err, c.want)
		}
	}
	if _, _, err := runLab(t, "run", "-h"); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: err = %v, want flag.ErrHelp", err)
	}
}

func TestVersion(t *testing.T) {
	out, _, err := runLab(t, "--version")
	if err != nil || !strings.HasPrefix(out, "lab ") {
		t.Errorf("--version: %q, %v", out, err)
	}
}

// TestDefaultStrategiesAreDocumented: without --strategy, run and sweep show none and the
// registry's strategies sized from the backend's capacity; docs/lab.md names the same list.
func TestDefaultStrategiesAreDocumented(t *testing.T) {
	if len(scenarioSized) < 2 || scenarioSized[0] != "none" {
		t.Fatalf("default strategies %v, want none first and the sized ones after it", scenarioSized)
	}
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "lab.md"))
	if err != nil {
		t.Fatal(err)
	}
	last := len(scenarioSized) - 1
	want := "Without `--strategy` the lab runs " + strings.Join(scenarioSized[:last], ", ") + " and " + scenarioSized[last] + " sized"
	if !strings.Contains(strings.Join(strings.Fields(string(doc)), " "), want) {
		t.Errorf("docs/lab.md does not say %q", want)
	}
}

// TestRunOnABusyNode: --node stretches the service and says so; the same seed gives the same
// run, and a busy node's run differs from a quiet one's.
func TestRunOnABusyNode(t *testing.T) {
	args := func(node string) []string {
		return []string{"run", "--strategy", "{strategy: inflight, inflight: {limit: 4}}", "--arrivals", "poisson:rate=150",
			"--duration", "5s", "--service", "constant:20ms", "--servers", "4", "--node", node, "--warmup", "1s", "--no-charts", "--quiet",
			"--out", t.TempDir()}
	}
	quiet, _, err := runLab(t, args("quiet")...)
	if err != nil {
		t.Fatal(err)
	}
	busy, _, err := runLab(t, args("spread=0.5,stall=0.2,stallFactor=3")...)
	if err != nil {
		t.Fatal(err)
	}
	again, _, err := runLab(t, args("spread=0.5,stall=0.2,stallFactor=3")...)
	if err != nil {
		t.Fatal(err)
	}
	row := func(out string) string {
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, "| inflight |") {
				return l
			}
		}
		t.Fatalf("no inflight row:\n%s", out)
		return ""
	}
	if !strings.Contains(busy, "Node: spread=0.5,epoch=100ms,stall=0.2,stallFactor=3.") || !strings.Contains(busy, "leave out the first 1s") {
		t.Errorf("the busy run does not describe its node and warm-up:\n%s", busy)
	}
	if strings.Contains(quiet, "Node:") {
		t.Errorf("a quiet run names a node:\n%s", quiet)
	}
	if row(busy) != row(again) {
		t.Errorf("the same seed gave two runs:\n%s\n%s", row(busy), row(again))
	}
	if row(busy) == row(quiet) {
		t.Errorf("a busy node changed nothing: %s", row(busy))
	}
}
