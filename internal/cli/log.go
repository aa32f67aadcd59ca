package cli

import (
	"io"
	"log/slog"
	"time"
)

// NewLogger returns the JSON logger of every command that logs: records of level and above to w,
// durations written as durations.
func NewLogger(w io.Writer, level slog.Leveler) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level, ReplaceAttr: ReplaceAttr}))
}

// ReplaceAttr writes durations as people read them ("5s", "250ms"): the JSON handler would
// write a time.Duration, and any type holding one (config.Duration), as nanoseconds.
func ReplaceAttr(_ []string, a slog.Attr) slog.Attr {
	switch v := a.Value; {
	case v.Kind() == slog.KindDuration:
		a.Value = slog.StringValue(v.Duration().String())
	case v.Kind() == slog.KindAny:
		if d, ok := v.Any().(interface{ D() time.Duration }); ok {
			a.Value = slog.StringValue(d.D().String())
		}
	}
	return a
}
