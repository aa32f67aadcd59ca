package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/loadshed/loadshed/internal/config"
)

// Kind is the family of a target.
type Kind string

// Target kinds.
const (
	KindLoadshed Kind = "loadshed"
	KindNginx    Kind = "nginx"
	KindHAProxy  Kind = "haproxy"
	KindPlain    Kind = "plainproxy"
	KindDirect   Kind = "direct"
	KindEnvoy    Kind = "envoy"
)

// Strategy is one loadshed admission strategy the harness runs. Admission returns its admission
// block for the shared limits; the config file and the report's settings are that block
// rendered (see loadshedConfig).
type Strategy struct {
	Name string
	// ToldCapacity reports whether the block is given the backend's capacity.
	ToldCapacity bool
	Admission    func(l Limits) (config.Admission, error)
}

// LoadshedStrategies are the loadshed strategies the harness runs: every strategy of the
// registry (internal/config), in its order, each sized for the shared limits by the registry
// itself (config.Sized), so the bench knows no strategy of its own and a strategy added to the
// registry is run at once. A strategy the proxy binary does not accept (proxy --check-config
// fails) is reported as skipped.
var LoadshedStrategies = func() []Strategy {
	var out []Strategy
	for _, k := range config.Kinds() {
		out = append(out, Strategy{Name: k.Name, ToldCapacity: k.ToldCapacity(),
			Admission: func(l Limits) (config.Admission, error) { return config.Sized(&k, l.backend()), nil }})
	}
	return out
}()

// backend is what the registry sizes a strategy from: the backend's workers (L = C*S = W), its
// service time and the SLO.
func (l Limits) backend() config.Backend {
	return config.Backend{Workers: l.InFlight, Service: l.Service, SLO: l.SLO}
}

// adaptiveStrategy is the adaptive strategy with the admission block a.
func adaptiveStrategy(a func() (config.Admission, error)) *Strategy {
	return &Strategy{Name: config.StrategyAdaptive, Admission: func(Limits) (config.Admission, error) { return a() }}
}

// Target is one thing k6 sends load to.
type Target struct {
	Name string
	Kind Kind
	// Peer marks the proxies loadshed is compared with (not loadshed, not "direct").
	Peer bool
	// ToldCapacity marks targets configured with the backend's exact concurrency.
	ToldCapacity bool
	// Settings describes the limits in force, for the report.
	Settings string

	strategy *Strategy
	nginxLoc string
	envoy    *EnvoySetup
	// haproxyPlain runs HAProxy with no maxconn, maxqueue or queue timeout (the cost scenario).
	haproxyPlain bool
}

// AllTargets returns every target the harness knows, in report order.
func AllTargets(l Limits) []Target {
	var ts []Target
	for i := range LoadshedStrategies {
		s := &LoadshedStrategies[i]
		settings := ""
		if a, err := s.Admission(l); err != nil {
			settings = "invalid: " + err.Error()
		} else if settings, err = settingsOf(a); err != nil {
			settings = "invalid: " + err.Error()
		}
		switch {
		case s.Name == config.StrategyNone:
			settings = "no admission (proxy overhead only)"
		case settings == "":
			settings = "strategy " + s.Name + " with its defaults (nothing about the backend)"
		}
		ts = append(ts, Target{Name: "loadshed/" + s.Name, Kind: KindLoadshed, ToldCapacity: s.ToldCapacity, Settings: settings, strategy: s})
	}
	ts = append(ts,
		Target{Name: "nginx/limit_conn", Kind: KindNginx, Peer: true, ToldCapacity: true,
			Settings: fmt.Sprintf("limit_conn %d (503)", l.InFlight),
			nginxLoc: fmt.Sprintf("limit_conn conns %d;\n      limit_conn_status 503;", l.InFlight)},
		Target{Name: "nginx/limit_req", Kind: KindNginx, Peer: true,
			Settings: fmt.Sprintf("limit_req %dr/s burst=%d nodelay (429)", int(l.CapacityRPS), l.Queue),
			nginxLoc: fmt.Sprintf("limit_req zone=rate burst=%d nodelay;\n      limit_req_status 429;", l.Queue)},
		Target{Name: "haproxy", Kind: KindHAProxy, Peer: true,
			Settings: fmt.Sprintf("maxconn %d, maxqueue %d, timeout queue %s", l.InFlight, l.Queue, l.MaxWait)},
	)
	for i := range EnvoySetups {
		ts = append(ts, envoyTarget(&EnvoySetups[i], l))
	}
	ts = append(ts,
		Target{Name: "plainproxy", Kind: KindPlain, Peer: true, Settings: "httputil.ReverseProxy, no admission"},
		Target{Name: "direct", Kind: KindDirect, Settings: "no proxy"},
	)
	return ts
}

