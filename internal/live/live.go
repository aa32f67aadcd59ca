// Package live runs the real thing on loopback: the synthetic backend, the proxy in front of it,
// and the open-model load generator, in one process and over real TCP connections. The demo,
// the integration tests and the lab's lab-versus-live comparison all measure with it.
package live

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/loadshed/loadshed/internal/backend"
	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/door/extproc"
	"github.com/loadshed/loadshed/internal/gate"
	"github.com/loadshed/loadshed/internal/loadgen"
	"github.com/loadshed/loadshed/internal/proxy"
	"github.com/loadshed/loadshed/internal/slowtail"
)

// Env is a backend and a proxy in front of it, serving on loopback.
type Env struct {
	Backend      *backend.Server
	Proxy        *proxy.Server // nil when the proxy runs as a separate process
	ProxyProcess *exec.Cmd     // set when Setup.ProxyBinary was given
	ProxyURL     string        // the data port, e.g. "http://127.0.0.1:41234"
	ProxyAdmin   string        // the admin port's base URL
	ConfigPath   string        // the proxy's configuration file, when Setup.Reloadable
	BackendURL   string        // the backend's data port (no admission)
	BackendGRPC  string        // the backend's gRPC port (host:port), when Setup.GRPC
	BackendAdmin string        // the backend's admin port (a test tool)
	// Envoy is the Envoy in front of the backend when Setup.Envoy asked for one; the proxy is
	// then its external processor, with no data port (ProxyURL is empty).
	Envoy  *Envoy
	cancel context.CancelFunc
	done   chan error
	dir    string

	// Proxies are every in-process proxy replica (Setup.Replicas), Proxy first, with their data
	// and admin URLs.
	Proxies                []*proxy.Server
	ProxyURLs, ProxyAdmins []string
}

// Setup describes an environment: the backend's capacity and service time, and the proxy's
// admission block.
type Setup struct {
	Workers int
	Service slowtail.Config
	Seed    uint64
	// Admission is the proxy's admission block, e.g. config.Use(&config.Inflight{Limit: 8}).
	Admission config.Admission
	// Extra holds more top-level keys of the proxy's config file (YAML: routes, headers, ...).
	Extra string
	// ProxyBinary, when set, runs the proxy as a separate process from this binary (built from
	// ./cmd/proxy), so its own goroutines, memory and exit code can be observed.
	ProxyBinary string
	// Shutdown overrides the proxy's shutdown block (default: no drain delay, a 5 s grace period).
	Shutdown *config.Shutdown
	// Stderr receives the proxy process's log (default: discarded).
	Stderr io.Writer
	// Reloadable writes the in-process proxy's configuration to a file (Env.ConfigPath) that
	// Env.Proxy.Reload reads again.
	Reloadable bool
	// GRPC makes the backend also serve its gRPC port (Env.BackendGRPC) and the proxy forward
	// to that port instead of the HTTP one; with the default upstreamProtocol (auto) the proxy
	// sends gRPC calls there over h2c. Offer gRPC load with Load.GRPC.
	GRPC bool
	// Envoy, when set, puts a real Envoy (deploy/envoy/envoy.yaml) in front of the backend and
	// runs the proxy as its external processor only; the proxy's extProc timeouts mirror the
	// Envoy's (zero timeouts: the file's 200ms and 2s). ExtProc is filled in, and App unless set.
	Envoy *EnvoySetup
	// Replicas runs this many in-process proxies with the same configuration in front of the
	// one backend (default 1), named replica-0, replica-1, ... among those sharing a quota
	// store (clients.store).
	Replicas int
}

// The ext_proc filter's timeouts in deploy/envoy/envoy.yaml.
const (
	envoyMessageTimeout    = 200 * time.Millisecond
	envoyMaxMessageTimeout = 2 * time.Second
)

// Constant returns a service time of exactly d.
func Constant(d time.Duration) slowtail.Config { return slowtail.Constant(d) }

