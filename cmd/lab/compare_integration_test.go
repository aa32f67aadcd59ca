//go:build integration

package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestCompareLabWithLive runs the lab and the live system (backend + proxy on loopback, the
// built-in load generator) on the same schedule at 2x for in-flight, token bucket and bounded
// queue: the lab's acceptance must be within 5 points of live and its admitted p99 within 25%.
func TestCompareLabWithLive(t *testing.T) {
	var out, errw bytes.Buffer
	if err := run(context.Background(), []string{"compare", "--duration", "6s"}, &out, &errw); err != nil {
		t.Fatalf("%v\n%s", err, errw.String())
	}
	t.Logf("\n%s", out.String())
	rows := 0
	for _, line := range strings.Split(out.String(), "\n") {
		if !strings.HasPrefix(line, "| ") || strings.HasPrefix(line, "| strategy") {
			continue
		}
		rows++
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if cells[len(cells)-1] != "yes" {
			t.Errorf("%s: the lab's prediction is outside the bounds: %s", cells[0], line)
		}
	}
	if rows != 3 {
		t.Fatalf("%d strategies compared, want 3", rows)
	}
}
