package main

import (
	"context"
	"io"
	"strings"
	"testing"
)

func TestParseLoads(t *testing.T) {
	got, err := parseLoads("0.5, 2x,10")
	if err != nil || len(got) != 3 || got[0] != 0.5 || got[1] != 2 || got[2] != 10 {
		t.Fatalf("parseLoads = %v, %v", got, err)
	}
	if _, err := parseLoads("1,lots"); err == nil || !strings.Contains(err.Error(), "--loads") {
		t.Fatalf("bad load: %v", err)
	}
}

func TestRunRejectsBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--loads", "x"}, "--loads"},
		{[]string{"--no-such-flag"}, "no-such-flag"},
		{[]string{"stray"}, "unexpected arguments"},
		{[]string{"--scenario", "chaos"}, "--scenario"},
		{[]string{"--scenario", "cost", "--k6-smoke", "loadshed/inflight"}, "--k6-smoke"},
		{[]string{"--scenario", "adaptive", "--adaptive-workers", "4,many"}, "--adaptive-workers"},
		{[]string{"--scenario", "adaptive", "--adaptive-services", "bursty", "--out", "unused"}, "Services"},
		{[]string{"--scenario", "cost", "--cost-rate", "0", "--out", "unused"}, "Rate"},
		{[]string{"--scenario", "long", "--loads", "2,3", "--out", "unused"}, "--loads"},
		{[]string{"--scenario", "long", "--long", "2s", "--out", "unused"}, "--long"},
		{[]string{"--scenario", "long", "--k6-smoke", "loadshed/inflight"}, "--k6-smoke"},
		{[]string{"--scenario", "balancing", "--balancing-cases", "slow,skewed", "--out", "unused"}, "--balancing-cases"},
		{[]string{"--scenario", "balancing", "--balancing-policies", "random", "--out", "unused"}, "unknown policy"},
		{[]string{"--scenario", "balancing", "--k6-smoke", "loadshed/inflight"}, "--k6-smoke"},
		{[]string{"--scenario", "fanout", "--k6-smoke", "loadshed/inflight"}, "--k6-smoke"},
		{[]string{"--scenario", "fanout", "--loads", "2,x"}, "--loads"},
		{[]string{"--scenario", "fanout", "--loads", "30", "--out", "unused"}, "Loads"},
		{[]string{"--scenario", "fanout", "--duration", "1s", "--out", "unused"}, "Duration"},
		{[]string{"--scenario", "peers", "--generator", "loadgen", "--out", "unused"}, "--generator"},
		{[]string{"--scenario", "adaptive", "--generator", "wrk", "--out", "unused"}, "Generator"},
	} {
		err := run(context.Background(), tc.args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want an error naming %s", tc.args, err, tc.want)
		}
	}
}
