// Package quotatest holds what integration tests of quotas shared through a store need: a real
// redis-server on a free loopback port that a test can kill and start again, a TCP proxy that
// black-holes the path to it on demand, and the tools that tell the machine's own pauses from
// the store's waits (a stall monitor, goroutine counts, latency quantiles).
package quotatest

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is Debian's redis-server on a loopback port, started, killed and started again by the
// test.
type Server struct {
	t    testing.TB
	port int
	dir  string
	spec Spec
	cmd  *exec.Cmd
	done chan struct{}
}

// Spec varies a server from the default: a plain node with the debug command enabled (for
// DEBUG SLEEP) and no persistence.
type Spec struct {
	Port     int         // 0: a free port
	Conf     string      // a configuration file, given first (Sentinel needs one)
	Sentinel bool        // run as a Sentinel: only port, bind and log flags besides Conf
	TLS      *tls.Config // serve TLS on the port (the test's admin client uses this config)
	Password string      // the admin client's password
	Extra    []string    // more flags
}

// Start starts a default redis-server with extra flags; it is killed when the test ends.
func Start(t testing.TB, extra ...string) *Server {
	return StartSpec(t, Spec{Extra: extra})
}

// StartSpec starts a redis-server as spec says; it is killed when the test ends.
func StartSpec(t testing.TB, spec Spec) *Server {
	t.Helper()
	RequireRedis(t)
	r := &Server{t: t, port: spec.Port, dir: t.TempDir(), spec: spec}
	if r.port == 0 {
		r.port = FreePort(t)
	}
	r.Start()
	t.Cleanup(r.Kill)
	return r
}

// RequireRedis skips the test when redis-server is not installed, or fails it under CI=true
// (CI installs it, in .ci/run; scripts/test.sh does too when it can).
func RequireRedis(t testing.TB) {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server not found: CI must install Debian's redis-server package (.ci/run does)")
		}
		t.Skip("skipped: redis-server not found (apt-get install redis-server to run the Redis tests)")
	}
}

// Addr is the server's host:port.
func (r *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// Port is the server's port.
func (r *Server) Port() int { return r.port }

// Start runs the server (again) on its port and waits until it answers PING.
func (r *Server) Start() {
	r.t.Helper()
	port := strconv.Itoa(r.port)
	var args []string
	if r.spec.Conf != "" {
		args = append(args, r.spec.Conf)
	}
	if r.spec.TLS != nil {
		args = append(args, "--port", "0", "--tls-port", port)
	} else {
		args = append(args, "--port", port)
	}
	args = append(args, "--bind", "127.0.0.1", "--dir", r.dir, "--loglevel", "warning", "--daemonize", "no")
	if r.spec.Sentinel {
		args = append(args, "--sentinel")
	} else {
		args = append(args, "--save", "", "--appendonly", "no", "--enable-debug-command", "local")
	}
	args = append(args, r.spec.Extra...)
	r.cmd = exec.Command("redis-server", args...)
	log, err := os.OpenFile(filepath.Join(r.dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		r.t.Fatal(err)
	}
	defer log.Close()
	r.cmd.Stdout, r.cmd.Stderr = log, log
	if err := r.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	r.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(r.cmd, r.done)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c := r.Admin()
		err := c.Ping(context.Background()).Err()
		c.Close()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(filepath.Join(r.dir, "redis.log"))
			r.t.Fatalf("redis-server on %s did not answer: %v\n%s", r.Addr(), err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill ends the server with SIGKILL (no goodbye to its clients) and waits for it.
func (r *Server) Kill() {
	if r.cmd == nil || r.cmd.Process == nil {
		return
	}
	_ = r.cmd.Process.Signal(syscall.SIGKILL)
	<-r.done
	r.cmd = nil
}

// Admin is a client for the test's own commands, with generous timeouts.
func (r *Server) Admin() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: r.Addr(), Protocol: 2, DisableIdentity: true, MaxRetries: -1,
		DialTimeout: 2 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 2 * time.Second,
		Password: r.spec.Password, TLSConfig: r.spec.TLS})
}

// Clients counts the server's client connections other than the admin one that asks.
func (r *Server) Clients(t testing.TB) int {
	t.Helper()
	c := r.Admin()
	defer c.Close()
	list, err := c.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(strings.TrimSpace(list), "\n") // one line per client, ours included
}

// WaitClients waits up to within for the server to list at most n client connections (a
// closed client's connections end on the server a moment later) and returns the last count.
func (r *Server) WaitClients(t testing.TB, n int, within time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := r.Clients(t)
		if got <= n || time.Now().After(deadline) {
			return got
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// FreePort returns a loopback port that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
