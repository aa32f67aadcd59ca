package loadgen

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Row is one line of WriteTable: a result and the name to show for it.
type Row struct {
	Name   string
	Result *Result
}

// WriteTable writes the rows as an aligned text table. capacity is the capacity C of the system
// under test in requests per second; the goodput/C column shows goodput / min(offered, C), the
// share of the load that could have been served well and was (shown as "-" when capacity is 0).
// Latencies are in milliseconds; invalid runs are flagged in the last column.
func WriteTable(w io.Writer, capacity float64, rows []Row) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, strings.Join(tableHeader, "\t")+"\t")
	for _, row := range rows {
		fmt.Fprintln(tw, strings.Join(tableCells(capacity, row), "\t")+"\t")
	}
	return tw.Flush()
}

// tableHeader names WriteTable's columns.
var tableHeader = []string{"run", "offered rps", "goodput rps", "goodput/C", "p50 ms", "p99 ms", "shed %", "timeout %", "late starts", "valid"}

// tableCells are the cells of one row of WriteTable.
func tableCells(capacity float64, row Row) []string {
	r := row.Result
	if r == nil {
		return []string{row.Name, "-", "-", "-", "-", "-", "-", "-", "-", "no result"}
	}
	share := "-"
	if capacity > 0 {
		share = fmt.Sprintf("%.2f", ratio(r.GoodputRPS, math.Min(r.OfferedRPS, capacity)))
	}
	valid := "yes"
	if !r.Valid {
		valid = "NO"
	}
	return []string{row.Name, fmt.Sprintf("%.0f", r.OfferedRPS), fmt.Sprintf("%.0f", r.GoodputRPS), share,
		millis(r.AdmittedLatency.P50), millis(r.AdmittedLatency.P99),
		fmt.Sprintf("%.1f", 100*r.ShedShare), fmt.Sprintf("%.1f", 100*ratio(float64(r.Timeouts), float64(r.Offered))),
		fmt.Sprintf("%d", r.LateStarts), valid}
}

// RowWriter writes WriteTable's table one row at a time, in columns of fixed width, so that a
// row can be printed as soon as its run ends (the demo's runs take seconds each).
type RowWriter struct {
	w         io.Writer
	capacity  float64
	nameWidth int
}

// NewRowWriter returns a RowWriter for rows whose names are at most nameWidth characters; it
// writes the header at once.
func NewRowWriter(w io.Writer, capacity float64, nameWidth int) (*RowWriter, error) {
	t := &RowWriter{w: w, capacity: capacity, nameWidth: max(nameWidth, len(tableHeader[0]))}
	return t, t.line(tableHeader)
}

// Write writes one row.
func (t *RowWriter) Write(row Row) error { return t.line(tableCells(t.capacity, row)) }

// line writes cells right-aligned: the name in nameWidth, each other cell in its header's width
// (at least 6; the last as wide as "no result"), two spaces apart.
func (t *RowWriter) line(cells []string) error {
	var b strings.Builder
	for i, c := range cells {
		width := t.nameWidth
		if i > 0 {
			width = max(len(tableHeader[i]), 6)
			if i == len(tableHeader)-1 {
				width = len("no result")
			}
			b.WriteString("  ")
		}
		fmt.Fprintf(&b, "%*s", width, c)
	}
	b.WriteString("\n")
	_, err := io.WriteString(t.w, b.String())
	return err
}

// millis formats d in milliseconds with one decimal.
func millis(d time.Duration) string {
	return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond))
}

