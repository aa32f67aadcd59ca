package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/loadshed/loadshed/bench/harness"
	"github.com/loadshed/loadshed/internal/cli"
)

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		cfg     harness.Config
		loads   string
		workers int
		quick   bool
		spike   bool
	)
	fs.BoolVar(&quick, "quick", false, "CI smoke: one short point (2x, 3s, one repeat, a few targets, no spike)")
	fs.StringVar(&cfg.OutDir, "out", "", "results directory (default results/bench-<time> under the repository root)")
	fs.StringVar(&cfg.WorkDir, "work", "", "directory for generated configs and logs (default: a temporary directory)")
	fs.BoolVar(&cfg.KeepWork, "keep-work", false, "keep the temporary work directory (configs and logs)")
	fs.StringVar(&loads, "loads", "0.5,1,2,5,10", "overload points as multiples of the backend capacity")
	fs.DurationVar(&cfg.PointDuration, "duration", 8*time.Second, "load duration of each point")
	fs.IntVar(&cfg.Repeats, "repeats", 3, "repeats of every point (medians are reported)")
	fs.BoolVar(&spike, "spike", true, "also run the spike scenario (0.5x -> 5x -> 0.5x)")
	fs.DurationVar(&cfg.SpikeBase, "spike-base", 5*time.Second, "spike: time at 0.5x before the spike")
	fs.DurationVar(&cfg.SpikeHold, "spike-hold", 10*time.Second, "spike: time at 5x")
	fs.DurationVar(&cfg.SpikeAfter, "spike-after", 15*time.Second, "spike: time at 0.5x after the spike")
	fs.StringVar(&cfg.Targets, "targets", "", "comma-separated target name prefixes (default all: loadshed/, nginx/, haproxy, plainproxy, direct)")
	fs.IntVar(&workers, "backend-workers", 4, "backend workers W")
	fs.DurationVar(&cfg.Backend.Service, "backend-service", 40*time.Millisecond, "backend service time S (constant); 4 x 40ms = 100 rps keeps 10x within what k6 drives on 2 shared cores")
	fs.DurationVar(&cfg.SLO, "slo", 100*time.Millisecond, "latency SLO; limits derive from it")
	fs.DurationVar(&cfg.ClientTimeout, "client-timeout", time.Second, "k6 client timeout")
	fs.StringVar(&cfg.Pin, "pin", harness.PinNone, "CPU placement: none (each proxy one worker thread, nothing pinned), proxy (target on CPU 1) or split (backend and target on CPU 1, k6 on CPU 0)")
	fs.Float64Var(&cfg.MaxLateMs, "max-late-ms", 100, "a point whose iterations start later than this at p99 is invalid")
	fs.BoolVar(&cfg.InstallPeers, "install-peers", true, "apt-get install nginx and haproxy when missing (needs root)")
	k6smoke := fs.String("k6-smoke", "", "instead of the benchmark, run every loadtest/k6 script briefly against this target (e.g. loadshed/inflight) and check its summary")
	reportFrom := fs.String("report-from", "", "re-render the report from DIR/points.json of an earlier run instead of running")
	fs.StringVar(&cfg.Bins.K6, "k6", "", "k6 binary (default: scripts/install-tools.sh k6)")
	fs.StringVar(&cfg.Bins.Proxy, "proxy-bin", "", "prebuilt proxy binary (default: go build ./cmd/proxy)")
	fs.StringVar(&cfg.Bins.Backend, "backend-bin", "", "prebuilt backend binary (default: go build ./cmd/backend)")
	fs.StringVar(&cfg.Bins.PlainProxy, "plainproxy-bin", "", "prebuilt plainproxy binary (default: go build ./cmd/plainproxy)")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *reportFrom != "" {
		return harness.Rerender(*reportFrom, stdout)
	}
	cfg.Backend.Workers = workers
	cfg.Spike = spike
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if quick {
		cfg.Quick = true
		if !set["loads"] {
			loads = "2"
		}
		if !set["duration"] {
			cfg.PointDuration = 3 * time.Second
		}
		if !set["repeats"] {
			cfg.Repeats = 1
		}
		if !set["spike"] {
			cfg.Spike = false
		}
		if !set["targets"] {
			cfg.Targets = "loadshed/inflight,loadshed/bounded-queue,nginx/limit_conn,haproxy,plainproxy,direct"
		}
	}
	var err error
	if cfg.Loads, err = parseLoads(loads); err != nil {
		return err
	}
	if cfg.RepoRoot, err = repoRoot(); err != nil {
		return err
	}
	if cfg.OutDir == "" {
		cfg.OutDir = filepath.Join(cfg.RepoRoot, "results", "bench-"+time.Now().UTC().Format("20060102-150405"))
	}
	if *k6smoke != "" {
		return harness.ScriptSmoke(ctx, cfg, *k6smoke, stdout, stderr)
	}
	cfg.CommandLine = strings.TrimSpace("go run ./bench/cmd/bench " + strings.Join(args, " "))
	start := time.Now()
	_, err = harness.Run(ctx, cfg, stdout, stderr)
	fmt.Fprintf(stderr, "bench: results in %s (%s)\n", cfg.OutDir, time.Since(start).Round(time.Second))
	return err
}

func parseLoads(s string) ([]float64, error) {
	var out []float64
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		x, err := strconv.ParseFloat(strings.TrimSuffix(f, "x"), 64)
		if err != nil {
			return nil, fmt.Errorf("--loads: %q is not a number", f)
		}
		out = append(out, x)
	}
	return out, nil
}

// repoRoot finds the repository root: git's top level, or the nearest directory with go.mod.
func repoRoot() (string, error) {
	if out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output(); err == nil {
		if root := strings.TrimSpace(string(out)); root != "" {
			if _, err := os.Stat(filepath.Join(root, "loadtest", "k6")); err == nil {
				return root, nil
			}
		}
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find the repository root (run from inside the checkout)")
		}
		dir = parent
	}
}
