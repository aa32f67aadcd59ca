//go:build integration

package quota

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisServer is Debian's redis-server on a free loopback port, started, killed and restarted
// by the test.
type redisServer struct {
	t    testing.TB
	port int
	dir  string
	spec redisSpec
	cmd  *exec.Cmd
	done chan struct{}
}

// redisSpec varies a server from the default: a plain node with the debug command enabled
// (for DEBUG SLEEP) and no persistence.
type redisSpec struct {
	conf     string      // a configuration file, given first (Sentinel needs one)
	sentinel bool        // run as a Sentinel: only port, bind and log flags besides conf
	tls      *tls.Config // serve TLS on the port (the test's admin client uses this config)
	password string      // the admin client's password
	extra    []string    // more flags
}

// startRedis starts a default redis-server with extra flags.
func startRedis(t testing.TB, extra ...string) *redisServer {
	return startRedisSpec(t, redisSpec{extra: extra})
}

func startRedisSpec(t testing.TB, spec redisSpec) *redisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatal("redis-server not found: install Debian's redis-server package (CI does, in .ci/run)")
	}
	r := &redisServer{t: t, port: freePort(t), dir: t.TempDir(), spec: spec}
	r.start()
	t.Cleanup(r.kill)
	return r
}

func (r *redisServer) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// start runs the server (again) on its port and waits until it answers PING.
func (r *redisServer) start() {
	r.t.Helper()
	port := strconv.Itoa(r.port)
	var args []string
	if r.spec.conf != "" {
		args = append(args, r.spec.conf)
	}
	if r.spec.tls != nil {
		args = append(args, "--port", "0", "--tls-port", port)
	} else {
		args = append(args, "--port", port)
	}
	args = append(args, "--bind", "127.0.0.1", "--dir", r.dir, "--loglevel", "warning", "--daemonize", "no")
	if r.spec.sentinel {
		args = append(args, "--sentinel")
	} else {
		args = append(args, "--save", "", "--appendonly", "no", "--enable-debug-command", "local")
	}
	args = append(args, r.spec.extra...)
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
		c := r.admin()
		err := c.Ping(context.Background()).Err()
		c.Close()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(filepath.Join(r.dir, "redis.log"))
			r.t.Fatalf("redis-server on %s did not answer: %v\n%s", r.addr(), err, out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// kill ends the server with SIGKILL (no goodbye to its clients) and waits for it.
func (r *redisServer) kill() {
	if r.cmd == nil || r.cmd.Process == nil {
		return
	}
	_ = r.cmd.Process.Signal(syscall.SIGKILL)
	<-r.done
	r.cmd = nil
}

// admin is a client for the test's own commands, with generous timeouts.
func (r *redisServer) admin() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: r.addr(), Protocol: 2, DisableIdentity: true, MaxRetries: -1,
		DialTimeout: 2 * time.Second, ReadTimeout: 10 * time.Second, WriteTimeout: 2 * time.Second,
		Password: r.spec.password, TLSConfig: r.spec.tls})
}

// clients counts the server's client connections other than the admin one that asks.
func (r *redisServer) clients(t *testing.T) int {
	t.Helper()
	c := r.admin()
	defer c.Close()
	list, err := c.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(strings.TrimSpace(list), "\n") // one line per client, ours included
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// stallProxy forwards TCP to a target until it is stalled: then it keeps accepting
// connections and reading, but forwards nothing in either direction until resumed, like a
// network path that black-holes traffic.
type stallProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	resume chan struct{} // nil: flowing; closed when a stall ends
	conns  map[net.Conn]bool
	wg     sync.WaitGroup
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, target: target, conns: map[net.Conn]bool{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *stallProxy) addr() string { return p.ln.Addr().String() }

func (p *stallProxy) stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resume == nil {
		p.resume = make(chan struct{})
	}
}

func (p *stallProxy) flow() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resume != nil {
		close(p.resume)
		p.resume = nil
	}
}

// gate returns a channel that is ready when bytes may flow.
func (p *stallProxy) gate() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resume != nil {
		return p.resume
	}
	open := make(chan struct{})
	close(open)
	return open
}

func (p *stallProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		c.Close()
		return false
	}
	p.conns[c] = true
	return true
}

func (p *stallProxy) accept() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(down) {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			<-p.gate() // a stalled path does not even reach the server
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				down.Close()
				return
			}
			if !p.track(up) {
				down.Close()
				return
			}
			var pumps sync.WaitGroup
			pumps.Add(2)
			go p.pump(up, down, &pumps)
			go p.pump(down, up, &pumps)
			pumps.Wait()
		}()
	}
}