// WriteSummary writes a few lines describing one result for a human reader.
func WriteSummary(w io.Writer, r *Result) error {
	var b strings.Builder
	target := r.Target
	if r.Protocol == "grpc" {
		target = "gRPC " + WorkMethod + " on " + target
	}
	fmt.Fprintf(&b, "target %s, %s schedule, timeout %s, SLO %s\n", target, scheduleKind(r.Schedule), r.Timeout, r.SLO)
	fmt.Fprintf(&b, "offered %d (%.1f rps over %s), sent %d, dropped %d, completed %d, timeouts %d, transport errors %d, canceled %d\n",
		r.Offered, r.OfferedRPS, r.Duration, r.Sent, r.Dropped, r.Completed, r.Timeouts, r.TransportErrors, r.Canceled)
	codes := make([]int, 0, len(r.Codes))
	for c := range r.Codes {
		codes = append(codes, c)
	}
	slices.Sort(codes)
	grpcRun := r.Protocol == "grpc"
	if grpcRun {
		b.WriteString("grpc-status:")
		for _, c := range codes {
			fmt.Fprintf(&b, " %s=%d", GRPCCodeName(c), r.Codes[c])
		}
		b.WriteString("\n")
		fmt.Fprintf(&b, "goodput %d (%.1f rps), OK %d; shed %d (%.1f%% of offered):", r.Goodput, r.GoodputRPS, r.Success, r.Shed, 100*r.ShedShare)
		shedCodes := make([]int, 0, len(r.ShedCodes))
		for c := range r.ShedCodes {
			shedCodes = append(shedCodes, c)
		}
		slices.Sort(shedCodes)
		for _, c := range shedCodes {
			fmt.Fprintf(&b, " %s=%d", GRPCCodeName(c), r.ShedCodes[c])
		}
		fmt.Fprintf(&b, "; grpc-retry-pushback-ms on %d of %d refusals, trailers-only %d of %d\n", r.PushbackPresent, r.Shed, r.TrailersOnly, r.Shed)
	} else {
		b.WriteString("codes:")
		for _, c := range codes {
			fmt.Fprintf(&b, " %d=%d", c, r.Codes[c])
		}
		b.WriteString("\n")
		fmt.Fprintf(&b, "goodput %d (%.1f rps), success %d; shed %d (%.1f%% of offered), Retry-After on %d of %d 429/503\n",
			r.Goodput, r.GoodputRPS, r.Success, r.Shed, 100*r.ShedShare, r.RetryAfterPresent, r.RetryAfterEligible)
	}
	l := r.AdmittedLatency
	fmt.Fprintf(&b, "admitted %d, latency ms p50 %s p90 %s p99 %s p99.9 %s max %s; shed p99 %s ms\n",
		r.Admitted, millis(l.P50), millis(l.P90), millis(l.P99), millis(l.P999), millis(l.Max), millis(r.ShedLatencyP99))
	fmt.Fprintf(&b, "late starts %d (tolerance %s), lateness p99 %s max %s, peak in flight %d of %d, elapsed %s\n",
		r.LateStarts, r.LateTolerance, r.LatenessP99, r.MaxLateness, r.PeakInFlight, r.MaxInFlight, r.Elapsed.Round(time.Millisecond))
	tags := make([]string, 0, len(r.Tags))
	for t := range r.Tags {
		tags = append(tags, t)
	}
	slices.Sort(tags)
	for _, name := range tags {
		t := r.Tags[name]
		fmt.Fprintf(&b, "tag %s: offered %d, success %d, goodput %d (%.1f rps), shed %d, timeouts %d, admitted p99 %s ms\n",
			name, t.Offered, t.Success, t.Goodput, t.GoodputRPS, t.Shed, t.Timeouts, millis(t.AdmittedP99))
	}
	for _, e := range r.ErrorSamples {
		fmt.Fprintf(&b, "error: %s\n", e)
	}
	if r.Valid {
		b.WriteString("run valid\n")
	} else {
		fmt.Fprintf(&b, "RUN INVALID: %s\n", r.InvalidReason)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// scheduleKind describes the arrivals of s in a word or two.
func scheduleKind(s Schedule) string {
	kind := "evenly spaced"
	if s.Poisson {
		kind = fmt.Sprintf("Poisson (seed %d)", s.Seed)
	}
	if len(s.Phases) > 1 {
		kind += fmt.Sprintf(", %d-phase", len(s.Phases))
	}
	return kind
}
