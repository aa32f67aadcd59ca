package cluster

import (
	"strings"
	"testing"
	"time"
)

func TestParseSteal(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Steal
		err  string
	}{
		{in: "", want: Steal{}},
		{in: "0", want: Steal{}},
		{in: "1", want: DefaultSteal()},
		{in: "frozen=2ms,thawed=20ms", want: Steal{Frozen: 2 * time.Millisecond, Thawed: 20 * time.Millisecond, Long: 40 * time.Millisecond, Every: 3 * time.Second}},
		{in: "long=0s,every=0s", want: Steal{Frozen: 3 * time.Millisecond, Thawed: 30 * time.Millisecond}},
		{in: "frozen=2ms,jitter=1ms", err: "jitter: unknown key"},
		{in: "frozen", err: "want key=duration"},
		{in: "frozen=-1ms", err: "frozen: want a duration between 0 and 1m"},
		{in: "thawed=0s", err: "thawed must be positive"},
	} {
		got, err := ParseSteal(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParseSteal(%q) = %v, %v; want an error containing %q", c.in, got, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("ParseSteal(%q) = %+v, %v; want %+v", c.in, got, err, c.want)
		}
		if !got.IsZero() {
			if again, err := ParseSteal(got.String()); err != nil || again != got {
				t.Errorf("ParseSteal(%q) reads back as %+v, %v", got.String(), again, err)
			}
		}
	}
}
