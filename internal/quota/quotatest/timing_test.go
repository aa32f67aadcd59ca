package quotatest

import "testing"

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
