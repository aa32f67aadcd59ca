package quotatest

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/procfs"
)

// Goroutines counts the process's goroutines, leaving out the stalling proxy's (it stands for
// the network, not for the code under test) and the runtime's own for expired context deadlines:
// when a deadline passes, the runtime runs its cancellation in a goroutine of its own that ends
// once the context is cancelled. Calls that share a timeout expire together, so on a busy
// machine there can be one such goroutine per call for a moment (40 were seen at once among 64
// callers); they are the calls' own deadlines, not goroutines the code under test keeps.
func Goroutines() int {
	n := 0
	for _, g := range strings.Split(GoroutineDump(), "\n\n") {
		if strings.HasPrefix(g, "goroutine ") && !strings.Contains(g, "(*StallProxy)") && !deadlineCancel(g) {
			n++
		}
	}
	return n
}

// deadlineCancel reports whether a goroutine's stack is the runtime cancelling an expired
// context deadline.
func deadlineCancel(stack string) bool {
	return strings.Contains(stack, "\ncontext.WithDeadlineCause.func") && strings.Contains(stack, "\ncreated by time.goFunc")
}

// SettledGoroutines waits until Goroutines() is at most want (background goroutines of closed
// clients end on their own schedule: go-redis' re-dial loop sleeps a second) and returns the
// last count.
func SettledGoroutines(want int, within time.Duration) int {
	deadline := time.Now().Add(within)
	for {
		n := Goroutines()
		if n <= want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// GoroutineDump is the stacks of every goroutine, for a failure message.
func GoroutineDump() string {
	buf := make([]byte, 4<<20)
	return string(buf[:runtime.Stack(buf, true)])
}

// Latencies collects durations.
type Latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

// Add records d.
func (l *Latencies) Add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

// Quantile returns the q-quantile (0..1) and the count.
func (l *Latencies) Quantile(q float64) (time.Duration, int) {
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

func (l *Latencies) String() string {
	p50, n := l.Quantile(0.5)
	p99, _ := l.Quantile(0.99)
	mx, _ := l.Quantile(1)
	return fmt.Sprintf("n=%d p50=%s p99=%s max=%s", n, p50, p99, mx)
}

// StallMonitor measures how long this process was kept from running, two ways, every 2 ms: one
// goroutine sleeps 2 ms at a time and records every wake-up more than 3 ms late; and, on Linux,
// it reads how long each of the process's threads has waited on the kernel's run queue
// (/proc/self/task/*/schedstat). On a shared machine the process is sometimes not scheduled for
// tens of milliseconds, and often only one of its threads is not: the goroutines whose timers
// that thread's scheduler holds then wake late together, while the sleeping goroutine, on
// another thread, wakes on time. A call that outlasts the store timeout across such a stall was
// held up by the machine, not by the store.
type StallMonitor struct {
	mu     sync.Mutex
	stalls []span
	stop   chan struct{}
	done   chan struct{}
}

// span is one stall: how long it was, the window it fell in (a thread's wait is read after it
// ended, so its window is wider than the wait), and the thread that waited (0 for the sleeping
// goroutine's late wake-up).
type span struct {
	from, to time.Time
	length   time.Duration
	thread   int
}

// StartStallMonitor starts measuring; End stops it.
func StartStallMonitor() *StallMonitor {
	m := &StallMonitor{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(m.done)
		waited, readAt := threadWaits(), time.Now()
		for {
			select {
			case <-m.stop:
				return
			default:
			}
			want := time.Now().Add(2 * time.Millisecond)
			time.Sleep(2 * time.Millisecond)
			now := time.Now()
			late := now.Sub(want)
			if late > 3*time.Millisecond {
				m.add(span{want, now, late, 0})
			}
			prev, prevAt := waited, readAt
			waited, readAt = threadWaits(), time.Now()
			for tid, w := range waited {
				before, seen := prev[tid]
				if !seen { // a new thread: its wait so far is not one this monitor saw
					continue
				}
				// The kernel adds a wait when the thread runs again: this one ended after the
				// previous reading and began its own length before it ended.
				if d := w - before; d > 0 {
					m.add(span{prevAt.Add(-d), readAt, d, tid})
				}
			}
		}
	}()
	return m
}

func (m *StallMonitor) add(s span) {
	m.mu.Lock()
	m.stalls = append(m.stalls, s)
	m.mu.Unlock()
}

// threadWaits reads, for each thread of this process, the total time it has waited on the
// run queue. Without /proc (not Linux) it returns nothing.
func threadWaits() map[int]time.Duration {
	threads, err := procfs.AllThreads(os.Getpid())
	if err != nil {
		return nil
	}
	out := make(map[int]time.Duration, len(threads))
	for _, th := range threads {
		if st, err := th.Schedstat(); err == nil { // else the thread ended
			out[th.PID] = time.Duration(st.WaitingNanoseconds)
		}
	}
	return out
}

// End stops the monitor.
func (m *StallMonitor) End() {
	close(m.stop)
	<-m.done
}

// LongestIn returns how long the process was held up during [from, to]: the longest late
// wake-up of the sleeping goroutine, or the total run-queue wait of any one thread, whichever
// is longer (the waits of one thread add up for the goroutines it holds; those of different
// threads do not).
func (m *StallMonitor) LongestIn(from, to time.Time) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	var longest time.Duration
	perThread := map[int]time.Duration{}
	for _, s := range m.stalls {
		if !s.to.After(from) || !s.from.Before(to) {
			continue
		}
		if s.thread == 0 {
			longest = max(longest, s.length)
			continue
		}
		perThread[s.thread] += s.length
		longest = max(longest, perThread[s.thread])
	}
	return longest
}

// Longest returns the longest single stall seen: one late wake-up, or one wait of a thread.
func (m *StallMonitor) Longest() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	var longest time.Duration
	for _, s := range m.stalls {
		longest = max(longest, s.length)
	}
	return longest
}

// Call is one timed call: when it began and how long it took beyond what it would have taken
// anyway (the added wait).
type Call struct {
	Start time.Time
	Took  time.Duration
}

// CheckAddedWait fails the test for a call that took longer than bound unless the process
// itself stalled, during that call, for at least the excess. It logs how many calls were
// excused so.
func CheckAddedWait(t testing.TB, what string, calls []Call, bound time.Duration, mon *StallMonitor) {
	t.Helper()
	excused := 0
	var worstExcused time.Duration
	for _, c := range calls {
		excess := c.Took - bound
		if excess <= 0 {
			continue
		}
		if stall := mon.LongestIn(c.Start, c.Start.Add(c.Took)); stall >= excess {
			excused++
			worstExcused = max(worstExcused, c.Took)
			continue
		}
		t.Errorf("%s: a call took %v, more than %v, and the process did not stall that long meanwhile (longest stall %v)",
			what, c.Took, bound, mon.LongestIn(c.Start, c.Start.Add(c.Took)))
	}
	if excused > 0 {
		t.Logf("FIGURE %s: %d calls outlasted %v during process stalls (the machine; longest call %v, longest stall %v)",
			what, excused, bound, worstExcused, mon.Longest())
	}
}
