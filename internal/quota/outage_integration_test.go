//go:build integration

package quota

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/loadshed/loadshed/internal/quota/quotatest"
)

// waitSlack is what a Check may take beyond the store timeout: the scheduler waking the
// caller after its deadline on a busy machine (longer stalls of the whole process are measured
// and excused separately, see checkAddedWait). The store itself adds nothing beyond the timeout.
const waitSlack = 10 * time.Millisecond

// fallbackWatch records, for each store, when it last switched to and from the fallback.
type fallbackWatch struct {
	mu    sync.Mutex
	start time.Time
	on    []time.Duration // first time seen in fallback after the disruption began, per store
	off   []time.Duration // first time seen back on the store after the disruption ended
	stop  chan struct{}
	done  chan struct{}
}

func watchFallback(stores []*Store, start time.Time, disruptFrom, disruptTo time.Duration) *fallbackWatch {
	w := &fallbackWatch{start: start, on: make([]time.Duration, len(stores)), off: make([]time.Duration, len(stores)),
		stop: make(chan struct{}), done: make(chan struct{})}
	for i := range stores {
		w.on[i], w.off[i] = -1, -1
	}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(2 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
			now := time.Since(start)
			w.mu.Lock()
			for i, s := range stores {
				fb := s.Fallback()
				if fb && now >= disruptFrom && w.on[i] < 0 {
					w.on[i] = now
				}
				if !fb && now >= disruptTo && w.on[i] >= 0 && w.off[i] < 0 {
					w.off[i] = now
				}
			}
			w.mu.Unlock()
		}
	}()
	return w
}

func (w *fallbackWatch) end() {
	close(w.stop)
	<-w.done
}

// disruption makes the store unusable between two moments of a run and restores it.
type disruption struct {
	name    string
	through bool // limiters reach Redis through the stalling proxy
	begin   func(t *testing.T, r *quotatest.Server, p *quotatest.StallProxy)
	end     func(t *testing.T, r *quotatest.Server, p *quotatest.StallProxy)
}

