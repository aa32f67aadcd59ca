package gate

import (
	"testing"
	"time"
)

func TestRetryAfterSeconds(t *testing.T) {
	for d, want := range map[time.Duration]string{0: "1", time.Millisecond: "1", time.Second: "1", 1001 * time.Millisecond: "2", 90 * time.Second: "90"} {
		if got := RetryAfterSeconds(d); got != want {
			t.Errorf("%v: %s, want %s", d, got, want)
		}
	}
}
