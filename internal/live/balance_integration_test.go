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

// TestGRPCWeightedRoundRobinOnReports: a grpc-go client balancing with weighted_round_robin on
// loadshed's load reports, per call (endpoint-load-metrics-bin trailers) and out of band (the
// sidecar's report stream), over two fast replicas and a slow one at 400/467 of their capacity,
// serves at least 0.95 of the offered calls within the SLO, and at least 0.08 more of them than
// the same client with round_robin in the same run (round robin sends the slow replica a third
// of the calls, twice what it can serve). Each variant has replicas of its own, fresh.
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
	served := map[string]float64{}
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			addrs := startReplicas(t, fastReplica, fastReplica, slowReplica)
			conn := balancedClient(t, addrs, v.lb)
			run := offerBalanced(t, conn, addrs, rate, warmup, d)
			served[v.name] = run.served()
			t.Logf("RESULT %s: %s", v.name, run)
			if run.late > run.offered/100 {
				t.Errorf("%d of %d calls sent more than 10 ms late: the client could not keep its schedule", run.late, run.offered)
			}
		})
	}
	rr, ok := served["round_robin"]
	if !ok {
		return // (-run left round robin out: nothing to compare with)
	}
	for _, v := range []string{"wrr_per_call", "wrr_oob"} {
		if s, ok := served[v]; ok && (s < 0.95 || s < rr+0.08) {
			t.Errorf("%s served %.3f of the offered calls within %s, round robin %.3f: want at least 0.95 and round robin + 0.08", v, s, balanceSLO, rr)
		}
	}
}
