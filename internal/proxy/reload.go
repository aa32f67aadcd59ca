package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/loadshed/loadshed/internal/config"
)

// errNoConfigFile: the server was built from a configuration that did not come from a file.
var errNoConfigFile = errors.New("no configuration file to reload")

// Reload reads the configuration file again (on SIGHUP, or when the watcher sees it change). A
// valid configuration takes effect at once, for new requests, without failing any request in
// flight or queued: policies whose route and
// admission configuration are unchanged keep their state; replaced policies finish serving
// what they hold. An invalid configuration is rejected, logged with every field that is wrong
// and counted in loadshed_config_reloads_total{result="failure"}; the running one stays.
// Addresses (extProc.listen too) and upstreamTimeout are fixed at start; a change to them is
// reported and ignored. The other doors read the configuration from the gate, so a reload reaches
// them too (extProc's timeouts included).
func (s *Server) Reload() error {
	if s.configPath == "" {
		return errNoConfigFile
	}
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	data, err := config.ReadFile(s.configPath, s.maxConfigBytes)
	if err == nil {
		// One reload per content change: a SIGHUP and the watcher seeing the same file, or a
		// second SIGHUP, change nothing and count nothing; the verdict on that content stands.
		switch {
		case bytes.Equal(data, s.lastConfig):
			return nil
		case s.lastRejected != nil && bytes.Equal(data, s.lastRejected):
			return s.lastRejectedErr
		}
	}
	if err == nil {
		err = s.apply(data)
	}
	if err != nil {
		s.gate.Metrics().Reloads.WithLabelValues("failure").Inc()
		s.gate.Metrics().ReloadOK.Set(0)
		s.log.Error("configuration reload rejected; the running configuration stays", "file", s.configPath, "err", err)
		s.lastRejected, s.lastRejectedErr = data, err
		return err
	}
	s.lastConfig = data
	s.gate.Metrics().Reloads.WithLabelValues("success").Inc()
	s.gate.Metrics().ReloadOK.Set(1)
	return nil
}

func (s *Server) apply(data []byte) error {
	old := s.gate.Config()
	extProcMoved := false
	cfg, err := config.ParseWith(data, func(c *config.Config) {
		if s.overrides != nil {
			s.overrides(c)
		}
		// The ext_proc server keeps its address; the rest of the file is validated against it
		// (whether its queues fit Envoy's timeouts).
		if c.ExtProc.Listen != old.ExtProc.Listen {
			extProcMoved = true
			c.ExtProc.Listen = old.ExtProc.Listen
		}
	})
	if err != nil {
		return err
	}
	for _, w := range cfg.Warnings() {
		s.log.Warn(w)
	}
	if extProcMoved {
		s.log.Warn("extProc.listen applies at the next restart; keeping the running value")
	}
	if cfg.Listen != old.Listen || cfg.AdminListen != old.AdminListen || cfg.UpstreamTimeout != old.UpstreamTimeout || cfg.Server != old.Server {
		s.log.Warn("listen, adminListen, upstreamTimeout and server settings apply at the next restart; keeping the running values")
		cfg.Listen, cfg.AdminListen, cfg.UpstreamTimeout, cfg.Server = old.Listen, old.AdminListen, old.UpstreamTimeout, old.Server
	}
	if _, err := url.Parse(cfg.Upstream); err != nil {
		return fmt.Errorf("upstream: %w", err)
	}
	if err := s.gate.Update(cfg); err != nil {
		return err
	}
	if err := s.door.SetUpstream(cfg.Upstream); err != nil {
		return err
	}
	s.log.Info("configuration reloaded", "file", s.configPath, "strategy", cfg.Admission.Strategy, "routes", len(cfg.Routes))
	return nil
}

// watch reloads on SIGHUP and, when the configuration asks for it, whenever the file's content
// changes (a mounted ConfigMap is replaced by a symlink swap; polling the content sees through it).
func (s *Server) watch(ctx context.Context) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	var tick <-chan time.Time
	if cfg := s.gate.Config(); cfg.Reload.Watch {
		t := time.NewTicker(cfg.Reload.Interval.D())
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			s.Reload()
		case <-tick:
			if _, err := os.Stat(s.configPath); err != nil {
				// Mid-swap or briefly absent: try again at the next tick.
				continue
			}
			s.Reload() // does nothing unless the content changed
		}
	}
}
