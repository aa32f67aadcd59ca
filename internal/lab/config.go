package lab

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/loadshed/loadshed/internal/config"
)

// ConfigStrategy is a user's real policy read from the proxy's own YAML file.
type ConfigStrategy struct {
	Strategy Strategy
	// UpstreamTimeout is the file's upstreamTimeout (the proxy answers 504 past it).
	UpstreamTimeout time.Duration
	// DryRun is set when the file's admission.dryRun is on: the proxy then admits everything
	// (it only counts would-be sheds), and so does the lab.
	DryRun bool
}

// StrategyFromConfig reads a proxy config file and returns its admission strategy, built by
// the proxy's own code (config.Admission.Build), so the lab runs exactly what the proxy would.
func StrategyFromConfig(path string) (ConfigStrategy, error) {
	cfg, err := config.Load(path)
	if err != nil {
		return ConfigStrategy{}, err
	}
	adm := cfg.Admission
	// Build once now so a bad policy is reported before any run starts.
	if _, err := adm.Build(); err != nil {
		return ConfigStrategy{}, fmt.Errorf("%s: admission: %w", path, err)
	}
	st := FromAdmission(adm, path)
	st.Name = fmt.Sprintf("%s (%s)", adm.Strategy, filepath.Base(path))
	if adm.DryRun {
		st.Name = fmt.Sprintf("%s dry run (%s)", adm.Strategy, filepath.Base(path))
	}
	return ConfigStrategy{Strategy: st, UpstreamTimeout: cfg.UpstreamTimeout.D(), DryRun: adm.DryRun}, nil
}
