package harness

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/loadshed/loadshed/internal/fsutil"

	"github.com/loadshed/loadshed/bench/k6summary"
)

// Point is one run of one scenario against one target.
type Point struct {
	Target   string
	Scenario string
	Load     float64
	Repeat   int
	// Summary is k6's summary; nil when the point failed before k6 finished.
	Summary *k6summary.Summary
	// CPUNanos is the target's CPU time during the k6 run (0 for direct); PeakRSS its peak
	// resident memory in bytes.
	CPUNanos int64
	PeakRSS  int64
	// Trace is the target's concurrency limit over time (Config.TraceEvery), from the start of
	// the warm-up; TraceStart is the time within it at which the measured run began.
	Trace      []Sample `json:",omitempty"`
	TraceStart float64  `json:",omitempty"`
	// Backend is what the backend's workers did over the measured window (nil: not read).
	Backend *BackendUsage `json:",omitempty"`
	// Err says why the point produced no figures (a process failed, k6 failed).
	Err string
}

// Valid reports whether the point's figures may be used.
func (p Point) Valid() bool { return p.Err == "" && p.Summary != nil && p.Summary.Valid }

// Skipped is a target left out, with the reason.
type Skipped struct{ Target, Reason string }

// Result is everything one harness run measured.
type Result struct {
	Config    Config
	Limits    Limits
	Targets   []Target
	Skipped   []Skipped
	Scenarios []Scenario
	Points    []Point
	Started   time.Time
	Elapsed   time.Duration
	Pinned    bool
}

// Run executes the whole benchmark and writes the outputs into cfg.OutDir. It returns an
// error when a process failed to start or k6 failed (in Quick mode at the first such point);
// invalid points (k6 behind schedule) and missed goals are reported, not returned.
func Run(ctx context.Context, cfg Config, stdout, stderr io.Writer) (*Result, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	limits, _ := DeriveLimits(cfg.Backend, cfg.SLO)
	res := &Result{Config: cfg, Limits: limits, Started: time.Now(), Scenarios: cfg.scenarios()}
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, "bench: "+format+"\n", a...) }

	targets, err := SelectTargets(append(AllTargets(limits), VariantTargets(limits, cfg.Variants...)...), cfg.Targets)
	if err != nil {
		return nil, err
	}
	work := cfg.WorkDir
	if work == "" {
		if work, err = os.MkdirTemp("", "loadshed-bench-"); err != nil {
			return nil, err
		}
		if !cfg.KeepWork {
			defer os.RemoveAll(work)
		}
	}
	if err := os.MkdirAll(work, 0o755); err != nil {
		return nil, err
	}
	if err := os.Chmod(work, 0o755); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(cfg.OutDir, "k6"), 0o755); err != nil {
		return nil, err
	}

	bins, err := prepareBinaries(ctx, cfg, targets, work, logf)
	if err != nil {
		return nil, err
	}
	root := os.Geteuid() == 0
	res.Pinned = cfg.Pin != PinNone && bins.Taskset != "" && runtime.NumCPU() >= 2
	if cfg.Pin != PinNone && !res.Pinned {
		logf("not pinning: needs taskset and two CPUs")
	}

	if res.Targets, res.Skipped, err = acceptedTargets(ctx, targets, bins.Proxy, limits, work, cfg.Quick, logf); err != nil {
		return nil, err
	}

	var failures []string
	n := 0
	total := cfg.Repeats * len(res.Scenarios) * len(res.Targets)
	for rep := 1; rep <= cfg.Repeats; rep++ {
		for _, sc := range res.Scenarios {
			order := rotate(res.Targets, rep-1)
			for _, t := range order {
				if err := ctx.Err(); err != nil {
					return res, err
				}
				n++
				logf("[%d/%d] repeat %d, %s, %s", n, total, rep, sc.Name, t.Name)
				p := runPoint(ctx, cfg, res, bins, t, sc, rep, work, root)
				res.Points = append(res.Points, p)
				switch {
				case p.Err != "":
					logf("  FAILED: %s", p.Err)
					failures = append(failures, fmt.Sprintf("%s %s repeat %d: %s", t.Name, sc.Name, rep, p.Err))
					if cfg.Quick {
						res.Elapsed = time.Since(res.Started)
						_ = writeOutputs(res, stdout)
						return res, fmt.Errorf("%s at %s failed: %s", t.Name, sc.Name, p.Err)
					}
				case !p.Summary.Valid:
					logf("  INVALID: %s", p.Summary.InvalidReason)
				default:
					s := p.Summary
					logf("  goodput/C %.3f, admitted p99 %s ms, shed %.1f%%, cpu %.1f ms/1k req",
						k6summary.Value(s.GoodputRatio), fmtMs(s.AdmittedMs.P99), 100*s.ShedShare, cpuPer1000(p))
				}
			}
		}
	}
	res.Elapsed = time.Since(res.Started)
	return res, finishRun(func() error { return writeOutputs(res, stdout) }, failures)
}

