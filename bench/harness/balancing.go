package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/loadshed/loadshed/internal/loadgen"
)

// The balancing scenario (issue 33) puts a real Envoy in front of three replicas, each the
// synthetic backend behind a loadshed sidecar (strategy adaptive, ORCA load reports on), and
// balances an open-model load over them three ways: round robin, client-side weighted round
// robin on the sidecars' in-band reports (endpoint-load-metrics), and least request. It reads
// the share of the OFFERED requests answered 2xx within the SLO, the shed share and p99 from
// cmd/loadgen, and each replica's share of the traffic from Envoy's per-host request counters.
// Three cases: one replica slowed (the 2 x 200 rps + 67 rps at 400 rps), three equal
// replicas, and the slowed replica recovering mid-run.

// Balancing cases.
const (
	CaseSlow     = "slow"
	CaseEqual    = "equal"
	CaseRecovery = "recovery"
)

// BalancingPolicy is one way Envoy balances the cluster of replicas.
type BalancingPolicy struct {
	Name string
	// Cluster is the cluster's load-balancing lines, at the cluster's indentation (column 0
	// here; envoy config indents them).
	Cluster string
}

// Policy names.
const (
	PolicyRoundRobin   = "round_robin"
	PolicyCSWRR        = "client_side_weighted_round_robin"
	PolicyLeastRequest = "least_request"
)

// BalancingPolicies are the policies the scenario compares. The weighted one reads in-band
// reports (the default: enable_oob_load_report off) and is tuned for a short run: a report
// stream of a second before a weight counts (default 10 s), weights recomputed every second
// (the default), kept for 3 minutes without reports (the default); error_utilization_penalty
// stays at its default 1.
var BalancingPolicies = []BalancingPolicy{
	{Name: PolicyRoundRobin, Cluster: "lb_policy: ROUND_ROBIN\n"},
	{Name: PolicyCSWRR, Cluster: `load_balancing_policy:
  policies:
    - typed_extension_config:
        name: envoy.load_balancing_policies.client_side_weighted_round_robin
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.client_side_weighted_round_robin.v3.ClientSideWeightedRoundRobin
          blackout_period: 1s
          weight_update_period: 1s
          weight_expiration_period: 180s
`},
	{Name: PolicyLeastRequest, Cluster: "lb_policy: LEAST_REQUEST\n"},
}

// Replica is one replica's backend: Workers workers, each request taking Service.
type Replica = Backend

// BalancingCase is one setup of replicas under one load.
type BalancingCase struct {
	Name     string
	Replicas []Replica
	Rate     float64
	// SwitchTo, in the recovery case, is what the last replica's backend becomes SwitchAfter
	// into the measured window (through its admin endpoint, at run time).
	SwitchTo    *Replica      `json:",omitempty"`
	SwitchAfter time.Duration `json:",omitempty"`
	// Policies are the policies run in this case (names of BalancingPolicies).
	Policies []string
}

// Capacity is the replicas' summed capacity in rps.
func (c BalancingCase) Capacity() float64 {
	var s float64
	for _, r := range c.Replicas {
		s += r.CapacityRPS()
	}
	return s
}

// BalancingConfig is one run of the balancing scenario.
type BalancingConfig struct {
	RepoRoot, OutDir, WorkDir string `json:"-"`
	KeepWork                  bool
	Bins                      Binaries `json:"-"`
	// Cases run in order, each policy of a case once per repeat (order rotated per repeat).
	Cases   []BalancingCase
	Repeats int
	// Warmup is sent before each measured window of Duration (the weights need a few seconds).
	Warmup, Duration   time.Duration
	SLO, ClientTimeout time.Duration
	// SampleEvery is how often Envoy's per-host counters are read.
	SampleEvery time.Duration
	// Loadshed is the sidecars' admission and report block (YAML), the same for every replica.
	Loadshed    string
	Quick       bool
	CommandLine string
}

// DefaultBalancingLoadshed is the sidecar's config beyond its addresses: strategy adaptive with
// its defaults (nothing about the backend) and in-band ORCA reports.
const DefaultBalancingLoadshed = "admission:\n  strategy: adaptive\nloadReports: {orca: true}\n"