func envoyTarget(s *EnvoySetup, l Limits) Target {
	return Target{Name: s.Name, Kind: KindEnvoy, Peer: true, ToldCapacity: s.ToldCapacity, Settings: s.Settings(l), envoy: s}
}

// AdaptiveAlgorithms are the limit algorithms of loadshed's adaptive strategy; the adaptive
// scenario runs each one (target "loadshed/adaptive-NAME") next to the default
// ("loadshed/adaptive") and Envoy's adaptive_concurrency.
var AdaptiveAlgorithms = []string{"gradient", "gradient2", "vegas", "aimd", "greed"}

// AdaptiveTargets are the targets of the adaptive scenario: loadshed's adaptive strategy with its
// default algorithm, then with each algorithm named, then Envoy's adaptive_concurrency. None is
// told anything about the backend. Each variant adds "loadshed/adaptive~NAME" after them.
func AdaptiveTargets(l Limits, variants ...AdaptiveVariant) []Target {
	var ts []Target
	for _, t := range AllTargets(l) {
		if t.Name == "loadshed/adaptive" {
			t.Settings = "strategy adaptive with its defaults (default algorithm)"
			ts = append(ts, t)
		}
	}
	for _, alg := range AdaptiveAlgorithms {
		b := config.DefaultAdaptive()
		b.Algorithm = alg
		s := adaptiveStrategy(func() (config.Admission, error) { return config.Use(&b), nil })
		ts = append(ts, Target{Name: "loadshed/adaptive-" + alg, Kind: KindLoadshed, strategy: s,
			Settings: "strategy adaptive, algorithm " + alg + ", its defaults otherwise"})
	}
	for _, v := range variants {
		ts = append(ts, v.sidecar())
	}
	for i := range EnvoySetups {
		if EnvoySetups[i].LimitStat != "" {
			ts = append(ts, envoyTarget(&EnvoySetups[i], l))
		}
	}
	return ts
}

// VariantTargets are the targets each variant adds outside the adaptive scenario: loadshed's
// adaptive strategy with the variant's block as the sidecar ("loadshed/adaptive~NAME") and as
// Envoy's external processor ("envoy+loadshed~NAME").
func VariantTargets(l Limits, variants ...AdaptiveVariant) []Target {
	var ts []Target
	for _, v := range variants {
		ts = append(ts, v.sidecar())
		s := extProcSetup(v)
		ts = append(ts, envoyTarget(&s, l))
	}
	return ts
}

// admission reads the variant's block as the config file's admission section would: strictly,
// so that a block the config package refuses is named with the reason.
func (v AdaptiveVariant) admission() (config.Admission, error) {
	a, err := config.ParseAdmission([]byte("strategy: adaptive\nadaptive: " + v.Block + "\n"))
	if err != nil {
		return config.Admission{}, fmt.Errorf("adaptive variant %s: %w", v.Name, err)
	}
	return *a, nil
}

// sidecar is the variant as a loadshed sidecar. A block the config refuses leaves the target
// skipped, named with the reason (checkStrategy).
func (v AdaptiveVariant) sidecar() Target {
	return Target{Name: "loadshed/adaptive~" + v.Name, Kind: KindLoadshed, strategy: adaptiveStrategy(v.admission),
		Settings: "strategy adaptive, " + v.Block}
}

// CostTargets are the targets of the cost scenario: loadshed with strategies none, inflight
// (limit L, which 64 connections never exceed in front of a 64-worker backend) and adaptive, the
// peers with no admission (nginx proxy_pass with keepalive, HAProxy, Envoy's router), the plain
// httputil proxy, and no proxy.
func CostTargets(l Limits) []Target {
	var ts []Target
	for _, t := range AllTargets(l) {
		switch t.Name {
		case "loadshed/none", "loadshed/inflight", "loadshed/adaptive":
			ts = append(ts, t)
		}
	}
	return append(ts,
		Target{Name: "nginx/proxy", Kind: KindNginx, Peer: true, Settings: "proxy_pass with upstream keepalive, no admission"},
		Target{Name: "haproxy/proxy", Kind: KindHAProxy, Peer: true, Settings: "http-reuse always, no maxconn or queue", haproxyPlain: true},
		envoyTarget(&EnvoyProxy, l),
		Target{Name: "plainproxy", Kind: KindPlain, Peer: true, Settings: "httputil.ReverseProxy, no admission"},
		Target{Name: "direct", Kind: KindDirect, Settings: "no proxy"},
	)
}