// finishRun writes a run's outputs, then reports the points that failed, if any.
func finishRun(write func() error, failures []string) error {
	if err := write(); err != nil {
		return err
	}
	if len(failures) > 0 {
		return fmt.Errorf("%d point(s) failed:\n  %s", len(failures), strings.Join(failures, "\n  "))
	}
	return nil
}

func rotate(ts []Target, k int) []Target {
	out := make([]Target, 0, len(ts))
	for i := range ts {
		out = append(out, ts[(i+k)%len(ts)])
	}
	return out
}

func fmtMs(p *float64) string {
	if p == nil {
		return "n/a"
	}
	return fmt.Sprintf("%.1f", *p)
}

// buildProgram builds the checkout's package pkg (cmd/...) into binDir/name.
func buildProgram(ctx context.Context, repoRoot, binDir, pkg, name string, logf func(string, ...any)) (string, error) {
	if _, err := os.Stat(filepath.Join(repoRoot, pkg)); err != nil {
		return "", fmt.Errorf("%s: not in this checkout (pass a prebuilt binary, or leave its targets out with --targets)", pkg)
	}
	out := filepath.Join(binDir, name)
	logf("building %s", pkg)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-o", out, "./"+pkg)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./%s: %v\n%s", pkg, err, msg)
	}
	return out, nil
}

// prepareBinaries builds the Go programs, finds or installs the peers and k6.
func prepareBinaries(ctx context.Context, cfg Config, targets []Target, work string, logf func(string, ...any)) (Binaries, error) {
	b := cfg.Bins
	need := map[Kind]bool{}
	for _, t := range targets {
		need[t.Kind] = true
		if t.envoy != nil && t.envoy.Sidecar != nil {
			need[KindLoadshed] = true // Envoy's external processor is the proxy
		}
	}
	binDir := filepath.Join(work, "bin")
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return b, err
	}
	build := func(dst *string, pkg, name string) error {
		if *dst != "" {
			return nil
		}
		out, err := buildProgram(ctx, cfg.RepoRoot, binDir, pkg, name, logf)
		*dst = out
		return err
	}
	if err := build(&b.Backend, "cmd/backend", "backend"); err != nil {
		return b, err
	}
	if need[KindLoadshed] {
		if err := build(&b.Proxy, "cmd/proxy", "proxy"); err != nil {
			return b, err
		}
	}
	if need[KindPlain] {
		if err := build(&b.PlainProxy, "cmd/plainproxy", "plainproxy"); err != nil {
			return b, err
		}
	}
	if b.Taskset == "" {
		b.Taskset, _ = exec.LookPath("taskset")
	}
	var missing []string
	look := func(dst *string, name string) {
		if *dst != "" {
			return
		}
		for _, p := range []string{name, "/usr/sbin/" + name, "/usr/local/sbin/" + name} {
			if path, err := exec.LookPath(p); err == nil {
				*dst = path
				return
			}
		}
		missing = append(missing, name)
	}
	if need[KindNginx] {
		look(&b.Nginx, "nginx")
	}
	if need[KindHAProxy] {
		look(&b.HAProxy, "haproxy")
	}
	if len(missing) > 0 {
		if !cfg.InstallPeers {
			return b, fmt.Errorf("%s not installed (let the harness install them with --install-peers, or leave them out with --targets)", strings.Join(missing, ", "))
		}
		if err := installPeers(ctx, missing, logf); err != nil {
			return b, err
		}
		missing = nil
		if need[KindNginx] {
			look(&b.Nginx, "nginx")
		}
		if need[KindHAProxy] {
			look(&b.HAProxy, "haproxy")
		}
		if len(missing) > 0 {
			return b, fmt.Errorf("%s still missing after apt-get install", strings.Join(missing, ", "))
		}
	}
	if b.K6 == "" {
		k6, err := installTool(ctx, cfg.RepoRoot, "k6", logf)
		if err != nil {
			return b, err
		}
		b.K6 = k6
	}
	if need[KindEnvoy] && b.Envoy == "" {
		envoy, err := installEnvoy(ctx, cfg.RepoRoot, binDir, logf)
		if err != nil {
			return b, err
		}
		b.Envoy = envoy
	}
	return b, nil
}

