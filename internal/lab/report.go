package lab

import (
	"encoding/csv"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// Columns of the two CSV files. The first ones are fixed by the published comparison; runs of
// a user's scenario (Extended) append more after them.
var (
	SummaryColumns   = []string{"strategy", "incoming", "accepted", "rejected", "acceptance_pct", "p50_ms", "p99_ms", "max_buffered"}
	SnapshotColumns  = []string{"strategy", "elapsed_s", "accepted", "rejected", "throughput_rps", "p50_ms", "p99_ms", "max_buffered"}
	summaryExtended  = []string{"requests", "retries", "abandoned", "timeouts", "upstream_timeouts", "successes", "good", "goodput_pct", "goodput_rps", "p95_ms", "p999_ms", "max_backend_queue"}
	snapshotExtended = []string{"incoming", "abandoned", "timeouts", "goodput_rps"}
)

// Named pairs a result with the strategy it belongs to.
type Named struct {
	Strategy string
	*Result
}

// ms formats a duration in milliseconds with one decimal, rounding half up, computed on integer
// nanoseconds so that the text never depends on floating point.
func ms(d time.Duration) string {
	tenths := (int64(d) + 50_000) / 100_000
	return fmt.Sprintf("%d.%d", tenths/10, tenths%10)
}

// pct formats 100*num/den with one decimal, rounding half up, on integers.
func pct(num, den int64) string {
	if den == 0 {
		return "0.0"
	}
	tenths := (2000*num + den) / (2 * den)
	return fmt.Sprintf("%d.%d", tenths/10, tenths%10)
}

// rate formats a per-second figure with one decimal.
func rate(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

func i64(v int64) string { return strconv.FormatInt(v, 10) }

// WriteSummaryCSV writes one row per result. With extended set it appends the columns that
// matter for timeouts, retries and goodput.
func WriteSummaryCSV(w io.Writer, results []Named, extended bool) error {
	cw := csv.NewWriter(w)
	head := SummaryColumns
	if extended {
		head = append(append([]string(nil), SummaryColumns...), summaryExtended...)
	}
	if err := cw.Write(head); err != nil {
		return err
	}
	for _, r := range results {
		s := r.Summary
		row := []string{r.Strategy, i64(s.Incoming), i64(s.Accepted), i64(s.Rejected), pct(s.Accepted, s.Incoming),
			ms(s.P50), ms(s.P99), i64(s.MaxBuffered)}
		if extended {
			row = append(row, i64(s.Requests), i64(s.Retries), i64(s.Abandoned), i64(s.Timeouts), i64(s.UpstreamTimeouts),
				i64(s.Successes), i64(s.Good), pct(s.Good, s.Requests), rate(s.GoodputRPS()), ms(s.P95), ms(s.P999),
				i64(s.MaxBackendQueue))
		}
		if err := cw.Write(row); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// WriteSnapshotsCSV writes one row per result per elapsed second. Seconds are one long, so
// throughput_rps is the number of successful answers finished in that second. p50_ms and p99_ms
// are empty in a second where no admitted request arrived.
func WriteSnapshotsCSV(w io.Writer, results []Named, extended bool) error {
	cw := csv.NewWriter(w)
	head := SnapshotColumns
	if extended {
		head = append(append([]string(nil), SnapshotColumns...), snapshotExtended...)
	}
	if err := cw.Write(head); err != nil {
		return err
	}
	for _, r := range results {
		for _, s := range r.Seconds {
			p50, p99 := "", ""
			if s.Samples > 0 {
				p50, p99 = ms(s.P50), ms(s.P99)
			}
			row := []string{r.Strategy, strconv.Itoa(s.Elapsed), i64(s.Accepted), i64(s.Rejected), i64(s.Completed), p50, p99, i64(s.MaxBuffered)}
			if extended {
				row = append(row, i64(s.Incoming), i64(s.Abandoned), i64(s.Timeouts), i64(s.Good))
			}
			if err := cw.Write(row); err != nil {
				return err
			}
		}
	}
	cw.Flush()
	return cw.Error()
}

// WriteTable prints the summary as a markdown table, in the layout of the published comparison.
// With extended set it adds goodput and timeout columns.
func WriteTable(w io.Writer, results []Named, extended bool) error {
	var b strings.Builder
	b.WriteString("| strategy | incoming | accepted | rejected | acceptance % | p50 ms | p99 ms | max buffered |")
	if extended {
		b.WriteString(" timeouts | retries | goodput % | goodput rps |")
	}
	b.WriteString("\n|---|---|---|---|---|---|---|---|")
	if extended {
		b.WriteString("---|---|---|---|")
	}
	b.WriteString("\n")
	for _, r := range results {
		s := r.Summary
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %s | %s | %s | %d |", r.Strategy, s.Incoming, s.Accepted, s.Rejected,
			pct(s.Accepted, s.Incoming), ms(s.P50), ms(s.P99), s.MaxBuffered)
		if extended {
			fmt.Fprintf(&b, " %d | %d | %s | %s |", s.Timeouts+s.UpstreamTimeouts+s.Abandoned, s.Retries, pct(s.Good, s.Requests), rate(s.GoodputRPS()))
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}
