package cli

import (
	"bytes"
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
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