// installEnvoy installs Envoy and returns the binary the servers run: as root, a copy in binDir,
// since servers run as an unprivileged user, who cannot reach into root's tool cache.
func installEnvoy(ctx context.Context, repoRoot, binDir string, logf func(string, ...any)) (string, error) {
	envoy, err := installTool(ctx, repoRoot, "envoy", logf)
	if err != nil {
		return "", err
	}
	if os.Geteuid() == 0 {
		dst := filepath.Join(binDir, "envoy")
		if err := fsutil.CopyFile(envoy, dst, 0o755); err != nil {
			return "", fmt.Errorf("envoy: %w", err)
		}
		envoy = dst
	}
	return envoy, nil
}

// installPeers installs the Debian packages of the missing peers (nginx-light where it exists).
func installPeers(ctx context.Context, missing []string, logf func(string, ...any)) error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%s missing and not root: install them with apt-get first", strings.Join(missing, ", "))
	}
	pkgs := []string{}
	for _, m := range missing {
		switch m {
		case "nginx":
			pkg := "nginx-light"
			if exec.CommandContext(ctx, "apt-cache", "show", pkg).Run() != nil {
				pkg = "nginx"
			}
			pkgs = append(pkgs, pkg)
		default:
			pkgs = append(pkgs, m)
		}
	}
	logf("apt-get install -y %s", strings.Join(pkgs, " "))
	cmd := exec.CommandContext(ctx, "apt-get", append([]string{"install", "-y", "--no-install-recommends"}, pkgs...)...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		// The package lists may be missing on a fresh machine.
		if upd, uerr := exec.CommandContext(ctx, "apt-get", "update").CombinedOutput(); uerr != nil {
			return fmt.Errorf("apt-get update: %v\n%s", uerr, upd)
		}
		cmd = exec.CommandContext(ctx, "apt-get", append([]string{"install", "-y", "--no-install-recommends"}, pkgs...)...)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out2, err2 := cmd.CombinedOutput(); err2 != nil {
			return fmt.Errorf("apt-get install %s: %v\n%s\n%s", strings.Join(pkgs, " "), err2, out, out2)
		}
	}
	return nil
}

// installTool runs scripts/install-tools.sh NAME (k6, envoy) and returns the path it prints.
func installTool(ctx context.Context, repo, name string, logf func(string, ...any)) (string, error) {
	logf("installing %s with scripts/install-tools.sh %s", name, name)
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(repo, "scripts", "install-tools.sh"), name)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("scripts/install-tools.sh %s: %v\n%s", name, err, stderr.String())
	}
	s := bufio.NewScanner(bytes.NewReader(out))
	for s.Scan() {
		if p, ok := strings.CutPrefix(s.Text(), name+"="); ok {
			return p, nil
		}
	}
	return "", fmt.Errorf("scripts/install-tools.sh %s printed no %s=PATH line", name, name)
}

