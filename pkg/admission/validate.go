package admission

import "github.com/loadshed/loadshed/pkg/admission/field"

// ConfigError lists every problem found in a strategy configuration, each naming the field it
// concerns ("maxWait: must be a positive duration ..."). It is the shared field error type of
// package field, so a caller validating a nested configuration places the problems under its own
// path with field.Errors.Nest.
type ConfigError = field.Errors

// fieldErrors collects the problems of one configuration.
type fieldErrors struct{ list field.Errors }

func (e *fieldErrors) add(name, format string, args ...any) { e.list.Add(name, format, args...) }

func (e *fieldErrors) nest(prefix string, err error) { e.list.Nest(prefix, err) }

func (e *fieldErrors) err() error { return e.list.Err() }
