//go:build integration

package status_test

// The status page in a real browser (Debian's chromium, driven over the DevTools protocol by
// chromedp) against a live proxy under a bounded overload on loopback: the figures render,
// update, and agree with /metrics read at about the same time.
//
// With LOADSHED_STATUS_SCREENSHOT=FILE it also writes a screenshot of the page under the
// overload to FILE (PNG); docs/images/status-page.png comes from
//
//	LOADSHED_STATUS_SCREENSHOT=$PWD/docs/images/status-page.png go test -tags integration -count=1 -run TestStatusPageInBrowser ./internal/status/

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/proxy"
)

// chromium finds Debian's chromium; without it the test skips with one line, except in CI
// (.ci/run installs it), where it fails.
func chromium(t *testing.T) string {
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("chromium not found: CI must install it (.ci/run: apt-get install chromium)")
	}
	t.Skip("chromium not installed (apt-get install chromium): skipping the status page's browser test")
	return ""
}

// idleSelf: clients, proxy and upstream share this process; its load is not the proxy's.
type idleSelf struct{}

func (idleSelf) Delay() time.Duration { return 0 }
func (idleSelf) Shed() float64        { return 0 }

// upstream answers after 20 ms of service, or at once with 500 on /err.
func upstream(t *testing.T) *httptest.Server {
	u := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/err" {
			http.Error(w, "failing on purpose", http.StatusInternalServerError)
			return
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-r.Context().Done():
			return
		}
		w.Write([]byte("ok\n"))
	}))
	t.Cleanup(u.Close)
	return u
}

// overload offers requests at a fixed rate (open model): two to the default route every 5 ms
// (400/s, one in 20 of them to /err) and one to /api/ every 10 ms (100/s), about twice what the
// limits admit. It is bounded in time and count, and in requests outstanding.
type overload struct {
	stop    chan struct{}
	done    sync.WaitGroup
	sent    atomic.Int64
	failed  atomic.Int64
	codes   sync.Map // status code -> *atomic.Int64
	maxSent int64
}

func startOverload(t *testing.T, base string, maxDuration time.Duration, maxSent int64) *overload {
	o := &overload{stop: make(chan struct{}), maxSent: maxSent}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 128}, Timeout: 5 * time.Second}
	slots := make(chan struct{}, 128)
	send := func(path string) {
		if o.sent.Load() >= o.maxSent {
			return
		}
		select {
		case slots <- struct{}{}:
		default:
			return // 128 outstanding: the proxy is not answering; offer no more
		}
		o.sent.Add(1)
		o.done.Add(1)
		go func() {
			defer o.done.Done()
			defer func() { <-slots }()
			res, err := client.Get(base + path)
			if err != nil {
				o.failed.Add(1)
				return
			}
			res.Body.Close()
			n, _ := o.codes.LoadOrStore(res.StatusCode, new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
		}()
	}
	o.done.Add(1)
	go func() {
		defer o.done.Done()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		end := time.After(maxDuration)
		for i := 0; ; i++ {
			select {
			case <-o.stop:
				return
			case <-end:
				return
			case <-tick.C:
			}
			send("/")
			if i%10 == 0 {
				send("/err")
			} else {
				send("/")
			}
			if i%2 == 0 {
				send("/api/items")
			}
		}
	}()
	t.Cleanup(func() { o.halt(); client.CloseIdleConnections() })
	return o
}

// halt stops offering and waits for every answer.
func (o *overload) halt() {
	select {
	case <-o.stop:
	default:
		close(o.stop)
	}
	o.done.Wait()
}

// scrape reads /metrics.
type scrape struct {
	at  time.Time
	mfs map[string]*dto.MetricFamily
}

func readMetrics(t *testing.T, admin string) scrape {
	t.Helper()
	at := time.Now()
	res, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return scrape{at: at, mfs: mfs}
}

func labelIs(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, l := range m.GetLabel() {
		if v, ok := want[l.GetName()]; ok {
			if v != l.GetValue() {
				return false
			}
			n++
		}
	}
	return n == len(want)
}

