package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/loadshed/loadshed/bench/k6summary"
)

// scriptRun is one short run of a k6 script, for ScriptSmoke.
type scriptRun struct {
	script string
	env    map[string]string
	// admin passes the backend's admin URL (capacity-drop).
	admin bool
	// grpc runs the script against the target in front of the backend's gRPC port.
	grpc bool
}

var scriptRuns = []scriptRun{
	{script: "smoke.js", env: map[string]string{"DURATION": "3s"}},
	{script: "overload.js", env: map[string]string{"K": "2", "DURATION": "3s"}},
	{script: "long.js", env: map[string]string{"K": "2", "DURATION": "3"}},
	{script: "spike.js", env: map[string]string{"BASE_S": "2", "RAMP_S": "1", "HOLD_S": "3", "AFTER_S": "3"}},
	{script: "capacity-drop.js", env: map[string]string{"DURATION": "6s", "DROP_AT": "2"}, admin: true},
	{script: "retry-storm.js", env: map[string]string{"BASE_S": "2", "TRIGGER_S": "2", "AFTER_S": "3"}},
	{script: "grpc-overload.js", env: map[string]string{"K": "2", "DURATION": "3s"}, grpc: true},
}

// ScriptSmoke runs every k6 script in loadtest/k6 once, for a few seconds, against the named
// target in front of a fresh backend, and checks that each one ran and wrote a summary that
// bench/k6summary reads, with requests sent, no unexpected errors, and (capacity-drop) the
// backend's workers restored afterwards. Thresholds and validity are printed, not enforced: the
// smoke guards the scripts, not performance. grpc-overload.js runs against loadshed targets and
// direct (the backend's gRPC port), in front of the backend's gRPC port; the peers are set up
// for HTTP/1.1 only and skip it.
func ScriptSmoke(ctx context.Context, cfg Config, targetName string, stdout, stderr io.Writer) error {
	limits, err := DeriveLimits(cfg.Backend, cfg.SLO)
	if err != nil {
		return err
	}
	if cfg.RepoRoot == "" || cfg.OutDir == "" {
		return errors.New("RepoRoot, OutDir: required")
	}
	targets, err := SelectTargets(AllTargets(limits), targetName)
	if err != nil {
		return err
	}
	t := targets[0]
	work, err := os.MkdirTemp("", "loadshed-k6smoke-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	if err := os.Chmod(work, 0o755); err != nil {
		return err
	}
	if err := os.MkdirAll(cfg.OutDir, 0o755); err != nil {
		return err
	}
	logf := func(format string, a ...any) { fmt.Fprintf(stderr, "k6 smoke: "+format+"\n", a...) }
	bins, err := prepareBinaries(ctx, cfg, []Target{t}, work, logf)
	if err != nil {
		return err
	}
	root := os.Geteuid() == 0
	var errs []error
	for _, sr := range scriptRuns {
		if err := ctx.Err(); err != nil {
			return err
		}
		if sr.grpc && !carriesGRPC(t) {
			fmt.Fprintf(stdout, "skip %s against %s: the harness configures %s for HTTP/1.1 only\n", sr.script, t.Name, t.Name)
			continue
		}
		s, err := smokeOne(ctx, cfg, limits, bins, t, sr, work, root)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", sr.script, err))
			fmt.Fprintf(stdout, "FAIL %s against %s: %v\n", sr.script, t.Name, err)
			continue
		}
		state := "valid"
		if !s.Valid {
			state = "INVALID (" + s.InvalidReason + ")"
		}
		fmt.Fprintf(stdout, "ok   %s against %s: %d requests, goodput/C %.3f, shed %.1f%%, thresholds ok %v, %s\n",
			sr.script, t.Name, s.Requests, k6summary.Value(s.GoodputRatio), 100*s.ShedShare, s.ThresholdsOK, state)
	}
	return errors.Join(errs...)
}

func smokeOne(ctx context.Context, cfg Config, l Limits, bins Binaries, t Target, sr scriptRun, work string, root bool) (*k6summary.Summary, error) {
	dir := filepath.Join(work, sr.script)
	st, err := startStackFor(ctx, cfg, l, bins, t, dir, root, PinNone, sr.grpc)
	if err != nil {
		return nil, err
	}
	defer st.stop()
	sc := Scenario{Name: sr.script, Script: sr.script, Env: map[string]string{}}
	for k, v := range sr.env {
		sc.Env[k] = v
	}
	if sr.admin {
		sc.Env["BACKEND_ADMIN_URL"] = "http://" + st.ep.BackendAdm
	}
	summaryPath := filepath.Join(cfg.OutDir, sr.script+".json")
	_ = os.Remove(summaryPath)
	if err := runK6(ctx, cfg, l, bins, -1, sc, st.launch.URL, summaryPath, filepath.Join(dir, "k6.log")); err != nil {
		return nil, err
	}
	s, err := k6summary.Read(summaryPath)
	if err != nil {
		return nil, err
	}
	var problems []error
	if want := sr.script[:len(sr.script)-len(".js")]; s.Script != want {
		problems = append(problems, fmt.Errorf("summary names script %q, want %q", s.Script, want))
	}
	if s.Requests == 0 {
		problems = append(problems, errors.New("no request sent"))
	}
	if s.Unexpected > 0 {
		problems = append(problems, fmt.Errorf("%d unexpected errors", s.Unexpected))
	}
	if sr.grpc {
		// What a gRPC refusal looks like does not depend on timing.
		if s.Protocol != "grpc" {
			problems = append(problems, fmt.Errorf("summary protocol %q, want grpc", s.Protocol))
		}
		if s.Shed > 0 && (s.TrailersOnly != s.Shed || s.Pushback != s.Shed) {
			problems = append(problems, fmt.Errorf("%d refusals, %d trailers-only, %d with grpc-retry-pushback-ms: want all of them both", s.Shed, s.TrailersOnly, s.Pushback))
		}
	}
	if !sr.grpc && s.OK > 0 {
		// Every answer of the project's backend says how long it was there: what is left of its
		// latency is small and never negative.
		out, adm := s.OutsideBackendMs.P50, s.AdmittedMs.P50
		if out == nil || adm == nil || !(*out > 0 && *out < *adm/2) {
			problems = append(problems, fmt.Errorf("latency outside the backend at p50 %v ms against admitted p50 %v ms: want above 0 and below half of it (X-Backend-Wait/-Service not read?)", fmtNum(v(out), "ms"), fmtNum(v(adm), "ms")))
		}
	}
	if sr.admin {
		w, err := backendWorkers(ctx, st.ep.BackendAdm)
		if err != nil {
			problems = append(problems, err)
		} else if w != cfg.Backend.Workers {
			problems = append(problems, fmt.Errorf("backend left with %d workers, want %d restored", w, cfg.Backend.Workers))
		}
		if s.Phases["after"].Offered == 0 {
			problems = append(problems, errors.New("no load after the drop"))
		}
	}
	for _, w := range st.watch() {
		if err := w.exited(); err != nil {
			problems = append(problems, err)
		}
	}
	return s, errors.Join(problems...)
}

func backendWorkers(ctx context.Context, admin string) (int, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+admin+"/admin/config", nil)
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var c struct {
		Workers int `json:"workers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&c); err != nil {
		return 0, fmt.Errorf("GET /admin/config: %w", err)
	}
	return c.Workers, nil
}
