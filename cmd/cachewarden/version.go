package main

import (
	"context"
	"fmt"
	"io"
	"runtime/debug"
	"strings"
)

// versionCmd implements `version`: the build's version and module
// versions, from the information the Go toolchain embeds in the binary.
func (a *app) versionCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("version",
		"version [--short]",
		"Prints cachewarden's version (the module version, and the VCS revision and\n"+
			"time it was built from when known), the Go version and platform, then the\n"+
			"path, version and checksum of every module linked in, one a line.",
		stderr)
	short := fs.Bool("short", false, "leave the module list out")
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return usageErrorf("version: unexpected argument %q", fs.Arg(0))
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return fmt.Errorf("version: the binary carries no build information")
	}
	return writeVersion(stdout, bi, !*short)
}

// writeVersion writes bi as `cachewarden version` prints it.
func writeVersion(w io.Writer, bi *debug.BuildInfo, modules bool) error {
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	version := bi.Main.Version
	if version == "" {
		version = "(unknown)"
	}
	fmt.Fprintf(w, "cachewarden %s\n", version)
	fmt.Fprintf(w, "module      %s\n", bi.Main.Path)
	fmt.Fprintf(w, "go          %s\n", bi.GoVersion)
	if rev := settings["vcs.revision"]; rev != "" {
		dirty := ""
		if settings["vcs.modified"] == "true" {
			dirty = " (modified)"
		}
		fmt.Fprintf(w, "revision    %s%s\n", rev, dirty)
	}
	if t := settings["vcs.time"]; t != "" {
		fmt.Fprintf(w, "built from  %s\n", t)
	}
	for _, k := range []string{"GOOS", "GOARCH", "CGO_ENABLED"} {
		if v := settings[k]; v != "" {
			fmt.Fprintf(w, "%-11s %s\n", k, v)
		}
	}
	if !modules {
		return nil
	}
	fmt.Fprintf(w, "modules:\n")
	for _, m := range bi.Deps {
		line := fmt.Sprintf("  %s %s", m.Path, m.Version)
		if r := m.Replace; r != nil {
			line += strings.TrimSuffix(" => "+r.Path+" "+r.Version, " ")
		}
		if m.Sum != "" {
			line += " " + m.Sum
		}
		if _, err := fmt.Fprintln(w, line); err != nil {
			return fmt.Errorf("version: %w", err)
		}
	}
	return nil
}
