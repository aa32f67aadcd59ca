package cluster

import (
	"errors"
	"fmt"
	"strings"

	"github.com/loadshed/loadshed/bench/k6summary"
)

// K6Summary finds the JSON summary the loadtest/k6 scripts print on stdout (when SUMMARY_PATH
// is unset) in a k6 pod's log, which may also hold k6's own log lines. The summary is the last
// JSON object that starts on a line of its own and parses as a loadshed k6 summary.
func K6Summary(log string) (*k6summary.Summary, error) {
	lines := strings.Split(log, "\n")
	var lastErr error
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.TrimRight(lines[i], "\r") != "{" {
			continue
		}
		s, err := k6summary.Parse(strings.NewReader(strings.Join(lines[i:], "\n")))
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	if lastErr != nil {
		return nil, fmt.Errorf("no loadshed k6 summary in the log: %w", lastErr)
	}
	return nil, errors.New("no JSON summary in the k6 log")
}