// acceptedTargets leaves out the loadshed strategies the proxy does not accept yet (with quick,
// CI's run, such a strategy is an error: its targets are strategies the proxy must have).
func acceptedTargets(ctx context.Context, targets []Target, proxy string, l Limits, work string, quick bool, logf func(string, ...any)) ([]Target, []Skipped, error) {
	var kept []Target
	var skipped []Skipped
	for _, t := range targets {
		if t.Kind == KindLoadshed {
			if reason := checkStrategy(ctx, proxy, t, l, work); reason != "" {
				if quick {
					return nil, nil, fmt.Errorf("%s: %s", t.Name, reason)
				}
				logf("skipping %s: %s", t.Name, reason)
				skipped = append(skipped, Skipped{t.Name, reason})
				continue
			}
		}
		kept = append(kept, t)
	}
	if len(kept) == 0 {
		return nil, nil, errors.New("no target left to run")
	}
	return kept, skipped, nil
}

// checkStrategy runs proxy --check-config on the strategy's config; it returns why the proxy
// refuses it, or "" when it is accepted.
func checkStrategy(ctx context.Context, proxy string, t Target, l Limits, work string) string {
	dir := filepath.Join(work, "check")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err.Error()
	}
	ep := endpoints{Listen: "127.0.0.1:1", Admin: "127.0.0.1:2", Backend: "127.0.0.1:3", UpstreamURL: "http://127.0.0.1:3"}
	path := filepath.Join(dir, strings.ReplaceAll(t.Name, "/", "-")+".yaml")
	text, err := loadshedConfig(t.strategy, l, ep)
	if err != nil {
		return err.Error()
	}
	if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
		return err.Error()
	}
	out, err := exec.CommandContext(ctx, proxy, "--check-config", path).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("proxy --check-config rejects it (%v): %s", err, strings.Join(strings.Fields(string(out)), " "))
	}
	return ""
}

// stack is a running backend and target.
type stack struct {
	ep      endpoints
	launch  launch
	backend *proc
	target  *proc // nil for direct
	sidecar *proc // launch.Sidecar, when the target has one
}

func (s *stack) watch() []*proc {
	ps := []*proc{s.backend}
	for _, p := range []*proc{s.sidecar, s.target} {
		if p != nil {
			ps = append(ps, p)
		}
	}
	return ps
}

// usage measures the target, its sidecar included.
func (s *stack) usage() usage {
	var u usage
	for _, p := range []*proc{s.target, s.sidecar} {
		if p != nil {
			t := treeUsage(p.pid())
			u.CPUNanos += t.CPUNanos
			u.PeakRSS += t.PeakRSS
			u.Procs += t.Procs
		}
	}
	return u
}

// stop kills what the stack started; the figures are taken, no need to wait for a drain.
func (s *stack) stop() {
	for _, p := range []*proc{s.target, s.sidecar, s.backend} {
		if p != nil {
			p.stop(0)
		}
	}
}

// startStack starts a fresh backend, configures it, starts the target in front of it and
// checks that one request passes end to end. On error it stops what it started.
func startStack(ctx context.Context, cfg Config, l Limits, bins Binaries, t Target, dir string, root bool, pin string) (_ *stack, err error) {
	return startStackFor(ctx, cfg, l, bins, t, dir, root, pin, false)
}

