package testwait

import (
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// recorder is a test that records its Fatalf and stops its goroutine, as testing.T does.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls Until on a recorder in a goroutine of its own (Fatalf ends it) and returns the
// recorder and whether Until returned.
func run(within time.Duration, cond func() bool) (r *recorder, returned bool) {
	r = &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Until(r, within, "the thing", cond)
		returned = true
	}()
	<-done
	return r, returned
}

func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	var polls atomic.Int32
	r, returned := run(time.Minute, func() bool { return polls.Add(1) >= 3 })
	if !returned || r.failed != "" {
		t.Fatalf("returned %v, failed %q: want a plain return", returned, r.failed)
	}
	if n := polls.Load(); n != 3 {
		t.Fatalf("polled %d times, want 3 (until the condition held, not after)", n)
	}
}

func TestUntilFailsTheTestAfterTheBound(t *testing.T) {
	start := time.Now()
	r, returned := run(20*time.Millisecond, func() bool { return false })
	if returned {
		t.Fatal("Until returned although the condition never held")
	}
	if took := time.Since(start); took < 20*time.Millisecond {
		t.Fatalf("failed after %s, before the bound of 20ms", took)
	}
	if !strings.Contains(r.failed, "20ms") || !strings.Contains(r.failed, "the thing") {
		t.Fatalf("failure %q: want the bound and what it waited for named", r.failed)
	}
}
