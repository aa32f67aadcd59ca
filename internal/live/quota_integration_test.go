//go:build integration

// Per-client quotas shared by proxy replicas through one Redis (issue "Limits that hold across
// replicas"): real proxies in front of the real backend on loopback, one Debian redis-server,
// each request sent to a replica picked at random, as a Service spreads them.
package live

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/metrics"
	"github.com/loadshed/loadshed/internal/quota"
	"github.com/loadshed/loadshed/internal/quota/quotatest"
)

const (
	quotaRate   = 100.0 // per second: the hot client's global quota
	quotaBurst  = 10
	exportRate  = 20.0 // the export route's own quota
	exportBurst = 4
	// addedSlack is what a request may take beyond the store timeout and what the allow-listed
	// client's requests took at the same moment: the scheduler waking a goroutine late on a
	// busy machine. Longer stalls of the whole process are measured and excused.
	addedSlack = 10 * time.Millisecond
	// controlRate is the rate of the allow-listed client "control": its requests skip the store
	// and see everything else (machine, proxies, backend), so they tell the wait the store added
	// to the others sent at the same moment.
	controlRate = 100.0
	// controlWindow is how close in time a control request must start to stand for another.
	controlWindow = 50 * time.Millisecond
)

// checkAddedWait fails the test for a request that took longer than the store timeout plus
// addedSlack beyond the slowest request of the allow-listed client started within
// controlWindow of it, unless this process stalled during it for at least the excess. It logs
// the distribution of that added wait.
func checkAddedWait(t *testing.T, name string, answers []answer, mon *quotatest.StallMonitor) {
	t.Helper()
	var control []answer
	for _, a := range answers {
		if a.key == "control" && a.err == nil {
			control = append(control, a)
		}
	}
	slices.SortFunc(control, func(a, b answer) int { return a.start.Compare(b.start) })
	added := &quotatest.Latencies{}
	excused, failed := 0, 0
	var worst answer
	var worstAdded time.Duration
	for _, a := range answers {
		if a.key == "control" || a.err != nil {
			continue
		}
		i, _ := slices.BinarySearchFunc(control, a.start.Add(-controlWindow), func(c answer, t time.Time) int { return c.start.Compare(t) })
		var noise time.Duration
		for ; i < len(control) && !control[i].start.After(a.start.Add(controlWindow)); i++ {
			noise = max(noise, control[i].took)
		}
		d := max(a.took-noise, 0)
		added.Add(d)
		if d > worstAdded {
			worst, worstAdded = a, d
		}
		excess := d - quota.DefaultTimeout - addedSlack
		if excess <= 0 {
			continue
		}
		if stall := mon.LongestIn(a.start, a.start.Add(a.took)); stall >= excess {
			excused++
			continue
		}
		if failed++; failed <= 5 {
			t.Errorf("%s: %s at %v took %v, %v more than the allow-listed client's requests then, beyond the store timeout %v + %v (longest process stall %v)",
				name, a.key, a.at, a.took, d, quota.DefaultTimeout, addedSlack, mon.LongestIn(a.start, a.start.Add(a.took)))
		}
	}
	if failed > 5 {
		t.Errorf("%s: %d requests in all waited too long", name, failed)
	}
	p99, n := added.Quantile(0.99)
	t.Logf("FIGURE %s: wait added to %d requests beyond the allow-listed client's at the same moment: p99 %v, max %v (at %v, took %v); %d excused by process stalls (longest %v)",
		name, n, p99, worstAdded, worst.at, worst.took, excused, mon.Longest())
}

