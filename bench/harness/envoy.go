package harness

import (
	"bytes"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/loadshed/loadshed/internal/envoystats"
)

// EnvoySetup is one way of running Envoy as a target: the HTTP filters in front of the router
// and the upstream cluster's circuit breaker. Every setup runs one worker (--concurrency 1), its
// admin interface on a free loopback port (never loadshed's 9901), and the same listener, route
// (timeout 30s, like loadshed's upstreamTimeout) and cluster; only what is listed here differs.
type EnvoySetup struct {
	// Name is the target's name.
	Name string
	// ToldCapacity reports whether the setup is given the backend's capacity.
	ToldCapacity bool
	// Settings describes the limits in force, for the report.
	Settings func(l Limits) string
	// Filters returns the http_filters list entries that go before the router, each starting
	// with "- name:" at column 0; "" for none.
	Filters func(l Limits, ep endpoints) string
	// MaxRequests is the cluster's max_requests circuit breaker; 0 sets every threshold high
	// enough never to bind, so the filters are the only admission.
	MaxRequests func(l Limits) int
	// LimitStat, when set, is the admin stat (a suffix of its full name) holding the setup's
	// concurrency limit; the adaptive scenario traces it over time.
	LimitStat string
	// Sidecar, when set, starts a second process the setup needs next to Envoy (an external
	// processor); its CPU and memory count as the target's.
	Sidecar func(dir string, bins Binaries, l Limits, ep endpoints) (launch, error)
}

// EnvoySetups are the Envoy targets the harness runs. Adding one is one entry here.
var EnvoySetups = []EnvoySetup{
	{
		// Envoy's gradient controller with its documented defaults: p50 samples, 25% buffer,
		// limit from 3 to 1000, min-RTT re-measured over 50 requests at concurrency 3 with 15%
		// jitter. Two fields have no default: concurrency_update_interval (0.1s, as in the
		// issue) and, since Envoy 1.40 validates it, the min-RTT interval (60s, the period the
		// field's docs and the peer measurements use).
		Name: "envoy/adaptive_concurrency",
		Settings: func(Limits) string {
			return "adaptive_concurrency gradient controller, documented defaults, concurrency_update_interval 0.1s, min-RTT interval 60s (nothing about the backend)"
		},
		Filters: func(Limits, endpoints) string {
			return `- name: envoy.filters.http.adaptive_concurrency
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.adaptive_concurrency.v3.AdaptiveConcurrency
    gradient_controller_config:
      concurrency_limit_params:
        concurrency_update_interval: 0.1s
      min_rtt_calc_params: {interval: 60s}
`
		},
		LimitStat: "adaptive_concurrency.gradient_controller.concurrency_limit",
	},
	extProcSetup(AdaptiveVariant{}),
	{
		Name:         "envoy/circuit_breaker",
		ToldCapacity: true,
		Settings: func(l Limits) string {
			return fmt.Sprintf("cluster circuit breaker max_requests %d (503 at once)", l.InFlight)
		},
		MaxRequests: func(l Limits) int { return l.InFlight },
	},
	{
		Name: "envoy/local_ratelimit",
		Settings: func(l Limits) string {
			b := envoyBucketFor(l)
			return fmt.Sprintf("local_ratelimit %d tokens per %s, max_tokens %d (429)", b.perFill, b.interval, b.max)
		},
		Filters: func(l Limits, _ endpoints) string {
			b := envoyBucketFor(l)
			return fmt.Sprintf(`- name: envoy.filters.http.local_ratelimit
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit
    stat_prefix: local_rate_limit
    token_bucket: {max_tokens: %d, tokens_per_fill: %d, fill_interval: %s}
    filter_enabled: {default_value: {numerator: 100, denominator: HUNDRED}, runtime_key: local_rate_limit_enabled}
    filter_enforced: {default_value: {numerator: 100, denominator: HUNDRED}, runtime_key: local_rate_limit_enforced}
`, b.max, b.perFill, b.interval)
		},
	},
}