// BalancingCases are the cases: two replicas of 4 x 20 ms and one of 4 x 60 ms (467 rps
// in all) at rate; three of 4 x 20 ms at equalRate; the slow one turning 4 x 20 ms after
// switchAfter of the measured window, at rate.
func BalancingCases(rate, equalRate float64, switchAfter time.Duration) []BalancingCase {
	fast := Replica{Workers: 4, Service: 20 * time.Millisecond}
	slow := Replica{Workers: 4, Service: 60 * time.Millisecond}
	all := []string{PolicyRoundRobin, PolicyCSWRR, PolicyLeastRequest}
	return []BalancingCase{
		{Name: CaseSlow, Replicas: []Replica{fast, fast, slow}, Rate: rate, Policies: all},
		{Name: CaseEqual, Replicas: []Replica{fast, fast, fast}, Rate: equalRate, Policies: all},
		{Name: CaseRecovery, Replicas: []Replica{fast, fast, slow}, Rate: rate, SwitchTo: &fast, SwitchAfter: switchAfter,
			Policies: []string{PolicyCSWRR, PolicyLeastRequest}},
	}
}

// Validate reports every problem, naming the field.
func (c BalancingConfig) Validate() error {
	var errs []error
	if c.RepoRoot == "" || c.OutDir == "" {
		errs = append(errs, errors.New("RepoRoot, OutDir: required"))
	}
	if c.Repeats < 1 {
		errs = append(errs, fmt.Errorf("Repeats: must be at least 1, got %d", c.Repeats))
	}
	if c.Duration < 5*time.Second {
		errs = append(errs, fmt.Errorf("Duration: must be at least 5s, got %s", c.Duration))
	}
	if c.Warmup < 0 {
		errs = append(errs, fmt.Errorf("Warmup: must be at least 0, got %s", c.Warmup))
	}
	if c.SLO <= 0 || c.ClientTimeout < c.SLO {
		errs = append(errs, fmt.Errorf("SLO, ClientTimeout: want 0 < SLO <= ClientTimeout, got %s and %s", c.SLO, c.ClientTimeout))
	}
	if c.SampleEvery < 50*time.Millisecond {
		errs = append(errs, fmt.Errorf("SampleEvery: must be at least 50ms, got %s", c.SampleEvery))
	}
	if len(c.Cases) == 0 {
		errs = append(errs, errors.New("Cases: none to run"))
	}
	for _, cs := range c.Cases {
		if len(cs.Replicas) == 0 || cs.Rate <= 0 {
			errs = append(errs, fmt.Errorf("Cases[%s]: needs replicas and a rate above 0", cs.Name))
		}
		if cs.SwitchTo != nil && (cs.SwitchAfter <= 0 || cs.SwitchAfter >= c.Duration) {
			errs = append(errs, fmt.Errorf("Cases[%s].SwitchAfter: must be inside the measured window (0, %s), got %s", cs.Name, c.Duration, cs.SwitchAfter))
		}
		for _, p := range cs.Policies {
			if _, ok := balancingPolicy(p); !ok {
				errs = append(errs, fmt.Errorf("Cases[%s].Policies: unknown policy %q", cs.Name, p))
			}
		}
	}
	return errors.Join(errs...)
}

func balancingPolicy(name string) (BalancingPolicy, bool) {
	for _, p := range BalancingPolicies {
		if p.Name == name {
			return p, true
		}
	}
	return BalancingPolicy{}, false
}

// ShareSample is Envoy's per-host counters at one moment, T seconds after the load started.
type ShareSample struct {
	T float64
	// Requests and Weights per replica (Envoy's rq_total and the host's current weight);
	// Limits each sidecar's concurrency limit (loadshed_limit, 0 when unread).
	Requests []uint64
	Weights  []uint64
	Limits   []float64 `json:",omitempty"`
}

// BalancingPoint is one policy in one case, one repeat.
type BalancingPoint struct {
	Case, Policy string
	Repeat       int
	// From cmd/loadgen over the measured window.
	Offered, Success, Goodput, Shed, Timeouts, Errors int
	P99Ms                                             float64
	// Shares are each replica's share of the requests Envoy sent in the measured window.
	Shares []float64
	// Samples are Envoy's per-host counters over the whole run (warm-up included).
	Samples []ShareSample `json:",omitempty"`
	// WarmupS is when the measured window started (seconds after the load did).
	WarmupS float64
	// Report is an endpoint-load-metrics value the last replica answered with right before the
	// load (a direct request): the reports are there.
	Report string
	// RecoveryS is, in the recovery case, how long after the switch the last replica's share
	// came back (nil: not within the run).
	RecoveryS *float64 `json:",omitempty"`
	Invalid   string   `json:",omitempty"`
	Err       string   `json:",omitempty"`
}

