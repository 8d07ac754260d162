package config

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestLoggerWritesEachKeyOnce(t *testing.T) {
	tests := []struct {
		name string
		log  func(*slog.Logger)
		json string // the line after "time", "level" and "msg"
		text string
	}{
		{"with, then the record", func(l *slog.Logger) { l.With("component", "consumer").Info("m", "component", "kafka", "n", 1) },
			`"component":"kafka","n":1}`, `component=kafka n=1`},
		{"twice with", func(l *slog.Logger) { l.With("a", 1).With("b", 2, "a", 3).Info("m") },
			`"a":3,"b":2}`, `a=3 b=2`},
		{"in the record", func(l *slog.Logger) { l.Info("m", "a", 1, "a", 2) },
			`"a":2}`, `a=2`},
		{"a group keeps its own keys", func(l *slog.Logger) { l.With("a", 1).WithGroup("g").Info("m", "a", 2) },
			`"a":1,"g":{"a":2}}`, `a=1 g.a=2`},
		{"durations as text", func(l *slog.Logger) {
			l.Info("m", "timeout", 5*time.Second, "cfg", slog.GroupValue(slog.Duration("wait", 1500*time.Microsecond)))
		}, `"timeout":"5s","cfg":{"wait":"1.5ms"}}`, `timeout=5s cfg.wait=1.5ms`},
	}
	for _, tt := range tests {
		for _, format := range []string{"json", "text"} {
			var buf bytes.Buffer
			tt.log(NewLogger(&buf, format, slog.LevelInfo))
			want := tt.json
			if format == "text" {
				want = tt.text
			}
			if got := strings.TrimSpace(buf.String()); !strings.HasSuffix(got, want) {
				t.Errorf("%s, %s: %s\nwant it to end %s", tt.name, format, got, want)
			}
		}
	}
}
