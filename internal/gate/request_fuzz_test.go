package gate

import (
	"math"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/loadshed/loadshed/internal/config"
	"github.com/loadshed/loadshed/internal/metrics"
	"github.com/loadshed/loadshed/pkg/admission"
)

// grpcTimeoutFormat is the grpc-timeout grammar of the gRPC over HTTP/2 specification.
var grpcTimeoutFormat = regexp.MustCompile(`^[0-9]{1,8}[HMSmun]$`)

// FuzzParseGRPCTimeout: never panics; accepts exactly the specification's grammar (1 to 8
// digits and a unit) and returns the value times the unit, capped at the largest Duration.
func FuzzParseGRPCTimeout(f *testing.F) {
	for _, s := range []string{"1H", "2M", "3S", "100m", "200u", "300n", "0n", "99999999H", "00000001S", "", "S", "1", "-1S", "+1S", "1.5S", "1s", "123456789m", "1 S", "１S"} {
		f.Add(s)
	}
	units := map[byte]time.Duration{'H': time.Hour, 'M': time.Minute, 'S': time.Second, 'm': time.Millisecond, 'u': time.Microsecond, 'n': time.Nanosecond}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := parseGRPCTimeout(s)
		if ok := grpcTimeoutFormat.MatchString(s); ok != (err == nil) {
			t.Fatalf("%q: accepted=%v, but the grammar says %v (%v)", s, err == nil, ok, err)
		}
		if err != nil {
			return
		}
		n, _ := strconv.ParseInt(s[:len(s)-1], 10, 64)
		want := time.Duration(math.MaxInt64)
		if unit := units[s[len(s)-1]]; n <= math.MaxInt64/int64(unit) {
			want = time.Duration(n) * unit
		}
		if d != want {
			t.Fatalf("%q: %v, want %v", s, d, want)
		}
	})
}

// FuzzParseTimeout: never panics; an accepted X-Request-Timeout is not negative, and is the Go
// duration or the number of seconds the value says (capped at the largest Duration).
func FuzzParseTimeout(f *testing.F) {
	for _, s := range []string{"1.5s", "250ms", "2", "0.25", " 3 ", "0", "-1s", "soon", "1e309", "NaN", "Inf", "1e-10", "9223372036.854775807", "2562047h47m16.854775807s", "0x10", "1_000"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := parseTimeout(s)
		if err != nil {
			if !strings.Contains(err.Error(), strconv.Quote(strings.TrimSpace(s))) && !strings.Contains(err.Error(), "positive") {
				t.Fatalf("%q: the error %q does not quote the value", s, err)
			}
			return
		}
		if d < 0 {
			t.Fatalf("%q accepted as %v", s, d)
		}
		v := strings.TrimSpace(s)
		if pd, perr := time.ParseDuration(v); perr == nil {
			if d != pd {
				t.Fatalf("%q: %v, want the Go duration %v", s, d, pd)
			}
			return
		}
		secs, perr := strconv.ParseFloat(v, 64)
		if perr != nil {
			t.Fatalf("%q accepted, but it is neither a duration nor a number", s)
		}
		if want := secs * float64(time.Second); math.Abs(float64(d)-math.Min(want, math.MaxInt64)) > math.Max(1, want*1e-9) {
			t.Fatalf("%q: %v, want %v seconds", s, d, secs)
		}
	})
}

// FuzzParseRequest feeds arbitrary priority, cost, X-Request-Timeout and grpc-timeout headers to
// the proxy's request parsing, from a trusted and from an untrusted sender. It never panics; a
// refusal names one of the headers; an accepted request has a known priority, a cost from 1 to
// maxCost (the route's cost when no header says otherwise), and a deadline exactly when a
// timeout header was given (unless the timeout is too long to represent), never before now and
// never later than the shorter of the two timeouts. A trusted sender gets the priority and cost
// it names; an untrusted one never a priority above the default nor a cost below the route's.
func FuzzParseRequest(f *testing.F) {
	f.Add("critical", "3", "1.5s", "100m", int64(0))
	f.Add("SHEDDABLE-PLUS ", " 100", "2", "0n", int64(5))
	f.Add("", "", "", "", int64(-1))
	f.Add("urgent", "0", "-1s", "5x", int64(1))
	f.Add("critical_plus", "101", "1e-10", "99999999H", int64(200))
	cfg := config.Default()
	cfg.Upstream = "http://127.0.0.1:1"
	st, err := buildState(&cfg, nil, metrics.New(prometheus.NewRegistry(), nil), admission.SystemClock{})
	if err != nil {
		f.Fatal(err)
	}
	untrusted := st.spec
	cfg.Trust.Sources = []string{"192.0.2.0/24"}
	if st, err = buildState(&cfg, nil, metrics.New(prometheus.NewRegistry(), nil), admission.SystemClock{}); err != nil {
		f.Fatal(err)
	}
	trustedSpec := st.spec
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, prio, cost, timeout, grpcTimeout string, routeCost int64) {
		for _, trusted := range []bool{true, false} {
			spec := untrusted
			if trusted {
				spec = trustedSpec
			}
			checkParse(t, spec, trusted, now, prio, cost, timeout, grpcTimeout, routeCost)
		}
	})
}

