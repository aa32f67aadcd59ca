package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
)

// LoadgenImage builds (or reuses) the image of loadshed's own load generator (cmd/loadgen,
// static): FROM scratch, the binary only.
func LoadgenImage(ctx context.Context, r *Runner, root, bin string) (string, error) {
	return cachedImage(ctx, r, "loadshed-e2e-loadgen", filepath.Join(root, "e2e", "images", "loadgen.Dockerfile"), map[string]string{"loadgen": bin})
}

// LoadgenResult is the part of cmd/loadgen's JSON result (--json; internal/loadgen.Result) the
// e2e reads. Durations are nanoseconds.
type LoadgenResult struct {
	Target          string      `json:"target"`
	Duration        int64       `json:"duration"`
	Offered         int         `json:"offered"`
	Sent            int         `json:"sent"`
	Dropped         int         `json:"dropped"`
	Completed       int         `json:"completed"`
	Codes           map[int]int `json:"codes"`
	Timeouts        int         `json:"timeouts"`
	TransportErrors int         `json:"transportErrors"`
	Canceled        int         `json:"canceled"`
	Success         int         `json:"success"`
	Shed            int         `json:"shed"`
	OfferedRPS      float64     `json:"offeredRps"`
	LateStarts      int         `json:"lateStarts"`
	LatenessP99     int64       `json:"latenessP99"`
	Valid           bool        `json:"valid"`
	InvalidReason   string      `json:"invalidReason"`
}

// ParseLoadgen finds loadgen's JSON result in a pod's log, which may also hold log lines: the
// last JSON object that starts on a line of its own and holds a run (a target and offered
// requests).
func ParseLoadgen(log string) (*LoadgenResult, error) {
	lines := strings.Split(log, "\n")
	var lastErr error
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.TrimRight(lines[i], "\r") != "{" {
			continue
		}
		var res LoadgenResult
		err := json.NewDecoder(strings.NewReader(strings.Join(lines[i:], "\n"))).Decode(&res)
		if err == nil && (res.Target == "" || res.Offered == 0) {
			err = errors.New("a JSON object without a target or offered requests")
		}
		if err == nil {
			return &res, nil
		}
		lastErr = err
	}
	if lastErr != nil {
		return nil, fmt.Errorf("no loadgen result in the log: %w", lastErr)
	}
	return nil, errors.New("no JSON result in the loadgen log")
}
