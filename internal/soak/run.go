package soak

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
	"sync"
	"sync/atomic"
	"time"

	"github.com/loadshed/loadshed/internal/config"

	"github.com/loadshed/loadshed/internal/live"
	"github.com/loadshed/loadshed/internal/loadgen"
	"github.com/loadshed/loadshed/internal/slowtail"
)

// maxFailureSamples bounds Requests.FailureSamples.
const maxFailureSamples = 10

// settle is how long in-flight may take to return to zero once the load has stopped.
const settle = 10 * time.Second

// Run runs a soak and returns its summary; an error means the soak could not run at all. The
// samples go to WorkDir/samples.csv as they are taken, the summary to WorkDir/summary.json.
func Run(ctx context.Context, c Config) (*Summary, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	logw := c.Log
	if logw == nil {
		logw = io.Discard
	}
	logf := func(format string, args ...any) { fmt.Fprintf(logw, "soak: "+format+"\n", args...) }
	if err := os.MkdirAll(c.WorkDir, 0o755); err != nil {
		return nil, err
	}
	bin := c.ProxyBinary
	if bin == "" {
		bin = filepath.Join(c.WorkDir, "proxy")
		logf("building the proxy into %s", bin)
		if err := BuildProxy(ctx, bin); err != nil {
			return nil, err
		}
	}
	proxyLog, err := os.Create(filepath.Join(c.WorkDir, "proxy.log"))
	if err != nil {
		return nil, err
	}
	defer proxyLog.Close()
	csvPath := filepath.Join(c.WorkDir, "samples.csv")
	csvFile, err := os.Create(csvPath)
	if err != nil {
		return nil, err
	}
	defer csvFile.Close()
	csv := bufio.NewWriter(csvFile)

	service := slowtail.DefaultConfig()
	service.Mean, service.Stddev = c.Service, c.Service/4
	adm, err := config.ParseAdmission([]byte(c.Admission))
	if err != nil {
		return nil, err
	}
	env, err := live.Start(live.Setup{Workers: c.Workers, Service: service, Admission: *adm, ProxyBinary: bin, Stderr: proxyLog, Extra: warmExtra})
	if err != nil {
		return nil, fmt.Errorf("starting the backend and the proxy: %w", err)
	}
	closed := false
	defer func() {
		if !closed {
			env.Close()
		}
	}()
	pid := env.ProxyProcess.Process.Pid
	logf("proxy pid %d on %s, admin %s; backend admin %s", pid, env.ProxyURL, env.ProxyAdmin, env.BackendAdmin)

	// A fixed pool of client connections, opened now and kept for the whole run.
	counter := newCounting(&http.Transport{
		MaxConnsPerHost: c.Conns, MaxIdleConns: c.Conns, MaxIdleConnsPerHost: c.Conns, DisableCompression: true,
	})
	client := &http.Client{Transport: counter, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	defer counter.base.CloseIdleConnections()
	admin := &http.Client{Timeout: 5 * time.Second}
	if err := warm(ctx, client, env.ProxyURL, c.Conns); err != nil {
		return nil, err
	}
	counter.reset()
	logf("opened %d client connections", c.Conns)

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	cycle, length := BackendCycle(c.Workers, c.Service), CycleLength(c.Duration)
	var phase atomic.Pointer[Phase]
	var bg sync.WaitGroup
	bgErr := make(chan error, 2)
	bg.Add(2)
	go func() {
		defer bg.Done()
		if err := drive(runCtx, admin, env.BackendAdmin, cycle, length, c.Duration, start, &phase); err != nil {
			bgErr <- err
		}
	}()
	results := make(chan *loadgen.Result, int(c.Duration/c.Chunk)+2)
	go func() {
		defer bg.Done()
		load(runCtx, c, env.ProxyURL+"/", client, start, results, logf)
		close(results)
	}()

	if _, err := fmt.Fprintln(csv, csvHeader); err != nil {
		return nil, err
	}
	var samples []Sample
	tick := time.NewTicker(c.Interval)
	defer tick.Stop()
	end := start.Add(c.Duration)
	interrupted := false
sampling:
	for time.Now().Before(end) {
		select {
		case <-ctx.Done():
			interrupted = true
			break sampling
		case err := <-bgErr:
			cancel()
			return nil, err
		case <-tick.C:
		}
		s, err := takeSample(runCtx, admin, env.ProxyAdmin, pid)
		if err != nil {
			cancel()
			return nil, fmt.Errorf("sampling the proxy at %s: %w", time.Since(start).Round(time.Second), err)
		}
		s.Elapsed = time.Since(start)
		if p := phase.Load(); p != nil {
			s.Backend = *p
		}
		s.OK, s.Shed, s.Failed = counter.ok.Swap(0), counter.shed.Swap(0), counter.failed.Swap(0)
		samples = append(samples, s)
		if _, err := fmt.Fprintln(csv, s.csvRow()); err != nil {
			return nil, err
		}
		csv.Flush()
		if len(samples)%60 == 0 {
			logf("%s: rss %.1f MiB, %d goroutines, %d fds, in flight %g", s.Elapsed.Round(time.Second), float64(s.RSSBytes)/(1<<20), s.Goroutines, s.FDs, s.InFlight)
		}
	}
	if interrupted {
		cancel()
	}
	var reqs Requests
	reqs.Shed = map[string]int64{}
	for r := range results {
		reqs.add(r)
	}
	bg.Wait()
	counter.fold(&reqs)

	// Once the load has stopped, every permit must come back.
	inflight := -1.0
	deadline := time.Now().Add(settle)
	for {
		m, err := scrape(ctx, admin, env.ProxyAdmin)
		if err == nil {
			inflight = m["loadshed_inflight"]
		}
		if inflight == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	env.Close()
	closed = true
	exit := "unknown"
	if st := env.ProxyProcess.ProcessState; st != nil {
		exit = st.String()
	}

	trends, problems := Judge(samples, c.Ceilings, c.MaxGrowth)
	if interrupted {
		problems = append(problems, "interrupted before the end")
	}
	if n := reqs.Failed(); n > 0 {
		problems = append(problems, fmt.Sprintf("%d admitted requests failed (%d unexpected status, %d transport errors, %d timeouts)", n, reqs.Unexpected, reqs.TransportErrors, reqs.Timeouts))
	}
	if inflight != 0 {
		problems = append(problems, fmt.Sprintf("in flight %g, not 0, %s after the load stopped", inflight, settle))
	}
	if st := env.ProxyProcess.ProcessState; st == nil || !st.Success() {
		problems = append(problems, "the proxy did not exit cleanly after SIGTERM: "+exit)
	}
	sum := &Summary{
		Duration: c.Duration, Load: c.Load, NominalRPS: c.NominalRPS(), Admission: c.Admission,
		Ceilings: c.Ceilings, MaxGrowth: c.MaxGrowth, Samples: len(samples), Trends: trends,
		Requests: reqs, InFlightAfter: inflight, ProxyExit: exit, Pass: len(problems) == 0, Problems: problems, CSV: csvPath,
	}
	b, err := json.MarshalIndent(sum, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(c.WorkDir, "summary.json"), append(b, '\n'), 0o644); err != nil {
		return nil, err
	}
	return sum, nil
}

// warmExtra adds to the proxy's configuration a route that bypasses admission, used only to
// open the client connections before the load, and an idle timeout longer than any soak, so
// the connection count stays what warm opened.
const warmExtra = "server: {idleTimeout: 25h}\nroutes:\n  - name: soak-warm\n    pathPrefix: /soak-warm\n    admission: {strategy: none}\n"

// warm opens n client connections: n concurrent requests that each hold theirs while the backend
// works through them (a short sleep each, behind its few workers).
func warm(ctx context.Context, client *http.Client, proxyURL string, n int) error {
	errc := make(chan error, n)
	for range n {
		go func() {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, proxyURL+"/soak-warm?sleep=20ms", nil)
			if err == nil {
				var res *http.Response
				if res, err = client.Do(req); err == nil {
					_, err = io.Copy(io.Discard, res.Body)
					res.Body.Close()
					if err == nil && res.StatusCode != http.StatusOK {
						err = fmt.Errorf("status %d", res.StatusCode)
					}
				}
			}
			errc <- err
		}()
	}
	for range n {
		if err := <-errc; err != nil {
			return fmt.Errorf("opening the client connections: %w", err)
		}
	}
	return nil
}

// BuildProxy builds ./cmd/proxy of this module, static, into path. It runs the go command, so
// the current directory must be inside the module.
func BuildProxy(ctx context.Context, path string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", path, "github.com/loadshed/loadshed/cmd/proxy")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("building the proxy (run inside the module, or pass a binary): %w\n%s", err, out.String())
	}
	return nil
}

