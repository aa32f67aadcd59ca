// Package envoystats reads Envoy's admin /stats output, for the live tests, the bench and the
// e2e module alike.
package envoystats

import (
	"bufio"
	"io"
	"strconv"
	"strings"
)

// Parse reads Envoy's plain /stats output ("name: value" lines), keeping the counters and
// gauges (histogram lines are not integers).
func Parse(r io.Reader) (map[string]int64, error) {
	out := map[string]int64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		name, v, ok := strings.Cut(sc.Text(), ": ")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
			out[name] = n
		}
	}
	return out, sc.Err()
}
