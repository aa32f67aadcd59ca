// Package scripts holds tests of the project's shell scripts.
package scripts

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// fakeKind is a kind binary that lists the clusters named in $dir/clusters and appends each
// deleted name to $dir/deleted; it refuses to delete the cluster called loadshed-e2e-stuck.
const fakeKind = `#!/usr/bin/env bash
dir=$(dirname "$0")
case "$1 $2" in
"get clusters") cat "$dir/clusters" ;;
"delete cluster")
	[[ $4 == loadshed-e2e-stuck ]] && exit 1
	echo "$4" >>"$dir/deleted" ;;
*) exit 2 ;;
esac
`

// bash runs script with scripts/e2e-owners.sh sourced and LOADSHED_CACHE set to cache.
func bash(t *testing.T, cache, script string) (stdout, stderr string) {
	t.Helper()
	cmd := exec.Command("bash", "-c", "set -euo pipefail; source ./e2e-owners.sh; "+script)
	cmd.Env = append(os.Environ(), "LOADSHED_CACHE="+cache)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("bash %q: %v\n%s", script, err, errb.String())
	}
	return out.String(), errb.String()
}

// procStart is field 22 of /proc/PID/stat, read here independently of the script.
func procStart(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndex(s, ")")+1:])
	return f[19]
}

// A later run deletes exactly the clusters whose recorded owner no longer runs (exited, or its
// PID now another process's), keeps the ones a running process owns, only reports the ones
// nobody owns, and leaves its own and other names alone.
func TestReapStaleClusters(t *testing.T) {
	cache := t.TempDir()
	bin := filepath.Join(cache, "bin")
	owners := filepath.Join(cache, "e2e-clusters")
	for _, d := range []string{bin, owners} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	kind := filepath.Join(bin, "kind")
	if err := os.WriteFile(kind, []byte(fakeKind), 0o755); err != nil {
		t.Fatal(err)
	}
	// The cluster whose delete fails comes last: the caller (set -e) must not stop on it.
	clusters := []string{"loadshed-e2e-1", "loadshed-e2e-2", "loadshed-e2e-3", "loadshed-e2e-4", "loadshed-e2e-5", "other", "loadshed-e2e-mine", "loadshed-e2e-stuck"}
	if err := os.WriteFile(filepath.Join(bin, "clusters"), []byte(strings.Join(clusters, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	// A process that has exited.
	done := exec.Command("true")
	if err := done.Run(); err != nil {
		t.Fatal(err)
	}
	// A process that runs for the whole test.
	live := exec.Command("sleep", "300")
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = live.Process.Kill(); _ = live.Wait() }()
	liveStart := procStart(t, live.Process.Pid)

	record := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(owners, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	record("loadshed-e2e-1", strconv.Itoa(done.Process.Pid)+" 12345\n")          // owner exited
	record("loadshed-e2e-2", strconv.Itoa(live.Process.Pid)+" "+liveStart+"\n")  // owner runs
	record("loadshed-e2e-3", strconv.Itoa(live.Process.Pid)+" 1"+liveStart+"\n") // its PID reused since
	record("loadshed-e2e-4", "garbage\n")                                        // unreadable record
	record("loadshed-e2e-stuck", strconv.Itoa(done.Process.Pid)+" 12345\n")      // delete fails
	record("loadshed-e2e-mine", strconv.Itoa(done.Process.Pid)+" 12345\n")       // the caller's own
	// loadshed-e2e-5 has no record.

	out, stderr := bash(t, cache, `e2e_reap_stale "$LOADSHED_CACHE/bin/kind" loadshed-e2e-mine; echo went on`)
	if strings.TrimSpace(out) != "went on" {
		t.Fatalf("the caller stopped after the reap: stdout %q\n%s", out, stderr)
	}

	b, _ := os.ReadFile(filepath.Join(bin, "deleted"))
	deleted := strings.Fields(string(b))
	slices.Sort(deleted)
	if want := []string{"loadshed-e2e-1", "loadshed-e2e-3", "loadshed-e2e-4"}; !slices.Equal(deleted, want) {
		t.Fatalf("deleted %v, want %v\n%s", deleted, want, stderr)
	}
	for name, kept := range map[string]bool{"loadshed-e2e-1": false, "loadshed-e2e-2": true, "loadshed-e2e-3": false,
		"loadshed-e2e-4": false, "loadshed-e2e-stuck": true, "loadshed-e2e-mine": true} {
		_, err := os.Stat(filepath.Join(owners, name))
		if (err == nil) != kept {
			t.Errorf("record of %s kept: %v, want %v", name, err == nil, kept)
		}
	}
	for _, want := range []string{"loadshed-e2e-5 is running and no e2e run owns it", "loadshed-e2e-2 belongs to a running e2e"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(stderr, "other") || strings.Contains(stderr, "loadshed-e2e-mine") {
		t.Errorf("reported a cluster it must leave alone:\n%s", stderr)
	}
}

// A claim records the claiming shell and its start time; a release removes the record.
func TestClaimAndRelease(t *testing.T) {
	cache := t.TempDir()
	out, _ := bash(t, cache, `e2e_owner_claim loadshed-e2e-9; echo "$$ $(cat "$(e2e_owners_dir)/loadshed-e2e-9")"; e2e_proc_start $$`)
	f := strings.Fields(out)
	if len(f) != 4 || f[0] != f[1] || f[2] != f[3] {
		t.Fatalf("claim recorded %q, want the shell's PID and its start time", out)
	}
	bash(t, cache, `e2e_owner_release loadshed-e2e-9`)
	if _, err := os.Stat(filepath.Join(cache, "e2e-clusters", "loadshed-e2e-9")); !os.IsNotExist(err) {
		t.Fatalf("record still there after release: %v", err)
	}
}
