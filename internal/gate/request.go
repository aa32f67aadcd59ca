package gate

import (
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/loadshed/loadshed/pkg/admission"
)

// headerError is a malformed request header: the client gets 400 naming the header.
type headerError struct {
	header, msg string
}

func (e *headerError) Error() string { return e.header + ": " + e.msg }

// The units of grpc-timeout, in the order of their durations below.
const grpcUnits = "HMSmun"

var grpcUnitDurations = [len(grpcUnits)]time.Duration{time.Hour, time.Minute, time.Second, time.Millisecond, time.Microsecond, time.Nanosecond}

// parseGRPCTimeout parses a grpc-timeout header value: at most 8 digits and a unit, H (hours),
// M (minutes), S (seconds), m (milliseconds), u (microseconds) or n (nanoseconds).
func parseGRPCTimeout(v string) (time.Duration, error) {
	if len(v) < 2 || len(v) > 9 {
		return 0, fmt.Errorf("want 1 to 8 digits and a unit (H, M, S, m, u, n), got %q", v)
	}
	n, err := strconv.ParseUint(v[:len(v)-1], 10, 64)
	if err != nil || strings.ContainsAny(v[:1], "+-") {
		return 0, fmt.Errorf("want 1 to 8 digits and a unit (H, M, S, m, u, n), got %q", v)
	}
	i := strings.IndexByte(grpcUnits, v[len(v)-1])
	if i < 0 {
		return 0, fmt.Errorf("unknown unit %q (want H, M, S, m, u or n)", v[len(v)-1:])
	}
	unit := grpcUnitDurations[i]
	// 8 digits of hours overflow a Duration; cap at its maximum.
	if n > uint64(math.MaxInt64/int64(unit)) {
		return time.Duration(math.MaxInt64), nil
	}
	return time.Duration(n) * unit, nil
}

// parseTimeout parses a request-timeout header: a Go duration ("1.5s", "250ms") or a number of
// seconds ("2", "0.25"). It must be positive.
func parseTimeout(v string) (time.Duration, error) {
	v = strings.TrimSpace(v)
	if d, err := time.ParseDuration(v); err == nil {
		if d <= 0 {
			return 0, fmt.Errorf("must be positive, got %q", v)
		}
		return d, nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("want a duration (\"1.5s\") or seconds (\"2\"), got %q", v)
	}
	if f <= 0 {
		return 0, fmt.Errorf("must be positive, got %q", v)
	}
	if f >= math.MaxInt64/float64(time.Second) { // float64(MaxInt64) rounds up: >= avoids overflow
		return time.Duration(math.MaxInt64), nil
	}
	return time.Duration(f * float64(time.Second)), nil
}

// Header reads a request header by name; the empty string when it is absent. http.Header
// satisfies it; other doors adapt their own header maps (gRPC metadata, Envoy's header list).
type Header interface {
	Get(name string) string
}

// requestSpec says how to read admission attributes from a request.
type requestSpec struct {
	priorityHeader  string
	defaultPriority admission.Priority
	costHeader      string
	maxCost         int64
	timeoutHeader   string
	grpcTimeout     bool
	clientKeyHeader string // empty: the client's address
	foldKey         bool
	trustForwarded  bool
	trust           *trustRules
	// strip are the admission headers removed before the upstream (unless trust forwards them).
	strip []string
}

// trustCheck evaluates, at most once per request, whether its sender is trusted.
type trustCheck struct {
	rules *trustRules
	h     Header
	peer  string
	done  bool
	ok    bool
}

func (c *trustCheck) trusted() bool {
	if !c.done {
		c.done = true
		c.ok = c.rules != nil && c.rules.trusted(c.h, c.peer)
	}
	return c.ok
}

// parseRequest reads priority, cost, deadline and client key. A malformed header is an error
// naming it; a missing one takes the default. Only a trusted sender (trust) may raise its
// priority above the default, lower its cost below the route's, or name its client key; an
// untrusted one's claims are bounded there, and its key is its address.
func (s *requestSpec) parseRequest(h Header, peer string, now time.Time, routeCost int64) (admission.Request, *headerError) {
	return s.parse(h, now, routeCost, &trustCheck{rules: s.trust, h: h, peer: peer})
}

// parse is parseRequest with the request's trust check, which the caller may consult again.
func (s *requestSpec) parse(h Header, now time.Time, routeCost int64, check *trustCheck) (admission.Request, *headerError) {
	routeCost = max(routeCost, 1)
	req := admission.Request{Priority: s.defaultPriority, Cost: routeCost}
	peer := check.peer
	if s.priorityHeader != "" {
		if v := h.Get(s.priorityHeader); v != "" {
			p, err := admission.ParsePriority(strings.ToLower(strings.TrimSpace(v)))
			if err != nil {
				return req, &headerError{s.priorityHeader, err.Error()}
			}
			if p >= s.defaultPriority || check.trusted() {
				req.Priority = p
			}
		}
	}
	if s.costHeader != "" {
		if v := h.Get(s.costHeader); v != "" {
			c, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil || c < 1 || c > s.maxCost {
				return req, &headerError{s.costHeader, fmt.Sprintf("want an integer from 1 to %d, got %q", s.maxCost, v)}
			}
			if c >= routeCost || check.trusted() {
				req.Cost = c
			}
		}
	}
	var timeout time.Duration
	hasTimeout := false
	if s.timeoutHeader != "" {
		if v := h.Get(s.timeoutHeader); v != "" {
			d, err := parseTimeout(v)
			if err != nil {
				return req, &headerError{s.timeoutHeader, err.Error()}
			}
			timeout, hasTimeout = d, true
		}
	}
	if s.grpcTimeout {
		if v := h.Get("Grpc-Timeout"); v != "" {
			d, err := parseGRPCTimeout(v)
			if err != nil {
				return req, &headerError{"grpc-timeout", err.Error()}
			}
			if !hasTimeout || d < timeout {
				timeout, hasTimeout = d, true
			}
		}
	}
	switch {
	case !hasTimeout:
	case timeout <= 0:
		// No time left (gRPC clients send "0n" once their deadline has passed): already late.
		req.Deadline = now
	case timeout < time.Duration(math.MaxInt64)-time.Duration(now.UnixNano()):
		req.Deadline = now.Add(timeout)
	}
	req.Key = s.clientKey(h, peer, check)
	return req, nil
}

// clientKey is the configured header's value from a trusted sender, or the client's address
// (the first X-Forwarded-For hop when forwarded headers are trusted).
func (s *requestSpec) clientKey(h Header, peer string, check *trustCheck) string {
	if s.clientKeyHeader != "" {
		if v := h.Get(s.clientKeyHeader); v != "" && check.trusted() {
			if s.foldKey {
				v = strings.ToLower(strings.TrimSpace(v))
			}
			if len(v) > 256 {
				v = v[:256]
			}
			return v
		}
	}
	if s.trustForwarded {
		if xff := h.Get("X-Forwarded-For"); xff != "" {
			first, _, _ := strings.Cut(xff, ",")
			if ip := net.ParseIP(strings.TrimSpace(first)); ip != nil {
				return ip.String()
			}
		}
	}
	host, _, err := net.SplitHostPort(peer)
	if err != nil {
		return peer
	}
	return host
}