// Start starts the backend and the proxy. Close stops them.
func Start(s Setup) (*Env, error) {
	bcfg := backend.DefaultConfig()
	bcfg.Workers = s.Workers
	bcfg.Service = s.Service
	if s.Seed != 0 {
		bcfg.Seed = s.Seed
	}
	be, err := backend.New(bcfg)
	if err != nil {
		return nil, fmt.Errorf("backend: %w", err)
	}
	data, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	admin, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		data.Close()
		return nil, err
	}
	var grpcPort net.Listener
	if s.GRPC {
		if grpcPort, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			data.Close()
			admin.Close()
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Env{Backend: be, cancel: cancel, done: make(chan error, 1+max(s.Replicas, 1)),
		BackendURL: "http://" + data.Addr().String(), BackendAdmin: "http://" + admin.Addr().String()}
	upstream := e.BackendURL
	if grpcPort != nil {
		e.BackendGRPC = grpcPort.Addr().String()
		upstream = "http://" + e.BackendGRPC
	}
	go func() {
		e.done <- be.Serve(ctx, backend.ServeConfig{Data: data, Admin: admin, GRPC: grpcPort, ShutdownTimeout: 5 * time.Second})
	}()

	pListen, pAdmin := "127.0.0.1:0", "127.0.0.1:0"
	if s.ProxyBinary != "" {
		if pListen, err = freePort(); err == nil {
			pAdmin, err = freePort()
		}
		if err != nil {
			e.Close()
			return nil, err
		}
	}
	if s.Envoy != nil {
		env := *s.Envoy
		env.MessageTimeout = cmp.Or(env.MessageTimeout, envoyMessageTimeout)
		env.MaxMessageTimeout = cmp.Or(env.MaxMessageTimeout, envoyMaxMessageTimeout)
		env.App = cmp.Or(env.App, data.Addr().String())
		env.ExtProc = pListen // the ext_proc server takes the data port's place
		s.Envoy = &env
	}
	cfg, err := proxyConfig(s, pListen, pAdmin, upstream)
	if err != nil {
		e.Close()
		return nil, fmt.Errorf("proxy config: %w", err)
	}
	y, err := yaml.Marshal(cfg)
	if err != nil {
		e.Close()
		return nil, fmt.Errorf("proxy config: %w", err)
	}
	if s.ProxyBinary != "" {
		if err := e.startProcess(s, y, pListen, pAdmin); err != nil {
			e.Close()
			return nil, err
		}
		return e, e.startEnvoy(s)
	}
	opts := proxy.Options{Doors: []gate.OpenDoor{extproc.Open}}
	if s.Reloadable {
		if e.dir, err = os.MkdirTemp("", "loadshed-live-"); err != nil {
			e.Close()
			return nil, err
		}
		e.ConfigPath = filepath.Join(e.dir, "config.yaml")
		if err := os.WriteFile(e.ConfigPath, y, 0o600); err != nil {
			e.Close()
			return nil, err
		}
		opts.ConfigPath = e.ConfigPath
	}
	for i := range max(s.Replicas, 1) {
		opts.ReplicaID = fmt.Sprintf("replica-%d", i)
		px, err := proxy.New(cfg, opts)
		if err != nil {
			e.Close()
			return nil, err
		}
		if err := px.Listen(); err != nil {
			px.Close()
			e.Close()
			return nil, err
		}
		d, a := px.Addrs()
		e.Proxies = append(e.Proxies, px)
		e.ProxyURLs, e.ProxyAdmins = append(e.ProxyURLs, "http://"+d), append(e.ProxyAdmins, "http://"+a)
		go func() { e.done <- px.Serve(ctx) }()
		if err := waitReady("http://"+a+"/readyz", 5*time.Second); err != nil {
			e.Close()
			return nil, err
		}
	}
	e.Proxy, e.ProxyURL, e.ProxyAdmin = e.Proxies[0], e.ProxyURLs[0], e.ProxyAdmins[0]
	if s.Envoy != nil {
		e.ProxyURL = ""
		s.Envoy.ExtProc = e.Proxy.Doors()[0].Addr().String()
	}
	return e, e.startEnvoy(s)
}

// startEnvoy starts the Envoy s asks for, if any; on failure it closes e.
func (e *Env) startEnvoy(s Setup) error {
	if s.Envoy == nil {
		return nil
	}
	envoy, err := StartEnvoy(*s.Envoy)
	if err != nil {
		e.Close()
		return err
	}
	e.Envoy = envoy
	return nil
}

// proxyConfig is the proxy's configuration for an environment: s's admission block and extra
// keys in front of the backend, on the given addresses, with no reloading of its own.
func proxyConfig(s Setup, listen, admin, upstream string) (*config.Config, error) {
	return config.ParseWith([]byte(s.Extra), func(c *config.Config) {
		c.Listen, c.AdminListen, c.Upstream = listen, admin, upstream
		c.UpstreamTimeout = config.Duration(10 * time.Second)
		c.Shutdown = config.Shutdown{GracePeriod: config.Duration(5 * time.Second)}
		if s.Shutdown != nil {
			c.Shutdown = *s.Shutdown
		}
		c.Reload.Watch = false
		c.Admission = s.Admission
		if s.Envoy != nil {
			// Envoy's external processor only: no data port, no upstream (Envoy forwards).
			c.Listen, c.Upstream = "", ""
			c.ExtProc = config.ExtProc{Listen: listen, MessageTimeout: config.Duration(s.Envoy.MessageTimeout),
				MaxMessageTimeout: config.Duration(s.Envoy.MaxMessageTimeout)}
		}
	})
}

