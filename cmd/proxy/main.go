// Command proxy is the loadshed sidecar: a reverse proxy that admits, queues or refuses each
// request before it reaches the service behind it, and, with extProc.listen, Envoy's external
// processor deciding the same for an Envoy in the pod.
//
//	proxy --config FILE [--listen ADDR] [--upstream URL] [--admin-listen ADDR] [--log-level LEVEL]
//	proxy --check-config FILE
//	proxy --version
//
// POD_NAME, when set, names this replica among those that share a quota store (clients.store).
// LOADSHED_DRAIN_TOKEN is the token GET /drain on the admin port requires (Authorization: Bearer);
// unset, /drain is refused to everyone.
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"

	"github.com/loadshed/loadshed/internal/cli"
	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/door/extproc"
	"github.com/loadshed/loadshed/internal/gate"
	"github.com/loadshed/loadshed/internal/proxy"
	"github.com/loadshed/loadshed/internal/quota"
)

func main() { cli.Main("proxy", run) }

var help = cli.Help{
	Name:     "proxy",
	Synopsis: "the loadshed sidecar: a reverse proxy that admits, queues or refuses each request before the service behind it",
	Usage:    []string{"--config FILE [flags]", "--check-config FILE", "--version"},
	Examples: []string{"proxy --config examples/minimal.yaml", "proxy --check-config examples/routes-priorities.yaml"},
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := cli.NewFlagSet(help, stdout)
	configPath := fs.String("config", "", "configuration file (YAML)")
	check := fs.String("check-config", "", "validate this configuration file and exit")
	listen := fs.String("listen", "", "data address, overrides the file's listen")
	upstream := fs.String("upstream", "", "upstream URL, overrides the file's upstream")
	adminListen := fs.String("admin-listen", "", "admin address, overrides the file's adminListen")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	maxConfig := fs.Int64("max-config-bytes", config.MaxFileBytes, "largest configuration file accepted, at start and on reload")
	if err := cli.Parse(fs, args); err != nil {
		return err
	}
	if *maxConfig < 1 {
		return cli.Usagef("--max-config-bytes: must be positive, got %d", *maxConfig)
	}
	if *check != "" {
		data, err := config.ReadFile(*check, *maxConfig)
		if err != nil {
			return err
		}
		c, err := config.Parse(data)
		if err != nil {
			return fmt.Errorf("%s: %w", *check, err)
		}
		fmt.Fprintf(stdout, "%s: valid: %s\n", *check, config.Summary(c))
		return nil
	}
	if *configPath == "" {
		return cli.Usagef("--config FILE is required (or --check-config FILE, --version)")
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return cli.Usagef("--log-level: %v", err)
	}
	cfg, err := loadWithOverrides(*configPath, *maxConfig, *listen, *upstream, *adminListen)
	if err != nil {
		return err
	}
	log := cli.NewLogger(stderr, level)
	if err := memoryLimit(os.Getenv, log); err != nil {
		return err
	}
	quota.SetClientLogger(log)
	srv, err := proxy.New(cfg, proxy.Options{Logger: log, ConfigPath: *configPath, Overrides: overrides(*listen, *upstream, *adminListen),
		MaxConfigBytes: *maxConfig, Doors: []gate.OpenDoor{extproc.Open},
		ReplicaID: os.Getenv(podNameEnv), DrainToken: os.Getenv(proxy.DrainTokenEnv)})
	if err != nil {
		return err
	}
	return srv.Serve(ctx)
}

// memoryLimitEnv carries the container's memory limit in bytes (the chart sets it from the
// pod's resources); the proxy makes 90% of it the Go runtime's soft memory limit, unless
// GOMEMLIMIT says otherwise.
const memoryLimitEnv = "LOADSHED_MEMORY_LIMIT"

// memoryLimit applies the container's memory limit to the Go runtime: the collector then works
// harder as the heap nears the limit instead of the container being killed.
func memoryLimit(getenv func(string) string, log *slog.Logger) error {
	v := getenv(memoryLimitEnv)
	if v == "" || getenv("GOMEMLIMIT") != "" {
		return nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n <= 0 {
		return fmt.Errorf("%s: want the container's memory limit in bytes, got %q", memoryLimitEnv, v)
	}
	limit := n / 10 * 9
	debug.SetMemoryLimit(limit)
	log.Info("go runtime memory limit", "bytes", limit, "container_limit", n)
	return nil
}

// podNameEnv names the environment variable holding the pod's name (the chart sets it from the
// downward API): the replica's name among those sharing a quota store. Unset, the replica is
// named by its host name and a random suffix.
const podNameEnv = "POD_NAME"

func overrides(listen, upstream, admin string) func(*config.Config) {
	return func(c *config.Config) {
		if listen != "" {
			c.Listen = listen
		}
		if upstream != "" {
			c.Upstream = upstream
		}
		if admin != "" {
			c.AdminListen = admin
		}
	}
}

// loadWithOverrides reads the file, applies the command-line overrides, then validates, so an
// override is checked like any other value.
func loadWithOverrides(path string, maxBytes int64, listen, upstream, admin string) (*config.Config, error) {
	data, err := config.ReadFile(path, maxBytes)
	if err != nil {
		return nil, err
	}
	c, err := config.ParseWith(data, overrides(listen, upstream, admin))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return c, nil
}
