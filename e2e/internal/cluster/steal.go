package cluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// Steal stalls a kind node the way a busy hypervisor's steal time stalls a virtual machine:
// every process of the node (the cluster's control plane, the pods, k6) is frozen for short
// random spells through the container's cgroup freezer. Spells last Frozen on average
// (exponentially distributed), the node runs Thawed on average between them, and about every
// Every one spell lasts Long. It is how the e2e reproduces, on a quiet machine, a slow day of
// the project's two-core CI machine, where the adaptive rows once fell to a third of capacity.
type Steal struct {
	Frozen, Thawed, Long, Every time.Duration
}

// DefaultSteal is what E2E_STEAL=1 means: frozen about a tenth of the time in spells of 3 ms,
// and 40 ms once every three seconds or so (about what the project's CI machine did to the
// unloaded rows on its slow day of 2026-11-29: their p99 a fifth to a half over a quiet run's).
func DefaultSteal() Steal {
	return Steal{Frozen: 3 * time.Millisecond, Thawed: 30 * time.Millisecond, Long: 40 * time.Millisecond, Every: 3 * time.Second}
}

// IsZero reports no stalling.
func (s Steal) IsZero() bool { return s == Steal{} }

// String is the setting in ParseSteal's syntax.
func (s Steal) String() string {
	return fmt.Sprintf("frozen=%s,thawed=%s,long=%s,every=%s", s.Frozen, s.Thawed, s.Long, s.Every)
}

// ParseSteal reads E2E_STEAL: empty or 0 (none), 1 (DefaultSteal), or
// frozen=3ms,thawed=30ms,long=40ms,every=3s (keys left out keep DefaultSteal's values).
func ParseSteal(v string) (Steal, error) {
	switch strings.TrimSpace(v) {
	case "", "0":
		return Steal{}, nil
	case "1":
		return DefaultSteal(), nil
	}
	s := DefaultSteal()
	for _, kv := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return Steal{}, fmt.Errorf("E2E_STEAL: %q: want key=duration", kv)
		}
		d, err := time.ParseDuration(val)
		if err != nil || d < 0 || d > time.Minute {
			return Steal{}, fmt.Errorf("E2E_STEAL: %s: want a duration between 0 and 1m, got %q", k, val)
		}
		switch k {
		case "frozen":
			s.Frozen = d
		case "thawed":
			s.Thawed = d
		case "long":
			s.Long = d
		case "every":
			s.Every = d
		default:
			return Steal{}, fmt.Errorf("E2E_STEAL: %s: unknown key (want frozen, thawed, long, every)", k)
		}
	}
	if s.Thawed <= 0 {
		return Steal{}, errors.New("E2E_STEAL: thawed must be positive: the node must run between spells")
	}
	return s, nil
}

// freezer is a container's cgroup freezer: the file to write and what freezes and thaws it.
type freezer struct {
	path           string
	frozen, thawed string
}

// containerFreezer finds the cgroup freezer of a Docker container: cgroup v1's freezer.state
// or cgroup v2's cgroup.freeze, under Docker's cgroupfs or systemd layout.
func containerFreezer(ctx context.Context, docker, name string) (freezer, error) {
	out, err := exec.CommandContext(ctx, docker, "inspect", "--format", "{{.Id}}", name).Output()
	if err != nil {
		return freezer{}, fmt.Errorf("docker inspect %s: %w", name, err)
	}
	id := strings.TrimSpace(string(out))
	for _, f := range []freezer{
		{"/sys/fs/cgroup/freezer/docker/" + id + "/freezer.state", "FROZEN", "THAWED"},
		{"/sys/fs/cgroup/freezer/system.slice/docker-" + id + ".scope/freezer.state", "FROZEN", "THAWED"},
		{"/sys/fs/cgroup/system.slice/docker-" + id + ".scope/cgroup.freeze", "1", "0"},
		{"/sys/fs/cgroup/docker/" + id + "/cgroup.freeze", "1", "0"},
	} {
		if _, err := os.Stat(f.path); err == nil {
			return f, nil
		}
	}
	return freezer{}, fmt.Errorf("no cgroup freezer found for container %s (%s): E2E_STEAL needs cgroup v1's freezer or cgroup v2", name, id)
}

// Start stalls the container until the returned stop is called (or ctx ends); stop waits until
// the container runs again and reports the share of the time it was frozen.
func (s Steal) Start(ctx context.Context, docker, container string, seed uint64) (stop func() (float64, error), err error) {
	f, err := containerFreezer(ctx, docker, container)
	if err != nil {
		return nil, err
	}
	write := func(v string) error { return os.WriteFile(f.path, []byte(v), 0) }
	ctx, cancel := context.WithCancel(ctx)
	var (
		wg          sync.WaitGroup
		frozen, all time.Duration
		werr        error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(seed, 0x57ea1))
		start, nextLong := time.Now(), time.Now().Add(s.Every)
		defer func() {
			if err := write(f.thawed); err != nil && werr == nil {
				werr = err
			}
			all = time.Since(start)
		}()
		for ctx.Err() == nil {
			spell := time.Duration(rng.ExpFloat64() * float64(s.Frozen))
			if s.Every > 0 && time.Now().After(nextLong) {
				spell = s.Long
				nextLong = time.Now().Add(time.Duration(rng.Float64() * 2 * float64(s.Every)))
			}
			if spell > 0 {
				if err := write(f.frozen); err != nil {
					werr = err
					return
				}
				t0 := time.Now()
				sleepCtx(ctx, spell)
				if err := write(f.thawed); err != nil {
					werr = err
					return
				}
				frozen += time.Since(t0)
			}
			sleepCtx(ctx, time.Duration(rng.ExpFloat64()*float64(s.Thawed)))
		}
	}()
	return func() (float64, error) {
		cancel()
		wg.Wait()
		if all <= 0 {
			return 0, werr
		}
		return frozen.Seconds() / all.Seconds(), werr
	}, nil
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
