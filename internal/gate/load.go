package gate

import (
	"encoding/base64"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	orcav3 "github.com/cncf/xds/go/xds/data/orca/v3"
	"google.golang.org/protobuf/proto"

	"github.com/loadshed/loadshed/internal/config"
)

// LoadReport is the replica's load as the gate sees it, in the terms of an ORCA load report
// (xds.data.orca.v3.OrcaLoadReport), for balancers that weight endpoints by it: Envoy's
// client_side_weighted_round_robin and gRPC's weighted_round_robin weigh an endpoint by
// RPS / (Utilization + EPS/RPS x penalty).
//
// Utilization is the share of the strategy's capacity in use, a moving mean over about a second:
// for a concurrency limit (inflight, bounded-queue, adaptive, codel), what is in flight and
// waiting over the limit (the limit's mean over about ten seconds: an adaptive limit's probing
// is not capacity); for a rate (token-bucket, leaky-bucket), the admitted rate over the
// configured rate; for a chain, the larger of the two; over several routes, the most loaded one.
// Either way a replica that serves R requests per second at its capacity C reads R/C, so a
// balancer's weight R/Utilization converges to C: each replica gets traffic in proportion to what
// it can serve, whatever that is. Requests that wait raise it above 1, which moves traffic away
// before anything is refused.
type LoadReport struct {
	// Utilization is application_utilization: the share of the capacity in use (above 1 while
	// requests wait).
	Utilization float64
	// RPS is rps_fractional: requests admitted per second.
	RPS float64
	// EPS is eps: requests refused, and upstream failures, per second.
	EPS float64
	// Limit, InFlight and Queued are named metrics: the concurrency limit, the requests in
	// flight and those waiting (summed over the routes).
	Limit, InFlight, Queued float64
}

// Text is the in-band report of an HTTP answer: the value of endpoint-load-metrics.
func (r LoadReport) Text() string {
	b := make([]byte, 0, 160)
	b = append(b, "TEXT application_utilization="...)
	b = strconv.AppendFloat(b, r.Utilization, 'f', 4, 64)
	b = append(b, ", rps_fractional="...)
	b = strconv.AppendFloat(b, r.RPS, 'f', 2, 64)
	b = append(b, ", eps="...)
	b = strconv.AppendFloat(b, r.EPS, 'f', 2, 64)
	b = append(b, ", named_metrics.limit="...)
	b = strconv.AppendFloat(b, r.Limit, 'f', 2, 64)
	b = append(b, ", named_metrics.in_flight="...)
	b = strconv.AppendFloat(b, r.InFlight, 'f', 2, 64)
	b = append(b, ", named_metrics.queued="...)
	b = strconv.AppendFloat(b, r.Queued, 'f', 2, 64)
	return string(b)
}

// Proto is the report as an OrcaLoadReport.
func (r LoadReport) Proto() *orcav3.OrcaLoadReport {
	return &orcav3.OrcaLoadReport{
		ApplicationUtilization: r.Utilization,
		RpsFractional:          r.RPS,
		Eps:                    r.EPS,
		NamedMetrics:           map[string]float64{"limit": r.Limit, "in_flight": r.InFlight, "queued": r.Queued},
	}
}

// Binary is the report as a gRPC call's trailer carries it: the value of
// endpoint-load-metrics-bin, the serialized OrcaLoadReport in base64 (as every -bin field is
// written on the wire).
func (r LoadReport) Binary() string {
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(r.Proto())
	if err != nil {
		return "" // (a message of plain numbers always marshals)
	}
	return base64.RawStdEncoding.EncodeToString(b)
}

// Load reports the replica's current load: the latest of the gate's samples (one when reports
// start, then every loadSampleEvery while they are on; zero while they are off).
func (g *Gate) Load() LoadReport {
	if s := g.loads.snap.Load(); s != nil {
		return s.report
	}
	return LoadReport{}
}

// The sampler's pace: every loadSampleEvery, and means over about loadWindow.
const (
	loadSampleEvery = 50 * time.Millisecond
	loadWindow      = time.Second
	// limitWindow is the moving mean of a concurrency limit that utilization divides by: an
	// adaptive limit probes up and down by several times within a second, and a balancer that
	// weighs by RPS/utilization would follow the probe instead of the capacity.
	limitWindow = 10 * time.Second
)

// loadSampler keeps the gate's load report current while the configuration asks for reports:
// it samples every policy's state and counts on the gate's clock and keeps moving means, and
// renders the report once per sample, so that an answer only copies a header that is ready.
type loadSampler struct {
	snap atomic.Pointer[loadSnap]

	mu      sync.Mutex
	timer   interface{ Stop() bool }
	stopped bool
	last    time.Time
	prev    map[*Policy]policyCounts
	util    map[*Policy]float64
	limit   map[*Policy]float64
	rps     float64
	eps     float64
}

// loadSnap is one sample, rendered for the doors.
type loadSnap struct {
	report LoadReport
	http   []Field // endpoint-load-metrics
	grpc   []Field // endpoint-load-metrics-bin
}

