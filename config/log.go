package config

import (
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
	return NewLogger(w, l.Format, l.SlogLevel())
}

// NewLogger returns a logger writing to w at lvl: JSON lines when format
// is "json" (in any case), else slog's text format. Every logger of the
// commands is built here.
func NewLogger(w io.Writer, format string, lvl slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: lvl}
	if strings.EqualFold(format, "json") {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