// drive moves the backend through the cycle until d has passed.
func drive(ctx context.Context, client *http.Client, backendAdmin string, cycle []Phase, length, d time.Duration, start time.Time, cur *atomic.Pointer[Phase]) error {
	step := length / time.Duration(len(cycle))
	for i := 0; ; i++ {
		at := time.Duration(i) * step
		if at >= d {
			return nil
		}
		if wait := time.Until(start.Add(at)); wait > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(wait):
			}
		}
		p := PhaseAt(cycle, length, at)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, backendAdmin+"/admin/config", bytes.NewReader(p.patch()))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		res, err := client.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("changing the backend: %w", err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			return fmt.Errorf("changing the backend to %+v: %d %s", p, res.StatusCode, body)
		}
		cur.Store(&p)
	}
}

// load offers c.Load x capacity for c.Duration as consecutive load-generator runs of c.Chunk
// each, started on time so the load has no gap; each run's result goes to results.
func load(ctx context.Context, c Config, target string, client *http.Client, start time.Time, results chan<- *loadgen.Result, logf func(string, ...any)) {
	rate := c.Load * c.NominalRPS()
	var wg sync.WaitGroup
	for k := 0; ; k++ {
		at := time.Duration(k) * c.Chunk
		if at >= c.Duration {
			break
		}
		if wait := time.Until(start.Add(at)); wait > 0 {
			select {
			case <-ctx.Done():
				wg.Wait()
				return
			case <-time.After(wait):
			}
		}
		d := min(c.Chunk, c.Duration-at)
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := loadgen.Run(ctx, loadgen.Config{
				Target: target, Schedule: loadgen.ConstantRate(rate, d), Timeout: c.ClientTimeout, Client: client,
				LateStartBudget: 1,
			})
			if err != nil && r == nil {
				logf("load chunk at %s: %v", at, err)
				return
			}
			if err != nil && !errors.Is(err, context.Canceled) {
				logf("load chunk at %s: %v", at, err)
			}
			results <- r
		}()
	}
	wg.Wait()
}

