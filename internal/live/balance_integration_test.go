//go:build integration

// Balancing by loadshed's load reports (issue 33): a grpc-go client with weighted_round_robin
// over three replicas, each the gRPC backend behind its own sidecar, one of them slow. Run
// without -race.
package live

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	_ "google.golang.org/grpc/balancer/weightedroundrobin" // registers weighted_round_robin
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	orcasvc "github.com/cncf/xds/go/xds/service/orca/v3"

	"github.com/loadshed/loadshed/internal/backend/backendpb"
)

// The three replicas of issue 33: two of 4 workers x 20 ms (200 calls/s each), one of 4 x 60 ms
// (67/s); 467/s in all, offered 400/s.
var (
	fastReplica = Capacity{Workers: 4, Service: 20 * time.Millisecond}
	slowReplica = Capacity{Workers: 4, Service: 60 * time.Millisecond}
)

// balanceSLO is the latency within which a call counts as served.
const balanceSLO = 250 * time.Millisecond

// startReplicas starts one sidecar (adaptive admission, ORCA reports on) in front of one gRPC
// backend per capacity, and returns their data ports (host:port).
func startReplicas(t *testing.T, caps ...Capacity) []string {
	t.Helper()
	var addrs []string
	for _, c := range caps {
		e, err := Start(Setup{Workers: c.Workers, Service: Constant(c.Service), GRPC: true,
			Admission: policy(t, "strategy: adaptive"), Extra: "loadReports: {orca: true}"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.Close)
		addrs = append(addrs, strings.TrimPrefix(e.ProxyURL, "http://"))
	}
	return addrs
}

// balancedClient is a grpc-go client over addrs (a manual resolver lists them) with the given
// load balancing config, connected to every one of them.
func balancedClient(t *testing.T, addrs []string, lbConfig string) *grpc.ClientConn {
	t.Helper()
	r := manual.NewBuilderWithScheme("replicas")
	var st resolver.State
	for _, a := range addrs {
		st.Endpoints = append(st.Endpoints, resolver.Endpoint{Addresses: []resolver.Address{{Addr: a}}})
	}
	r.InitialState(st)
	conn, err := grpc.NewClient(r.Scheme()+":///loadshed",
		grpc.WithResolvers(r),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDisableRetry(), // one attempt per call: the run measures, it does not retry
		grpc.WithNoProxy(),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig": [`+lbConfig+`]}`))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn.Connect()
	for s := conn.GetState(); s != connectivity.Ready; s = conn.GetState() {
		if !conn.WaitForStateChange(ctx, s) {
			t.Fatalf("client over %v not ready: %v", addrs, s)
		}
	}
	return conn
}

// balanceRun is what one open-model run through a balanced client measured after its warm-up.
type balanceRun struct {
	offered, withinSLO, ok, refused, failed int
	late                                    int     // calls sent more than 10 ms after their time
	perReplica                              []int   // calls answered by each replica
	shares                                  [][]int // per second of the measured part: calls per replica
	refusedBy                               []int
}

// served is the share of the offered calls answered OK within the SLO.
func (r balanceRun) served() float64 { return float64(r.withinSLO) / float64(max(r.offered, 1)) }

func (r balanceRun) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "offered %d, OK within %s %d (%.3f), OK %d, refused %d %v, failed %d, late starts %d, per replica %v",
		r.offered, balanceSLO, r.withinSLO, r.served(), r.ok, r.refused, r.refusedBy, r.failed, r.late, r.perReplica)
	b.WriteString("; shares per second:")
	for _, s := range r.shares {
		total := max(s[0]+s[1]+s[2], 1)
		fmt.Fprintf(&b, " %.2f/%.2f/%.2f", float64(s[0])/float64(total), float64(s[1])/float64(total), float64(s[2])/float64(total))
	}
	return b.String()
}

