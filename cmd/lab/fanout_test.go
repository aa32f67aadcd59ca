package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loadshed/loadshed/internal/cli"
)

func TestFanoutCommand(t *testing.T) {
	dir := t.TempDir()
	out, _, err := runLab(t, "fanout", "--variants", "independent", "--loads", "2", "--duration", "2s", "--out", dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"A frontend calls 4 services at once per user request; user requests Poisson at 2x of 174.3 rps",
		"Every service: sidecar {strategy: inflight, inflight: {limit: 4}}, 4 workers, service normal 20ms±5ms, 1% tail of mean 300ms in [100ms, 2s]",
		"| sidecars | end-to-end % | product of legs % | least leg % | legs % | wasted/admitted % | p99 ok ms |",
		"| independent @ 2x | ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	csv, err := os.ReadFile(filepath.Join(dir, "fanout.csv"))
	if err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(string(csv)), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[1], "2,independent,") {
		t.Errorf("fanout.csv:\n%s", csv)
	}
	// lab compare --fanout --lab-only is the same prediction.
	cmp, _, err := runLab(t, "compare", "--fanout", "--lab-only", "--variants", "independent", "--loads", "2", "--duration", "2s")
	if err != nil {
		t.Fatal(err)
	}
	if cmp != out {
		t.Errorf("compare --fanout --lab-only differs from fanout:\n%s\n%s", cmp, out)
	}
	// Per-service policies and backends.
	out, _, err = runLab(t, "fanout", "--services", "2", "--variants", "independent", "--loads", "2", "--duration", "1s",
		"--strategy", "none", "--strategy", "{strategy: inflight, inflight: {limit: 8}}", "--servers", "4,8", "--service", "constant:20ms")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Service s1: sidecar none, 4 workers, service constant 20ms", "Service s2: sidecar {strategy: inflight, inflight: {limit: 8}}, 8 workers", "of 200.0 rps"} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
}

// lab fanout with its defaults writes the golden fanout.csv (internal/lab's TestFanoutGolden
// keeps it), with and without cohorts.
func TestFanoutCommandWritesTheGoldenFile(t *testing.T) {
	dir := t.TempDir()
	if _, _, err := runLab(t, "fanout", "--out", dir); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(dir, "fanout.csv"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join("..", "..", "internal", "lab", "testdata", "golden", "fanout.csv"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("fanout.csv differs from the golden file:\n--- got\n%s--- want\n%s", got, want)
	}
}

func TestFanoutCommandUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"fanout", "--strategy", "none", "--strategy", "none"}, "--strategy: give it once for every service or 4 times"},
		{[]string{"fanout", "--servers", "4,4,4"}, "--servers: give it once for every service or 4 times"},
		{[]string{"fanout", "--servers", "0"}, `--servers: "0": want a number of workers`},
		{[]string{"fanout", "--services", "0"}, "--services: must be in [1, 64]"},
		{[]string{"fanout", "--cohorts", "count=1"}, "--cohorts: cohorts \"count=1\": count: must be in [2, 4096]"},
		{[]string{"fanout", "--variants", "both"}, `--variants: "both" is not independent or cohorts`},
		{[]string{"fanout", "--strategy", "nonsense"}, "--strategy: strategy \"nonsense\": unknown strategy"},
		{[]string{"fanout", "--loads", "2,x"}, `--loads: "x" is not a number`},
		{[]string{"compare", "--fanout", "--arrivals", "poisson:rate=100"}, "--arrivals: the live call graph runs Poisson user requests"},
	} {
		_, _, err := runLab(t, c.args...)
		if !errors.As(err, new(cli.UsageError)) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("lab %v: error %v, want a usage error with %q", c.args, err, c.want)
		}
	}
}