// SelectTargets keeps the targets whose name starts with one of the comma-separated prefixes
// in spec ("" or "all" keeps every one); a prefix that matches nothing is an error. A prefix
// that is a target's whole name selects that target only ("loadshed/adaptive" is not also
// "loadshed/adaptive-vegas").
func SelectTargets(all []Target, spec string) ([]Target, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" || spec == "all" {
		return all, nil
	}
	var out []Target
	seen := map[string]bool{}
	for _, p := range strings.Split(spec, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		exact := false
		for _, t := range all {
			exact = exact || t.Name == p
		}
		n := 0
		for _, t := range all {
			if t.Name == p || (!exact && strings.HasPrefix(t.Name, p)) {
				n++
				if !seen[t.Name] {
					seen[t.Name] = true
					out = append(out, t)
				}
			}
		}
		if n == 0 {
			return nil, fmt.Errorf("--targets: %q matches no target", p)
		}
	}
	return out, nil
}

// endpoints are the loopback addresses one point uses.
type endpoints struct {
	Listen      string // target data address
	Admin       string // loadshed admin address
	Backend     string // backend data address
	BackendAdm  string // backend admin address
	BackendGRPC string // backend gRPC address (gRPC stacks only)
	UpstreamURL string // http://Backend, or http://BackendGRPC in a gRPC stack
	// Sidecar and SidecarAdmin are free addresses for a second process a target starts next to
	// itself (EnvoySetup.Sidecar).
	Sidecar, SidecarAdmin string
}

// launch is how to start a target and reach it.
type launch struct {
	Path string
	Args []string
	// URL is what k6 loads; ReadyURL, when set, must answer 200 before the point starts.
	URL      string
	ReadyURL string
	// Sidecar, when set, is started first, on the same CPU, and must be ready before the target
	// starts; its CPU and memory count as the target's.
	Sidecar *launch
}

// prepare writes the target's config files into dir and returns how to start it; a nil
// launch.Path means nothing to start (direct).
func (t Target) prepare(dir string, bins Binaries, l Limits, ep endpoints) (launch, error) {
	switch t.Kind {
	case KindDirect:
		return launch{URL: "http://" + ep.Backend + "/"}, nil
	case KindPlain:
		return launch{Path: bins.PlainProxy, Args: []string{"--listen", ep.Listen, "--upstream", ep.UpstreamURL},
			URL: "http://" + ep.Listen + "/"}, nil
	case KindLoadshed:
		path := filepath.Join(dir, "loadshed.yaml")
		text, err := loadshedConfig(t.strategy, l, ep)
		if err != nil {
			return launch{}, err
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			return launch{}, err
		}
		return launch{Path: bins.Proxy, Args: []string{"--config", path}, URL: "http://" + ep.Listen + "/",
			ReadyURL: "http://" + ep.Admin + "/readyz"}, nil
	case KindNginx:
		for _, sub := range []string{"logs", "tmp"} {
			if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
				return launch{}, err
			}
		}
		path := filepath.Join(dir, "nginx.conf")
		if err := os.WriteFile(path, []byte(nginxConfig(t.nginxLoc, l, dir, ep)), 0o644); err != nil {
			return launch{}, err
		}
		return launch{Path: bins.Nginx, Args: []string{"-p", dir, "-c", path, "-e", filepath.Join(dir, "logs", "error.log")},
			URL: "http://" + ep.Listen + "/"}, nil
	case KindHAProxy:
		path := filepath.Join(dir, "haproxy.cfg")
		text := haproxyConfig(l, ep)
		if t.haproxyPlain {
			text = haproxyPlainConfig(ep)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			return launch{}, err
		}
		return launch{Path: bins.HAProxy, Args: []string{"-f", path, "-db"}, URL: "http://" + ep.Listen + "/"}, nil
	case KindEnvoy:
		text, err := envoyConfig(t.envoy, l, ep)
		if err != nil {
			return launch{}, err
		}
		path := filepath.Join(dir, "envoy.yaml")
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			return launch{}, err
		}
		lch := launch{Path: bins.Envoy, Args: envoyArgs(path), URL: "http://" + ep.Listen + "/", ReadyURL: "http://" + ep.Admin + "/ready"}
		if t.envoy.Sidecar != nil {
			sc, err := t.envoy.Sidecar(dir, bins, l, ep)
			if err != nil {
				return launch{}, err
			}
			lch.Sidecar = &sc
		}
		return lch, nil
	}
	return launch{}, fmt.Errorf("target %s: unknown kind %q", t.Name, t.Kind)
}

