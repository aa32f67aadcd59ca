//go:build integration

package quota

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/loadshed/loadshed/internal/quota/quotatest"
)

// waitSlack is what a Check may take beyond the store timeout: the scheduler waking the
// caller after its deadline on a busy machine (longer stalls of the whole process are measured
// and excused separately, see checkAddedWait). The store itself adds nothing beyond the timeout.
const waitSlack = 10 * time.Millisecond

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
	for _, d := range quotatest.Disruptions(disruptTo - disruptFrom) {
		t.Run(d.Name, func(t *testing.T) {
			r, p, addr := d.Start(t)
			cfg := RedisConfig{Addr: addr}.withDefaults()
			baseGoroutines := quotatest.Goroutines()
			baseClients := r.Clients(t)

			rs := newReplicas(t, n, cfg, testQuota(), nil)
			rs.waitCounted(t, n)
			mon := quotatest.StartStallMonitor()
			start := time.Now()
			w := quotatest.WatchFallback(len(rs.stores), func(i int) bool { return rs.stores[i].Fallback() }, start, disruptFrom, disruptTo)
			var calls []call
			loadDone := make(chan struct{})
			go func() {
				defer close(loadDone)
				calls = offer(rs.lims, map[string]float64{"hot": 3 * quotaRate}, runFor)
			}()
			time.Sleep(time.Until(start.Add(disruptFrom)))
			d.Begin(t, r, p)
			time.Sleep(time.Until(start.Add(disruptTo)))
			d.End(t, r, p)
			<-loadDone
			w.End()
			mon.End()

			// No added wait beyond the store timeout, whatever the store did.
			all := tookLatencies(calls, 0, runFor)
			during := tookLatencies(calls, disruptFrom, disruptTo+2*time.Second)
			t.Logf("FIGURE %s: Check duration whole run %s; disruption and recovery %s (timeout %v)", d.Name, all, during, cfg.Timeout)
			checkAddedWait(t, d.Name, timed(calls), cfg.Timeout, mon)
			checkRefusals(t, calls, time.Second)

			// Each replica falls back within a second, and returns to the store within seconds.
			for i := range rs.stores {
				on, off := w.On[i], w.Off[i]
				t.Logf("FIGURE %s: replica %d in fallback %v after the disruption began, back on the store %v after it ended",
					d.Name, i, on-disruptFrom, off-disruptTo)
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
				d.Name, outage, wantOutage, 100*(float64(outage)/wantOutage-1), after, wantAfter, 100*(float64(after)/wantAfter-1))
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
