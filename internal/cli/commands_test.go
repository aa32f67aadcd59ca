package cli_test

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// commands are every command under cmd/, with the module each is built in (inject and injector
// are modules of their own) and, where one is cheap, a command line that fails at run time.
var commands = []struct {
	name, module string
	fail         []string
}{
	{"backend", ".", []string{"--get", "http://127.0.0.1:1/"}},
	{"demo", ".", nil},
	{"inject", "cmd/inject", []string{"-f", "no-such-file.yaml"}},
	{"injector", "cmd/injector", []string{"--tls-cert-file", "no-such.crt", "--tls-key-file", "no-such.key", "--kube-version", "1.33", "--metrics-listen", ""}},
	{"lab", ".", []string{"trace", "--duration", "10ms", "--out", "no-such-dir/arrivals.trace"}},
	{"loadgen", ".", nil},
	{"plainproxy", ".", []string{"--listen", "127.0.0.1:-1"}},
	{"proxy", ".", []string{"--check-config", "no-such-file.yaml"}},
	{"soak", ".", nil},
}

// TestEveryCommandFollowsTheConvention builds every command and checks the convention of package
// cli: --help exits 0 with "NAME - synopsis" on its first line and an example, --version exits
// 0, an unknown flag exits 2 naming it, and a failure at run time exits 1.
func TestEveryCommandFollowsTheConvention(t *testing.T) {
	if testing.Short() {
		t.Skip("builds every command")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(filepath.Join(root, "cmd"))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string]bool{}
	for _, c := range commands {
		listed[c.name] = true
	}
	for _, e := range entries {
		if e.IsDir() && !listed[e.Name()] {
			t.Errorf("cmd/%s is not in this test's list of commands", e.Name())
		}
	}
	bin := t.TempDir()
	for _, c := range commands {
		build := exec.Command("go", "build", "-o", filepath.Join(bin, c.name), ".")
		build.Dir = filepath.Join(root, "cmd", c.name)
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("building %s: %v\n%s", c.name, err, out)
		}
	}
	work := t.TempDir() // where the failing command lines look for their missing files
	runCmd := func(name string, args ...string) (stdout, stderr string, code int) {
		t.Helper()
		cmd := exec.Command(filepath.Join(bin, name), args...)
		cmd.Dir = work
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		var exit *exec.ExitError
		switch {
		case err == nil:
		case errors.As(err, &exit):
			code = exit.ExitCode()
		default:
			t.Fatalf("%s %q: %v", name, args, err)
		}
		return out.String(), errb.String(), code
	}
	for _, c := range commands {
		t.Run(c.name, func(t *testing.T) {
			for _, h := range []string{"--help", "-h"} {
				out, errOut, code := runCmd(c.name, h)
				first, _, _ := strings.Cut(out, "\n")
				if code != 0 || !strings.HasPrefix(first, c.name+" - ") || len(first) < len(c.name)+15 || errOut != "" {
					t.Errorf("%s: exit %d, first line %q, stderr %q; want exit 0, %q and a synopsis, no stderr", h, code, first, errOut, c.name+" - ")
				}
				if !strings.Contains(out, "\nUsage:\n  "+c.name+" ") || !strings.Contains(out, "\nExample:\n  ") {
					t.Errorf("%s: no usage or example:\n%s", h, out)
				}
			}
			if out, _, code := runCmd(c.name, "--version"); code != 0 || !strings.HasPrefix(out, c.name+" ") {
				t.Errorf("--version: exit %d, %q; want exit 0 and %q", code, out, c.name+" ...")
			}
			out, errOut, code := runCmd(c.name, "--no-such-flag")
			if code != 2 || out != "" || !strings.Contains(errOut, "no-such-flag") || !strings.Contains(errOut, "Run '"+c.name+" --help' for usage.") {
				t.Errorf("--no-such-flag: exit %d, stdout %q, stderr %q; want exit 2 and a line naming the flag", code, out, errOut)
			}
			if c.fail != nil {
				if _, errOut, code := runCmd(c.name, c.fail...); code != 1 || !strings.HasPrefix(errOut, c.name+": ") && !strings.Contains(errOut, "\n"+c.name+": ") {
					t.Errorf("%q: exit %d, stderr %q; want exit 1 and the error after %q", c.fail, code, errOut, c.name+": ")
				}
			}
		})
	}
}