// TestStoreAwayIsInvisible: Redis killed, Redis blocked by DEBUG SLEEP, and the network path
// to Redis black-holed, each for 4 s in the middle of a 14 s run of two replicas holding a
// client offered 3x its quota. No Check takes longer than the store timeout; each replica
// falls back to rate / replicas within a second, holding the client near its quota; the store
// is used again within seconds of its return, with the global quota held again; and when the
// replicas close, no goroutine and no Redis connection is left.
func TestStoreAwayIsInvisible(t *testing.T) {
	const (
		n           = 2
		disruptFrom = 3 * time.Second
		disruptTo   = 7 * time.Second
		runFor      = 14 * time.Second
	)
	var sleeping sync.WaitGroup
	for _, d := range []disruption{
		{
			name:  "killed",
			begin: func(t *testing.T, r *quotatest.Server, _ *quotatest.StallProxy) { r.Kill() },
			end:   func(t *testing.T, r *quotatest.Server, _ *quotatest.StallProxy) { r.Start() },
		},
		{
			name: "DEBUG SLEEP",
			begin: func(t *testing.T, r *quotatest.Server, _ *quotatest.StallProxy) {
				sleeping.Add(1)
				go func() {
					defer sleeping.Done()
					c := r.Admin()
					defer c.Close()
					if err := c.Do(context.Background(), "DEBUG", "SLEEP", (disruptTo - disruptFrom).Seconds()).Err(); err != nil {
						t.Errorf("DEBUG SLEEP: %v", err)
					}
				}()
			},
			end: func(t *testing.T, r *quotatest.Server, _ *quotatest.StallProxy) { sleeping.Wait() },
		},
		{
			name:    "stalled network",
			through: true,
			begin:   func(t *testing.T, _ *quotatest.Server, p *quotatest.StallProxy) { p.Stall() },
			end:     func(t *testing.T, _ *quotatest.Server, p *quotatest.StallProxy) { p.Flow() },
		},
	} {
		t.Run(d.name, func(t *testing.T) {
			r := quotatest.Start(t)
			p := quotatest.NewStallProxy(t, r.Addr())
			addr := r.Addr()
			if d.through {
				addr = p.Addr()
			}
			cfg := RedisConfig{Addr: addr}.withDefaults()
			baseGoroutines := quotatest.Goroutines()
			baseClients := r.Clients(t)

			rs := newReplicas(t, n, cfg, testQuota(), nil)
			rs.waitCounted(t, n)
			mon := quotatest.StartStallMonitor()
			start := time.Now()
			w := watchFallback(rs.stores, start, disruptFrom, disruptTo)
			var calls []call
			loadDone := make(chan struct{})
			go func() {
				defer close(loadDone)
				calls = offer(rs.lims, map[string]float64{"hot": 3 * quotaRate}, runFor)
			}()
			time.Sleep(time.Until(start.Add(disruptFrom)))
			d.begin(t, r, p)
			time.Sleep(time.Until(start.Add(disruptTo)))
			d.end(t, r, p)
			<-loadDone
			w.end()
			mon.End()

			// No added wait beyond the store timeout, whatever the store did.
			all := tookLatencies(calls, 0, runFor)
			during := tookLatencies(calls, disruptFrom, disruptTo+2*time.Second)
			t.Logf("FIGURE %s: Check duration whole run %s; disruption and recovery %s (timeout %v)", d.name, all, during, cfg.Timeout)
			checkAddedWait(t, d.name, timed(calls), cfg.Timeout, mon)
			checkRefusals(t, calls, time.Second)

			// Each replica falls back within a second, and returns to the store within seconds.
			for i := range rs.stores {
				on, off := w.on[i], w.off[i]
				t.Logf("FIGURE %s: replica %d in fallback %v after the disruption began, back on the store %v after it ended",
					d.name, i, on-disruptFrom, off-disruptTo)
				if on < 0 || on-disruptFrom > time.Second {
					t.Errorf("replica %d: fallback at %v, want within 1 s of %v", i, on, disruptFrom)
				}
				if off < 0 || off-disruptTo > 3*time.Second {
					t.Errorf("replica %d: back on the store at %v, want within 3 s of %v", i, off, disruptTo)
				}
			}

			// Rate / replicas during the outage holds the client near its quota; the global
			// quota holds after the return.
			outage := admittedIn(calls, "hot", disruptFrom+time.Second, disruptTo)
			wantOutage := quotaRate * (disruptTo - disruptFrom - time.Second).Seconds()
			after := admittedIn(calls, "hot", disruptTo+3*time.Second, runFor)
			wantAfter := quotaRate * (runFor - disruptTo - 3*time.Second).Seconds()
			t.Logf("FIGURE %s: admitted %d in the outage (quota %.0f, %+.1f%%), %d after the return (quota %.0f, %+.1f%%)",
				d.name, outage, wantOutage, 100*(float64(outage)/wantOutage-1), after, wantAfter, 100*(float64(after)/wantAfter-1))
			if float64(outage) < 0.85*wantOutage || float64(outage) > 1.15*wantOutage {
				t.Errorf("admitted %d during the outage, want about %.0f (rate / replicas on each)", outage, wantOutage)
			}
			if float64(after) < 0.9*wantAfter || float64(after) > 1.1*wantAfter {
				t.Errorf("admitted %d after the return, want %.0f within 10%%", after, wantAfter)
			}
			// The metrics saw it: store errors by kind, decisions made locally.
			for i, reg := range rs.regs {
				if testutil.CollectAndCount(reg, "loadshed_quota_store_errors_total") == 0 {
					t.Errorf("replica %d recorded no store error", i)
				}
				if n := testutil.ToFloat64(rs.stores[i].m.Decisions.WithLabelValues("api", "fallback", "allowed")); n == 0 {
					t.Errorf("replica %d recorded no fallback decision", i)
				}
			}

			// Nothing left behind.
			rs.close()
			p.Close()
			if got := quotatest.SettledGoroutines(baseGoroutines, 5*time.Second); got > baseGoroutines {
				t.Errorf("%d goroutines after closing, %d before the replicas started\n%s", got, baseGoroutines, quotatest.GoroutineDump())
			}
			deadline := time.Now().Add(3 * time.Second)
			for r.Clients(t) > baseClients && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			if got := r.Clients(t); got > baseClients {
				t.Errorf("Redis lists %d client connections after the replicas closed, %d before", got, baseClients)
			}
		})
	}
}