// add folds one load-generator run into the totals.
func (r *Requests) add(res *loadgen.Result) {
	r.Offered += res.Offered
	r.Sent += res.Sent
	r.Dropped += res.Dropped
	r.TransportErrors += res.TransportErrors
	r.Timeouts += res.Timeouts
	r.LateStarts += res.LateStarts
	r.AdmittedP99 = max(r.AdmittedP99, res.AdmittedLatency.P99)
	for _, e := range res.ErrorSamples {
		if len(r.FailureSamples) < maxFailureSamples {
			r.FailureSamples = append(r.FailureSamples, "transport: "+e)
		}
	}
}

// counting is the clients' transport: it classifies every answer as it arrives.
type counting struct {
	base             *http.Transport
	ok, shed, failed atomic.Int64 // since the last sample
	mu               sync.Mutex
	totalOK          int64
	sheds            map[string]int64
	unexpected       int64
	samples          []string
}

func newCounting(base *http.Transport) *counting {
	return &counting{base: base, sheds: map[string]int64{}}
}

func (c *counting) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := c.base.RoundTrip(req)
	if err != nil {
		c.failed.Add(1)
		return nil, err
	}
	reason := res.Header.Get("X-Loadshed-Reason")
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case res.StatusCode < 400:
		c.ok.Add(1)
		c.totalOK++
	case reason != "" && (res.StatusCode == 503 || res.StatusCode == 429 || res.StatusCode == 403):
		c.shed.Add(1)
		c.sheds[reason]++
	default:
		c.failed.Add(1)
		c.unexpected++
		if len(c.samples) < maxFailureSamples {
			c.samples = append(c.samples, fmt.Sprintf("status %d (reason %q)", res.StatusCode, reason))
		}
	}
	return res, nil
}

// reset forgets what the transport saw so far (the warm-up requests).
func (c *counting) reset() {
	c.ok.Store(0)
	c.shed.Store(0)
	c.failed.Store(0)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.totalOK, c.unexpected, c.samples = 0, 0, nil
	clear(c.sheds)
}

// fold adds what the transport saw to the totals.
func (c *counting) fold(r *Requests) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r.OK += c.totalOK
	r.Unexpected += c.unexpected
	for k, v := range c.sheds {
		r.Shed[k] += v
	}
	for _, s := range c.samples {
		if len(r.FailureSamples) < maxFailureSamples {
			r.FailureSamples = append(r.FailureSamples, s)
		}
	}
}

// takeSample reads the proxy process's memory and descriptors from /proc and its goroutines,
// in-flight, queue and limit from its /metrics.
func takeSample(ctx context.Context, client *http.Client, admin string, pid int) (Sample, error) {
	var s Sample
	var err error
	if s.RSSBytes, err = readRSS(pid); err != nil {
		return s, err
	}
	if s.FDs, err = countFDs(pid); err != nil {
		return s, err
	}
	m, err := scrape(ctx, client, admin)
	if err != nil {
		return s, err
	}
	s.Goroutines = int(m["go_goroutines"])
	s.InFlight, s.QueueDepth, s.Limit = m["loadshed_inflight"], m["loadshed_queue_depth"], m["loadshed_limit"]
	return s, nil
}
