package lab

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/loadshed/loadshed/pkg/admission"
)

// MaxTraceRecords bounds the size of a trace file read into memory.
const MaxTraceRecords = 5_000_000

// A trace file is CSV with a header row. Column arrival_s (required) holds each request's arrival
// as seconds from the start of the run, a decimal with up to 9 fractional digits (read exactly,
// to the nanosecond); rows must be in non-decreasing order. Optional columns: priority (a wire
// name such as critical or sheddable; default critical) and cost (an integer; default 1).
// Other columns are ignored, so a trace may carry notes.
//
//	arrival_s,priority,cost
//	0,critical,1
//	0.005,sheddable,1
//	0.0125,critical,3

// ReadTrace reads a trace file.
func ReadTrace(r io.Reader) ([]Arrival, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.TrimLeadingSpace = true
	header, err := cr.Read()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("trace: empty file (want a header row with arrival_s)")
		}
		return nil, fmt.Errorf("trace: %w", err)
	}
	col := map[string]int{}
	for i, h := range header {
		col[strings.TrimSpace(h)] = i
	}
	at, ok := col["arrival_s"]
	if !ok {
		return nil, fmt.Errorf("trace: header %q has no arrival_s column", strings.Join(header, ","))
	}
	pc, hasPrio := col["priority"]
	cc, hasCost := col["cost"]
	var out []Arrival
	for line := 2; ; line++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("trace: %w", err)
		}
		if len(out) == MaxTraceRecords {
			return nil, fmt.Errorf("trace: more than %d records", MaxTraceRecords)
		}
		field := func(i int) string {
			if i < len(rec) {
				return strings.TrimSpace(rec[i])
			}
			return ""
		}
		a := Arrival{Priority: admission.Critical, Cost: 1}
		if a.At, err = parseSeconds(field(at)); err != nil {
			return nil, fmt.Errorf("trace: line %d: arrival_s: %w", line, err)
		}
		if n := len(out); n > 0 && a.At < out[n-1].At {
			return nil, fmt.Errorf("trace: line %d: arrival_s %s is before the previous row's %s (rows must be in time order)",
				line, field(at), formatSeconds(out[n-1].At))
		}
		if hasPrio && field(pc) != "" {
			if a.Priority, err = admission.ParsePriority(field(pc)); err != nil {
				return nil, fmt.Errorf("trace: line %d: priority: %w", line, err)
			}
		}
		if hasCost && field(cc) != "" {
			c, err := strconv.ParseInt(field(cc), 10, 64)
			if err != nil || c < 1 || c > 1<<20 {
				return nil, fmt.Errorf("trace: line %d: cost: %q is not an integer in [1, %d]", line, field(cc), 1<<20)
			}
			a.Cost = c
		}
		out = append(out, a)
	}
}

// WriteTrace writes arrivals in the trace format, with all three columns, so that ReadTrace
// returns them unchanged.
func WriteTrace(w io.Writer, arrivals []Arrival) error {
	cw := csv.NewWriter(w)
	if err := cw.Write([]string{"arrival_s", "priority", "cost"}); err != nil {
		return err
	}
	for _, a := range arrivals {
		cost := max(a.Cost, 1)
		if err := cw.Write([]string{formatSeconds(a.At), a.Priority.String(), strconv.FormatInt(cost, 10)}); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// CollectArrivals opens a and returns every arrival it yields, at most limit (0: no limit beyond
// MaxTraceRecords).
func CollectArrivals(a Arrivals, seed uint64, limit int) ([]Arrival, error) {
	if limit <= 0 || limit > MaxTraceRecords {
		limit = MaxTraceRecords
	}
	st, err := a.Open(seed)
	if err != nil {
		return nil, err
	}
	var out []Arrival
	for len(out) < limit {
		x, ok := st.Next()
		if !ok {
			break
		}
		out = append(out, x)
	}
	return out, nil
}

// parseSeconds reads a non-negative decimal number of seconds exactly into a Duration.
func parseSeconds(s string) (time.Duration, error) {
	whole, frac, _ := strings.Cut(s, ".")
	if whole == "" && frac == "" {
		return 0, fmt.Errorf("%q is not a number of seconds", s)
	}
	if len(frac) > 9 {
		return 0, fmt.Errorf("%q has more than 9 fractional digits", s)
	}
	for _, part := range []string{whole, frac} {
		for _, c := range part {
			if c < '0' || c > '9' {
				return 0, fmt.Errorf("%q is not a non-negative decimal number of seconds", s)
			}
		}
	}
	var w int64
	if whole != "" {
		v, err := strconv.ParseInt(whole, 10, 64)
		if err != nil || v > int64(100*24*time.Hour/time.Second) {
			return 0, fmt.Errorf("%q is out of range (at most 100 days)", s)
		}
		w = v
	}
	var f int64
	if frac != "" {
		v, _ := strconv.ParseInt(frac+strings.Repeat("0", 9-len(frac)), 10, 64)
		f = v
	}
	return time.Duration(w)*time.Second + time.Duration(f), nil
}

// formatSeconds writes d as decimal seconds without trailing zeros ("0.005", "12").
func formatSeconds(d time.Duration) string {
	s := fmt.Sprintf("%d.%09d", d/time.Second, d%time.Second)
	s = strings.TrimRight(s, "0")
	return strings.TrimSuffix(s, ".")
}
