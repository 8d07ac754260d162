package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/cachewarden/cachewarden/wiring"
)

// buildVersion is the version text the build stamps into the binary:
// `make build`, `make static` and deploy/container/Dockerfile link with
// -ldflags "-X main.buildVersion=$(VERSION)", VERSION being
// `git describe --tags --always --dirty` unless given. Empty in a plain
// `go build`; see binaryBuild for what is reported then. Set only by the
// linker, read only.
var buildVersion string

// binaryBuild identifies this binary: the stamped buildVersion, else the
// module version Go recorded (a `go install ...@version`), else "devel"
// and the VCS revision when the toolchain recorded one, else "unknown".
func binaryBuild() wiring.BuildInfo {
	bi, _ := debug.ReadBuildInfo()
	return buildOf(bi, buildVersion)
}

// buildOf is binaryBuild for a given build information (nil when the
// binary carries none) and stamped version.
func buildOf(bi *debug.BuildInfo, stamped string) wiring.BuildInfo {
	b := wiring.BuildInfo{Version: stamped, GoVersion: runtime.Version()}
	if bi == nil {
		if b.Version == "" {
			b.Version = "unknown"
		}
		return b
	}
	b.GoVersion = bi.GoVersion
	modified := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			b.Revision = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if b.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		b.Version = bi.Main.Version
	}
	if b.Version == "" && b.Revision != "" {
		b.Version = "devel-" + b.Revision[:min(12, len(b.Revision))]
		if modified {
			b.Version += "-dirty"
		}
	}
	if b.Version == "" {
		b.Version = "unknown"
	}
	return b
}

// versionHelp is the description `cachewarden version -h` prints.
const versionHelp = `Prints cachewarden's version (the module version, and the VCS revision and
time it was built from when known), the Go version and platform, then the
path, version and checksum of every module linked in, one a line.`

// versionCmd implements `version`: the build's version and module
// versions, from the information the Go toolchain embeds in the binary.
func (a *app) versionCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("version", "version [--short]", versionHelp, stderr)
	short := fs.Bool("short", false, "leave the module list out")
	if err := parseFlags(fs, "version", args); err != nil {
		return err
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return fmt.Errorf("version: the binary carries no build information")
	}
	return writeVersion(stdout, bi, buildVersion, !*short)
}

// writeVersion writes bi, with the stamped version text (buildVersion),
// as `cachewarden version` prints it.
func writeVersion(w io.Writer, bi *debug.BuildInfo, stamped string, modules bool) error {
	settings := map[string]string{}
	for _, s := range bi.Settings {
		settings[s.Key] = s.Value
	}
	fmt.Fprintf(w, "cachewarden %s\n", buildOf(bi, stamped).Version)
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
