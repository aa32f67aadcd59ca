package lab

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"github.com/loadshed/loadshed/internal/quota"
	"github.com/loadshed/loadshed/pkg/admission"
)

// QuotaMode is how a per-client quota is counted across replicas.
type QuotaMode string

const (
	// QuotaLocal: no store; every replica keeps its own bucket at the full rate, so a client
	// gets the rate from every replica it reaches.
	QuotaLocal QuotaMode = "local"
	// QuotaStore: one bucket in the shared store (GCRA on the store's one clock), whatever
	// replica a request reaches: the quota holds at any replica count.
	QuotaStore QuotaMode = "store"
	// QuotaFallback: the store is away; every replica enforces rate / replicas with a burst of
	// ceil(burst / replicas) by itself.
	QuotaFallback QuotaMode = "fallback"
)

// QuotaModes lists the modes in the order reports show them.
var QuotaModes = []QuotaMode{QuotaLocal, QuotaStore, QuotaFallback}

// Limits that keep a quota run bounded.
const (
	MaxQuotaReplicas    = 1000
	MaxQuotaConnections = 100_000
	maxQuotaRequests    = 50_000_000
)

// QuotaScenario is one client's requests against its per-client quota, served by Replicas
// replicas of the proxy. The replicas run the very code of the proxy's quotas: the store's
// algorithm (quota.Bucket) and the local buckets (admission.ClientLimits) with the fallback's
// limits (quota.FallbackLimits).
type QuotaScenario struct {
	// Arrivals are the client's requests (their Cost counts, capped at the burst as the proxy
	// caps it).
	Arrivals Arrivals
	// Limits is the quota: Rate and Burst (the clients block, or a route's own).
	Limits admission.ClientLimitsConfig
	// Replicas is how many replicas serve the client, and the count each replica's fallback
	// divides by.
	Replicas int
	// Connections is how requests reach replicas: 0 sends each request to a replica picked at
	// random (a client that opens a connection per request, or an L7 balancer); K > 0 models a
	// client with K keep-alive connections, each bound to a replica picked at random when it
	// opens (a Kubernetes Service balances connections, not requests), used in turn.
	Connections int
	// Seed seeds the arrivals and the choice of replicas.
	Seed uint64
}

// Validate reports every problem with the scenario.
func (s QuotaScenario) Validate() error {
	var errs []error
	if s.Arrivals == nil {
		errs = append(errs, errors.New("arrivals: required"))
	}
	if err := (admission.ClientLimitsConfig{Rate: s.Limits.Rate, Burst: s.Limits.Burst, MaxKeys: 1}).Validate(); err != nil {
		errs = append(errs, fmt.Errorf("quota: %w", err))
	}
	if s.Replicas < 1 || s.Replicas > MaxQuotaReplicas {
		errs = append(errs, fmt.Errorf("replicas: must be from 1 to %d, got %d", MaxQuotaReplicas, s.Replicas))
	}
	if s.Connections < 0 || s.Connections > MaxQuotaConnections {
		errs = append(errs, fmt.Errorf("connections: must be from 0 (a replica per request) to %d, got %d", MaxQuotaConnections, s.Connections))
	}
	return errors.Join(errs...)
}

// QuotaResult is what the client got in one mode.
type QuotaResult struct {
	Mode     QuotaMode
	Replicas int
	// Offered and Admitted count requests; Span is the arrival window the rates are over.
	Offered, Admitted int64
	Span              time.Duration
	// QuotaRPS is the quota's rate; AdmittedRPS what the client got.
	QuotaRPS, AdmittedRPS float64
	// Busiest is the largest share of the admitted requests one replica admitted.
	Busiest float64
}

// OfferedRPS is the offered rate over the span.
func (r QuotaResult) OfferedRPS() float64 { return float64(r.Offered) / r.Span.Seconds() }

// OfQuota is the admitted rate as a share of the quota.
func (r QuotaResult) OfQuota() float64 { return r.AdmittedRPS / r.QuotaRPS }