// EnvoyProxy is Envoy with no admission at all (the cost scenario: what the proxy itself costs).
var EnvoyProxy = EnvoySetup{
	Name:     "envoy/proxy",
	Settings: func(Limits) string { return "router only, no admission" },
}

// envoyBucket is a token bucket in Envoy's terms.
type envoyBucket struct {
	max, perFill int
	interval     string
}

// envoyBucketFor refills the bucket at C per second, every 100 ms when C/10 is whole (Envoy
// wants fill_interval >= 50ms), else every second; it holds Q tokens (nginx's burst) or one
// fill, whichever is larger.
func envoyBucketFor(l Limits) envoyBucket {
	c := int(l.CapacityRPS + 0.5)
	b := envoyBucket{perFill: max(1, c), interval: "1s"}
	if c%10 == 0 && c >= 10 {
		b = envoyBucket{perFill: c / 10, interval: "0.1s"}
	}
	b.max = max(b.perFill, l.Queue)
	return b
}

// envoyConfig is the bootstrap for one setup: listener on ep.Listen, admin on ep.Admin, one
// static cluster to ep.Backend.
func envoyConfig(s *EnvoySetup, l Limits, ep endpoints) (string, error) {
	lh, lp, err := net.SplitHostPort(ep.Listen)
	if err != nil {
		return "", fmt.Errorf("envoy listen address %q: %w", ep.Listen, err)
	}
	ah, ap, err := net.SplitHostPort(ep.Admin)
	if err != nil {
		return "", fmt.Errorf("envoy admin address %q: %w", ep.Admin, err)
	}
	bh, bp, err := net.SplitHostPort(ep.Backend)
	if err != nil {
		return "", fmt.Errorf("envoy backend address %q: %w", ep.Backend, err)
	}
	filters := ""
	if s.Filters != nil {
		filters = s.Filters(l, ep)
	}
	extProcCluster := ""
	if s.Sidecar != nil {
		// The external processor beside Envoy: gRPC over HTTP/2 cleartext.
		sh, sp, err := net.SplitHostPort(ep.Sidecar)
		if err != nil {
			return "", fmt.Errorf("envoy sidecar address %q: %w", ep.Sidecar, err)
		}
		extProcCluster = fmt.Sprintf(`    - name: loadshed
      type: STATIC
      connect_timeout: 1s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: {http2_protocol_options: {}}
      load_assignment:
        cluster_name: loadshed
        endpoints:
          - lb_endpoints:
              - endpoint: {address: {socket_address: {address: %s, port_value: %s}}}
`, sh, sp)
	}
	// Envoy's default thresholds (1024 each) are set out of reach unless the setup is the
	// circuit breaker itself: only the setup's own mechanism admits or refuses.
	maxReq, others := 1000000, 1000000
	if s.MaxRequests != nil {
		maxReq = s.MaxRequests(l)
	}
	return fmt.Sprintf(`# generated by bench: %[1]s, one worker (--concurrency 1), loopback only
admin:
  address: {socket_address: {address: %[2]s, port_value: %[3]s}}
static_resources:
  listeners:
    - name: ingress
      address: {socket_address: {address: %[4]s, port_value: %[5]s}}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: ingress
                route_config:
                  virtual_hosts:
                    - name: all
                      domains: ["*"]
                      routes:
                        - match: {prefix: "/"}
                          route: {cluster: backend, timeout: 30s}
                http_filters:
%[6]s                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
    - name: backend
      type: STATIC
      connect_timeout: 1s
      circuit_breakers:
        thresholds:
          - {max_requests: %[9]d, max_connections: %[10]d, max_pending_requests: %[10]d, max_retries: 3}
      load_assignment:
        cluster_name: backend
        endpoints:
          - lb_endpoints:
              - endpoint: {address: {socket_address: {address: %[7]s, port_value: %[8]s}}}
%[11]s`, s.Name, ah, ap, lh, lp, indent(filters, 18), bh, bp, maxReq, others, extProcCluster), nil
}