// Valid reports whether the point's figures may be used.
func (p BalancingPoint) Valid() bool { return p.Err == "" && p.Invalid == "" }

// WithinSLO is the share of the offered requests answered 2xx within the SLO.
func (p BalancingPoint) WithinSLO() float64 { return ratio(p.Goodput, p.Offered) }

// ShedShare is the share of the offered requests refused.
func (p BalancingPoint) ShedShare() float64 { return ratio(p.Shed, p.Offered) }

func ratio(a, b int) float64 {
	if b == 0 {
		return math.NaN()
	}
	return float64(a) / float64(b)
}

// BalancingResult is a whole run.
type BalancingResult struct {
	Kind    string // "balancing"
	Config  BalancingConfig
	Points  []BalancingPoint
	Started time.Time
	Elapsed time.Duration
}

// RunBalancing runs the balancing scenario and writes its outputs into cfg.OutDir.
func RunBalancing(ctx context.Context, cfg BalancingConfig, stdout, stderr io.Writer) (*BalancingResult, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, "bench balancing: "+format+"\n", a...) }
	work, cleanup, err := workDir(cfg.WorkDir, cfg.KeepWork, "loadshed-balancing-")
	if err != nil {
		return nil, err
	}
	defer cleanup()
	if err := os.MkdirAll(filepath.Join(cfg.OutDir, "loadgen"), 0o755); err != nil {
		return nil, err
	}
	if cfg.Bins, err = balancingBinaries(ctx, cfg, work, logf); err != nil {
		return nil, err
	}
	root := os.Geteuid() == 0
	res := &BalancingResult{Kind: "balancing", Config: cfg, Started: time.Now()}
	var failures []string
	total := 0
	for _, cs := range cfg.Cases {
		total += cfg.Repeats * len(cs.Policies)
	}
	n := 0
	for rep := 1; rep <= cfg.Repeats; rep++ {
		for _, cs := range cfg.Cases {
			for i := range cs.Policies {
				pol, _ := balancingPolicy(cs.Policies[(i+rep-1)%len(cs.Policies)])
				if err := ctx.Err(); err != nil {
					return res, err
				}
				n++
				logf("[%d/%d] repeat %d, %s, %s", n, total, rep, cs.Name, pol.Name)
				p := runBalancingPoint(ctx, cfg, cs, pol, rep, work, root)
				res.Points = append(res.Points, p)
				switch {
				case p.Err != "":
					logf("  FAILED: %s", p.Err)
					failures = append(failures, fmt.Sprintf("%s %s repeat %d: %s", cs.Name, pol.Name, rep, p.Err))
					if cfg.Quick {
						res.Elapsed = time.Since(res.Started)
						_ = res.writeOutputs(stdout)
						return res, fmt.Errorf("%s %s failed: %s", cs.Name, pol.Name, p.Err)
					}
				default:
					state := ""
					if p.Invalid != "" {
						state = " INVALID: " + p.Invalid
					}
					rec := ""
					if cs.SwitchTo != nil {
						rec = ", recovery " + fmtSeconds(p.RecoveryS)
					}
					logf("  within SLO %.3f, shed %.3f, p99 %.0f ms, shares %s%s%s", p.WithinSLO(), p.ShedShare(), p.P99Ms, fmtShares(p.Shares), rec, state)
				}
			}
		}
	}
	res.Elapsed = time.Since(res.Started)
	return res, finishRun(func() error { return res.writeOutputs(stdout) }, failures)
}

func fmtSeconds(s *float64) string {
	if s == nil {
		return "not within the run"
	}
	return fmt.Sprintf("%.1f s", *s)
}

func fmtShares(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf("%.3f", x)
	}
	return strings.Join(parts, " / ")
}