// RunQuota runs the client's requests against its quota in one mode.
func RunQuota(sc QuotaScenario, mode QuotaMode) (QuotaResult, error) {
	if err := sc.Validate(); err != nil {
		return QuotaResult{}, err
	}
	stream, err := sc.Arrivals.Open(sc.Seed)
	if err != nil {
		return QuotaResult{}, fmt.Errorf("arrivals: %w", err)
	}
	n := sc.Replicas
	check, err := quotaChecker(mode, sc.Limits, n)
	if err != nil {
		return QuotaResult{}, err
	}
	rng := rand.New(rand.NewPCG(sc.Seed, 0x9e3779b97f4a7c15))
	conns := make([]int, sc.Connections)
	for i := range conns {
		conns[i] = rng.IntN(n)
	}
	res := QuotaResult{Mode: mode, Replicas: n, Span: sc.Arrivals.Span(), QuotaRPS: sc.Limits.Rate}
	perReplica := make([]int64, n)
	for {
		a, ok := stream.Next()
		if !ok {
			break
		}
		if res.Offered == maxQuotaRequests {
			return QuotaResult{}, fmt.Errorf("arrivals: more than %d requests", maxQuotaRequests)
		}
		replica := 0
		if len(conns) > 0 {
			replica = conns[res.Offered%int64(len(conns))]
		} else {
			replica = rng.IntN(n)
		}
		res.Offered++
		if check(replica, Base.Add(a.At), max(a.Cost, 1)) == nil {
			res.Admitted++
			perReplica[replica]++
		}
	}
	if res.Span <= 0 {
		return QuotaResult{}, errors.New("arrivals: an empty window")
	}
	res.AdmittedRPS = float64(res.Admitted) / res.Span.Seconds()
	for _, a := range perReplica {
		if res.Admitted > 0 {
			res.Busiest = max(res.Busiest, float64(a)/float64(res.Admitted))
		}
	}
	return res, nil
}

// quotaChecker returns the decision of a replica in mode: the same code the proxy runs.
func quotaChecker(mode QuotaMode, limits admission.ClientLimitsConfig, n int) (func(replica int, now time.Time, cost int64) *admission.Rejection, error) {
	limits.MaxKeys, limits.Allow, limits.Deny = 1, nil, nil
	perReplica := func(c admission.ClientLimitsConfig) (func(int, time.Time, int64) *admission.Rejection, error) {
		ls := make([]*admission.ClientLimits, n)
		for i := range ls {
			l, err := admission.NewClientLimits(c)
			if err != nil {
				return nil, err
			}
			ls[i] = l
		}
		return func(r int, now time.Time, cost int64) *admission.Rejection { return ls[r].Check(now, "client", cost) }, nil
	}
	switch mode {
	case QuotaLocal:
		return perReplica(limits)
	case QuotaFallback:
		return perReplica(quota.FallbackLimits(limits, int64(n)))
	case QuotaStore:
		b := quota.NewBucket(limits.Rate, limits.Burst)
		return func(_ int, now time.Time, cost int64) *admission.Rejection { return b.Take(now, cost) }, nil
	}
	return nil, fmt.Errorf("quota mode %q: want one of local, store, fallback", mode)
}

// WriteQuotaTable writes results as a Markdown table.
func WriteQuotaTable(w io.Writer, results []QuotaResult) error {
	if _, err := fmt.Fprintln(w, "| replicas | quota counted | offered rps | admitted rps | of the quota | busiest replica's share |\n|---|---|---|---|---|---|"); err != nil {
		return err
	}
	for _, r := range results {
		if _, err := fmt.Fprintf(w, "| %d | %s | %.1f | %.1f | %.2f | %.2f |\n", r.Replicas, quotaModeText[r.Mode], r.OfferedRPS(), r.AdmittedRPS, r.OfQuota(), r.Busiest); err != nil {
			return err
		}
	}
	return nil
}

// WriteQuotaCSV writes results as CSV, one row per replica count and mode.
func WriteQuotaCSV(w io.Writer, results []QuotaResult) error {
	if _, err := fmt.Fprintln(w, "replicas,mode,offered,admitted,span_s,offered_rps,admitted_rps,quota_rps,of_quota,busiest_share"); err != nil {
		return err
	}
	for _, r := range results {
		if _, err := fmt.Fprintf(w, "%d,%s,%d,%d,%g,%.3f,%.3f,%g,%.4f,%.4f\n", r.Replicas, r.Mode, r.Offered, r.Admitted, r.Span.Seconds(),
			r.OfferedRPS(), r.AdmittedRPS, r.QuotaRPS, r.OfQuota(), r.Busiest); err != nil {
			return err
		}
	}
	return nil
}

var quotaModeText = map[QuotaMode]string{
	QuotaLocal:    "local (no store)",
	QuotaStore:    "store",
	QuotaFallback: "fallback (store away)",
}
