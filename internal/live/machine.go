package live

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// CPUMeter measures how much of the machine's CPU other processes used while a measurement ran,
// so a figure taken on a shared machine says so. It reads /proc/stat (Linux); elsewhere it
// reports nothing.
type CPUMeter struct {
	ok         bool
	start      time.Time
	busy       float64 // machine-wide busy CPU seconds at start
	own        float64 // this process's CPU seconds at start
	cpus       int
	errMessage string
}

// userHZ is the unit of /proc/stat (USER_HZ, 100 on every Linux architecture Go supports).
const userHZ = 100

// StartCPUMeter takes the first reading.
func StartCPUMeter() *CPUMeter {
	m := &CPUMeter{start: time.Now(), cpus: runtime.NumCPU()}
	busy, err := machineBusy()
	if err != nil {
		m.errMessage = err.Error()
		return m
	}
	own, err := ownCPU()
	if err != nil {
		m.errMessage = err.Error()
		return m
	}
	m.ok, m.busy, m.own = true, busy, own
	return m
}

// Others returns the share of the machine's CPU (0 = idle, 1 = every core busy) that other
// processes used since StartCPUMeter, and false when it cannot tell.
func (m *CPUMeter) Others() (float64, bool) {
	if !m.ok {
		return 0, false
	}
	busy, err := machineBusy()
	if err != nil {
		return 0, false
	}
	own, err := ownCPU()
	if err != nil {
		return 0, false
	}
	elapsed := time.Since(m.start).Seconds()
	if elapsed <= 0 || m.cpus <= 0 {
		return 0, false
	}
	others := (busy - m.busy) - (own - m.own)
	share := others / (elapsed * float64(m.cpus))
	return min(max(share, 0), 1), true
}

// CPUs is the number of cores the share is of.
func (m *CPUMeter) CPUs() int { return m.cpus }

// machineBusy returns the CPU seconds all cores spent not idle, from /proc/stat's cpu line.
func machineBusy() (float64, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 || f[0] != "cpu" {
			continue
		}
		var total, idle float64
		for i, v := range f[1:] {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, err
			}
			if i >= 8 { // guest time is already counted in user and nice
				break
			}
			total += n
			if i == 3 || i == 4 { // idle, iowait
				idle += n
			}
		}
		return (total - idle) / userHZ, nil
	}
	return 0, errors.New("/proc/stat: no cpu line")
}

// ownCPU returns this process's user and system CPU seconds.
func ownCPU() (float64, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, err
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime), nil
}