func (p *stallProxy) pump(dst, src net.Conn, wg *sync.WaitGroup) {
	defer wg.Done()
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			<-p.gate()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *stallProxy) close() {
	p.ln.Close()
	p.flow()
	p.mu.Lock()
	for c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

// goroutines counts the process's goroutines, leaving out the stalling proxy's: it stands for
// the network, not for the code under test.
func goroutines() int {
	n := 0
	for _, g := range strings.Split(goroutineDump(), "\n\n") {
		if strings.HasPrefix(g, "goroutine ") && !strings.Contains(g, "(*stallProxy)") {
			n++
		}
	}
	return n
}

// settledGoroutines waits until goroutines() is at most want (background goroutines of closed
// clients end on their own schedule: go-redis' re-dial loop sleeps a second) and returns the
// last count.
func settledGoroutines(want int, within time.Duration) int {
	deadline := time.Now().Add(within)
	for {
		n := goroutines()
		if n <= want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// goroutineDump is the stacks of every goroutine, for a failure message.
func goroutineDump() string {
	buf := make([]byte, 4<<20)
	return string(buf[:runtime.Stack(buf, true)])
}

// latencies collects call durations.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

// quantile returns the q-quantile (0..1) and the count.
func (l *latencies) quantile(q float64) (time.Duration, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.d) == 0 {
		return 0, 0
	}
	s := slices.Clone(l.d)
	slices.Sort(s)
	i := min(len(s)-1, int(q*float64(len(s))))
	return s[i], len(s)
}

func (l *latencies) String() string {
	p50, n := l.quantile(0.5)
	p99, _ := l.quantile(0.99)
	mx, _ := l.quantile(1)
	return fmt.Sprintf("n=%d p50=%s p99=%s max=%s", n, p50, p99, mx)
}

// stallMonitor measures how late this process's goroutines get to run: one goroutine sleeps
// 2 ms at a time and records every wake-up more than 3 ms late. On a shared machine the whole
// process is sometimes not scheduled for tens of milliseconds; a call that outlasts the store
// timeout across such a stall was held up by the machine, not by the store.
type stallMonitor struct {
	mu     sync.Mutex
	stalls []span
	stop   chan struct{}
	done   chan struct{}
}

type span struct{ from, to time.Time }

func startStallMonitor() *stallMonitor {
	m := &stallMonitor{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(m.done)
		for {
			select {
			case <-m.stop:
				return
			default:
			}
			want := time.Now().Add(2 * time.Millisecond)
			time.Sleep(2 * time.Millisecond)
			if late := time.Since(want); late > 3*time.Millisecond {
				m.mu.Lock()
				m.stalls = append(m.stalls, span{want, want.Add(late)})
				m.mu.Unlock()
			}
		}
	}()
	return m
}

func (m *stallMonitor) end() {
	close(m.stop)
	<-m.done
}

// longestIn returns the longest stall overlapping [from, to].
func (m *stallMonitor) longestIn(from, to time.Time) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	var longest time.Duration
	for _, s := range m.stalls {
		if s.to.After(from) && s.from.Before(to) {
			longest = max(longest, s.to.Sub(s.from))
		}
	}
	return longest
}

// longest returns the longest stall seen.
func (m *stallMonitor) longest() time.Duration {
	return m.longestIn(time.Time{}, time.Now().Add(time.Hour))
}

// timedCall is one call's start and duration.
type timedCall struct {
	start time.Time
	took  time.Duration
}

// checkAddedWait fails the test for a call that took longer than timeout + waitSlack unless
// the process itself stalled, during that call, for at least the excess. It logs how many
// calls were excused so.
func checkAddedWait(t *testing.T, what string, calls []timedCall, timeout time.Duration, mon *stallMonitor) {
	t.Helper()
	excused := 0
	var worstExcused time.Duration
	for _, c := range calls {
		excess := c.took - timeout - waitSlack
		if excess <= 0 {
			continue
		}
		if stall := mon.longestIn(c.start, c.start.Add(c.took)); stall >= excess {
			excused++
			worstExcused = max(worstExcused, c.took)
			continue
		}
		t.Errorf("%s: a Check took %v, more than the store timeout %v + %v slack, and the process did not stall that long meanwhile (longest stall %v)",
			what, c.took, timeout, waitSlack, mon.longestIn(c.start, c.start.Add(c.took)))
	}
	if excused > 0 {
		t.Logf("FIGURE %s: %d calls outlasted timeout + slack during process stalls (the machine; longest call %v, longest stall %v)",
			what, excused, worstExcused, mon.longest())
	}
}
