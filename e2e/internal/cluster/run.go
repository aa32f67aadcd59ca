// Package cluster drives the pieces of the end-to-end test that live outside the Go process:
// the Docker engine, the pinned tools (kind, Helm, k6), the container images, a kind cluster
// and the Kubernetes API of that cluster.
//
// Every step waits on a condition with a deadline taken from its context; nothing sleeps a
// fixed time hoping that something is ready.
package cluster

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"
)

// Logf is where progress goes (the test's t.Logf).
type Logf func(format string, args ...any)

// Runner runs external commands. Their combined output is appended to LogFile (when set), so
// a failing step can be read in full in the artifacts; errors carry the output's tail.
type Runner struct {
	// Dir is the working directory of the commands (the repository root).
	Dir string
	// Env is added to the process environment of every command.
	Env []string
	// LogFile receives every command line and its output; empty discards them.
	LogFile string
	// Log reports progress; nil is silent.
	Log Logf
}

// Output runs name with args and returns its standard output. Standard error goes to the log
// file; on failure the error holds the tail of both.
func (r *Runner) Output(ctx context.Context, env []string, name string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	err := r.run(ctx, env, nil, &stdout, &stderr, name, args...)
	return stdout.String(), err
}

// Run runs name with args, sending standard output and error to the log file.
func (r *Runner) Run(ctx context.Context, env []string, name string, args ...string) error {
	var out bytes.Buffer
	return r.run(ctx, env, nil, &out, &out, name, args...)
}

// Pipe runs name with args, stdin as its standard input, and returns its standard output and
// error (`inject ... | kubectl apply -f -` is two Pipe calls).
func (r *Runner) Pipe(ctx context.Context, stdin []byte, name string, args ...string) (string, string, error) {
	var stdout, stderr bytes.Buffer
	err := r.run(ctx, nil, bytes.NewReader(stdin), &stdout, &stderr, name, args...)
	return stdout.String(), stderr.String(), err
}

func (r *Runner) run(ctx context.Context, env []string, stdin io.Reader, stdout, stderr *bytes.Buffer, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = r.Dir
	cmd.Env = append(append(os.Environ(), r.Env...), env...)
	cmd.Stdin = stdin
	cmd.Stdout = stdout
	cmd.Stderr = stderr
	// A cancelled context sends SIGTERM first, so kind and helm can clean up after themselves.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = 30 * time.Second
	start := time.Now()
	err := cmd.Run()
	line := name + " " + strings.Join(args, " ")
	r.record(line, start, err, stdout, stderr)
	if err != nil {
		tail := lastLines(stderr.String(), 20)
		if stdout != stderr {
			if t := lastLines(stdout.String(), 10); t != "" {
				tail = t + "\n" + tail
			}
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w (%v)\n%s", short(line), ctx.Err(), err, tail)
		}
		return fmt.Errorf("%s: %w\n%s", short(line), err, tail)
	}
	return nil
}

func (r *Runner) record(line string, start time.Time, err error, stdout, stderr *bytes.Buffer) {
	if r.LogFile == "" {
		return
	}
	f, ferr := os.OpenFile(r.LogFile, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if ferr != nil {
		return
	}
	defer f.Close()
	status := "ok"
	if err != nil {
		status = err.Error()
	}
	fmt.Fprintf(f, "\n$ %s\n# %s, %.1f s, %s\n", line, start.UTC().Format(time.RFC3339), time.Since(start).Seconds(), status)
	f.Write(stdout.Bytes())
	if stderr != stdout {
		f.Write(stderr.Bytes())
	}
}

func short(line string) string {
	if len(line) > 200 {
		return line[:200] + "..."
	}
	return line
}

// lastLines returns at most n trailing lines of s.
func lastLines(s string, n int) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return ""
	}
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Poll calls cond every interval until it reports done, returns an error, or ctx ends. The
// error on a deadline names what was awaited and the last reason cond gave.
func Poll(ctx context.Context, interval time.Duration, what string, cond func(context.Context) (done bool, reason string, err error)) error {
	last := ""
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		done, reason, err := cond(ctx)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		if done {
			return nil
		}
		if ctx.Err() == nil {
			last = reason
		}
		select {
		case <-ctx.Done():
			if last == "" {
				return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
			}
			return fmt.Errorf("waiting for %s: %w (last: %s)", what, ctx.Err(), last)
		case <-t.C:
		}
	}
}