// startStackFor is startStack; with grpc the backend also serves its gRPC port, the target
// forwards there and the end-to-end check is one gRPC call (waitGRPC).
func startStackFor(ctx context.Context, cfg Config, l Limits, bins Binaries, t Target, dir string, root bool, pin string, grpc bool) (_ *stack, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	backendCPU, targetCPU := -1, -1
	switch pin {
	case PinProxy:
		targetCPU = 1
	case PinSplit:
		backendCPU, targetCPU = 1, 1
	case pinCost:
		backendCPU, targetCPU = 0, 1
	}
	ports, err := freePorts(7)
	if err != nil {
		return nil, err
	}
	st := &stack{ep: endpoints{Listen: ports[0], Admin: ports[1], Backend: ports[2], BackendAdm: ports[3], UpstreamURL: "http://" + ports[2],
		Sidecar: ports[4], SidecarAdmin: ports[5]}}
	backendArgs := []string{"--listen", st.ep.Backend, "--admin-listen", st.ep.BackendAdm}
	if grpc {
		st.ep.BackendGRPC, st.ep.UpstreamURL = ports[6], "http://"+ports[6]
		backendArgs = append(backendArgs, "--grpc-listen", st.ep.BackendGRPC)
	}
	defer func() {
		if err != nil {
			st.stop()
		}
	}()
	if st.launch, err = t.prepare(dir, bins, l, st.ep); err != nil {
		return nil, err
	}
	if grpc && t.Kind == KindDirect {
		st.launch.URL = "http://" + st.ep.BackendGRPC + "/"
	}
	if root {
		if err := makeWritable(dir); err != nil {
			return nil, err
		}
	}
	if cfg.fastUpstream {
		if st.backend, err = startFastUpstream(ctx, bins, dir, st.ep.Backend, backendCPU, root); err != nil {
			return nil, err
		}
	} else {
		st.backend, err = startProc("backend", bins.Backend, backendArgs, nil,
			filepath.Join(dir, "backend.log"), bins.Taskset, backendCPU, root)
		if err != nil {
			return nil, err
		}
		if err := waitHTTP(ctx, "http://"+st.ep.BackendAdm+"/healthz", 10*time.Second, st.backend); err != nil {
			return nil, fmt.Errorf("backend: %w", err)
		}
		if err := configureBackend(ctx, st.ep.BackendAdm, cfg.Backend); err != nil {
			return nil, fmt.Errorf("backend: %w", err)
		}
	}
	if sc := st.launch.Sidecar; sc != nil {
		st.sidecar, err = startProc(t.Name+" sidecar", sc.Path, sc.Args, []string{"GOMAXPROCS=1"},
			filepath.Join(dir, "sidecar.log"), bins.Taskset, targetCPU, root)
		if err != nil {
			return nil, err
		}
		if sc.ReadyURL != "" {
			if err := waitHTTP(ctx, sc.ReadyURL, 10*time.Second, st.watch()...); err != nil {
				return nil, err
			}
		}
	}
	if st.launch.Path != "" {
		// One worker thread per proxy: nginx, HAProxy and Envoy are configured so, Go gets
		// GOMAXPROCS=1.
		st.target, err = startProc(t.Name, st.launch.Path, st.launch.Args, []string{"GOMAXPROCS=1"},
			filepath.Join(dir, "target.log"), bins.Taskset, targetCPU, root)
		if err != nil {
			return nil, err
		}
		if st.launch.ReadyURL != "" {
			if err := waitHTTP(ctx, st.launch.ReadyURL, 10*time.Second, st.watch()...); err != nil {
				return nil, err
			}
		}
	}
	// One request must pass end to end before the load starts.
	wait := waitHTTP
	if grpc {
		wait = waitGRPC
	}
	if err := wait(ctx, st.launch.URL, 10*time.Second, st.watch()...); err != nil {
		return nil, fmt.Errorf("end-to-end check: %w", err)
	}
	return st, nil
}

