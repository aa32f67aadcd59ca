package quotatest

import (
	"testing"
	"time"
)

func TestDeadlineCancel(t *testing.T) {
	// A stack as runtime.Stack prints it for the goroutine that cancels an expired deadline.
	const cancel = "goroutine 912 [runnable]:\n" +
		"context.WithDeadlineCause.func2()\n" +
		"\t/opt/go/src/context/context.go:643\n" +
		"created by time.goFunc\n" +
		"\t/opt/go/src/time/sleep.go:215 +0x2d"
	// A caller waiting for its own deadline: its stack names the context package too, but it is
	// the code under test.
	const caller = "goroutine 77 [select]:\n" +
		"github.com/redis/go-redis/v9/internal.(*FastSemaphore).Acquire(0x1, {0x2, 0x3}, 0x1312d00, {0x4, 0x5})\n" +
		"\t/home/dev/go/pkg/mod/github.com/redis/go-redis/v9@v9.22.0/internal/semaphore.go:97 +0x1a5\n" +
		"context.WithDeadlineCause.func1()\n" +
		"created by github.com/loadshed/loadshed/internal/quota.TestFullPoolWaitsNoLongerThanTheTimeout in goroutine 22"
	const timer = "goroutine 5 [runnable]:\n" +
		"github.com/loadshed/loadshed/internal/quota.(*store).expire()\n" +
		"created by time.goFunc"
	for _, c := range []struct {
		name, stack string
		want        bool
	}{
		{"the runtime cancelling a deadline", cancel, true},
		{"a caller of the code under test", caller, false},
		{"another time.AfterFunc callback", timer, false},
	} {
		if got := deadlineCancel(c.stack); got != c.want {
			t.Errorf("%s: deadlineCancel = %v, want %v", c.name, got, c.want)
		}
	}
}

// TestStallMonitorLongestIn: LongestIn gives the length of the stalls whose windows overlap
// the interval, not the width of the window a stall was read in; the waits of one thread add
// up, those of different threads and the late wake-ups do not.
func TestStallMonitorLongestIn(t *testing.T) {
	base := time.Unix(1000, 0)
	at := func(ms int) time.Time { return base.Add(time.Duration(ms) * time.Millisecond) }
	m := &StallMonitor{}
	m.add(span{at(0), at(10), 3 * time.Millisecond, 7})
	m.add(span{at(8), at(12), 2 * time.Millisecond, 7})
	m.add(span{at(9), at(12), 4 * time.Millisecond, 8})
	m.add(span{at(20), at(24), 4 * time.Millisecond, 0})
	m.add(span{at(22), at(26), 3 * time.Millisecond, 0})
	for _, c := range []struct {
		name     string
		from, to int
		want     time.Duration
	}{
		{"one wait of thread 7", 4, 5, 3 * time.Millisecond},
		{"two waits of thread 7 add up", 9, 11, 5 * time.Millisecond},
		{"late wake-ups do not add up", 21, 25, 4 * time.Millisecond},
		{"between them", 13, 19, 0},
		{"the interval ends where a window begins", 16, 20, 0},
	} {
		if got := m.LongestIn(at(c.from), at(c.to)); got != c.want {
			t.Errorf("%s: LongestIn = %v, want %v", c.name, got, c.want)
		}
	}
	if got := m.Longest(); got != 4*time.Millisecond {
		t.Errorf("Longest = %v, want the longest single stall, 4ms", got)
	}
}
