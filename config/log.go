package config

import (
	"io"
	"log/slog"
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
	opts := &slog.HandlerOptions{Level: l.SlogLevel()}
	if l.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
