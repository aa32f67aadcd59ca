package config

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/loadshed/loadshed/pkg/admission"
)

// Cohorts ranks the requests of one priority class, so that every sidecar of a call graph ranks
// the legs of one user request alike and refuses the bottom of the same ranking (docs/cohorts.md).
// A request's rank is a keyed hash of its key and the current period, with a secret the call
// graph's sidecars share; a trusted caller's rank travels on in the W3C baggage header.
type Cohorts struct {
	// Key is what ranks a request: traceparent (the trace-id of the W3C traceparent header) or
	// header:NAME (that header's value, e.g. header:X-User-ID). It is honoured only from trusted
	// senders (trust); anyone else gets a random rank.
	Key string `yaml:"key"`
	// Count is the number of ranks per priority class (2 to 4096).
	Count int `yaml:"count"`
	// Rotate is the period of the ranking: it is drawn anew each period, the same in every
	// sidecar (at least 1m).
	Rotate Duration `yaml:"rotate"`
	// SecretFile holds the secret the call graph's sidecars share (at least 16 bytes, used as
	// they are; a mounted Secret). It is read when the configuration is loaded and reloaded; an
	// unreadable or short secret rejects the configuration.
	SecretFile string `yaml:"secretFile"`
	// StrategyShare is the share of the requests the cohort level lets through that the strategy
	// itself should still refuse, so that its limit keeps learning (0 to 0.5, not 0).
	StrategyShare float64 `yaml:"strategyShare"`
	// WaitFraction: a request the level lets through but the strategy refuses for capacity waits
	// up to this times the mean admitted latency for a release (0 to 4; 0: no wait).
	WaitFraction float64 `yaml:"waitFraction"`

	secret []byte // SecretFile's content, read by Config.Validate
}

// Cohort keys.
const (
	// CohortKeyTraceparent ranks by the trace-id of the W3C traceparent header.
	CohortKeyTraceparent = "traceparent"
	// CohortKeyHeaderPrefix, followed by a header name, ranks by that header's value.
	CohortKeyHeaderPrefix = "header:"
)

// Bounds of the cohorts block.
const (
	MinCohortSecretBytes = 16
	maxCohortSecretBytes = 64 << 10
	MinCohortRanks       = 2
	MaxCohortRanks       = 4096
	minCohortRotate      = time.Minute
)

func (c *Cohorts) setDefaults() {
	*c = Cohorts{Key: CohortKeyTraceparent, Count: 128, Rotate: Duration(time.Hour), StrategyShare: 0.03, WaitFraction: 0.5}
}

// KeyHeader is the header a header:NAME key reads; empty for traceparent.
func (c *Cohorts) KeyHeader() string {
	name, _ := strings.CutPrefix(c.Key, CohortKeyHeaderPrefix)
	if name == c.Key {
		return ""
	}
	return name
}

// Options are the ranked admission's settings (admission.NewCohorts) the block describes.
func (c *Cohorts) Options() admission.CohortOptions {
	return admission.CohortOptions{Ranks: c.Count, StrategyShare: c.StrategyShare, WaitFraction: c.WaitFraction}
}

// Secret is the content of SecretFile, as read when the configuration was loaded (nil for a block
// that did not come through Config.Validate: ParseAdmission reads no secret). The slice is the
// configuration's own: never change it.
func (c *Cohorts) Secret() []byte { return c.secret }

// validate checks the block's settings (the secret is read apart, by readSecret).
func (c *Cohorts) validate(errs *Problems, path string) {
	if c == nil {
		return
	}
	switch {
	case c.Key == CohortKeyTraceparent:
	case strings.HasPrefix(c.Key, CohortKeyHeaderPrefix):
		if !validHeaderName(c.KeyHeader()) {
			errs.add(path+".key", "not a valid header name after header: %q", c.KeyHeader())
		}
	default:
		errs.add(path+".key", "want traceparent or header:NAME (e.g. header:X-User-ID), got %q", c.Key)
	}
	if c.Count < MinCohortRanks || c.Count > MaxCohortRanks {
		errs.add(path+".count", "must be from %d to %d ranks, got %d", MinCohortRanks, MaxCohortRanks, c.Count)
	}
	if c.Rotate.D() < minCohortRotate {
		errs.add(path+".rotate", "must be at least %s, got %s", minCohortRotate, c.Rotate)
	}
	if c.StrategyShare <= 0 || c.StrategyShare > 0.5 {
		errs.add(path+".strategyShare", "must be above 0 and at most 0.5, got %g", c.StrategyShare)
	}
	if c.WaitFraction < 0 || c.WaitFraction > 4 {
		errs.add(path+".waitFraction", "must be from 0 to 4, got %g", c.WaitFraction)
	}
}

// readSecret reads SecretFile: required, readable, from 16 bytes to 64 KiB.
func (c *Cohorts) readSecret(errs *Problems, path string) {
	if c == nil {
		return
	}
	path += ".secretFile"
	if c.SecretFile == "" {
		errs.add(path, "required: the file of the secret the call graph's sidecars share (at least %d bytes), e.g. /etc/loadshed/cohort/key", MinCohortSecretBytes)
		return
	}
	f, err := os.Open(c.SecretFile)
	if err != nil {
		errs.add(path, "cannot read the secret: %v", err)
		return
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxCohortSecretBytes+1))
	switch {
	case err != nil:
		errs.add(path, "cannot read the secret: %v", err)
	case len(data) < MinCohortSecretBytes:
		errs.add(path, "the secret in %s has %d bytes; it needs at least %d", c.SecretFile, len(data), MinCohortSecretBytes)
	case len(data) > maxCohortSecretBytes:
		errs.add(path, "the secret in %s is larger than %d bytes", c.SecretFile, maxCohortSecretBytes)
	default:
		c.secret = data
	}
}

// readSecrets reads the secret of every cohorts block: the top-level admission's and the routes'.
func (c *Config) readSecrets(errs *Problems) {
	c.Admission.Cohorts.readSecret(errs, "admission.cohorts")
	for i, r := range c.Routes {
		if r.Admission != nil {
			r.Admission.Cohorts.readSecret(errs, fmt.Sprintf("routes[%d].admission.cohorts", i))
		}
	}
}
