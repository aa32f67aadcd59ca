// Package testwait is for tests only: it waits for a condition that another goroutine brings
// about, by polling it, and fails the test once a bound has passed. The bound guards against a
// hang; it is not a timing the test relies on.
package testwait

import (
	"testing"
	"time"
)

// Until polls cond every millisecond until it holds. If it still does not hold after within, the
// test fails at once (Fatalf), naming what it waited for.
func Until(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(time.Millisecond)
	}
}
