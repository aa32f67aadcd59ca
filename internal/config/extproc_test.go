package config

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestHoldFor: the timeout HoldFor names leaves exactly AnswerMargin after the wait, and no
// shorter one does.
func TestHoldFor(t *testing.T) {
	for _, wait := range []time.Duration{0, time.Millisecond, 20 * time.Millisecond, 21 * time.Millisecond, 160 * time.Millisecond,
		200 * time.Millisecond, 201 * time.Millisecond, time.Second, time.Minute} {
		l := HoldFor(wait)
		if wait+AnswerMargin(l) > l {
			t.Errorf("wait %v: HoldFor %v leaves less than its margin %v", wait, l, AnswerMargin(l))
		}
		if shorter := l - time.Millisecond; wait+AnswerMargin(shorter) <= shorter {
			t.Errorf("wait %v: %v would do, HoldFor says %v", wait, shorter, l)
		}
	}
}

// TestExtProcHolds: a queue must fit the time Envoy waits: the message timeout, or the longest
// extension when Envoy allows one; the problem names the Envoy setting to raise and by how much.
func TestExtProcHolds(t *testing.T) {
	base := "listen: \"\"\nadmission: {strategy: bounded-queue, boundedQueue: {concurrency: 4, depth: 8, maxWait: 500ms}}\n"
	for _, c := range []struct {
		extProc string
		problem string // "" for valid
	}{
		{"{listen: 127.0.0.1:9002}", "raise max_message_timeout in Envoy's ext_proc filter to at least 550ms"},
		{"{listen: 127.0.0.1:9002, messageTimeout: 600ms}", ""},
		{"{listen: 127.0.0.1:9002, maxMessageTimeout: 300ms}", "longer than Envoy lets loadshed extend a wait (extProc.maxMessageTimeout 300ms"},
		{"{listen: 127.0.0.1:9002, maxMessageTimeout: 550ms}", ""},
		{"{listen: 127.0.0.1:9002, maxMessageTimeout: 0.5ms}", "extProc.messageTimeout 200ms"}, // under 1 ms Envoy allows none
	} {
		_, err := Parse([]byte(base + "extProc: " + c.extProc + "\n"))
		switch {
		case c.problem == "" && err != nil:
			t.Errorf("%s: %v", c.extProc, err)
		case c.problem != "":
			var p *Problems
			if !errors.As(err, &p) || !strings.Contains(err.Error(), c.problem) || p.Fields()[0] != "admission" {
				t.Errorf("%s: got %v, want a problem of admission saying %q", c.extProc, err, c.problem)
			}
		}
	}
	// A dry run never holds a request.
	dry := "listen: \"\"\nextProc: {listen: 127.0.0.1:9002}\nadmission: {strategy: bounded-queue, dryRun: true, boundedQueue: {concurrency: 4, depth: 8, maxWait: 5s}}\n"
	if _, err := Parse([]byte(dry)); err != nil {
		t.Errorf("dry run: %v", err)
	}
}
