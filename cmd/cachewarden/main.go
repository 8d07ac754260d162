// Command cachewarden keeps memcached consistent with MySQL by turning CDC
// events read from Kafka into namespace bumps, set updates and counter
// changes. Run `cachewarden help` for the subcommands.
//
// Exit status: 0 on success, 1 when a command fails, 2 on a command-line
// mistake, 78 (EX_CONFIG of sysexits.h) when the config file or its rule
// files cannot be loaded: a service manager should not restart a daemon
// whose configuration is wrong (deploy/systemd: RestartPreventExitStatus).
//
// It only wires: each subcommand (one file each: run.go, replay.go,
// check.go, verify.go, plan.go, rules.go, observe.go, demo.go,
// doctor.go, probe.go, version.go, key.go, invalidate.go, config.go, dlq.go)
// parses its flags, loads the config and calls the packages that do the
// work (consumer, check, doctor, verify, inspect, ruletest). The demo is a
// command of its own, cmd/cachewarden-demo, so that this binary links
// neither the test and demo harness (package integration) nor its
// in-process broker; `cachewarden demo` says so and exits with status 2.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/cachewarden/cachewarden/config"
)

// command is one subcommand: an entry of app.commands.
type command struct {
	name string
	// help is a one-line description for `cachewarden help`.
	help string
	// run receives the arguments after the command name. It writes its
	// results to stdout and diagnostics to stderr.
	run func(ctx context.Context, args []string, stdout, stderr io.Writer) error
}

// app holds what every subcommand shares: the logger built from the global
// flags and the standard input. A new app is built for each invocation.
type app struct {
	log   *slog.Logger
	stdin io.Reader
	// logFlags are the global --log-format and --log-level as given;
	// commands that read a config file apply them over its log section.
	logFlags logFlags
}

// commands is the subcommand table, in the order `cachewarden help` lists
// it. Adding a subcommand is adding an entry here.
func (a *app) commands() []command {
	return []command{
		{name: "run", help: "run the daemon: consume CDC topics and keep memcached in step (run -c FILE)", run: a.runCmd},
		{name: "check", help: "check config, rules and rule tests, and with --dsn the rules against the live schema (check -c FILE)", run: a.checkCmd},
		{name: "rules", help: "check rule files or run rule unit tests (rules check|test)", run: a.rulesCmd},
		{name: "plan", help: "print the cache operations planned for CDC messages read from stdin", run: a.planCmd},
		{name: "replay", help: "re-apply a range of the CDC topics, or an NDJSON file (replay -c FILE --from START | --file F)", run: a.replayCmd},
		{name: "dlq", help: "list the dead-letter topic, or re-apply chosen dead letters with the current rules (dlq list|redrive -c FILE)", run: a.dlqCmd},
		{name: "observe", help: "check continuously that memcached reflects the changes another daemon applies (observe -c FILE)", run: a.observeCmd},
		{name: "verify", help: "compare the sets and counters in memcached with MySQL", run: a.verifyCmd},
		{name: "key", help: "show one entity's items in memcached, what they mean and what MySQL says (key -c FILE --rule R COL=VAL)", run: a.keyCmd},
		{name: "invalidate", help: "bump a namespace, delete a set or counter, or bump a table's fallbacks by hand (invalidate -c FILE --rule R COL=VAL | --table DB.T)", run: a.invalidateCmd},
		{name: "config", help: "print the effective config: defaults filled, environment expanded, secrets redacted (config print -c FILE)", run: a.configCmd},
		{name: "demo", help: "the demo is its own command: `make demo` runs cmd/cachewarden-demo", run: a.demoCmd},
		{name: "doctor", help: "check that the topics, the DLQ, the group, every memcached server and MySQL are there and usable (doctor -c FILE)", run: a.doctorCmd},
		{name: "probe", help: "ask a running daemon's /readyz and exit 0 only when it is ready (for images without a shell)", run: a.probeCmd},
		{name: "version", help: "print the version and the versions of the modules linked in", run: a.versionCmd},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil && !alreadyReported(err) {
		fmt.Fprintf(os.Stderr, "cachewarden: %v\n", err)
	}
	os.Exit(exitCode(err))
}

// run executes one command line (without the program name), reading
// standard input from os.Stdin.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runWithInput(ctx, os.Stdin, args, stdout, stderr)
}

// runWithInput is run with an explicit standard input.
func runWithInput(ctx context.Context, stdin io.Reader, args []string, stdout, stderr io.Writer) error {
	a := &app{stdin: stdin}
	fs := flag.NewFlagSet("cachewarden", flag.ContinueOnError)
	fs.SetOutput(stderr)
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "info", "minimum log level: debug, info, warn or error")
	showVersion := fs.Bool("version", false, "print the version (as `cachewarden version --short` does) and exit")
	fs.Usage = func() { a.usage(fs.Output(), fs) }
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	log, err := newLogger(stderr, *logFormat, *logLevel)
	if err != nil {
		return usageErrorf("%v", err)
	}
	a.log = log
	a.logFlags = givenLogFlags(fs)

	rest := fs.Args()
	if *showVersion {
		return a.versionCmd(ctx, []string{"--short"}, stdout, stderr)
	}
	if len(rest) == 0 {
		a.usage(stderr, fs)
		return usageErrorf("no command given")
	}
	name, cmdArgs := rest[0], rest[1:]
	if name == "help" {
		return a.help(ctx, cmdArgs, stdout, stderr, fs)
	}
	for _, c := range a.commands() {
		if c.name == name {
			return c.run(ctx, cmdArgs, stdout, stderr)
		}
	}
	return usageErrorf("unknown command %q (see `cachewarden help`)", name)
}