// sum adds up the samples of family whose labels match want, and whose outcome (if the family
// has one) is in outcomes.
func (s scrape) sum(family string, want map[string]string, outcomes ...string) float64 {
	total := 0.0
	for _, m := range s.mfs[family].GetMetric() {
		if !labelIs(m, want) {
			continue
		}
		if len(outcomes) > 0 && !contains(outcomes, labelOf(m, "outcome")) {
			continue
		}
		switch {
		case m.GetCounter() != nil:
			total += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			total += m.GetGauge().GetValue()
		}
	}
	return total
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

var admittedOutcomes = []string{"success", "client_error", "upstream_error", "upstream_timeout"}

// bucketOf is the histogram bucket (lower, upper bound) that holds the q-quantile of the
// loadshed_request_duration_seconds observed between a and b, over all routes.
func bucketOf(a, b scrape, q float64) (lo, hi float64, ok bool) {
	counts := map[float64]float64{}
	var total float64
	for _, s := range []struct {
		sc   scrape
		sign float64
	}{{b, 1}, {a, -1}} {
		for _, m := range s.sc.mfs["loadshed_request_duration_seconds"].GetMetric() {
			h := m.GetHistogram()
			total += s.sign * float64(h.GetSampleCount())
			for _, bk := range h.GetBucket() {
				counts[bk.GetUpperBound()] += s.sign * float64(bk.GetCumulativeCount())
			}
		}
	}
	if total <= 0 {
		return 0, 0, false
	}
	var bounds []float64
	for ub := range counts {
		bounds = append(bounds, ub)
	}
	slices.Sort(bounds)
	lo = 0
	for _, ub := range bounds {
		if counts[ub] >= q*total {
			return lo, ub, true
		}
		lo = ub
	}
	return lo, math.Inf(1), true
}

// figures reads every figure of the page: data-metric, qualified by its route, door or reason
// ("admitted_total{route=api}"), to its data-value; and "points:<series>" to the count of points
// each chart line has.
const readFigures = `(() => {
  const out = {};
  for (const e of document.querySelectorAll("[data-metric]")) {
    const d = e.dataset;
    let k = d.metric;
    if (d.route !== undefined) k += "{route=" + d.route + "}";
    else if (d.door !== undefined) k += "{door=" + d.door + "}";
    else if (d.reason !== undefined) k += "{reason=" + d.reason + "}";
    else if (d.scope !== "all") continue;
    if (d.value !== undefined) out[k] = d.value;
  }
  for (const e of document.querySelectorAll("[data-series]")) out["points:" + e.closest("svg").dataset.metric + ":" + e.dataset.series] = e.dataset.points;
  return out;
})()`

type page map[string]string

func (p page) num(t *testing.T, key string) float64 {
	t.Helper()
	s, ok := p[key]
	if !ok || s == "" {
		t.Fatalf("the page has no figure %s (figures: %v)", key, p)
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("figure %s: %q is not a number", key, s)
	}
	return v
}

// has reports whether the page shows key as a number.
func (p page) has(key string) bool {
	_, err := strconv.ParseFloat(p[key], 64)
	return err == nil
}

func TestStatusPageInBrowser(t *testing.T) {
	exe := chromium(t)
	up := upstream(t)
	cfg, err := config.Parse([]byte(fmt.Sprintf(`listen: 127.0.0.1:0
adminListen: 127.0.0.1:0
upstream: %s
shutdown: {drainDelay: 0s, gracePeriod: 1s}
admission:
  strategy: bounded-queue
  boundedQueue: {concurrency: 4, depth: 4, maxWait: 30ms}
routes:
  - name: api
    pathPrefix: /api/
    admission:
      strategy: inflight
      inflight: {limit: 1}
`, up.URL)))
	if err != nil {
		t.Fatal(err)
	}
	srv, err := proxy.New(cfg, proxy.Options{Registry: prometheus.NewRegistry(), SelfLoad: idleSelf{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(); err != nil {
		t.Fatal(err)
	}
	data, adminAddr := srv.Addrs()
	admin := "http://" + adminAddr
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	}()

	// The browser, with a fresh profile, on loopback only.
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(exe), chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("headless", true), chromedp.Flag("no-sandbox", true), chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true), chromedp.Flag("no-first-run", true), chromedp.Flag("no-default-browser-check", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.Flag("disable-extensions", true), chromedp.WindowSize(1400, 1100))
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	bctx, cancelTimeout := context.WithTimeout(bctx, 150*time.Second)
	defer cancelTimeout()

	// Anything the page logs as an error (a CSP violation, a script error, a failed fetch) fails
	// the test; the browser's own request for /favicon.ico is the one 404 allowed.
	var consoleMu sync.Mutex
	var console []string
	cctx, stopConsole := context.WithCancel(bctx)
	messages := chromedp.Console(cctx)
	consoleDone := make(chan struct{})
	go func() {
		defer close(consoleDone)
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type != chromedp.ConsoleError && m.Type != chromedp.ConsoleException || strings.Contains(m.URL, "favicon.ico") {
				continue
			}
			consoleMu.Lock()
			console = append(console, m.String()+" "+m.URL)
			consoleMu.Unlock()
		}
	}()

	load := startOverload(t, "http://"+data, 60*time.Second, 40000)
	if err := chromedp.Do(bctx, chromedp.Navigate(admin+"/")); err != nil {
		t.Fatal(err)
	}
	read := func() page {
		t.Helper()
		p, err := chromedp.Run(bctx, chromedp.Evaluate[page](readFigures))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	// waitPage polls the page (every 100 ms, up to limit) until ok holds.
	waitPage := func(what string, limit time.Duration, ok func(page) bool) page {
		t.Helper()
		deadline := time.Now().Add(limit)
		for {
			p := read()
			if ok(p) {
				return p
			}
			if time.Now().After(deadline) {
				t.Fatalf("the page did not show %s within %s; it shows %v", what, limit, p)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	pos := func(p page, k string) bool { v, err := strconv.ParseFloat(p[k], 64); return err == nil && v > 0 }

	// 1. The figures render: the overload shows as admissions, refusals and errors, on the
	// figures, per route, per door, per reason and on the chart.
	first := waitPage("the overload", 20*time.Second, func(p page) bool {
		return pos(p, "admitted_per_second") && pos(p, "refused_per_second") && pos(p, "upstream_errors_total") &&
			pos(p, "refused_per_second{route=api}") && pos(p, "admitted_total{door=http}") && pos(p, "admitted_p99_seconds") &&
			pos(p, "points:chart_rates:refused_per_second") && pos(p, "samples") && p.num(t, "samples") >= 3
	})
	if first["strategy"] != "bounded-queue" {
		t.Errorf("strategy %q, want bounded-queue (the default route's)", first["strategy"])
	}

	// 2. They update: the next sample changes the sample time and the totals.
	waitPage("a new sample", 5*time.Second, func(p page) bool {
		return p["sample_time"] != first["sample_time"] && p.num(t, "admitted_total") > first.num(t, "admitted_total")
	})

	// 3. They agree with /metrics. The totals of a sample taken after one scrape and read before
	// the next lie between the two; the rates over the page's window match the growth between
	// scrapes around it; the quantiles fall in the bucket /metrics puts them in (or one beside it,
	// as the spans differ by a second or two).
	before := readMetrics(t, admin)
	p := waitPage("a sample 5 s after a scrape", 10*time.Second, func(p page) bool {
		return p.num(t, "sample_time") >= float64(before.at.Add(5*time.Second).UnixMilli())
	})
	mid := readMetrics(t, admin) // the page's window [sample-5 s, sample] lies within [before, mid]
	for _, c := range []metricCheck{
		{"admitted_total", "loadshed_requests_total", nil, admittedOutcomes},
		{"admitted_total{route=api}", "loadshed_requests_total", map[string]string{"route": "api"}, admittedOutcomes},
		{"admitted_total{door=http}", "loadshed_requests_total", map[string]string{"door": "http"}, admittedOutcomes},
		{"upstream_errors_total", "loadshed_requests_total", nil, []string{"upstream_error", "upstream_timeout"}},
		{"refused_total", "loadshed_shed_total", nil, nil},
		{"refused_total{route=default}", "loadshed_shed_total", map[string]string{"route": "default"}, nil},
		{"refused_total{reason=concurrency_limit}", "loadshed_shed_total", map[string]string{"reason": "concurrency_limit"}, nil},
	} {
		got := p.num(t, c.key)
		lo, hi := before.sum(c.family, c.labels, c.out...), mid.sum(c.family, c.labels, c.out...)
		if got < lo || got > hi {
			t.Errorf("%s: the page shows %v, /metrics had %v before and %v after", c.key, got, lo, hi)
		}
		if lo == hi {
			t.Errorf("%s: %v both times: the overload did not move it", c.key, lo)
		}
	}
	span := mid.at.Sub(before.at).Seconds()
	for _, c := range []metricCheck{
		{"admitted_per_second", "loadshed_requests_total", nil, admittedOutcomes},
		{"refused_per_second", "loadshed_shed_total", nil, nil},
		{"admitted_per_second{route=api}", "loadshed_requests_total", map[string]string{"route": "api"}, admittedOutcomes},
		{"upstream_errors_per_second", "loadshed_requests_total", nil, []string{"upstream_error"}},
	} {
		got := p.num(t, c.key)
		want := (mid.sum(c.family, c.labels, c.out...) - before.sum(c.family, c.labels, c.out...)) / span
		if math.Abs(got-want) > 0.3*want+5 {
			t.Errorf("%s: the page shows %.1f/s, /metrics grew %.1f/s over the %.1f s around its window", c.key, got, want, span)
		}
	}
	for _, q := range []struct {
		key string
		q   float64
	}{{"admitted_p50_seconds", 0.5}, {"admitted_p99_seconds", 0.99}} {
		got := p.num(t, q.key)
		lo, hi, ok := bucketOf(before, mid, q.q)
		if !ok {
			t.Fatalf("%s: /metrics observed nothing between the scrapes", q.key)
		}
		if got < lo/2.5 || got > hi*2.5 {
			t.Errorf("%s: the page shows %v s, /metrics puts it in (%v, %v]", q.key, got, lo, hi)
		}
	}
	for _, route := range []string{"default", "api"} {
		want := mid.sum("loadshed_limit", map[string]string{"route": route})
		if got := p.num(t, "limit{route="+route+"}"); got != want || want <= 0 {
			t.Errorf("limit of %s: the page shows %v, /metrics %v", route, got, want)
		}
		if in := p.num(t, "inflight{route="+route+"}"); in < 0 || in > mid.sum("loadshed_limit", map[string]string{"route": route}) {
			t.Errorf("in flight on %s: %v, beyond its limit", route, in)
		}
	}
	if got, want := p.num(t, "limit"), mid.sum("loadshed_limit", map[string]string{"route": "default"}); got != want {
		t.Errorf("limit: the page shows %v, /metrics has %v for the default route", got, want)
	}
	if n := p.num(t, "points:chart_rates:admitted_per_second"); n < 5 {
		t.Errorf("the chart has %v points of admitted/s after 5 s and more, want one a second", n)
	}

	if path := os.Getenv("LOADSHED_STATUS_SCREENSHOT"); path != "" {
		// A chart worth looking at: a while of overload first (bounded by the load's own limits).
		waitPage("20 s of history", 30*time.Second, func(p page) bool { return p.num(t, "points:chart_rates:admitted_per_second") >= 20 })
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot of the page under overload: %s", path)
	}

	// 4. The overload ends: once quiet, the page's totals equal /metrics exactly, and nothing is
	// in flight or queued.
	load.halt()
	t.Logf("overload: %d requests sent, %d failed", load.sent.Load(), load.failed.Load())
	quiet := readMetrics(t, admin)
	end := waitPage("the end of the overload", 10*time.Second, func(p page) bool {
		return p.has("sample_time") && p.num(t, "sample_time") >= float64(quiet.at.UnixMilli()) && p["inflight"] == "0" && p["queued"] == "0"
	})
	after := readMetrics(t, admin)
	for _, c := range []metricCheck{
		{"admitted_total", "loadshed_requests_total", nil, admittedOutcomes},
		{"refused_total", "loadshed_shed_total", nil, nil},
		{"upstream_errors_total", "loadshed_requests_total", nil, []string{"upstream_error", "upstream_timeout"}},
		{"admitted_total{route=default}", "loadshed_requests_total", map[string]string{"route": "default"}, admittedOutcomes},
		{"refused_total{door=http}", "loadshed_shed_total", map[string]string{"door": "http"}, nil},
		{"refused_total{reason=queue_full}", "loadshed_shed_total", map[string]string{"reason": "queue_full"}, nil},
	} {
		if got, want := end.num(t, c.key), after.sum(c.family, c.labels, c.out...); got != want {
			t.Errorf("%s at rest: the page shows %v, /metrics %v", c.key, got, want)
		}
	}
	stopConsole()
	<-consoleDone
	consoleMu.Lock()
	defer consoleMu.Unlock()
	if len(console) > 0 {
		t.Errorf("the page logged errors (a CSP violation or a script error?): %q", console)
	}
	if errors.Is(bctx.Err(), context.DeadlineExceeded) {
		t.Error("the browser's time ran out")
	}
}

// metricCheck compares one figure of the page (key) with the sum of a /metrics family's series
// that carry labels and, when out is not empty, one of those outcomes.
type metricCheck struct {
	key    string
	family string
	labels map[string]string
	out    []string
}
