package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loadshed/loadshed/internal/cli"
)

func TestRunCommandLine(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		code int
		want string // in stdout+stderr
	}{
		{"version", []string{"--version"}, 0, "soak"},
		{"help", []string{"--help"}, 0, "-duration"},
		{"unknown flag", []string{"--nope"}, 2, "flag provided but not defined"},
		{"extra argument", []string{"now"}, 2, "unexpected arguments"},
		{"too short", []string{"--duration", "1s", "--out", t.TempDir()}, 2, "Duration:"},
		{"bad load", []string{"--load", "0", "--out", t.TempDir()}, 2, "Load:"},
		{"bad ceiling", []string{"--max-fds", "0", "--out", t.TempDir()}, 2, "Ceilings:"},
		{"missing admission file", []string{"--admission-file", filepath.Join(t.TempDir(), "none.yaml")}, 2, "--admission-file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(context.Background(), c.args, &stdout, &stderr)
			if code := cli.ExitCode("soak", err, &stderr); code != c.code {
				t.Fatalf("exit %d (%v), want %d; stderr %s", code, err, c.code, stderr.String())
			}
			if out := stdout.String() + stderr.String(); !strings.Contains(out, c.want) {
				t.Fatalf("output %q does not mention %q", out, c.want)
			}
		})
	}
	if cli.ExitCode("soak", errFailed, &bytes.Buffer{}) != 1 {
		t.Fatal("a failed soak must exit 1")
	}
}
