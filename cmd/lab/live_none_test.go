//go:build nolive

package main

import (
	"errors"
	"testing"
)

// The image's lab (-tags nolive) predicts but refuses the live half with errNoLive, in both
// commands that start it.
func TestNoLiveBuildRefusesTheLiveHalf(t *testing.T) {
	for _, args := range [][]string{
		{"compare", "--duration", "2s"},
		{"calibrate"},
		{"compare", "--fanout", "--hop", "none", "--duration", "1s"},
	} {
		_, _, err := runLab(t, args...)
		if !errors.Is(err, errNoLive) {
			t.Errorf("lab %v: error %v, want %v", args, err, errNoLive)
		}
	}
}