// runPoint starts a fresh backend and target, runs one scenario (k6, or cmd/loadgen with
// Config.Generator) and measures the target.
func runPoint(ctx context.Context, cfg Config, res *Result, bins Binaries, t Target, sc Scenario, rep int, work string, root bool) Point {
	p := Point{Target: t.Name, Scenario: sc.Name, Load: sc.Load, Repeat: rep}
	name := fmt.Sprintf("r%d-%s-%s", rep, sc.Name, strings.ReplaceAll(t.Name, "/", "-"))
	pin, k6CPU := PinNone, -1
	if res.Pinned {
		pin = cfg.Pin
		if pin == PinSplit {
			k6CPU = 0
		}
	}
	st, err := startStack(ctx, cfg, res.Limits, bins, t, filepath.Join(work, "points", name), root, pin)
	if err != nil {
		p.Err = err.Error()
		return p
	}
	defer st.stop()

	var tr *tracer
	if cfg.TraceEvery > 0 {
		if probe := t.limitProbe(st.ep); probe != nil {
			tr = startTrace(ctx, *probe, cfg.TraceEvery)
			defer tr.stop()
		}
	}
	if sc.Warmup > 0 && !warmsInRun(cfg, sc) {
		// The same load, unmeasured: the adaptive limits settle before the figures start.
		warm := sc
		warm.Env = map[string]string{}
		for k, v := range sc.Env {
			warm.Env[k] = v
		}
		warm.Env["DURATION"] = sc.Warmup.String()
		dir := filepath.Join(work, "points", name)
		if err := runLoad(ctx, cfg, res.Limits, bins, k6CPU, warm, st.launch.URL, filepath.Join(dir, "warmup.json"), filepath.Join(dir, "k6-warmup.log")); err != nil {
			p.Err = "warm-up: " + err.Error()
			return p
		}
	}
	var before usage
	var reseedErr, backendErr error
	var backendBefore BackendUsage
	measuring := func() {
		backendBefore, backendErr = scrapeBackend(ctx, st.ep.BackendAdm)
		if st.target != nil {
			before = st.usage()
		}
		if tr != nil {
			p.TraceStart = tr.elapsed()
		}
		// Every target's measured window draws the same service times in the same order (the
		// round's seed), whatever its warm-up drew: a slow-tail request is worth 5-100 fast
		// ones, so a window shifted by the few dozen draws one warm-up took more than another
		// held other slow requests, and the goodput compared the slices, not the targets
		// (4 x 20 ms, slow tail: one target 0.7% behind in every round with a fixed limit).
		reseedErr = reseedBackend(ctx, st.ep.BackendAdm, uint64(rep))
	}
	summaryPath := filepath.Join(cfg.OutDir, "k6", name+".json")
	if sc.Script == "capacity-drop.js" {
		// The script halves the backend through its admin endpoint (and restores it at the end).
		env := map[string]string{"BACKEND_ADMIN_URL": "http://" + st.ep.BackendAdm}
		for k, v := range sc.Env {
			env[k] = v
		}
		sc.Env = env
	}
	logPath := filepath.Join(work, "points", name, "k6.log")
	if warmsInRun(cfg, sc) {
		err = runLoadgenScenario(ctx, cfg, res.Limits, bins, k6CPU, sc, st.launch.URL, summaryPath, logPath, measuring)
	} else {
		measuring()
		err = runLoad(ctx, cfg, res.Limits, bins, k6CPU, sc, st.launch.URL, summaryPath, logPath)
	}
	if err == nil && reseedErr != nil {
		err = fmt.Errorf("measured window: %w", reseedErr)
	}
	if err == nil && backendErr == nil {
		var after BackendUsage
		if after, backendErr = scrapeBackend(ctx, st.ep.BackendAdm); backendErr == nil {
			d := after.minus(backendBefore)
			p.Backend = &d
		}
	}
	if err == nil && backendErr != nil {
		err = fmt.Errorf("measured window: %w", backendErr)
	}
	if err != nil {
		p.Err = err.Error()
		return p
	}
	if tr != nil {
		p.Trace = tr.stop()
	}
	for _, w := range st.watch() {
		if err := w.exited(); err != nil {
			p.Err = err.Error()
			return p
		}
	}
	if st.target != nil {
		after := st.usage()
		p.CPUNanos = after.CPUNanos - before.CPUNanos
		p.PeakRSS = after.PeakRSS
	}
	s, err := k6summary.Read(summaryPath)
	if err != nil {
		p.Err = err.Error()
		return p
	}
	p.Summary = s
	return p
}

