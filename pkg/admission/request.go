package admission

import (
	"fmt"
	"time"
)

// Priority is a request's criticality. Lower values are more important; the zero value is
// CriticalPlus, so callers normally set Priority explicitly (the proxy applies a configured
// default). The levels follow the criticality classes of Google's SRE book.
type Priority uint8

const (
	CriticalPlus  Priority = iota // must not be shed while anything else can be
	Critical                      // user-facing, shed only after every sheddable request
	SheddablePlus                 // batch work whose failure is visible but retried
	Sheddable                     // best effort
	NumPriorities = 4
)

var priorityNames = [NumPriorities]string{"critical_plus", "critical", "sheddable_plus", "sheddable"}

// String returns the wire name of p, for example "critical_plus".
func (p Priority) String() string {
	if int(p) < len(priorityNames) {
		return priorityNames[p]
	}
	return fmt.Sprintf("priority(%d)", uint8(p))
}

// ParsePriority maps a wire name ("critical_plus", "critical", "sheddable_plus", "sheddable",
// case-sensitive, hyphens accepted for underscores) to a Priority.
func ParsePriority(s string) (Priority, error) {
	for i, n := range priorityNames {
		if s == n || s == hyphenate(n) {
			return Priority(i), nil
		}
	}
	return 0, fmt.Errorf("unknown priority %q (want one of critical_plus, critical, sheddable_plus, sheddable)", s)
}

func hyphenate(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c == '_' {
			b[i] = '-'
		}
	}
	return string(b)
}

// Request carries what strategies need to know about a request. The zero value is a request of
// cost 1 with priority CriticalPlus, no deadline and no client key.
type Request struct {
	// Priority orders queues and decides who is shed first under pressure.
	Priority Priority
	// Cost is how many permits the request takes (a heavy endpoint costs more). Values below 1
	// count as 1. A cost above a strategy's whole capacity is clamped to that capacity, so the
	// request runs alone rather than never.
	Cost int64
	// Deadline, when not zero, is the moment after which nobody waits for the answer: a
	// strategy refuses the request with ReasonDeadline rather than queue it past this point.
	Deadline time.Time
	// Key identifies the client for per-client limits.
	Key string
	// Rank orders requests of one priority under ranked admission (NewCohorts): rank 0 is
	// admitted first, ranks at or above the count are treated as the last. Ignored otherwise.
	Rank int
}

func (r *Request) cost() int64 {
	if r.Cost < 1 {
		return 1
	}
	return r.Cost
}

// Outcome says how an admitted request ended. Adaptive strategies learn from it.
type Outcome uint8

const (
	// Success: the request was served (2xx/3xx); its duration is a valid latency sample.
	Success Outcome = iota
	// Ignore: the result says nothing about the backend's load (a client error, a cancelled or
	// long-lived request); no sample is taken.
	Ignore
	// Dropped: the backend was overloaded or failed (429, 5xx, timeout); adaptive limits shrink.
	Dropped
)

func (o Outcome) String() string {
	switch o {
	case Success:
		return "success"
	case Ignore:
		return "ignore"
	case Dropped:
		return "dropped"
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}
