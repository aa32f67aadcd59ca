package harness

import (
	"bufio"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// usage is a process tree's resource use at one moment.
type usage struct {
	// CPUNanos is the CPU time used so far by every thread of every process in the tree,
	// summed from /proc/<pid>/task/<tid>/schedstat (nanoseconds); when schedstat is missing, from
	// utime+stime in /proc/<pid>/stat (clock ticks, 10 ms).
	CPUNanos int64
	// PeakRSS is the sum of VmHWM over the tree's processes, in bytes.
	PeakRSS int64
	Procs   int
}

// clockTicks is USER_HZ, which Linux fixes at 100 for /proc.
const clockTicks = 100

// treeUsage measures pid and all its descendants.
func treeUsage(pid int) usage {
	var u usage
	for _, p := range descendants(pid) {
		u.Procs++
		u.CPUNanos += procCPU(p)
		u.PeakRSS += procHWM(p)
	}
	return u
}

// descendants returns pid and every process below it, by scanning /proc for parent links.
func descendants(pid int) []int {
	parent := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		id, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pp, ok := ppid(id); ok {
			parent[pp] = append(parent[pp], id)
		}
	}
	out := []int{pid}
	for i := 0; i < len(out) && i < 10000; i++ {
		out = append(out, parent[out[i]]...)
	}
	return out
}

// statFields returns the fields of /proc/<pid>/stat after the command name.
func statFields(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return nil
	}
	return strings.Fields(string(b[i+1:]))
}

func ppid(pid int) (int, bool) {
	f := statFields(pid)
	if len(f) < 2 {
		return 0, false
	}
	n, err := strconv.Atoi(f[1])
	return n, err == nil
}

func procCPU(pid int) int64 {
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/schedstat")
	var sum int64
	ok := false
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			continue
		}
		if n, err := strconv.ParseInt(f[0], 10, 64); err == nil {
			sum += n
			ok = true
		}
	}
	if ok {
		return sum
	}
	f := statFields(pid)
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64) // field 14 of stat
	st, _ := strconv.ParseInt(f[12], 10, 64) // field 15
	return (ut + st) * (1e9 / clockTicks)
}

func procHWM(pid int) int64 {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := s.Text()
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			fs := strings.Fields(rest)
			if len(fs) >= 1 {
				kb, _ := strconv.ParseInt(fs[0], 10, 64)
				return kb * 1024
			}
		}
	}
	return 0
}