// policyCounts are a policy's cumulative counts at a sample.
type policyCounts struct{ admitted, refused, failed int64 }

// startLoads starts the sampler if cfg asks for reports and it is not running.
func (g *Gate) startLoads(cfg *config.Config) {
	if !cfg.LoadReports.ORCA {
		return
	}
	s := &g.loads
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.timer != nil || s.stopped {
		return
	}
	s.last = g.clock.Now()
	s.prev, s.util, s.limit = map[*Policy]policyCounts{}, map[*Policy]float64{}, map[*Policy]float64{}
	// A first sample now (the limits, no rate yet), so that the answers before the first tick
	// carry a report too.
	s.snap.Store(s.sample(g.state.Load(), 0))
	s.timer = g.clock.AfterFunc(loadSampleEvery, g.sampleLoad)
}

// stopLoads stops the sampler for good (Close).
func (g *Gate) stopLoads() {
	s := &g.loads
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	if s.timer != nil {
		s.timer.Stop()
	}
}

// sampleLoad takes one sample and arms the next.
func (g *Gate) sampleLoad() {
	s := &g.loads
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	now := g.clock.Now()
	dt := now.Sub(s.last)
	s.last = now
	s.snap.Store(s.sample(g.state.Load(), dt))
	s.timer = g.clock.AfterFunc(loadSampleEvery, g.sampleLoad)
}

// sample folds the state of every policy into the moving means, dt after the previous sample.
func (s *loadSampler) sample(st *state, dt time.Duration) *loadSnap {
	alpha := 1 - math.Exp(-dt.Seconds()/loadWindow.Seconds())
	alphaLimit := 1 - math.Exp(-dt.Seconds()/limitWindow.Seconds())
	var r LoadReport
	var admitted, refused int64
	seen := make(map[*Policy]bool, len(s.util))
	for _, p := range st.policies() {
		seen[p] = true
		c := p.m.counts()
		before, known := s.prev[p]
		s.prev[p] = c
		if !known {
			before = c // a policy new since the last sample starts counting now
		}
		admitted += c.admitted - before.admitted
		refused += c.refused - before.refused + c.failed - before.failed
		if p.strategy == config.StrategyNone {
			continue // no capacity to speak of
		}
		stats := p.limiter.Stats()
		u := 0.0
		if p.rate > 0 && dt > 0 {
			u = float64(c.admitted-before.admitted) / dt.Seconds() / p.rate
		}
		if stats.Limit > 0 && (p.rate == 0 || p.strategy == config.StrategyChain) {
			r.Limit += stats.Limit
			r.InFlight += float64(stats.InFlight)
			r.Queued += float64(stats.Queued)
			// What is in use now, or (Little's law) what the admitted rate keeps in flight over
			// the route's typical latency: a sample may fall between short requests.
			inUse := float64(stats.InFlight + stats.Queued)
			if dt > 0 {
				inUse = max(inUse, float64(c.admitted-before.admitted)/dt.Seconds()*p.latency.value().Seconds())
			}
			lim, known := s.limit[p]
			if !known {
				lim = stats.Limit
			}
			lim += alphaLimit * (stats.Limit - lim)
			s.limit[p] = lim
			u = max(u, inUse/lim)
		}
		s.util[p] += alpha * (u - s.util[p])
		r.Utilization = max(r.Utilization, s.util[p])
	}
	for p := range s.util {
		if !seen[p] {
			delete(s.util, p) // replaced by a reload
			delete(s.prev, p)
			delete(s.limit, p)
		}
	}
	if dt > 0 {
		s.rps += alpha * (float64(admitted)/dt.Seconds() - s.rps)
		s.eps += alpha * (float64(refused)/dt.Seconds() - s.eps)
	}
	r.RPS, r.EPS = s.rps, s.eps
	if r.RPS > 0 && r.Utilization <= 0 {
		// Traffic, but never caught in flight at a sample: the smallest load that is not none
		// (a balancer takes a report of 0 for no report at all).
		r.Utilization = 1e-4
	}
	return &loadSnap{report: r,
		http: []Field{{"Endpoint-Load-Metrics", r.Text()}},
		grpc: []Field{{"Endpoint-Load-Metrics-Bin", r.Binary()}}}
}

// fields are the report's fields for an answer (none from a nil snapshot).
func (s *loadSnap) fields(grpc bool) []Field {
	switch {
	case s == nil:
		return nil
	case grpc:
		return s.grpc
	}
	return s.http
}

// ReportsTo reports whether a caller gets load reports: they are on (loadReports.orca), and
// not limited to trusted callers (loadReports.trustedOnly) or this one is trusted.
func (g *Gate) ReportsTo(h Header, peer string) bool {
	st := g.state.Load()
	lr := st.cfg.LoadReports
	return lr.ORCA && (!lr.TrustedOnly || st.spec.trust != nil && st.spec.trust.trusted(h, peer))
}
