package main

import (
	"flag"
	"io"
	"log/slog"

	"github.com/cachewarden/cachewarden/config"
)

// logFlags records the global --log-format and --log-level given on the
// command line ("" when not given).
type logFlags struct {
	format, level string
}

// givenLogFlags returns the log flags set explicitly in the parsed global
// flag set fs.
func givenLogFlags(fs *flag.FlagSet) logFlags {
	var lf logFlags
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "log-format":
			lf.format = f.Value.String()
		case "log-level":
			lf.level = f.Value.String()
		}
	})
	return lf
}

// configLogger returns the logger of a command that reads a config file:
// the config's log section, each setting overridden by the global flag
// that names it when that flag was given. It writes to w.
func (a *app) configLogger(l config.Log, w io.Writer) *slog.Logger {
	level := l.SlogLevel()
	if a.logFlags.level != "" {
		// Checked by newLogger when the flags were parsed.
		_ = level.UnmarshalText([]byte(a.logFlags.level))
	}
	format := string(l.Format)
	if a.logFlags.format != "" {
		format = a.logFlags.format
	}
	return config.NewLogger(w, format, level)
}