// offerBalanced offers rate Work calls per second through conn for warmup+d, an open model:
// every call is sent at its scheduled time whatever the others do (at most rate x (warmup+d)
// calls, each bounded by a 1 s deadline), and reports the calls of the last d. A call counts
// for the replica (index in addrs) that answered it.
func offerBalanced(t *testing.T, conn *grpc.ClientConn, addrs []string, rate float64, warmup, d time.Duration) balanceRun {
	t.Helper()
	replica := map[string]int{}
	for i, a := range addrs {
		replica[a] = i
	}
	gap := time.Duration(float64(time.Second) / rate)
	n := int((warmup + d) / gap)
	first := int(warmup / gap)
	run := balanceRun{perReplica: make([]int, len(addrs)), refusedBy: make([]int, len(addrs)),
		shares: make([][]int, int(d/time.Second))}
	for i := range run.shares {
		run.shares[i] = make([]int, len(addrs))
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	client := backendpb.NewBackendClient(conn)
	start := time.Now().Add(50 * time.Millisecond)
	for i := range n {
		due := start.Add(time.Duration(i) * gap)
		time.Sleep(time.Until(due))
		late := time.Since(due) > 10*time.Millisecond
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithDeadline(context.Background(), due.Add(time.Second))
			defer cancel()
			var p peer.Peer
			_, err := client.Work(ctx, &backendpb.WorkRequest{}, grpc.Peer(&p))
			took := time.Since(due)
			if i < first {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			run.offered++
			if late {
				run.late++
			}
			who := -1
			if p.Addr != nil {
				if r, ok := replica[p.Addr.String()]; ok {
					who = r
				}
			}
			code := status.Code(err)
			switch {
			case err == nil:
				run.ok++
				if took <= balanceSLO {
					run.withinSLO++
				}
			case code == codes.Unavailable && who >= 0:
				run.refused++
				run.refusedBy[who]++
			default:
				run.failed++
			}
			if who >= 0 {
				run.perReplica[who]++
				if sec := int(due.Sub(start.Add(warmup)) / time.Second); sec >= 0 && sec < len(run.shares) {
					run.shares[sec][who]++
				}
			}
		}()
	}
	wg.Wait()
	return run
}

// watchReports follows every replica's out-of-band report stream (one report a second) until
// the test ends, and returns a function that renders what it saw: per second, each replica's
// utilization, rate, limit and the weight grpc-go derives from them, rps / (utilization +
// eps/rps). It is how a failed run says why.
func watchReports(t *testing.T, addrs []string) func() string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	lines := make([][]string, len(addrs))
	var wg sync.WaitGroup
	for i, a := range addrs {
		conn, err := grpc.NewClient(a, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithNoProxy())
		if err != nil {
			t.Fatal(err)
		}
		stream, err := orcasvc.NewOpenRcaServiceClient(conn).StreamCoreMetrics(ctx,
			&orcasvc.OrcaLoadReportRequest{ReportInterval: durationpb.New(time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Close()
			for {
				r, err := stream.Recv()
				if err != nil {
					return
				}
				w := 0.0
				if u, rps := r.GetApplicationUtilization(), r.GetRpsFractional(); u > 0 && rps > 0 {
					w = rps / (u + r.GetEps()/rps)
				}
				mu.Lock()
				lines[i] = append(lines[i], fmt.Sprintf("u=%.2f rps=%.0f eps=%.1f limit=%.0f in=%.0f q=%.0f w=%.0f",
					r.GetApplicationUtilization(), r.GetRpsFractional(), r.GetEps(), r.GetNamedMetrics()["limit"],
					r.GetNamedMetrics()["in_flight"], r.GetNamedMetrics()["queued"], w))
				mu.Unlock()
			}
		}()
	}
	stop := func() { cancel(); wg.Wait() }
	t.Cleanup(stop)
	return func() string {
		stop()
		var b strings.Builder
		for i, l := range lines {
			fmt.Fprintf(&b, "\n  replica %d: %s", i, strings.Join(l, " | "))
		}
		return b.String()
	}
}

// TestGRPCWeightedRoundRobinOnReports: a grpc-go client balancing with weighted_round_robin on
// loadshed's per-call load reports (endpoint-load-metrics-bin trailers), over two fast replicas
// and a slow one at 400/467 of their capacity, serves at least 0.95 of the offered calls within
// the SLO, and at least 0.08 more of them than the same client with round_robin in the same run
// (round robin sends the slow replica a third of the calls, twice what it can serve). Each
// variant has fresh replicas of its own.
//
// The same client on the out-of-band reports (the sidecar's report stream, one report a second,
// the shortest loadReports.minInterval allows) is held to the lead over round robin only: it
// served 0.938 to 0.964 in four runs here, against 0.989 to 0.994 per call. One report a second
// of a one-second moving mean is one draw of a noisy figure (utilization is over the adaptive
// limit, which swings between 2 and 15 on the fast replicas at 170 calls/s), and a weight kept
// for a second on one draw overloads a fast replica now and then; per-call reports replace the
// weight with a fresh sample every weightUpdatePeriod. The run logs the reports it saw.
func TestGRPCWeightedRoundRobinOnReports(t *testing.T) {
	const (
		rate   = 400.0
		warmup = 5 * time.Second
		d      = 20 * time.Second
	)
	wrr := func(extra string) string {
		return `{"weighted_round_robin": {"blackoutPeriod": "1s", "weightUpdatePeriod": "0.25s"` + extra + `}}`
	}
	variants := []struct{ name, lb string }{
		{"round_robin", `{"round_robin": {}}`},
		{"wrr_per_call", wrr("")},
		{"wrr_oob", wrr(`, "enableOobLoadReport": true, "oobReportingPeriod": "1s"`)},
	}
	bestOfThree(t, func() []string {
		var problems []string
		served := map[string]float64{}
		for _, v := range variants {
			addrs := startReplicas(t, fastReplica, fastReplica, slowReplica)
			conn := balancedClient(t, addrs, v.lb)
			reports := watchReports(t, addrs)
			run := offerBalanced(t, conn, addrs, rate, warmup, d)
			served[v.name] = run.served()
			t.Logf("RESULT gRPC %s: %s", v.name, run)
			t.Logf("%s: reports once a second: %s", v.name, reports())
			if run.late > run.offered/100 {
				problems = append(problems, fmt.Sprintf("%s: %d of %d calls sent more than 10 ms late: the client could not keep its schedule", v.name, run.late, run.offered))
			}
		}
		rr := served["round_robin"]
		t.Logf("RESULT gRPC served within %s: round_robin %.3f, weighted_round_robin per call %.3f, out of band %.3f", balanceSLO, rr, served["wrr_per_call"], served["wrr_oob"])
		if s := served["wrr_per_call"]; s < 0.95 || s < rr+0.08 {
			problems = append(problems, fmt.Sprintf("weighted_round_robin on per-call reports served %.3f of the offered calls within %s, round robin %.3f: want at least 0.95 and round robin + 0.08", s, balanceSLO, rr))
		}
		if s := served["wrr_oob"]; s < rr+0.08 {
			problems = append(problems, fmt.Sprintf("weighted_round_robin on out-of-band reports served %.3f of the offered calls within %s, round robin %.3f: want at least round robin + 0.08", s, balanceSLO, rr))
		}
		return problems
	})
}
