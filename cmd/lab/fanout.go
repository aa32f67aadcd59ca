package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/loadshed/loadshed/internal/cli"
	"github.com/loadshed/loadshed/internal/lab"
)

// fanoutDefaultStrategy is the sidecar policy of the case: an in-flight limit of 4 in
// front of 4 workers.
const fanoutDefaultStrategy = "{strategy: inflight, inflight: {limit: 4}}"

// runFanout is "lab fanout" and, with live set, "lab compare --fanout": a frontend's user
// requests fanning out to every service at once, with independent sidecars and with cohorts.
func runFanout(ctx context.Context, name string, args []string, live bool, stdout, stderr io.Writer) error {
	fs := newFlagSet(name, stdout)
	if live {
		fs.Bool("fanout", true, "compare a call graph (this command's flags are lab fanout's)")
	}
	services := fs.Int("services", 4, "services the frontend calls at once for every user request")
	var strategies, svcSpecs listFlag
	fs.Var(&strategies, "strategy", "every sidecar's admission block, as for lab run; repeat once per service to give each its own (default "+fanoutDefaultStrategy+")")
	fs.Var(&svcSpecs, "service", "every backend's service time, as for lab run; repeat once per service to give each its own (default slowtail: 20ms mean, 5ms stddev, 1% tail of mean 300ms in [100ms, 2s], the bench's adaptive slow tail at 20ms)")
	servers := fs.String("servers", "4", "backend workers: one number for every service, or one per service (4,4,8,4)")
	cohorts := fs.String("cohorts", "count=128", "the cohorts variant's ranked admission: count=N[,strategyShare=F,waitFraction=F,maxWait=D,window=D] (admission.CohortOptions)")
	variants := fs.String("variants", "independent,cohorts", "which sidecars to run: independent, cohorts, or both")
	loadList := fs.String("loads", "1.5,2,3", "offered loads: user requests per second as multiples of the least service's capacity (workers / mean service time)")
	duration := fs.Duration("duration", 10*time.Second, "how long user requests are offered")
	arrivals := fs.String("arrivals", "", "the frontend's own arrivals instead of Poisson at --loads, as for lab run (lab only)")
	timeout := fs.Duration("timeout", 2*time.Second, "each leg's timeout (the frontend's --call-timeout; 0 = none)")
	hop := fs.String("hop", "none", "every service's hop, as for lab run")
	seed := fs.Uint64("seed", 1, "seed of arrivals, ranks, hops and service times")
	out := fs.String("out", "", "directory for fanout.csv (default: none written)")
	var labOnly *bool
	if live {
		labOnly = fs.Bool("lab-only", false, "run only the lab half")
		if f := fs.Lookup("hop"); f != nil {
			f.Usage += "; when not given, the comparison calibrates with the live half (none with --lab-only)"
		}
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	sc, cfg, err := fanoutSetup(*services, strategies, svcSpecs, *servers, *cohorts, *variants, *loadList, *arrivals, *duration, *timeout, *hop, *seed)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	cfg.Scenario = sc
	var runner lab.FanoutLive
	if live && !*labOnly {
		if *arrivals != "" {
			return cli.Usagef("--arrivals: the live call graph runs Poisson user requests at --loads; use --lab-only")
		}
		runner = newFanoutLive()
		cfg.Calibrate = !flagSet(fs, "hop")
	}
	start := time.Now()
	cmp, err := lab.CompareFanout(ctx, cfg, runner, stderr)
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, describeFanout(sc, cfg, cmp))
	if cal := cmp.Calibration; cal != nil {
		fmt.Fprintf(stdout, "Calibrated in %s (%d workers x %s behind the proxy): %s.\n", cal.Took.Round(100*time.Millisecond),
			cal.Workers, cal.Service, describeCalibration(*cal))
	}
	if runner != nil {
		var rows []lab.CompareRow
		for _, r := range cmp.Rows {
			if r.Live != nil {
				rows = append(rows, lab.CompareRow{Live: &lab.LiveResult{Machine: r.Live.Machine}})
			}
		}
		fmt.Fprintf(stdout, "Machine: %s; took %s.\n", describeMachine(rows), time.Since(start).Round(time.Second))
	}
	fmt.Fprintln(stdout)
	if err := lab.WriteFanoutTable(stdout, cmp.Rows); err != nil {
		return err
	}
	if *out == "" {
		return nil
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := lab.WriteFanoutCSV(&buf, cmp.Rows); err != nil {
		return err
	}
	path := filepath.Join(*out, "fanout.csv")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "lab: wrote %s\n", path)
	return nil
}