// balancingBinaries builds the backend, the proxy and the load generator from the checkout
// (unless given) and installs Envoy (scripts/install-tools.sh envoy) unless given.
func balancingBinaries(ctx context.Context, cfg BalancingConfig, work string, logf func(string, ...any)) (Binaries, error) {
	b := cfg.Bins
	binDir := filepath.Join(work, "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return b, err
	}
	for _, prog := range []struct {
		dst       *string
		pkg, name string
	}{{&b.Backend, "cmd/backend", "backend"}, {&b.Proxy, "cmd/proxy", "proxy"}, {&b.Loadgen, "cmd/loadgen", "loadgen"}} {
		if *prog.dst != "" {
			continue
		}
		out, err := buildProgram(ctx, cfg.RepoRoot, binDir, prog.pkg, prog.name, logf)
		if err != nil {
			return b, err
		}
		*prog.dst = out
	}
	if b.Envoy == "" {
		envoy, err := installEnvoy(ctx, cfg.RepoRoot, binDir, logf)
		if err != nil {
			return b, err
		}
		b.Envoy = envoy
	}
	return b, nil
}

// replicaProcs are one replica's processes and addresses.
type replicaProcs struct {
	backend, sidecar    *proc
	data, admin, badmin string
}

// runBalancingPoint starts fresh replicas and a fresh Envoy, sends the load and reads the figures.
func runBalancingPoint(ctx context.Context, cfg BalancingConfig, cs BalancingCase, pol BalancingPolicy, rep int, work string, root bool) BalancingPoint {
	p := BalancingPoint{Case: cs.Name, Policy: pol.Name, Repeat: rep, WarmupS: cfg.Warmup.Seconds()}
	name := fmt.Sprintf("r%d-%s-%s", rep, cs.Name, pol.Name)
	dir := filepath.Join(work, "points", name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		p.Err = err.Error()
		return p
	}
	if root {
		if err := makeWritable(dir); err != nil {
			p.Err = err.Error()
			return p
		}
	}
	var all []*proc
	defer func() {
		for _, pr := range all {
			pr.stop(0)
		}
	}()
	reps := make([]replicaProcs, len(cs.Replicas))
	for i, r := range cs.Replicas {
		ports, err := freePorts(4)
		if err != nil {
			p.Err = err.Error()
			return p
		}
		rp := replicaProcs{data: ports[0], admin: ports[1], badmin: ports[3]}
		be, err := startProc(fmt.Sprintf("backend %d", i+1), cfg.Bins.Backend, []string{"--listen", ports[2], "--admin-listen", ports[3]}, nil,
			filepath.Join(dir, fmt.Sprintf("backend%d.log", i+1)), "", -1, root)
		if err != nil {
			p.Err = err.Error()
			return p
		}
		all = append(all, be)
		rp.backend = be
		if err := waitHTTP(ctx, "http://"+ports[3]+"/healthz", 10*time.Second, be); err != nil {
			p.Err = fmt.Sprintf("backend %d: %v", i+1, err)
			return p
		}
		if err := configureBackend(ctx, ports[3], r); err != nil {
			p.Err = fmt.Sprintf("backend %d: %v", i+1, err)
			return p
		}
		path := filepath.Join(dir, fmt.Sprintf("loadshed%d.yaml", i+1))
		if err := os.WriteFile(path, []byte(balancingLoadshedConfig(cfg.Loadshed, rp.data, rp.admin, ports[2])), 0o644); err != nil {
			p.Err = err.Error()
			return p
		}
		sc, err := startProc(fmt.Sprintf("loadshed %d", i+1), cfg.Bins.Proxy, []string{"--config", path}, []string{"GOMAXPROCS=1"},
			filepath.Join(dir, fmt.Sprintf("loadshed%d.log", i+1)), "", -1, root)
		if err != nil {
			p.Err = err.Error()
			return p
		}
		all = append(all, sc)
		rp.sidecar = sc
		if err := waitHTTP(ctx, "http://"+rp.admin+"/readyz", 10*time.Second, be, sc); err != nil {
			p.Err = fmt.Sprintf("loadshed %d: %v", i+1, err)
			return p
		}
		reps[i] = rp
	}
	ports, err := freePorts(2)
	if err != nil {
		p.Err = err.Error()
		return p
	}
	listen, admin := ports[0], ports[1]
	var datas []string
	for _, r := range reps {
		datas = append(datas, r.data)
	}
	text, err := balancingEnvoyConfig(pol, listen, admin, datas)
	if err != nil {
		p.Err = err.Error()
		return p
	}
	envoyPath := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(envoyPath, []byte(text), 0o644); err != nil {
		p.Err = err.Error()
		return p
	}
	envoy, err := startProc("envoy", cfg.Bins.Envoy, envoyArgs(envoyPath), nil, filepath.Join(dir, "envoy.log"), "", -1, root)
	if err != nil {
		p.Err = err.Error()
		return p
	}
	all = append(all, envoy)
	if err := waitHTTP(ctx, "http://"+admin+"/ready", 10*time.Second, all...); err != nil {
		p.Err = "envoy: " + err.Error()
		return p
	}
	if err := waitHTTP(ctx, "http://"+listen+"/", 10*time.Second, all...); err != nil {
		p.Err = "end-to-end check: " + err.Error()
		return p
	}
	// The reports are there: one request straight to the last replica's sidecar.
	if p.Report, err = loadReportOf(ctx, "http://"+reps[len(reps)-1].data+"/"); err != nil {
		p.Err = err.Error()
		return p
	}

	// The load, with Envoy's per-host counters read beside it.
	var admins []string
	for _, r := range reps {
		admins = append(admins, "http://"+r.admin+"/metrics")
	}
	sampler := startHostSampler(ctx, "http://"+admin+"/clusters?format=json", datas, admins, cfg.SampleEvery)
	var switchErr error
	var switchWait sync.WaitGroup
	if cs.SwitchTo != nil {
		switchWait.Add(1)
		go func() {
			defer switchWait.Done()
			select {
			case <-ctx.Done():
			case <-time.After(cfg.Warmup + cs.SwitchAfter):
				switchErr = configureBackend(ctx, reps[len(reps)-1].badmin, *cs.SwitchTo)
			}
		}()
	}
	out := filepath.Join(cfg.OutDir, "loadgen", name+".json")
	lg, err := runBalancingLoad(ctx, cfg, cs, rep, "http://"+listen+"/", out, filepath.Join(dir, "loadgen.log"))
	p.Samples = sampler.stop()
	switchWait.Wait()
	if err != nil {
		p.Err = err.Error()
		return p
	}
	if switchErr != nil {
		p.Err = "switching the last replica: " + switchErr.Error()
		return p
	}
	for _, pr := range all {
		if err := pr.exited(); err != nil {
			p.Err = err.Error()
			return p
		}
	}
	p.Offered, p.Success, p.Goodput, p.Shed = lg.Offered, lg.Success, lg.Goodput, lg.Shed
	p.Timeouts, p.Errors = lg.Timeouts, lg.TransportErrors+lg.BuildErrors
	p.P99Ms = float64(lg.AdmittedLatency.P99) / float64(time.Millisecond)
	if !lg.Valid {
		p.Invalid = lg.InvalidReason
	}
	start, end := cfg.Warmup.Seconds(), (cfg.Warmup + cfg.Duration).Seconds()
	p.Shares = sharesBetween(p.Samples, start, end)
	if p.Shares == nil && p.Invalid == "" {
		p.Invalid = "no per-host counters from Envoy over the measured window"
	}
	if cs.SwitchTo != nil {
		p.RecoveryS = recoveryTime(p.Samples, len(reps)-1, start+cs.SwitchAfter.Seconds(), end)
	}
	return p
}