// reseedBackend starts the backend's service-time sequence over from seed (its admin's "seed").
func reseedBackend(ctx context.Context, admin string, seed uint64) error {
	body := fmt.Sprintf(`{"seed":%d}`, seed)
	msg, err := postBackendConfig(ctx, admin, []byte(body))
	if err != nil {
		return fmt.Errorf("backend reseed: %w", err)
	}
	var got struct {
		Seed *uint64 `json:"seed"`
	}
	if json.Unmarshal(msg, &got) != nil || got.Seed == nil || *got.Seed != seed {
		return fmt.Errorf("backend reseed: POST /admin/config %s: answer %s does not show seed %d", body, msg, seed)
	}
	return nil
}

// configureBackend sets the backend to W workers with its service time distribution.
func configureBackend(ctx context.Context, admin string, b Backend) error {
	st := b.serviceTime()
	body, _ := json.Marshal(map[string]any{
		"workers": b.Workers, "mean": st.Mean.String(), "stddev": st.Stddev.String(), "tailProb": st.TailProb,
		"tailMean": st.TailMean.String(), "tailMin": st.TailMin.String(), "tailMax": st.TailMax.String(), "fanout": st.Fanout,
	})
	msg, err := postBackendConfig(ctx, admin, body)
	if err != nil {
		return err
	}
	var got struct {
		Workers int `json:"workers"`
	}
	if err := json.Unmarshal(msg, &got); err != nil || got.Workers != b.Workers {
		return fmt.Errorf("POST /admin/config %s: answer %s does not show %d workers", body, msg, b.Workers)
	}
	return nil
}

// postBackendConfig posts a patch to the backend admin's /admin/config and returns its answer
// (the configuration now in force); a status other than 200 is an error naming the patch.
func postBackendConfig(ctx context.Context, admin string, body []byte) ([]byte, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+admin+"/admin/config", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("POST /admin/config %s: status %d: %s", body, resp.StatusCode, msg)
	}
	return msg, nil
}

// runK6 runs one scenario; exit status 99 (thresholds crossed) is a result, not a failure.
func runK6(ctx context.Context, cfg Config, l Limits, bins Binaries, cpu int, sc Scenario, url, summary, logPath string) error {
	_, err := runK6CPU(ctx, cfg, l, bins, cpu, sc, url, summary, logPath)
	return err
}

// runK6CPU is runK6 that also returns the CPU time k6 used.
func runK6CPU(ctx context.Context, cfg Config, l Limits, bins Binaries, cpu int, sc Scenario, url, summary, logPath string) (time.Duration, error) {
	script := filepath.Join(cfg.RepoRoot, "loadtest", "k6", sc.Script)
	argv := []string{bins.K6, "run", "--quiet", "--no-color", script}
	if cpu >= 0 && bins.Taskset != "" {
		argv = append([]string{bins.Taskset, "-c", fmt.Sprint(cpu)}, argv...)
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	env := map[string]string{
		"TARGET_URL":         url,
		"CAPACITY_RPS":       fmt.Sprint(l.CapacityRPS),
		"SLO_MS":             fmt.Sprint(l.SLO.Milliseconds()),
		"CLIENT_TIMEOUT":     cfg.ClientTimeout.String(),
		"SUMMARY_PATH":       summary,
		"MAX_LATE_MS":        fmt.Sprint(cfg.MaxLateMs),
		"K6_NO_USAGE_REPORT": "true",
	}
	for k, v := range sc.Env {
		env[k] = v
	}
	cmd.Env = os.Environ()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	f, err := os.Create(logPath)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	cmd.Stdout, cmd.Stderr = f, f
	err = cmd.Run()
	var used time.Duration
	if cmd.ProcessState != nil {
		used = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	}
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 99 {
		err = nil
	}
	if err != nil {
		return used, fmt.Errorf("k6 %s: %v; log %s:\n%s", sc.Script, err, logPath, tail(logPath, 15))
	}
	return used, nil
}