// loadshedConfig is the proxy config for one strategy (see the config reference in the README):
// the addresses, then the strategy's admission block as the config package writes it.
func loadshedConfig(s *Strategy, l Limits, ep endpoints) (string, error) {
	a, err := s.Admission(l)
	if err != nil {
		return "", err
	}
	block, err := yaml.Marshal(struct {
		Admission config.Admission `yaml:"admission"`
	}{a})
	if err != nil {
		return "", fmt.Errorf("loadshed/%s: admission block: %w", s.Name, err)
	}
	return fmt.Sprintf("listen: %q\nupstream: %q\nadminListen: %q\nupstreamTimeout: 30s\nserver: {maxConnections: %d}\n", ep.Listen, ep.UpstreamURL, ep.Admin, BenchMaxConnections) + string(block), nil
}

// BenchMaxConnections is every loadshed target's connection cap (server.maxConnections). k6
// holds a connection per VU, and an open-model point needs thousands of VUs (about 1.4 x the
// rate: 2,760 at 2,000 rps); at the default cap of 1,024 the sidecar would close an idle one
// for every new one, and the client would reconnect for most requests, a cost in CPU and
// latency on both sides that the peers, which have no cap, do not pay.
const BenchMaxConnections = 8192

// settingsOf is an admission block's settings for the report: every key but the strategy, each
// on one line in the config file's flow style ("boundedQueue: {concurrency: 4, depth: 6, maxWait:
// 60ms}"); "" when the block holds nothing but its strategy.
func settingsOf(a config.Admission) (string, error) {
	var n yaml.Node
	if err := n.Encode(a); err != nil {
		return "", err
	}
	var parts []string
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == "strategy" {
			continue
		}
		n.Content[i+1].Style |= yaml.FlowStyle
		out, err := yaml.Marshal(&yaml.Node{Kind: yaml.MappingNode, Content: n.Content[i : i+2]})
		if err != nil {
			return "", err
		}
		parts = append(parts, strings.TrimSpace(string(out)))
	}
	return strings.Join(parts, ", "), nil
}

// nginxHead is the start of every generated nginx config, up to inside the http block: one
// worker in the foreground, files under dir, no access log, long keep-alive.
func nginxHead(comment, dir string) string {
	tmp := filepath.Join(dir, "tmp")
	return fmt.Sprintf(`# generated by bench: %[3]s
worker_processes 1;
daemon off;
pid %[1]s/nginx.pid;
error_log %[1]s/logs/error.log warn;
worker_rlimit_nofile 16384;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path %[2]s/body;
  proxy_temp_path %[2]s/proxy;
  fastcgi_temp_path %[2]s/fastcgi;
  uwsgi_temp_path %[2]s/uwsgi;
  scgi_temp_path %[2]s/scgi;
  keepalive_timeout 120s;
  keepalive_requests 1000000;
`, dir, tmp, comment)
}

func nginxConfig(location string, l Limits, dir string, ep endpoints) string {
	return nginxHead("one worker, loopback only", dir) + fmt.Sprintf(`  limit_conn_zone $server_name zone=conns:1m;
  limit_req_zone $server_name zone=rate:1m rate=%[1]dr/s;
  upstream backend {
    server %[2]s;
    keepalive 256;
  }
  server {
    listen %[3]s;
    # limit_conn_zone / limit_req_zone key on $server_name: it must not be empty (empty keys
    # are not limited).
    server_name bench;
    location / {
      %[4]s
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_read_timeout 30s;
    }
  }
}
`, int(l.CapacityRPS), ep.Backend, ep.Listen, location)
}

func haproxyConfig(l Limits, ep endpoints) string {
	return haproxyWith(ep, fmt.Sprintf("  timeout queue %dms\n", l.MaxWait.Milliseconds()), fmt.Sprintf(" maxconn %d maxqueue %d", l.InFlight, l.Queue))
}

// haproxyPlainConfig forwards with no limit: what HAProxy itself costs.
func haproxyPlainConfig(ep endpoints) string { return haproxyWith(ep, "", "") }

func haproxyWith(ep endpoints, backendLines, serverOpts string) string {
	return fmt.Sprintf(`# generated by bench: one thread, loopback only
global
  nbthread 1
  maxconn 8000
defaults
  mode http
  timeout connect 1s
  timeout client 30s
  timeout server 30s
frontend fe
  bind %s
  default_backend be
backend be
%s  http-reuse always
  server backend %s%s
`, ep.Listen, backendLines, ep.Backend, serverOpts)
}
