// Package field reports what is wrong with a configuration value, each problem naming the field
// it concerns. It is the one error type of every validator in pkg/admission, pkg/admission/limit
// and the proxy's configuration loader: a caller that validates a nested value places its
// problems under the value's own path with Nest, so a field path is built structurally and never
// recovered by taking a message apart.
package field

import (
	"fmt"
	"strings"
)

// Problem is one thing wrong with one field.
type Problem struct {
	// Field is the dotted path of the field relative to the value validated, such as
	// "gradient.buffer" or "priorities.reserved"; empty for the value as a whole.
	Field string
	// Detail says what is wrong and what is wanted.
	Detail string
}

func (p Problem) String() string {
	if p.Field == "" {
		return p.Detail
	}
	return p.Field + ": " + p.Detail
}

// Errors lists every problem found in a value. The zero value is empty and ready to use; build it
// with Add and Nest and return Err.
type Errors struct {
	Problems []Problem
}

// Add records a problem with field.
func (e *Errors) Add(field, format string, args ...any) {
	e.Problems = append(e.Problems, Problem{Field: field, Detail: fmt.Sprintf(format, args...)})
}

// Nest records the problems of err, the result of validating the value at prefix, each under
// that path. A nil err adds nothing; an error that is not an *Errors becomes one problem of the
// field prefix.
func (e *Errors) Nest(prefix string, err error) {
	if err == nil {
		return
	}
	if inner, ok := err.(*Errors); ok {
		for _, p := range inner.Problems {
			e.Problems = append(e.Problems, Problem{Field: Join(prefix, p.Field), Detail: p.Detail})
		}
		return
	}
	e.Problems = append(e.Problems, Problem{Field: prefix, Detail: err.Error()})
}

// Err returns e when it holds a problem, else nil.
func (e *Errors) Err() error {
	if e == nil || len(e.Problems) == 0 {
		return nil
	}
	return e
}

// Error lists every problem on one line.
func (e *Errors) Error() string {
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		parts[i] = p.String()
	}
	return "invalid config: " + strings.Join(parts, "; ")
}

// Fields returns the field of every problem, in order.
func (e *Errors) Fields() []string {
	out := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		out[i] = p.Field
	}
	return out
}

// Join appends field to the dotted path prefix.
func Join(prefix, field string) string {
	switch {
	case prefix == "":
		return field
	case field == "":
		return prefix
	case strings.HasPrefix(field, "["):
		return prefix + field
	}
	return prefix + "." + field
}
