package cli

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestExitCodes(t *testing.T) {
	for _, c := range []struct {
		err  error
		code int
		out  string
	}{
		{nil, 0, ""},
		{flag.ErrHelp, 0, ""},
		{Usagef("--rate: must be positive"), 2, "tool: --rate: must be positive\nRun 'tool --help' for usage.\n"},
		{errors.New("upstream unreachable"), 1, "tool: upstream unreachable\n"},
	} {
		var stderr bytes.Buffer
		if code := ExitCode("tool", c.err, &stderr); code != c.code || stderr.String() != c.out {
			t.Errorf("%v: exit %d %q, want %d %q", c.err, code, stderr.String(), c.code, c.out)
		}
	}
}

func TestParse(t *testing.T) {
	newFS := func() *flag.FlagSet {
		fs := flag.NewFlagSet("tool", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		fs.Int("n", 1, "a number")
		return fs
	}
	if err := Parse(newFS(), []string{"-n", "2"}); err != nil {
		t.Fatalf("good flags: %v", err)
	}
	for _, args := range [][]string{{"-x"}, {"-n", "two"}, {"extra"}} {
		err := Parse(newFS(), args)
		if !errors.As(err, new(UsageError)) {
			t.Errorf("%q: %v, want a UsageError", args, err)
		}
		if strings.Contains(strings.Join(args, " "), "extra") && !strings.Contains(err.Error(), "unexpected arguments") {
			t.Errorf("%q: %v", args, err)
		}
	}
	if err := Parse(newFS(), []string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v, want flag.ErrHelp", err)
	}
}

func TestHelpAndVersion(t *testing.T) {
	h := Help{Name: "tool", Synopsis: "does a thing", Usage: []string{"[flags]"}, Examples: []string{"tool -n 2"}}
	var out bytes.Buffer
	fs := NewFlagSet(h, &out)
	fs.Int("n", 1, "a `count` of things")
	if err := Parse(fs, []string{"--help"}); !errors.Is(err, flag.ErrHelp) || !Done(err) {
		t.Fatalf("--help: %v", err)
	}
	want := "tool - does a thing\n\nUsage:\n  tool [flags]\n\nExample:\n  tool -n 2\n\nFlags:\n  -n count\n        a count of things (default 1)\n  --version\n        print the version and exit\n"
	if out.String() != want {
		t.Errorf("help:\n%s\nwant:\n%s", out.String(), want)
	}
	out.Reset()
	if err := Parse(fs, []string{"--version"}); !errors.Is(err, ErrDone) || !strings.HasPrefix(out.String(), "tool dev ") {
		t.Errorf("--version: %v, %q", err, out.String())
	}
	out.Reset()
	fs = NewFlagSet(h, &out)
	if err := Parse(fs, []string{"--bogus"}); !errors.As(err, new(UsageError)) || out.Len() != 0 {
		t.Errorf("--bogus: %v, printed %q; want a UsageError and nothing printed", err, out.String())
	}
	if code := ExitCode("tool", ErrDone, io.Discard); code != 0 {
		t.Errorf("ErrDone: exit %d", code)
	}
}

func TestDurationsAreLoggedAsDurations(t *testing.T) {
	type wrapped int64 // like config.Duration: a duration with a D method
	var out bytes.Buffer
	NewLogger(&out, slog.LevelInfo).Info("draining", "drainDelay", 5*time.Second, "grace", durationOf(250*time.Millisecond), "count", 3, "n", wrapped(7))
	for _, want := range []string{`"drainDelay":"5s"`, `"grace":"250ms"`, `"count":3`, `"n":7`} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("log line %s lacks %s", out.String(), want)
		}
	}
}

type durationOf time.Duration

func (d durationOf) D() time.Duration { return time.Duration(d) }
