//go:build !nolive

package main

import (
	"errors"
	"testing"
)

// Until the backend's frontend mode and the cohorts configuration are in, the live call graph
// says what it needs instead of running half a graph.
func TestLiveCallGraphSaysWhatItNeeds(t *testing.T) {
	_, _, err := runLab(t, "compare", "--fanout", "--hop", "none", "--duration", "1s", "--loads", "2")
	if !errors.Is(err, errNoCallGraph) {
		t.Errorf("error %v, want %v", err, errNoCallGraph)
	}
}