func checkParse(t *testing.T, spec requestSpec, trusted bool, now time.Time, prio, cost, timeout, grpcTimeout string, routeCost int64) {
	{
		r, _ := http.NewRequest("GET", "http://proxy.test/", nil)
		r.RemoteAddr = "192.0.2.1:1234"
		set := func(name, v string) {
			if v != "" {
				r.Header.Set(name, v)
			}
		}
		set(spec.priorityHeader, prio)
		set(spec.costHeader, cost)
		set(spec.timeoutHeader, timeout)
		set("Grpc-Timeout", grpcTimeout)
		req, herr := spec.parseRequest(r.Header, r.RemoteAddr, now, routeCost)
		if herr != nil {
			switch herr.header {
			case spec.priorityHeader, spec.costHeader, spec.timeoutHeader, "grpc-timeout":
			default:
				t.Fatalf("refusal names %q", herr.header)
			}
			return
		}
		if req.Priority >= admission.NumPriorities {
			t.Fatalf("priority %v", req.Priority)
		}
		wantPrio := spec.defaultPriority
		if prio != "" {
			wantPrio, _ = admission.ParsePriority(strings.ToLower(strings.TrimSpace(prio)))
			if !trusted {
				wantPrio = max(wantPrio, spec.defaultPriority)
			}
		}
		if req.Priority != wantPrio {
			t.Fatalf("trusted %v: priority %v from header %q, want %v", trusted, req.Priority, prio, wantPrio)
		}
		wantCost := max(routeCost, 1)
		if cost != "" {
			c, _ := strconv.ParseInt(strings.TrimSpace(cost), 10, 64)
			if trusted {
				wantCost = c
			} else {
				wantCost = max(c, wantCost)
			}
		}
		if req.Cost != wantCost || req.Cost < 1 || cost != "" && req.Cost > max(spec.maxCost, routeCost) {
			t.Fatalf("trusted %v: cost %d from header %q and route cost %d", trusted, req.Cost, cost, routeCost)
		}
		var limits []time.Duration
		if timeout != "" {
			d, _ := parseTimeout(timeout)
			limits = append(limits, d)
		}
		if grpcTimeout != "" {
			d, _ := parseGRPCTimeout(grpcTimeout)
			limits = append(limits, d)
		}
		if len(limits) == 0 {
			if !req.Deadline.IsZero() {
				t.Fatalf("deadline %v without a timeout header", req.Deadline)
			}
			return
		}
		shortest := limits[0]
		for _, d := range limits[1:] {
			shortest = min(shortest, d)
		}
		if req.Deadline.IsZero() {
			if shortest < 100*365*24*time.Hour {
				t.Fatalf("no deadline for a timeout of %v", shortest)
			}
			return
		}
		if req.Deadline.Before(now) || req.Deadline.Sub(now) != shortest {
			t.Fatalf("deadline in %v, want the shortest timeout %v", req.Deadline.Sub(now), shortest)
		}
	}
}

func TestParseGRPCTimeout(t *testing.T) {
	for in, want := range map[string]time.Duration{"1H": time.Hour, "2M": 2 * time.Minute, "3S": 3 * time.Second,
		"100m": 100 * time.Millisecond, "200u": 200 * time.Microsecond, "300n": 300, "99999999H": time.Duration(1<<63 - 1)} {
		got, err := parseGRPCTimeout(in)
		if err != nil || got != want {
			t.Errorf("%s: %v %v, want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "S", "1", "-1S", "+1S", "1.5S", "1s", "123456789m", "1 S"} {
		if _, err := parseGRPCTimeout(bad); err == nil {
			t.Errorf("%q must be refused", bad)
		}
	}
}
