package backend

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/loadshed/loadshed/internal/slowtail"
)

// MaxWorkers is the largest worker count. Workers are counted slots, not goroutines, so the bound
// only keeps values sane.
const MaxWorkers = 100000

// Config is the backend's capacity and service-time model.
type Config struct {
	// Workers is how many requests are served at once; more wait inside, in FIFO order, without
	// bound. In [1, MaxWorkers].
	Workers int
	// Service is the service-time distribution.
	Service slowtail.Config
	// Seed seeds the service-time sampler. Draws happen in the order requests start service, so
	// with concurrent clients the sequence a given request sees depends on arrival order. Only
	// Reseed (the admin's "seed" field) changes it after New: the sequence then starts over.
	Seed uint64
}

// DefaultConfig returns 8 workers, the default slow-tail sampler and seed 1.
func DefaultConfig() Config {
	return Config{Workers: 8, Service: slowtail.DefaultConfig(), Seed: 1}
}

// FieldError is one problem with one field. Field uses the admin JSON spelling
// ("workers", "mean", "tailProb", ...).
type FieldError struct {
	Field   string
	Problem string
}

func (e *FieldError) Error() string { return "backend: " + e.Field + ": " + e.Problem }

// Validate reports every problem with c as *FieldError values joined with errors.Join, or nil.
func (c Config) Validate() error {
	var errs []error
	if err := checkWorkers(c.Workers); err != nil {
		errs = append(errs, err)
	}
	if err := c.Service.Validate(); err != nil {
		for _, e := range unjoin(err) {
			var fe *slowtail.FieldError
			if errors.As(e, &fe) {
				errs = append(errs, &FieldError{fe.Field, fe.Problem})
			} else {
				errs = append(errs, e)
			}
		}
	}
	return errors.Join(errs...)
}

func checkWorkers(n int) error {
	if n < 1 || n > MaxWorkers {
		return &FieldError{"workers", fmt.Sprintf("must be in [1, %d], got %d", MaxWorkers, n)}
	}
	return nil
}

// unjoin splits an errors.Join result into its parts.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// Problems returns the messages of err without the "backend: " prefix, one per problem, in the
// form "field: problem". It is meant for Validate's result.
func Problems(err error) []string {
	if err == nil {
		return nil
	}
	var out []string
	for _, e := range unjoin(err) {
		var fe *FieldError
		if errors.As(e, &fe) {
			out = append(out, fe.Field+": "+fe.Problem)
		} else {
			out = append(out, e.Error())
		}
	}
	return out
}

// configJSON is the wire form of GET/POST /admin/config. Durations are Go duration strings.
type configJSON struct {
	Workers  int     `json:"workers"`
	Mean     string  `json:"mean"`
	Stddev   string  `json:"stddev"`
	TailProb float64 `json:"tailProb"`
	TailMean string  `json:"tailMean"`
	TailMin  string  `json:"tailMin"`
	TailMax  string  `json:"tailMax"`
	Fanout   int     `json:"fanout"`
	// Seed is the seed the service-time sequence last started from; POSTed, it starts the
	// sequence over from it (a bench's measured window then draws the same service times, in
	// the same order, whatever a warm-up drew before it).
	Seed uint64 `json:"seed"`
}

func toJSON(c Config) configJSON {
	s := c.Service
	return configJSON{
		Workers: c.Workers, Mean: s.Mean.String(), Stddev: s.Stddev.String(), TailProb: s.TailProb,
		TailMean: s.TailMean.String(), TailMin: s.TailMin.String(), TailMax: s.TailMax.String(), Fanout: s.Fanout,
		Seed: c.Seed,
	}
}

// applyPatch decodes a partial JSON object of configJSON's fields and applies it to c. It returns
// the new Config, whether the patch names a seed (the sequence then starts over from c.Seed,
// even the same one) and every problem found (unknown fields, wrong types, unparsable
// durations), each naming its field; it does not run Validate.
func applyPatch(c Config, body []byte) (Config, bool, []string) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil || raw == nil {
		return c, false, []string{"body: must be a JSON object with fields of " + fieldList()}
	}
	_, reseed := raw["seed"]
	keys := make([]string, 0, len(raw))
	for k := range raw {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var problems []string
	bad := func(field, problem string) { problems = append(problems, field+": "+problem) }
	integer := func(field string, v json.RawMessage, dst *int) {
		var f float64
		if err := json.Unmarshal(v, &f); err != nil || f != math.Trunc(f) || math.Abs(f) > math.MaxInt32 {
			bad(field, "must be an integer, got "+string(v))
			return
		}
		*dst = int(f)
	}
	duration := func(field string, v json.RawMessage, dst *time.Duration) {
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			bad(field, `must be a duration string such as "20ms", got `+string(v))
			return
		}
		d, err := time.ParseDuration(s)
		if err != nil {
			bad(field, fmt.Sprintf(`must be a duration string such as "20ms", got %q`, s))
			return
		}
		*dst = d
	}
	s := &c.Service
	for _, k := range keys {
		v := raw[k]
		if bytes.Equal(bytes.TrimSpace(v), []byte("null")) {
			bad(k, "must not be null")
			continue
		}
		switch k {
		case "workers":
			integer(k, v, &c.Workers)
		case "fanout":
			integer(k, v, &s.Fanout)
		case "tailProb":
			if err := json.Unmarshal(v, &s.TailProb); err != nil {
				bad(k, "must be a number in [0, 1], got "+string(v))
			}
		case "mean":
			duration(k, v, &s.Mean)
		case "stddev":
			duration(k, v, &s.Stddev)
		case "tailMean":
			duration(k, v, &s.TailMean)
		case "tailMin":
			duration(k, v, &s.TailMin)
		case "tailMax":
			duration(k, v, &s.TailMax)
		case "seed":
			if err := json.Unmarshal(v, &c.Seed); err != nil {
				bad(k, "must be a non-negative integer, got "+string(v))
			}
		default:
			bad(k, "unknown field; known fields are "+fieldList())
		}
	}
	return c, reseed, problems
}

func fieldList() string {
	return "workers, mean, stddev, tailProb, tailMean, tailMin, tailMax, fanout, seed"
}