// ConfigYAML returns a proxy configuration file for this environment's backend, as Start writes
// it, with the admission block given as the file would spell it (for tests that reload a changed
// file, valid or not: the block is placed as it is, not validated).
func (e *Env) ConfigYAML(admissionYAML string) (string, error) {
	cfg, err := proxyConfig(Setup{Admission: config.Named(config.StrategyNone)}, "127.0.0.1:0", "127.0.0.1:0", e.BackendURL)
	if err != nil {
		return "", err
	}
	var doc, block yaml.Node
	if err := doc.Encode(cfg); err != nil {
		return "", err
	}
	if err := yaml.Unmarshal([]byte(admissionYAML), &block); err != nil || len(block.Content) != 1 {
		return "", fmt.Errorf("admission block %q: not one YAML document (%v)", admissionYAML, err)
	}
	for i := 0; i+1 < len(doc.Content); i += 2 {
		if doc.Content[i].Value == "admission" {
			doc.Content[i+1] = block.Content[0]
		}
	}
	y, err := yaml.Marshal(&doc)
	return string(y), err
}

func waitReady(url string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		res, err := http.Get(url)
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return errors.New("proxy not ready: " + url)
}

// Close shuts Envoy, the proxy and the backend down and waits for them.
func (e *Env) Close() {
	if e.Envoy != nil {
		e.Envoy.Close()
	}
	if e.ProxyProcess != nil && e.ProxyProcess.ProcessState == nil {
		e.ProxyProcess.Process.Signal(syscall.SIGTERM)
		e.ProxyProcess.Wait()
	}
	e.cancel()
	for range 1 + len(e.Proxies) {
		<-e.done
	}
	if e.dir != "" {
		os.RemoveAll(e.dir)
	}
}

// freePort returns a loopback address with a port that was free a moment ago.
func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func (e *Env) startProcess(s Setup, config []byte, listen, admin string) error {
	dir, err := os.MkdirTemp("", "loadshed-live-")
	if err != nil {
		return err
	}
	e.dir = dir
	path := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(path, config, 0o600); err != nil {
		return err
	}
	cmd := exec.Command(s.ProxyBinary, "--config", path)
	cmd.Stdout = s.Stderr
	cmd.Stderr = s.Stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("proxy process: %w", err)
	}
	e.ProxyProcess = cmd
	e.ProxyURL, e.ProxyAdmin = "http://"+listen, "http://"+admin
	if s.Envoy != nil {
		e.ProxyURL = "" // Envoy's external processor only
	}
	return waitReady(e.ProxyAdmin+"/readyz", 10*time.Second)
}

// Load is one load-generator run against the proxy.
type Load struct {
	Rate     float64       // requests per second offered
	Duration time.Duration // how long
	Timeout  time.Duration // client timeout (default 1 s)
	SLO      time.Duration // goodput threshold (default 100 ms)
	Prepare  func(i int) loadgen.Request
	Schedule *loadgen.Schedule // overrides Rate and Duration
	// Warmup is sent first, as part of the same continuous load, and left out of the figures.
	Warmup time.Duration
	// GRPC, when set, offers gRPC calls of the backend's Work method instead of HTTP requests
	// (the Env must have been started with Setup.GRPC).
	GRPC *loadgen.GRPC
}

// Run offers the load to the proxy and returns the generator's result.
func (e *Env) Run(ctx context.Context, l Load) (*loadgen.Result, error) {
	return e.run(ctx, e.ProxyURL, l)
}

// RunEnvoy offers the load to the Envoy in front of the backend (Setup.Envoy).
func (e *Env) RunEnvoy(ctx context.Context, l Load) (*loadgen.Result, error) {
	return e.run(ctx, e.Envoy.URL, l)
}

// RunDirect offers the load to the backend itself, with no proxy in between (its gRPC port for
// a gRPC load).
func (e *Env) RunDirect(ctx context.Context, l Load) (*loadgen.Result, error) {
	if l.GRPC != nil {
		return e.run(ctx, "http://"+e.BackendGRPC, l)
	}
	return e.run(ctx, e.BackendURL, l)
}

func (e *Env) run(ctx context.Context, target string, l Load) (*loadgen.Result, error) {
	if l.Timeout == 0 {
		l.Timeout = time.Second
	}
	if l.SLO == 0 {
		l.SLO = 100 * time.Millisecond
	}
	sched := loadgen.ConstantRate(l.Rate, l.Warmup+l.Duration)
	if l.Schedule != nil {
		sched = *l.Schedule
	}
	if l.GRPC != nil && e.BackendGRPC == "" {
		return nil, errors.New("live: a gRPC load needs an Env started with Setup.GRPC")
	}
	return loadgen.Run(ctx, loadgen.Config{
		Target: target + "/", Schedule: sched, Timeout: l.Timeout, SLO: l.SLO, Prepare: l.Prepare, Warmup: l.Warmup,
		GRPC: l.GRPC,
	})
}
