package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// unprivileged is the uid/gid servers run as when the harness runs as root.
const unprivileged = 65534

// proc is a server process the harness started.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

// startProc starts path with args, its output in logPath, pinned to cpu (-1: not pinned) via
// taskset when taskset is non-empty, as the unprivileged user when asUser is set.
func startProc(name, path string, args, env []string, logPath, taskset string, cpu int, asUser bool) (*proc, error) {
	argv := append([]string{path}, args...)
	if taskset != "" && cpu >= 0 {
		// taskset execs the program, so the pid stays the server's.
		argv = append([]string{taskset, "-c", fmt.Sprint(cpu)}, argv...)
	}
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if asUser {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: unprivileged, Gid: unprivileged, NoSetGroups: true}
	}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// exited returns a non-nil error when the process has already ended.
func (p *proc) exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("%s exited early (%v); log %s:\n%s", p.name, p.err, p.log, tail(p.log, 20))
	default:
		return nil
	}
}

// stop ends the process group: SIGTERM, then SIGKILL after grace (at once when grace is 0).
func (p *proc) stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	if grace <= 0 {
		_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
		<-p.done
		return
	}
	_ = syscall.Kill(-p.pid(), syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
		<-p.done
	}
}

// tail returns the last n lines of a file, for error messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitHTTP polls url until it answers 200 or the deadline passes; it fails at once when one of
// the watched processes exits.
func waitHTTP(ctx context.Context, url string, timeout time.Duration, watch ...*proc) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{Timeout: time.Second}
	var last error
	for {
		for _, p := range watch {
			if err := p.exited(); err != nil {
				return err
			}
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := client.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			last = fmt.Errorf("status %d", resp.StatusCode)
		} else {
			last = err
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("%s did not answer 200 within %s: %v", url, timeout, last)
			}
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// freePorts returns n distinct free loopback ports, as 127.0.0.1:port addresses.
func freePorts(n int) ([]string, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var out []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		out = append(out, l.Addr().String())
	}
	return out, nil
}

// makeWritable hands dir to the unprivileged user, so servers can write logs and temp files.
func makeWritable(dir string) error {
	return filepath.WalkDir(dir, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, unprivileged, unprivileged)
	})
}
