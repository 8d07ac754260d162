package config

import (
	"context"
	"io"
	"log/slog"
	"strings"
)

func parseLevel(s string) (slog.Level, bool) {
	switch s {
	case "debug":
		return slog.LevelDebug, true
	case "info":
		return slog.LevelInfo, true
	case "warn", "warning":
		return slog.LevelWarn, true
	case "error":
		return slog.LevelError, true
	}
	return 0, false
}

// SlogLevel returns the configured level (info when unset or unknown).
func (l Log) SlogLevel() slog.Level {
	lvl, ok := parseLevel(l.Level)
	if !ok {
		return slog.LevelInfo
	}
	return lvl
}

// NewLogger returns a logger writing to w in the configured format and at
// the configured level.
func (l Log) NewLogger(w io.Writer) *slog.Logger {
	return NewLogger(w, string(l.Format), l.SlogLevel())
}

// NewLogger returns a logger writing to w at lvl: JSON lines when format
// is "json" (in any case), else slog's text format. Every logger of the
// commands is built here. In both formats a key appears once per line
// (the last value given wins) and durations are written as text ("5s").
func NewLogger(w io.Writer, format string, lvl slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: lvl, ReplaceAttr: durationsAsText}
	if strings.EqualFold(format, "json") {
		return slog.New(uniqueKeys{inner: slog.NewJSONHandler(w, opts)})
	}
	return slog.New(uniqueKeys{inner: slog.NewTextHandler(w, opts)})
}

// uniqueKeys writes each top-level key once per line, the last value given
// winning, as encoding/json and most log pipelines would read a repeated
// key: a logger made With("component", "consumer") that a library adapter
// logs through with its own "component" writes `"component":"kafka"` once,
// not both (a strict JSON parser rejects a repeated key). Attributes
// inside groups are written as given.
type uniqueKeys struct {
	inner slog.Handler
	// attrs are those of WithAttrs not yet handed to inner.
	attrs []slog.Attr
}

func (h uniqueKeys) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h uniqueKeys) WithAttrs(as []slog.Attr) slog.Handler {
	return uniqueKeys{inner: h.inner, attrs: append(h.attrs[:len(h.attrs):len(h.attrs)], as...)}
}

// WithGroup hands the attributes gathered so far to inner first: keys
// after a group are inside it and cannot repeat the outer ones.
func (h uniqueKeys) WithGroup(name string) slog.Handler {
	inner := h.inner
	if len(h.attrs) > 0 {
		inner = inner.WithAttrs(lastOfEachKey(h.attrs))
	}
	return uniqueKeys{inner: inner.WithGroup(name)}
}

func (h uniqueKeys) Handle(ctx context.Context, r slog.Record) error {
	if len(h.attrs) == 0 && r.NumAttrs() < 2 {
		return h.inner.Handle(ctx, r)
	}
	all := make([]slog.Attr, 0, len(h.attrs)+r.NumAttrs())
	all = append(all, h.attrs...)
	r.Attrs(func(a slog.Attr) bool {
		all = append(all, a)
		return true
	})
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	out.AddAttrs(lastOfEachKey(all)...)
	return h.inner.Handle(ctx, out)
}

// lastOfEachKey returns as with each key kept once, at the place of its
// first use, holding its last value. Attributes with an empty key (inlined
// groups) are kept as they are.
func lastOfEachKey(as []slog.Attr) []slog.Attr {
	last := make(map[string]int, len(as))
	for i, a := range as {
		if a.Key != "" {
			last[a.Key] = i
		}
	}
	out := make([]slog.Attr, 0, len(last))
	seen := make(map[string]bool, len(last))
	for _, a := range as {
		if a.Key == "" {
			out = append(out, a)
			continue
		}
		if seen[a.Key] {
			continue
		}
		seen[a.Key] = true
		out = append(out, as[last[a.Key]])
	}
	return out
}

// durationsAsText writes a time.Duration as its Go text (`"5s"`,
// `"1.5ms"`) instead of the JSON handler's integer of nanoseconds.
func durationsAsText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}