// help implements `cachewarden help [COMMAND [SUBCOMMAND]]`: the command
// list on stdout, or the named command's own -h output.
func (a *app) help(ctx context.Context, args []string, stdout, stderr io.Writer, global *flag.FlagSet) error {
	if len(args) == 0 {
		a.usage(stdout, global)
		return nil
	}
	for _, c := range a.commands() {
		if c.name == args[0] {
			// The command's -h output is the answer: send it to stdout.
			err := c.run(ctx, append(args[1:len(args):len(args)], "-h"), stdout, stdout)
			if errors.Is(err, flag.ErrHelp) {
				return nil
			}
			return err
		}
	}
	return usageErrorf("unknown command %q (see `cachewarden help`)", args[0])
}

func (a *app) usage(w io.Writer, global *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: cachewarden [global flags] COMMAND [ARGS]\n\nCommands:\n")
	for _, c := range a.commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.help)
	}
	fmt.Fprintf(w, "  %-10s %s\n", "help", "list the commands, or describe one: help COMMAND")
	fmt.Fprintf(w, "\nGlobal flags:\n")
	global.SetOutput(w)
	global.PrintDefaults()
}

// newLogger builds the logger every command receives. It writes to w.
func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	switch strings.ToLower(format) {
	case "text", "json":
		return config.NewLogger(w, format, lvl), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

// errReported marks a failure whose details the command has already
// written to stderr; main adds nothing and exits with status 1.
var errReported = errors.New("failed (reported above)")

// errConfigReported is errReported for a config file or rule files that
// do not load; main exits with status exitConfig.
var errConfigReported = fmt.Errorf("the configuration does not load: %w", errReported)

// exitConfig is the exit status of a configuration that does not load:
// EX_CONFIG of sysexits.h.
const exitConfig = 78

// usageError is a command-line mistake; main exits with status 2.
type usageError struct {
	msg string
	// reported is true when the message was already written to stderr
	// (by package flag).
	reported bool
}

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// flagError converts an error from flag.FlagSet.Parse, which has already
// printed the message and the usage: -h stays flag.ErrHelp (status 0),
// anything else becomes a usage error that main does not print again.
func flagError(err error) error {
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	return &usageError{msg: err.Error(), reported: true}
}

// alreadyReported reports whether err's message needs no printing: -h
// output, flag errors and failures the command has described on stderr.
func alreadyReported(err error) bool {
	var ue *usageError
	if errors.As(err, &ue) {
		return ue.reported
	}
	return errors.Is(err, flag.ErrHelp) || errors.Is(err, errReported)
}

// exitCode maps run's result to the process exit status.
func exitCode(err error) int {
	var ue *usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		return 2
	case errors.Is(err, errConfigReported):
		return exitConfig
	}
	return 1
}

// configFlag adds -c and its long form --config to fs: the config file
// that run, observe, replay and check require.
func configFlag(fs *flag.FlagSet) *string {
	path := fs.String("c", "", "config file (required)")
	fs.StringVar(path, "config", "", "same as -c")
	return path
}

// parseFlags parses args, the command line of a command that takes flags
// only: -h gives flag.ErrHelp, a flag mistake or an argument a usage error
// (after the usage), naming command in the message.
func parseFlags(fs *flag.FlagSet, command string, args []string) error {
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	return checkNoArgs(fs, command)
}

// parseOperands parses args, the command line of a command that takes
// flags and at least one operand (what names it in the message, e.g.
// "PATH"), and returns the operands.
func parseOperands(fs *flag.FlagSet, command, what string, args []string) ([]string, error) {
	if err := fs.Parse(args); err != nil {
		return nil, flagError(err)
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return nil, usageErrorf("%s: no %s given", command, what)
	}
	return fs.Args(), nil
}

// checkNoArgs reports an argument left after fs's flags as a usage error.
func checkNoArgs(fs *flag.FlagSet, command string) error {
	if fs.NArg() > 0 {
		fs.Usage()
		return usageErrorf("%s: unexpected argument %q", command, fs.Arg(0))
	}
	return nil
}

// checkConfigArgs reports the mistakes every command that reads a config
// file can make after its flags: an argument, or no -c.
func checkConfigArgs(fs *flag.FlagSet, command, path string) error {
	if err := checkNoArgs(fs, command); err != nil {
		return err
	}
	if path == "" {
		fs.Usage()
		return usageErrorf("%s: -c FILE is required", command)
	}
	return nil
}

// parseConfigFlags is parseFlags for a command that requires -c, whose
// value path holds after parsing.
func parseConfigFlags(fs *flag.FlagSet, command string, args []string, path *string) error {
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	return checkConfigArgs(fs, command, *path)
}

// parseConfigOnly parses args for a command whose one flag is -c and
// loads that config file.
func parseConfigOnly(fs *flag.FlagSet, command string, args []string, stderr io.Writer) (*config.Config, error) {
	path := configFlag(fs)
	if err := parseConfigFlags(fs, command, args, path); err != nil {
		return nil, err
	}
	return loadConfig(*path, stderr)
}

// loadConfig loads the config file at path. Its problems go to stderr,
// one "file:line:col: message" per line, and errConfigReported comes back.
func loadConfig(path string, stderr io.Writer) (*config.Config, error) {
	cfg, err := config.Load(path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return nil, errConfigReported
	}
	return cfg, nil
}

// newFlagSet returns a flag set for a subcommand whose messages go to
// stderr. synopsis is the usage line after "Usage: cachewarden ".
func newFlagSet(name, synopsis, description string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: cachewarden %s\n\n%s\n", synopsis, description)
		hasFlags := false
		fs.VisitAll(func(*flag.Flag) { hasFlags = true })
		if hasFlags {
			fmt.Fprintf(fs.Output(), "\nFlags:\n")
			fs.PrintDefaults()
		}
	}
	return fs
}
