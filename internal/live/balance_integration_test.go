//go:build integration

// Balancing by loadshed's load reports (issue 33): a grpc-go client with weighted_round_robin
// over three replicas, each the gRPC backend behind its own sidecar, one of them slow. Run
// without -race.
package live

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
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
	"github.com/loadshed/loadshed/internal/loadgen"
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
	for _, e := range startSidecars(t, true, caps...) {
		addrs = append(addrs, strings.TrimPrefix(e.ProxyURL, "http://"))
	}
	return addrs
}

// startSidecars starts one sidecar (adaptive admission, ORCA reports on) in front of one
// backend per capacity, forwarding to its gRPC port or (grpc false) its HTTP port.
func startSidecars(t *testing.T, grpc bool, caps ...Capacity) []*Env {
	t.Helper()
	var envs []*Env
	for _, c := range caps {
		e, err := Start(Setup{Workers: c.Workers, Service: Constant(c.Service), GRPC: grpc,
			Admission: policy(t, "strategy: adaptive"), Extra: "loadReports: {orca: true}"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.Close)
		envs = append(envs, e)
	}
	return envs
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
// served 0.938 to 0.984 in four runs here, against 0.989 to 1.000 per call and 0.817 to 0.831
// for round robin (go test -tags integration -run TestGRPCWeightedRoundRobinOnReports
// ./internal/live/). One report a second
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

// balancingEnvoy is an Envoy config: one HTTP listener routing everything to a cluster of the
// given endpoints (host:port) under the given cluster-level balancing YAML.
const balancingEnvoy = `admin:
  address: {socket_address: {address: 127.0.0.1, port_value: %s}}
static_resources:
  listeners:
  - name: in
    address: {socket_address: {address: 127.0.0.1, port_value: %s}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: in
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: /}
                route: {cluster: replicas, timeout: 2s}
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
  clusters:
  - name: replicas
    type: STATIC
    connect_timeout: 1s
%s
    load_assignment:
      cluster_name: replicas
      endpoints:
      - lb_endpoints:
%s`

// Envoy's balancing blocks: round robin, and client_side_weighted_round_robin on the endpoints'
// ORCA reports (in-band: endpoint-load-metrics on every answer).
const (
	envoyRoundRobin = "    lb_policy: ROUND_ROBIN"
	envoyCSWRR      = `    load_balancing_policy:
      policies:
      - typed_extension_config:
          name: envoy.load_balancing_policies.client_side_weighted_round_robin
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.load_balancing_policies.client_side_weighted_round_robin.v3.ClientSideWeightedRoundRobin
            blackout_period: 1s
            weight_update_period: 0.25s`
)

// startBalancingEnvoy runs Envoy in front of the sidecars' data ports with a balancing block,
// until the test ends, and returns its listener's URL.
func startBalancingEnvoy(t *testing.T, lb string, envs []*Env) string {
	t.Helper()
	bin, err := FindEnvoy()
	if err != nil {
		t.Skip(err)
	}
	listen, err1 := freePort()
	admin, err2 := freePort()
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	port := func(addr string) string { return addr[strings.LastIndexByte(addr, ':')+1:] }
	var eps strings.Builder
	for _, e := range envs {
		fmt.Fprintf(&eps, "        - endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: %s}}}\n", port(e.ProxyURL))
	}
	path := filepath.Join(t.TempDir(), "envoy.yaml")
	if err := os.WriteFile(path, fmt.Appendf(nil, balancingEnvoy, port(admin), port(listen), lb, eps.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	cmd := exec.Command(bin, "-c", path, "--disable-hot-restart", "--concurrency", "2", "-l", "warning")
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Signal(syscall.SIGTERM); cmd.Wait() })
	deadline := time.Now().Add(20 * time.Second)
	for {
		if res, err := http.Get("http://" + admin + "/ready"); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return "http://" + listen
			}
		}
		if time.Now().After(deadline) || cmd.ProcessState != nil {
			t.Fatalf("envoy not ready within 20 s: %s", log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestEnvoyWeightsByReports: Envoy 1.40 with client_side_weighted_round_robin over two sidecars,
// one in front of a backend three times slower, reads the reports on their answers
// (endpoint-load-metrics, TEXT) and sends the slow one clearly less than round robin's half:
// its weight follows its capacity (67 of 267 calls/s, a quarter). Envoy does not expose the
// weights it computes, so the traffic it sends is the proof that it parsed the reports.
func TestEnvoyWeightsByReports(t *testing.T) {
	const rate = 200.0
	share := map[string]float64{}
	bestOfThree(t, func() []string {
		for _, v := range []struct{ name, lb string }{{"round_robin", envoyRoundRobin}, {"cswrr", envoyCSWRR}} {
			envs := startSidecars(t, false, fastReplica, slowReplica)
			url := startBalancingEnvoy(t, v.lb, envs)
			l := func(d time.Duration) loadgen.Config {
				return loadgen.Config{Target: url + "/", Schedule: loadgen.ConstantRate(rate, d), Timeout: time.Second, SLO: balanceSLO}
			}
			if _, err := loadgen.Run(context.Background(), l(3*time.Second)); err != nil { // past the blackout period
				t.Fatal(err)
			}
			before := []float64{count(t, envs[0]), count(t, envs[1])}
			res, err := loadgen.Run(context.Background(), l(10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			fast, slow := count(t, envs[0])-before[0], count(t, envs[1])-before[1]
			share[v.name] = slow / max(fast+slow, 1)
			t.Logf("RESULT Envoy %s: the slow replica got %.0f of %.0f requests (%.3f); goodput %.0f/s of %.0f/s offered, shed %.1f%%",
				v.name, slow, fast+slow, share[v.name], res.GoodputRPS, rate, 100*res.ShedShare)
		}
		if rr, w := share["round_robin"], share["cswrr"]; w > 0.35 || w > rr-0.1 {
			return []string{fmt.Sprintf("client_side_weighted_round_robin sent the slow replica %.3f of the requests, round robin %.3f: want at most 0.35 and 0.1 less than round robin", w, rr)}
		}
		return nil
	})
}