// balancingLoadshedConfig is one sidecar's config: its addresses, then block.
func balancingLoadshedConfig(block, listen, admin, backend string) string {
	return fmt.Sprintf("listen: %q\nupstream: %q\nadminListen: %q\nupstreamTimeout: 30s\n", listen, "http://"+backend, admin) + block
}

// balancingEnvoyConfig is Envoy's bootstrap for one policy: listener on listen, admin on admin,
// one cluster "replicas" of the given addresses balanced by the policy. One worker, circuit
// breakers out of reach (the sidecars admit and refuse), the router's 30 s timeout.
func balancingEnvoyConfig(pol BalancingPolicy, listen, admin string, replicas []string) (string, error) {
	lh, lp, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("envoy listen address %q: %w", listen, err)
	}
	ah, ap, err := net.SplitHostPort(admin)
	if err != nil {
		return "", fmt.Errorf("envoy admin address %q: %w", admin, err)
	}
	if len(replicas) == 0 {
		return "", errors.New("envoy cluster: no replicas")
	}
	var eps strings.Builder
	for _, r := range replicas {
		h, p, err := net.SplitHostPort(r)
		if err != nil {
			return "", fmt.Errorf("replica address %q: %w", r, err)
		}
		fmt.Fprintf(&eps, "              - endpoint: {address: {socket_address: {address: %s, port_value: %s}}}\n", h, p)
	}
	return fmt.Sprintf(`# generated by bench: balancing, policy %[1]s, one worker (--concurrency 1), loopback only
admin:
  address: {socket_address: {address: %[2]s, port_value: %[3]s}}
static_resources:
  listeners:
    - name: ingress
      address: {socket_address: {address: %[4]s, port_value: %[5]s}}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: ingress
                route_config:
                  virtual_hosts:
                    - name: all
                      domains: ["*"]
                      routes:
                        - match: {prefix: "/"}
                          route: {cluster: replicas, timeout: 30s}
                http_filters:
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
    - name: replicas
      type: STATIC
      connect_timeout: 1s
%[6]s      circuit_breakers:
        thresholds:
          - {max_requests: 1000000, max_connections: 1000000, max_pending_requests: 1000000, max_retries: 3}
      load_assignment:
        cluster_name: replicas
        endpoints:
          - lb_endpoints:
%[7]s`, pol.Name, ah, ap, lh, lp, indent(pol.Cluster, 6), eps.String()), nil
}

