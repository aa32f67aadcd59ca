//go:build integration

// Attacks by untrusted clients (issue "Untrusted clients"), each measured on loopback against
// the real backend (8 workers x 20 ms = 400 rps) and proxy: the success share of honest clients
// while the attack runs must be at least 0.9 of their share in the same run without it.
package live

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/loadshed/loadshed/internal/loadgen"
)

const attackQueue = "strategy: bounded-queue\nboundedQueue: {concurrency: 8, depth: 32, maxWait: 80ms}"

// successShare is the share of offered requests answered 2xx.
func successShare(res *loadgen.Result) float64 {
	if res.Offered == 0 {
		return 0
	}
	return float64(res.Success) / float64(res.Offered)
}

// attackRun starts a fresh backend and proxy, runs the honest load (2 s of warm-up, then
// measure) and, while it lasts, attack (when not nil, until its context ends), and returns the
// honest clients' result.
func attackRun(t *testing.T, admission, extra string, honest Load, attack func(ctx context.Context, e *Env)) *loadgen.Result {
	t.Helper()
	e, err := Start(Setup{Workers: eight.Workers, Service: Constant(eight.Service), Admission: policy(t, admission), Extra: extra})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	if attack != nil {
		wg.Add(1)
		go func() { defer wg.Done(); attack(ctx, e) }()
	}
	res, err := e.Run(context.Background(), honest)
	cancel()
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// compareAttack measures the honest clients without and with the attack (each point measured
// again while it misses, up to three runs, as the latency tests do: interference only ever
// lowers it).
func compareAttack(t *testing.T, name, admission, extra string, honest Load, attack func(ctx context.Context, e *Env)) {
	t.Helper()
	bestOfThree(t, func() []string {
		calm := attackRun(t, admission, extra, honest, nil)
		attacked := attackRun(t, admission, extra, honest, attack)
		c, a := successShare(calm), successShare(attacked)
		t.Logf("%s: honest success %.3f without the attack, %.3f with it (ratio %.2f); late starts %d / %d",
			name, c, a, a/max(c, 1e-9), calm.LateStarts, attacked.LateStarts)
		var problems []string
		problems = append(problems, invalid(calm)...)
		problems = append(problems, invalid(attacked)...)
		if a < 0.9*c {
			problems = append(problems, fmt.Sprintf("%s: honest success %.3f under attack, below 0.9 x %.3f", name, a, c))
		}
		return problems
	})
}

// TestAttackPrioritySpoofing: half the load (1.5x of capacity) claims critical_plus and a cost of
// 1, the other half (1.5x) is honest. Spoofing buys nothing: the honest half keeps its share.
func TestAttackPrioritySpoofing(t *testing.T) {
	honest := Load{Rate: 1.5 * eight.RPS(), Duration: 5 * time.Second, Warmup: 2 * time.Second}
	spoofers := func(spoof bool) func(ctx context.Context, e *Env) {
		return func(ctx context.Context, e *Env) {
			l := honest
			l.Prepare = func(int) loadgen.Request {
				h := http.Header{}
				if spoof {
					h.Set("X-Loadshed-Priority", "critical_plus")
					h.Set("X-Loadshed-Cost", "1")
				}
				return loadgen.Request{Header: h}
			}
			e.Run(ctx, l)
		}
	}
	bestOfThree(t, func() []string {
		// The calm run has the same total load: the other half does not spoof.
		calm := attackRun(t, attackQueue, "", honest, spoofers(false))
		attacked := attackRun(t, attackQueue, "", honest, spoofers(true))
		c, a := successShare(calm), successShare(attacked)
		t.Logf("priority spoofing at 3x: honest success %.3f beside plain requests, %.3f beside critical_plus spoofers (ratio %.2f)", c, a, a/max(c, 1e-9))
		if a < 0.9*c {
			return []string{fmt.Sprintf("honest success %.3f beside spoofers, below 0.9 x %.3f", a, c)}
		}
		return nil
	})
}

// TestAttackMalformedBodies: 100 chunked POSTs a second with a chunk size of "zz" beside honest
// traffic at half the capacity, against the adaptive limit: every one is the client's error, the
// limit does not shrink, honest traffic keeps its success.
func TestAttackMalformedBodies(t *testing.T) {
	honest := Load{Rate: 0.5 * eight.RPS(), Duration: 5 * time.Second, Warmup: 2 * time.Second}
	compareAttack(t, "malformed bodies", "strategy: adaptive", "", honest, func(ctx context.Context, e *Env) {
		addr := strings.TrimPrefix(e.ProxyURL, "http://")
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				go func() {
					c, err := net.DialTimeout("tcp", addr, time.Second)
					if err != nil {
						return
					}
					defer c.Close()
					c.SetDeadline(time.Now().Add(2 * time.Second))
					io.WriteString(c, "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
					if res, err := http.ReadResponse(bufio.NewReader(c), nil); err == nil {
						res.Body.Close()
					}
				}()
			}
		}
	})
}

// TestAttackSlowSenders: eight connections announce a 10-byte body and never send it (each
// reconnects when cut off), beside honest traffic at half the capacity of a bounded queue of 8.
func TestAttackSlowSenders(t *testing.T) {
	honest := Load{Rate: 0.5 * eight.RPS(), Duration: 5 * time.Second, Warmup: 2 * time.Second}
	compareAttack(t, "slow senders", attackQueue, "server: {requestBodyTimeout: 2s}", honest, func(ctx context.Context, e *Env) {
		stallers(ctx, e, 8, "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n", 2500*time.Millisecond)
	})
}

// TestAttackSlowReaders: eight clients fetch a 20 MB answer and read none of it (each reconnects
// when cut off), beside honest traffic at half the capacity of a bounded queue of 8. The proxy
// buffers answers up to server.responseBodyBuffer (here raised to 32 MiB), so the backend and the
// permit are free before the reader is.
func TestAttackSlowReaders(t *testing.T) {
	honest := Load{Rate: 0.5 * eight.RPS(), Duration: 5 * time.Second, Warmup: 2 * time.Second}
	compareAttack(t, "slow readers", attackQueue, "server: {responseBodyBuffer: 33554432, responseBufferBudget: 268435456, writeIdleTimeout: 2s}", honest,
		func(ctx context.Context, e *Env) {
			stallers(ctx, e, 8, "GET /?bytes=20000000 HTTP/1.1\r\nHost: x\r\n\r\n", 4*time.Second)
		})
}

// stallers keeps n connections that send req and then neither send nor read anything; each
// holds its connection for hold (longer than the proxy's timeouts), then closes it and starts
// again, until the attack ends.
func stallers(ctx context.Context, e *Env, n int, req string, hold time.Duration) {
	addr := strings.TrimPrefix(e.ProxyURL, "http://")
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Staggered starts, as independent attackers would come.
			select {
			case <-ctx.Done():
			case <-time.After(time.Duration(i) * hold / time.Duration(n)):
			}
			for ctx.Err() == nil {
				c, err := net.DialTimeout("tcp", addr, time.Second)
				if err != nil {
					continue
				}
				if tc, ok := c.(*net.TCPConn); ok {
					tc.SetReadBuffer(4 << 10) // a reader that takes nothing
				}
				io.WriteString(c, req)
				select {
				case <-ctx.Done():
				case <-time.After(hold):
				}
				c.Close()
			}
		}()
	}
	wg.Wait()
}