// quotaEnv starts n proxy replicas with a shared quota store at redisAddr, in front of a
// backend with room for everything (32 workers x 1 ms).
func quotaEnv(t *testing.T, n int, redisAddr, prefix string) *Env {
	t.Helper()
	extra := fmt.Sprintf(`headers: {clientKey: X-Client}
trust: {sources: [127.0.0.1/32]}
clients:
  rate: %v
  burst: %d
  allow: [control]
  store: {redis: {addr: %q, keyPrefix: %q}}
routes:
  - {name: export, pathPrefix: /export, clients: {rate: %v, burst: %d}}
`, quotaRate, quotaBurst, redisAddr, prefix, exportRate, exportBurst)
	e, err := Start(Setup{Workers: 32, Service: Constant(time.Millisecond), Admission: config.Named(config.StrategyNone),
		Extra: extra, Replicas: n})
	if err != nil {
		t.Fatal(err)
	}
	// Every replica counts the others before the load starts (a heartbeat a second).
	deadline := time.Now().Add(5 * time.Second)
	for i, px := range e.Proxies {
		for {
			st, ok := px.QuotaState()
			if ok && st.Replicas == float64(n) {
				break
			}
			if time.Now().After(deadline) {
				e.Close()
				t.Fatalf("replica %d counts %v replicas (store %v), want %d", i, st.Replicas, ok, n)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return e
}

// flow is one client's requests: key, path and rate (per second, all replicas together).
type flow struct {
	key, path string
	rate      float64
}

// answer is one request as the client saw it.
type answer struct {
	key, path  string
	at         time.Duration // scheduled, from the start of the run
	start      time.Time
	took       time.Duration
	status     int
	retryAfter string
	reason     string
	err        error
}

// spread sends every flow's requests open loop (each at its scheduled time from start,
// whatever earlier ones did) for d, each to a replica picked at random. Bounded: at most
// rate x d requests per flow, at most 512 in flight.
func spread(urls []string, flows []flow, start time.Time, d time.Duration) []answer {
	type job struct {
		f  flow
		at time.Duration
	}
	var jobs []job
	for _, f := range flows {
		for i := range int(f.rate * d.Seconds()) {
			jobs = append(jobs, job{f, time.Duration(float64(i) / f.rate * float64(time.Second))})
		}
	}
	slices.SortStableFunc(jobs, func(a, b job) int { return int(a.at - b.at) })
	tr := &http.Transport{MaxIdleConnsPerHost: 128}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	rng := rand.New(rand.NewPCG(7, 11))
	out := make([]answer, len(jobs))
	sem := make(chan struct{}, 512)
	var wg sync.WaitGroup
	for i, j := range jobs {
		if wait := time.Until(start.Add(j.at)); wait > 0 {
			time.Sleep(wait)
		}
		url := urls[rng.IntN(len(urls))] + j.f.path
		select {
		case sem <- struct{}{}:
		default:
			out[i] = answer{key: j.f.key, path: j.f.path, at: j.at, err: fmt.Errorf("load generator: 512 requests in flight")}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			a := answer{key: j.f.key, path: j.f.path, at: j.at, start: time.Now()}
			req, _ := http.NewRequest(http.MethodGet, url, nil)
			req.Header.Set("X-Client", j.f.key)
			res, err := client.Do(req)
			if err == nil {
				_, err = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				a.status, a.retryAfter, a.reason = res.StatusCode, res.Header.Get("Retry-After"), res.Header.Get("X-Loadshed-Reason")
			}
			a.took, a.err = time.Since(a.start), err
			out[i] = a
		}()
	}
	wg.Wait()
	return out
}

// admitted counts key's 200s on path among requests scheduled in [from, to).
func admitted(answers []answer, key, path string, from, to time.Duration) int {
	n := 0
	for _, a := range answers {
		if a.key == key && a.path == path && a.status == http.StatusOK && a.at >= from && a.at < to {
			n++
		}
	}
	return n
}

// checkAnswers fails the test for a request that failed (a transport error, or a status other
// than 200 and 429) and for a 429 that is not client_limited with a Retry-After of 1 to
// maxRetryAfter seconds.
func checkAnswers(t *testing.T, answers []answer, maxRetryAfter int) {
	t.Helper()
	bad := 0
	for _, a := range answers {
		var problem string
		switch {
		case a.err != nil:
			problem = a.err.Error()
		case a.status == http.StatusOK:
		case a.status != http.StatusTooManyRequests:
			problem = fmt.Sprintf("status %d", a.status)
		case a.reason != "client_limited":
			problem = fmt.Sprintf("429 with reason %q", a.reason)
		default:
			if s, err := strconv.Atoi(a.retryAfter); err != nil || s < 1 || s > maxRetryAfter {
				problem = fmt.Sprintf("429 with Retry-After %q", a.retryAfter)
			}
		}
		if problem != "" {
			if bad++; bad <= 5 {
				t.Errorf("%s at %v: %s", a.key, a.at, problem)
			}
		}
	}
	if bad > 5 {
		t.Errorf("... %d requests in all failed or were refused without client_limited and Retry-After 1..%d", bad, maxRetryAfter)
	}
}

func within(t *testing.T, what string, got int, want, tolerance float64) {
	t.Helper()
	dev := float64(got)/want - 1
	t.Logf("FIGURE %s: %d admitted, quota %.0f (%+.1f%%)", what, got, want, 100*dev)
	if math.Abs(dev) > tolerance {
		t.Errorf("%s: %d admitted, want %.0f within %.0f%%", what, got, want, 100*tolerance)
	}
}

// storeP99 is the p99 of the replicas' quota checks in the store (op take), from their
// latency histograms, interpolated within a bucket as histogram_quantile does; and how many
// checks failed in the store (decided locally).
func storeP99(t *testing.T, e *Env) (p99 time.Duration, calls, failed float64) {
	t.Helper()
	var buckets []*dto.Bucket
	for _, admin := range e.ProxyAdmins {
		res, err := http.Get(admin + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		p := expfmt.NewTextParser(model.UTF8Validation)
		mfs, err := p.TextToMetricFamilies(res.Body)
		res.Body.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mfs["loadshed_quota_store_latency_seconds"].GetMetric() {
			if labelOf(m, "op") != "take" {
				continue
			}
			h := m.GetHistogram()
			calls += float64(h.GetSampleCount())
			for i, b := range h.GetBucket() {
				if len(buckets) <= i {
					buckets = append(buckets, &dto.Bucket{UpperBound: b.UpperBound, CumulativeCount: new(uint64)})
				}
				*buckets[i].CumulativeCount += b.GetCumulativeCount()
			}
		}
		for _, m := range mfs["loadshed_quota_store_errors_total"].GetMetric() {
			if labelOf(m, "op") == "take" {
				failed += m.GetCounter().GetValue()
			}
		}
	}
	rank, lower, below := 0.99*calls, 0.0, 0.0
	for _, b := range buckets {
		n := float64(b.GetCumulativeCount())
		if n >= rank && n > below {
			f := lower + (b.GetUpperBound()-lower)*(rank-below)/(n-below)
			return time.Duration(f * float64(time.Second)), calls, failed
		}
		lower, below = b.GetUpperBound(), n
	}
	return time.Duration(lower * float64(time.Second)), calls, failed
}

func labelOf(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// TestQuotaAcrossProxyReplicas: two and three proxy replicas sharing one Redis hold a client
// offered 3x its quota, its requests spread at random over the replicas, to the quota within
// 10% over 10 s (the first second, with the initial burst, excluded); the same client's own
// quota on the export route is counted apart and held too; a client under its quota is never
// refused; every refusal is 429 client_limited with Retry-After. The store's p99 is reported.
func TestQuotaAcrossProxyReplicas(t *testing.T) {
	r := quotatest.Start(t)
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("%d replicas", n), func(t *testing.T) {
			e := quotaEnv(t, n, r.Addr(), fmt.Sprintf("healthy%d:", n))
			defer e.Close()
			answers := spread(e.ProxyURLs, []flow{
				{"hot", "/", 3 * quotaRate}, {"calm", "/", 0.4 * quotaRate}, {"hot", "/export", 3 * exportRate},
				{"control", "/", controlRate},
			}, time.Now(), 11*time.Second)
			checkAnswers(t, answers, 2)
			within(t, fmt.Sprintf("%d replicas, hot client at 3x over 10 s", n), admitted(answers, "hot", "/", time.Second, 11*time.Second), 10*quotaRate, 0.10)
			within(t, fmt.Sprintf("%d replicas, export route at 3x over 10 s", n), admitted(answers, "hot", "/export", time.Second, 11*time.Second), 10*exportRate, 0.10)
			if got, want := admitted(answers, "calm", "/", 0, time.Hour), int(0.4*quotaRate*11); got != want {
				t.Errorf("calm client admitted %d of %d: a client under its quota was refused", got, want)
			}
			if got, want := admitted(answers, "control", "/", 0, time.Hour), int(controlRate*11); got != want {
				t.Errorf("allow-listed client admitted %d of %d", got, want)
			}
			p99, calls, failed := storeP99(t, e)
			lat := &quotatest.Latencies{}
			for _, a := range answers {
				lat.Add(a.took)
			}
			t.Logf("FIGURE %d replicas: store p99 %v over %.0f checks (%.0f failed and were decided locally); request latency %s", n, p99, calls, failed, lat)
			if p99 > quota.DefaultTimeout {
				t.Errorf("store p99 %v on loopback, above the store timeout", p99)
			}
			for i, px := range e.Proxies {
				if st, _ := px.QuotaState(); st.Breaker != metrics.BreakerClosed {
					t.Errorf("replica %d's breaker is %s after a healthy run", i, st.Breaker)
				}
			}
		})
	}
}

// metricSum sums the samples of a counter on a replica's /metrics whose labels include want
// (name, value pairs).
func metricSum(t *testing.T, admin, name string, want ...string) float64 {
	t.Helper()
	res, err := http.Get(admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
next:
	for _, m := range mfs[name].GetMetric() {
		for i := 0; i+1 < len(want); i += 2 {
			if labelOf(m, want[i]) != want[i+1] {
				continue next
			}
		}
		sum += m.GetCounter().GetValue()
	}
	return sum
}

// TestQuotaStoreAwayIsInvisible: Redis killed, Redis blocked by DEBUG SLEEP, and the network
// path to Redis black-holed, each for 4 s in the middle of a 14 s run of two proxy replicas
// holding a client offered 3x its quota. No request fails, every refusal is client_limited
// with Retry-After 1, and none waits longer than the store timeout beyond its usual latency;
// each replica falls back within a second (its metrics count the failed store calls and the
// requests its fallback allowed), holding the client near its quota at rate / replicas each;
// the store is used again within seconds of its return, with the global quota held again; and
// once the replicas stop, no goroutine and no Redis connection is left. (This is the store's
// outage test too: internal/quota has no copy of it with bare stores in place of proxies.)
func TestQuotaStoreAwayIsInvisible(t *testing.T) {
	const (
		n           = 2
		disruptFrom = 3 * time.Second
		disruptTo   = 7 * time.Second
		runFor      = 14 * time.Second
	)
	for _, d := range quotatest.Disruptions(disruptTo - disruptFrom) {
		t.Run(d.Name, func(t *testing.T) {
			r, p, addr := d.Start(t)
			baseGoroutines := quotatest.Goroutines()
			baseClients := r.Clients(t)
			e := quotaEnv(t, n, addr, "away:")
			closed := false
			defer func() {
				if !closed {
					e.Close()
				}
			}()

			mon := quotatest.StartStallMonitor()
			start := time.Now()
			w := quotatest.WatchFallback(len(e.Proxies), func(i int) bool {
				st, _ := e.Proxies[i].QuotaState()
				return st.Breaker != metrics.BreakerClosed
			}, start, disruptFrom, disruptTo)
			var answers []answer
			loadDone := make(chan struct{})
			go func() {
				defer close(loadDone)
				answers = spread(e.ProxyURLs, []flow{{"hot", "/", 3 * quotaRate}, {"calm", "/", 0.4 * quotaRate}, {"control", "/", controlRate}}, start, runFor)
			}()
			time.Sleep(time.Until(start.Add(disruptFrom)))
			d.Begin(t, r, p)
			time.Sleep(time.Until(start.Add(disruptTo)))
			d.End(t, r, p)
			<-loadDone
			w.End()
			mon.End()

			// No request failed, every refusal asked for a retry within a second (the quota's
			// own retry-after, store or fallback, rounded up); none waited longer than the store
			// timeout beyond what the allow-listed client's requests took at the same moment.
			checkAnswers(t, answers, 1)
			usual, during := &quotatest.Latencies{}, &quotatest.Latencies{}
			for _, a := range answers {
				if a.at < disruptFrom {
					usual.Add(a.took)
				} else if a.at < disruptTo+2*time.Second {
					during.Add(a.took)
				}
			}
			t.Logf("FIGURE %s: request latency before the disruption %s; during it and its recovery %s (store timeout %v)",
				d.Name, usual, during, quota.DefaultTimeout)
			checkAddedWait(t, d.Name, answers, mon)

			// Each replica falls back within a second and uses the store again within seconds;
			// its metrics saw it: failed store calls, and requests allowed by its fallback.
			for i := range e.Proxies {
				on, off := w.On[i], w.Off[i]
				t.Logf("FIGURE %s: replica %d in fallback %v after the disruption began, back on the store %v after it ended (in fallback again for %v since)",
					d.Name, i, on-disruptFrom, off-disruptTo, w.Again[i])
				if on < 0 || on-disruptFrom > time.Second {
					t.Errorf("replica %d: fallback at %v, want within 1 s of %v", i, on, disruptFrom)
				}
				if off < 0 || off-disruptTo > 3*time.Second {
					t.Errorf("replica %d: back on the store at %v, want within 3 s of %v", i, off, disruptTo)
				}
				if metricSum(t, e.ProxyAdmins[i], "loadshed_quota_store_errors_total") == 0 {
					t.Errorf("replica %d recorded no store error", i)
				}
				if metricSum(t, e.ProxyAdmins[i], "loadshed_quota_decisions_total", "source", "fallback", "result", "allowed") == 0 {
					t.Errorf("replica %d counted no request allowed by its fallback", i)
				}
			}
			// rate / replicas on each holds the client near its quota during the outage; the
			// global quota holds again after the return; the calm client is not refused.
			within(t, d.Name+", hot client at 3x during the outage (after its first second)",
				admitted(answers, "hot", "/", disruptFrom+time.Second, disruptTo), quotaRate*(disruptTo-disruptFrom-time.Second).Seconds(), 0.15)
			within(t, d.Name+", hot client at 3x from 3 s after the return",
				admitted(answers, "hot", "/", disruptTo+3*time.Second, runFor), quotaRate*(runFor-disruptTo-3*time.Second).Seconds(), 0.10)
			calm := admitted(answers, "calm", "/", 0, time.Hour)
			if offered := int(0.4 * quotaRate * runFor.Seconds()); float64(calm) < 0.99*float64(offered) {
				t.Errorf("calm client admitted %d of %d", calm, offered)
			}

			// Nothing left behind once the replicas have stopped.
			e.Close()
			closed = true
			p.Close()
			if got := quotatest.SettledGoroutines(baseGoroutines, 5*time.Second); got > baseGoroutines {
				t.Errorf("%d goroutines after the replicas stopped, %d before they started\n%s", got, baseGoroutines, quotatest.GoroutineDump())
			}
			if got := r.WaitClients(t, baseClients, 3*time.Second); got > baseClients {
				t.Errorf("Redis lists %d client connections after the replicas stopped, %d before", got, baseClients)
			}
		})
	}
}