// fanoutSetup builds the call graph and the comparison from the flags' values.
func fanoutSetup(n int, strategies, svcSpecs []string, servers, cohorts, variants, loads, arrivals string,
	duration, timeout time.Duration, hop string, seed uint64) (lab.FanoutScenario, lab.FanoutConfig, error) {
	var sc lab.FanoutScenario
	var cfg lab.FanoutConfig
	if n < 1 || n > lab.MaxFanoutServices {
		return sc, cfg, fmt.Errorf("--services: must be in [1, %d], got %d", lab.MaxFanoutServices, n)
	}
	perService := func(flag string, given []string, def string) ([]string, error) {
		switch len(given) {
		case 0:
			given = []string{def}
			fallthrough
		case 1:
			out := make([]string, n)
			for i := range out {
				out[i] = given[0]
			}
			return out, nil
		case n:
			return given, nil
		}
		return nil, fmt.Errorf("--%s: give it once for every service or %d times (once per service), not %d times", flag, n, len(given))
	}
	stSpecs, err := perService("strategy", strategies, fanoutDefaultStrategy)
	if err != nil {
		return sc, cfg, err
	}
	svcs, err := perService("service", svcSpecs, "slowtail")
	if err != nil {
		return sc, cfg, err
	}
	srv, err := perService("servers", strings.Split(servers, ","), "4")
	if err != nil {
		return sc, cfg, err
	}
	h, err := lab.ParseHop(hop)
	if err != nil {
		return sc, cfg, fmt.Errorf("--hop: %w", err)
	}
	for i := range n {
		st, err := lab.ParseStrategy(stSpecs[i])
		if err != nil {
			return sc, cfg, fmt.Errorf("--strategy: %w", err)
		}
		svc, err := lab.ParseService(svcs[i])
		if err != nil {
			return sc, cfg, fmt.Errorf("--service: %w", err)
		}
		w, err := strconv.Atoi(strings.TrimSpace(srv[i]))
		if err != nil || w < 1 || w > lab.MaxServers {
			return sc, cfg, fmt.Errorf("--servers: %q: want a number of workers in [1, %d]", srv[i], lab.MaxServers)
		}
		sc.Services = append(sc.Services, lab.FanoutService{Strategy: st, Service: svc, Servers: w, Hop: h})
	}
	sc.Timeout, sc.Seed = timeout, seed
	if timeout < 0 {
		return sc, cfg, fmt.Errorf("--timeout: must not be negative, got %s", timeout)
	}
	if cfg.Cohorts, err = lab.ParseCohorts(cohorts); err != nil {
		return sc, cfg, fmt.Errorf("--cohorts: %w", err)
	}
	for _, v := range strings.Split(variants, ",") {
		switch strings.TrimSpace(v) {
		case "independent", "off":
			cfg.Variants = append(cfg.Variants, false)
		case "cohorts", "on":
			cfg.Variants = append(cfg.Variants, true)
		default:
			return sc, cfg, fmt.Errorf("--variants: %q is not independent or cohorts", v)
		}
	}
	cfg.Duration = duration
	if arrivals != "" {
		if sc.Arrivals, err = lab.ParseArrivals(arrivals, duration); err != nil {
			return sc, cfg, fmt.Errorf("--arrivals: %w", err)
		}
		return sc, cfg, nil
	}
	if cfg.Loads, err = parseLoads(loads); err != nil {
		return sc, cfg, err
	}
	return sc, cfg, nil
}

// describeFanout is the line above the table: the call graph and how it was offered.
func describeFanout(sc lab.FanoutScenario, cfg lab.FanoutConfig, cmp *lab.FanoutComparison) string {
	var b strings.Builder
	fmt.Fprintf(&b, "A frontend calls %d services at once per user request; ", len(sc.Services))
	if len(cfg.Loads) > 0 {
		loads := make([]string, len(cfg.Loads))
		for i, l := range cfg.Loads {
			loads[i] = fmt.Sprintf("%gx", l)
		}
		fmt.Fprintf(&b, "user requests Poisson at %s of %.1f rps (the least service's capacity) for %s.\n", strings.Join(loads, ", "), cmp.Capacity, cfg.Duration)
	} else {
		fmt.Fprintf(&b, "user requests: %s.\n", sc.Arrivals)
	}
	same := true
	for _, s := range sc.Services[1:] {
		same = same && s.Strategy.Spec == sc.Services[0].Strategy.Spec && s.Servers == sc.Services[0].Servers && s.Service == sc.Services[0].Service
	}
	for i, s := range sc.Services {
		if same && i > 0 {
			break
		}
		who := "Every service"
		if !same {
			who = "Service " + sc.ServiceName(i)
		}
		fmt.Fprintf(&b, "%s: sidecar %s, %d workers, service %s (mean %s).\n", who, s.Strategy.Spec, s.Servers,
			describeSlowtail(s), lab.MeanService(s.Service).Round(10*time.Microsecond))
	}
	fmt.Fprintf(&b, "Leg timeout %s; hop %s; cohorts %s, one uniformly random rank per user request on every leg.", describeTimeout(sc.Timeout), cmp.Hop, cfg.Cohorts)
	return b.String()
}

func describeSlowtail(s lab.FanoutService) string {
	c := s.Service
	if c.Stddev == 0 && c.TailProb == 0 {
		return "constant " + c.Mean.String()
	}
	return fmt.Sprintf("normal %s±%s, %g%% tail of mean %s in [%s, %s]", c.Mean, c.Stddev, 100*c.TailProb, c.TailMean, c.TailMin, c.TailMax)
}

// isFanoutCompare reports whether compare's arguments ask for the call graph.
func isFanoutCompare(args []string) bool {
	for _, a := range args {
		switch a {
		case "--fanout", "-fanout", "--fanout=true", "-fanout=true":
			return true
		}
	}
	return false
}
