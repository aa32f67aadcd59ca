package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/loadshed/loadshed/internal/cli"
	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/lab"
	"github.com/loadshed/loadshed/pkg/admission"
)

// runQuota predicts what a per-client quota gives one client at given replica counts: counted
// in each replica (no store), in the shared store, and by each replica alone while the store
// is away.
func runQuota(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("quota", stdout)
	clients := fs.String("clients", "", "the quota: a clients block as the proxy's config file spells it, e.g. '{rate: 100, burst: 20}'")
	configPath := fs.String("config", "", "a proxy config file whose clients block (or --route's own quota) to run, instead of --clients")
	route := fs.String("route", "", "with --config: the route whose own quota (routes[].clients) to run")
	arrivals := fs.String("arrivals", "", "the client's requests: constant:rate=R, poisson:rate=R, ramp:..., spike:..., trace:FILE (default: Poisson at 3x the quota)")
	duration := fs.Duration("duration", 60*time.Second, "how long generated arrivals go on")
	replicas := fs.String("replicas", "1,2,3,5", "replica counts to predict, comma-separated")
	conns := fs.Int("connections", 0, "0: each request reaches a replica at random; K: the client holds K keep-alive connections, each bound to a replica at random")
	seed := fs.Uint64("seed", 1, "seed of Poisson arrivals and of the choice of replicas")
	out := fs.String("out", "", "directory for quota.csv (none: the table only)")
	if err := parse(fs, args); err != nil {
		return err
	}
	limits, what, err := quotaOf(*clients, *configPath, *route)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	counts, err := replicaCounts(*replicas)
	if err != nil {
		return cli.UsageError{Err: fmt.Errorf("--replicas: %w", err)}
	}
	spec := *arrivals
	if spec == "" {
		spec = "poisson:rate=" + strconv.FormatFloat(3*limits.Rate, 'g', -1, 64)
	}
	arr, err := lab.ParseArrivals(spec, *duration)
	if err != nil {
		return cli.UsageError{Err: fmt.Errorf("--arrivals: %w", err)}
	}
	var results []lab.QuotaResult
	for _, n := range counts {
		sc := lab.QuotaScenario{Arrivals: arr, Limits: limits, Replicas: n, Connections: *conns, Seed: *seed}
		if err := sc.Validate(); err != nil {
			return cli.UsageError{Err: err}
		}
		for _, mode := range lab.QuotaModes {
			r, err := lab.RunQuota(sc, mode)
			if err != nil {
				return err
			}
			results = append(results, r)
		}
	}
	spread := "each request to a replica at random"
	switch {
	case *conns == 1:
		spread = "one keep-alive connection, bound to a replica at random"
	case *conns > 1:
		spread = fmt.Sprintf("%d keep-alive connections, each bound to a replica at random", *conns)
	}
	fmt.Fprintf(stdout, "lab quota: a quota of %g/s with a burst of %d (%s); one client, %s; %s.\n\n", limits.Rate, limits.Burst, what, arr, spread)
	if err := lab.WriteQuotaTable(stdout, results); err != nil {
		return err
	}
	if *out == "" {
		return nil
	}
	var csv bytes.Buffer
	if err := lab.WriteQuotaCSV(&csv, results); err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	path := filepath.Join(*out, "quota.csv")
	if err := os.WriteFile(path, csv.Bytes(), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "lab: wrote %s\n", path)
	return nil
}

// quotaOf reads the quota from --clients, or from a config file's clients block or a route's
// own quota, and describes where it came from.
func quotaOf(clients, path, route string) (admission.ClientLimitsConfig, string, error) {
	switch {
	case clients != "" && path != "":
		return admission.ClientLimitsConfig{}, "", fmt.Errorf("give --clients or --config, not both")
	case clients != "":
		if route != "" {
			return admission.ClientLimitsConfig{}, "", fmt.Errorf("--route needs --config")
		}
		c, err := config.ParseClients([]byte(clients))
		if err != nil {
			return admission.ClientLimitsConfig{}, "", fmt.Errorf("--clients: %w", err)
		}
		return c.Limits(), "--clients", nil
	case path != "":
		cfg, err := config.Load(path)
		if err != nil {
			return admission.ClientLimitsConfig{}, "", fmt.Errorf("--config: %w", err)
		}
		if cfg.Clients == nil {
			return admission.ClientLimitsConfig{}, "", fmt.Errorf("--config: %s has no clients block", path)
		}
		if route == "" {
			return cfg.Clients.Limits(), "the clients block of " + filepath.Base(path), nil
		}
		for _, r := range cfg.Routes {
			if r.Name == route {
				if r.Clients == nil {
					return admission.ClientLimitsConfig{}, "", fmt.Errorf("--route: route %q of %s has no quota of its own (routes[].clients)", route, path)
				}
				return r.ClientLimits(cfg.Clients), fmt.Sprintf("route %s of %s", route, filepath.Base(path)), nil
			}
		}
		return admission.ClientLimitsConfig{}, "", fmt.Errorf("--route: %s has no route %q", path, route)
	}
	return admission.ClientLimitsConfig{}, "", fmt.Errorf("give the quota: --clients '{rate: 100, burst: 20}' or --config FILE")
}

func replicaCounts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > lab.MaxQuotaReplicas {
			return nil, fmt.Errorf("%q is not a replica count from 1 to %d", f, lab.MaxQuotaReplicas)
		}
		out = append(out, n)
	}
	return out, nil
}