// loadReportOf sends one GET to url and returns its endpoint-load-metrics header.
func loadReportOf(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return "", fmt.Errorf("direct request to a replica: %w", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	r := resp.Header.Get("Endpoint-Load-Metrics")
	if r == "" {
		return "", fmt.Errorf("direct request to a replica (%s): status %d with no endpoint-load-metrics header (are loadReports on?)", url, resp.StatusCode)
	}
	return r, nil
}

// runBalancingLoad runs cmd/loadgen: Poisson arrivals at the case's rate for the warm-up and the
// measured window, the warm-up left out of its figures.
func runBalancingLoad(ctx context.Context, cfg BalancingConfig, cs BalancingCase, rep int, url, out, logPath string) (*loadgen.Result, error) {
	argv := []string{cfg.Bins.Loadgen, "--target", url, "--rate", strconv.FormatFloat(cs.Rate, 'g', -1, 64),
		"--duration", (cfg.Warmup + cfg.Duration).String(), "--warmup", cfg.Warmup.String(), "--poisson-seed", fmt.Sprint(rep),
		"--timeout", cfg.ClientTimeout.String(), "--slo", cfg.SLO.String(), "--json"}
	return execLoadgen(ctx, argv, out, logPath)
}

// hostSampler reads Envoy's /clusters?format=json every interval until stopped.
type hostSampler struct {
	cancel  context.CancelFunc
	done    chan struct{}
	samples []ShareSample
}

// It also reads each sidecar's concurrency limit from metricsURLs (one per replica).
func startHostSampler(ctx context.Context, url string, replicas, metricsURLs []string, every time.Duration) *hostSampler {
	ctx, cancel := context.WithCancel(ctx)
	s := &hostSampler{cancel: cancel, done: make(chan struct{})}
	start := time.Now()
	client := &http.Client{Timeout: time.Second}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			if sm, ok := readHosts(ctx, client, url, replicas); ok {
				sm.T = time.Since(start).Seconds()
				sm.Limits = make([]float64, len(metricsURLs))
				for i, u := range metricsURLs {
					if body, err := getBody(ctx, client, u); err == nil {
						sm.Limits[i], _ = loadshedLimit(body)
					}
				}
				s.samples = append(s.samples, sm)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

func (s *hostSampler) stop() []ShareSample {
	s.cancel()
	<-s.done
	return s.samples
}

// envoyClusters is the part of Envoy's /clusters?format=json the sampler reads.
type envoyClusters struct {
	ClusterStatuses []struct {
		Name         string `json:"name"`
		HostStatuses []struct {
			Address struct {
				SocketAddress struct {
					Address   string `json:"address"`
					PortValue int    `json:"port_value"`
				} `json:"socket_address"`
			} `json:"address"`
			Stats []struct {
				Name  string          `json:"name"`
				Value json.RawMessage `json:"value"`
			} `json:"stats"`
			Weight json.RawMessage `json:"weight"`
		} `json:"host_statuses"`
	} `json:"cluster_statuses"`
}

func readHosts(ctx context.Context, client *http.Client, url string, replicas []string) (ShareSample, bool) {
	body, err := getBody(ctx, client, url)
	if err != nil {
		return ShareSample{}, false
	}
	return parseHosts(body, "replicas", replicas)
}

// getBody GETs url and returns its body (at most 1 MiB) when the answer is 200.
func getBody(ctx context.Context, client *http.Client, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	return body, err
}

// parseHosts takes each replica's rq_total and weight from Envoy's /clusters?format=json.
func parseHosts(body []byte, cluster string, replicas []string) (ShareSample, bool) {
	var cs envoyClusters
	if err := json.Unmarshal(body, &cs); err != nil {
		return ShareSample{}, false
	}
	sm := ShareSample{Requests: make([]uint64, len(replicas)), Weights: make([]uint64, len(replicas))}
	found := 0
	for _, c := range cs.ClusterStatuses {
		if c.Name != cluster {
			continue
		}
		for _, h := range c.HostStatuses {
			addr := net.JoinHostPort(h.Address.SocketAddress.Address, strconv.Itoa(h.Address.SocketAddress.PortValue))
			for i, r := range replicas {
				if r != addr {
					continue
				}
				found++
				sm.Weights[i] = jsonUint(h.Weight)
				for _, st := range h.Stats {
					if st.Name == "rq_total" {
						sm.Requests[i] = jsonUint(st.Value)
					}
				}
			}
		}
	}
	return sm, found == len(replicas)
}

// jsonUint reads a protobuf JSON integer, written as a number or (64-bit) as a string; 0 when
// absent.
func jsonUint(raw json.RawMessage) uint64 {
	n, err := strconv.ParseUint(strings.Trim(string(raw), `"`), 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// sharesBetween is each replica's share of the requests Envoy sent between the samples nearest
// to from and to (seconds after the load started); nil when there are no two such samples.
func sharesBetween(samples []ShareSample, from, to float64) []float64 {
	a, b := nearestSample(samples, from), nearestSample(samples, to)
	if a < 0 || b <= a {
		return nil
	}
	var total uint64
	for i := range samples[b].Requests {
		total += samples[b].Requests[i] - samples[a].Requests[i]
	}
	if total == 0 {
		return nil
	}
	out := make([]float64, len(samples[b].Requests))
	for i := range out {
		out[i] = float64(samples[b].Requests[i]-samples[a].Requests[i]) / float64(total)
	}
	return out
}

func nearestSample(samples []ShareSample, t float64) int {
	best := -1
	for i, s := range samples {
		if best < 0 || math.Abs(s.T-t) < math.Abs(samples[best].T-t) {
			best = i
		}
	}
	return best
}

// Recovery criterion: the replica's share over a RecoveryWindow reaches RecoveryShare of an
// equal share and its mean share over the next RecoveryHold stays there.
const (
	RecoveryWindow = time.Second
	RecoveryHold   = 3 * time.Second
	RecoveryShare  = 0.9
)

// recoveryTime is how long after switchAt (seconds after the load started) replica's share of
// Envoy's requests over the previous RecoveryWindow first reached RecoveryShare of an equal share
// (1/replicas) and held that on average over the following RecoveryHold, all before end; nil if
// it never did.
func recoveryTime(samples []ShareSample, replica int, switchAt, end float64) *float64 {
	if len(samples) == 0 {
		return nil
	}
	target := RecoveryShare / float64(len(samples[0].Requests))
	shareOver := func(from, to float64) (float64, bool) {
		s := sharesBetween(samples, from, to)
		if s == nil {
			return 0, false
		}
		return s[replica], true
	}
	w, hold := RecoveryWindow.Seconds(), RecoveryHold.Seconds()
	for _, s := range samples {
		if s.T < switchAt || s.T+hold > end {
			continue
		}
		now, ok := shareOver(s.T-w, s.T)
		if !ok || now < target {
			continue
		}
		if next, ok := shareOver(s.T, s.T+hold); ok && next >= target {
			d := s.T - switchAt
			return &d
		}
	}
	return nil
}