// indent adds n spaces in front of every non-empty line of s.
func indent(s string, n int) string {
	if s == "" {
		return ""
	}
	pad := strings.Repeat(" ", n)
	var b strings.Builder
	for _, line := range strings.SplitAfter(s, "\n") {
		if strings.TrimSpace(line) != "" {
			b.WriteString(pad)
		}
		b.WriteString(line)
	}
	return b.String()
}

// envoyArgs are the command-line arguments of every Envoy target: one worker, no hot restart
// (so several Envoys never share memory), warnings only.
func envoyArgs(config string) []string {
	return []string{"-c", config, "--concurrency", "1", "--disable-hot-restart", "--log-level", "warn"}
}

// envoyStat reads the value of the stat whose name ends in suffix (the first by name, should
// several) from Envoy's plain-text /stats output.
func envoyStat(body []byte, suffix string) (float64, bool) {
	stats, err := envoystats.Parse(bytes.NewReader(body))
	if err != nil {
		return 0, false
	}
	for _, name := range slices.Sorted(maps.Keys(stats)) {
		if strings.HasSuffix(name, suffix) {
			return float64(stats[name]), true
		}
	}
	return 0, false
}

// extProcSetup is Envoy calling loadshed as its external processor: the filter as
// deploy/envoy/envoy.yaml sets it (headers both ways, no bodies, fail open, 200ms message timeout
// extendable to 2s), loadshed with strategy adaptive and nothing about the backend, as
// deploy/envoy/loadshed.yaml, with the variant's adaptive block if it has one
// ("envoy+loadshed~NAME"). Envoy still has one worker; loadshed runs beside it on the same CPU
// with GOMAXPROCS=1, and its CPU counts as the target's.
func extProcSetup(v AdaptiveVariant) EnvoySetup {
	name, settings, adaptive := EnvoyLoadshed, "strategy adaptive with its defaults", ""
	if v.Name != "" {
		name, settings, adaptive = EnvoyLoadshed+"~"+v.Name, "strategy adaptive, "+v.Block, "  adaptive: "+v.Block+"\n"
	}
	return EnvoySetup{
		Name: name,
		Settings: func(Limits) string {
			return "ext_proc filter (deploy/envoy/envoy.yaml) calling loadshed, " + settings + " (nothing about the backend)"
		},
		Filters: func(_ Limits, ep endpoints) string {
			return `- name: envoy.filters.http.ext_proc
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor
    grpc_service: {envoy_grpc: {cluster_name: loadshed}}
    failure_mode_allow: true
    message_timeout: 0.2s
    max_message_timeout: 2s
    allow_mode_override: true
    request_attributes: ["source.address"]
    processing_mode:
      request_header_mode: SEND
      response_header_mode: SEND
      request_body_mode: NONE
      response_body_mode: NONE
      request_trailer_mode: SKIP
      response_trailer_mode: SKIP
`
		},
		Sidecar: func(dir string, bins Binaries, _ Limits, ep endpoints) (launch, error) {
			if v.Name != "" {
				// A block the config refuses fails the point with the reason, not a proxy
				// that will not start.
				if _, err := v.admission(); err != nil {
					return launch{}, err
				}
			}
			path := filepath.Join(dir, "loadshed.yaml")
			cfg := fmt.Sprintf("listen: \"\"\nadminListen: %q\nextProc: {listen: %q, messageTimeout: 200ms, maxMessageTimeout: 2s}\nadmission:\n  strategy: adaptive\n%s",
				ep.SidecarAdmin, ep.Sidecar, adaptive)
			if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
				return launch{}, err
			}
			return launch{Path: bins.Proxy, Args: []string{"--config", path}, ReadyURL: "http://" + ep.SidecarAdmin + "/readyz"}, nil
		},
	}
}
