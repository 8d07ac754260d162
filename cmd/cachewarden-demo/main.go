// Command cachewarden-demo runs the whole cachewarden pipeline once on
// local services and shows what happens: `make demo` builds and runs it.
// It is a command of its own so that the production binary, cachewarden,
// links neither the test and demo harness (package integration) nor the
// in-process Kafka-protocol broker it starts; `cachewarden demo` only
// points here.
//
// Exit status: 0 when the final consistency check passes, 1 when it or
// the demo fails, 2 on a command-line mistake.
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
	"slices"
	"strings"
	"syscall"

	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/integration"
)

// Environment variables the demo reads for its services when no flag
// names them; `make services` writes the first two to .services/env.
const (
	envMemcached = "CACHEWARDEN_TEST_MEMCACHED"
	envMySQLDSN  = "CACHEWARDEN_TEST_MYSQL_DSN"
	envKafka     = "CACHEWARDEN_TEST_KAFKA"
	// envBinlogDSN names the MariaDB with the binary log on that
	// --source binlog uses (`make services-bench` or `make services`).
	envBinlogDSN = "CACHEWARDEN_TEST_MYSQL_BINLOG_DSN"
)

// The MySQL DSNs used when neither --mysql nor the environment names one:
// the server `make services-demo` starts, and the binary log server of
// `scripts/services.sh demo-binlog` (what `make demo DEMO_FLAGS="--source
// binlog"` runs).
const (
	defaultMySQLDSN  = "root@tcp(127.0.0.1:3306)/"
	defaultBinlogDSN = "root@tcp(127.0.0.1:3307)/"
)

// errUsage marks a command-line mistake: exit status 2.
var errUsage = errors.New("usage")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(report(err, os.Stderr))
}

// report writes err to stderr unless package flag already has, and
// returns the exit status for it.
func report(err error, stderr io.Writer) int {
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		if !errors.Is(err, errFlagReported) {
			fmt.Fprintf(stderr, "cachewarden-demo: %v\n", err)
		}
		return 2
	}
	fmt.Fprintf(stderr, "cachewarden-demo: %v\n", err)
	return 1
}

// errFlagReported marks a flag error package flag has printed already.
var errFlagReported = errors.New("reported by package flag")

// usageErrorf returns a command-line mistake described by format.
func usageErrorf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errUsage}, args...)...)
}

// demoFlags are the parsed command line.
type demoFlags struct {
	params               integration.DemoParams
	logLevel, logFormat  string
	kafkaList, formatArg string
	source               string
}

// newFlags declares the demo's flags on a flag set writing to stderr.
func newFlags(stderr io.Writer) (*flag.FlagSet, *demoFlags) {
	fs := flag.NewFlagSet("cachewarden-demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: cachewarden-demo %s\n\n%s\n\nFlags:\n", synopsis, description)
		fs.PrintDefaults()
	}
	f := &demoFlags{}
	p := &f.params
	fs.StringVar(&p.ConfigPath, "c", "configs/cachewarden.yaml", "daemon config whose rules, topics and group the demo uses")
	fs.StringVar(&p.Memcached, "memcached", envOr(envMemcached, "127.0.0.1:11311"), "memcached host:port")
	fs.StringVar(&p.MySQLDSN, "mysql", "", "MySQL DSN of a user that may create databases (its database name is ignored); default $"+envMySQLDSN+
		", else "+defaultMySQLDSN+"; with --source binlog $"+envBinlogDSN+", else "+defaultBinlogDSN)
	fs.StringVar(&f.source, "source", string(config.SourceKafka), "where the daemon reads changes: kafka (CDC events published to a broker) or binlog (the MySQL server's binary log, read as a replica: no broker)")
	fs.StringVar(&p.Database, "database", "cachewarden_demo", "database the demo drops and creates")
	fs.StringVar(&f.kafkaList, "kafka", os.Getenv(envKafka), "comma-separated Kafka brokers (default: an in-process broker)")
	fs.StringVar(&f.formatArg, "format", string(integration.Debezium), "CDC format published: "+formatNames())
	fs.IntVar(&p.Rounds, "rounds", 6, "rounds of changes")
	fs.IntVar(&p.Size, "size", 12, "transactions per round")
	fs.Uint64Var(&p.Seed, "seed", 0, "workload seed (0: random)")
	fs.BoolVar(&p.Verbose, "v", false, "print every transaction, and the daemon's logs down to level info on stderr")
	fs.StringVar(&f.logLevel, "log-level", "", "the daemon's minimum log level: debug, info, warn or error (default error, with -v info)")
	fs.StringVar(&f.logFormat, "log-format", "text", "the daemon's log format: text or json")
	return fs, f
}

const synopsis = "[-c FILE] [--source kafka|binlog] [--memcached ADDR] [--mysql DSN] [--database NAME] [--kafka ADDRS] [--format FORMAT] [--rounds N] [--size N]"

const description = "Runs cachewarden end to end and shows what happens: starts an in-process\n" +
	"Kafka-protocol broker (or uses --kafka), creates the example schema in a\n" +
	"fresh MySQL database, changes rows and publishes the matching CDC events,\n" +
	"runs the daemon in this process on the config's rules (its brokers,\n" +
	"memcached servers and DSN replaced by the live ones), and prints the\n" +
	"events, the cache operations and sample keys round by round. At the end it\n" +
	"checks that every set and counter in memcached equals the database and\n" +
	"that the namespace of every changed entity moved; exit status 1 if not.\n" +
	"With --source binlog no broker runs: the daemon reads the binary log of\n" +
	"the MySQL server (a MariaDB with the binary log on and GTIDs) as a\n" +
	"replica, and no broken message is shown.\n" +
	"Services default to $" + envMemcached + ", $" + envMySQLDSN + " and\n" +
	"$" + envKafka + " (what `make services` writes), else the local defaults.\n" +
	"Before it starts, it checks that memcached, MySQL and --kafka answer, and\n" +
	"fails within seconds naming each one that does not.\n" +
	"The daemon logs errors only (-v: from info; --log-level sets it)."

// run executes one command line (without the program name).
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	params, log, err := parseArgs(args, stderr)
	if err != nil {
		return err
	}
	if err := demoPreflight(ctx, params.Memcached, params.MySQLDSN, params.Kafka, params.Source == config.SourceBinlog); err != nil {
		return err
	}
	return integration.RunDemo(ctx, params, stdout, log)
}

// parseArgs parses and checks the command line and returns the demo's
// parameters and the daemon's logger, which writes to stderr.
func parseArgs(args []string, stderr io.Writer) (integration.DemoParams, *slog.Logger, error) {
	fs, f := newFlags(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return integration.DemoParams{}, nil, err
		}
		return integration.DemoParams{}, nil, fmt.Errorf("%w: %w: %v", errUsage, errFlagReported, err)
	}
	p := f.params
	p.Format = integration.Format(f.formatArg)
	p.Kafka = splitList(f.kafkaList)
	p.Source = config.SourceKind(f.source)
	if p.MySQLDSN == "" {
		p.MySQLDSN = envOr(envMySQLDSN, defaultMySQLDSN)
		if p.Source == config.SourceBinlog {
			p.MySQLDSN = envOr(envBinlogDSN, defaultBinlogDSN)
		}
	}
	switch {
	case fs.NArg() > 0:
		fs.Usage()
		return p, nil, usageErrorf("unexpected argument %q", fs.Arg(0))
	case !slices.Contains(config.SourceKinds, p.Source):
		return p, nil, usageErrorf("--source %q: want kafka or binlog", f.source)
	case p.Source == config.SourceBinlog && (p.Format != integration.Debezium || len(p.Kafka) > 0):
		return p, nil, usageErrorf("--source binlog reads no broker: --format and --kafka do not apply")
	case !slices.Contains(integration.Formats, p.Format):
		return p, nil, usageErrorf("--format %q: want one of %s", f.formatArg, formatNames())
	case !integration.ValidDemoDatabase(p.Database):
		return p, nil, usageErrorf("--database %q: want letters, digits and _", p.Database)
	case p.Rounds < 1 || p.Size < 1:
		return p, nil, usageErrorf("--rounds and --size must be at least 1")
	}
	log, err := f.logger(stderr)
	return p, log, err
}

// logger returns the daemon's logger: level error, info with -v, or
// --log-level when given. The daemon's warnings (a poison message, say)
// would otherwise interleave with the report.
func (f *demoFlags) logger(stderr io.Writer) (*slog.Logger, error) {
	level := slog.LevelError
	if f.params.Verbose {
		level = slog.LevelInfo
	}
	if f.logLevel != "" {
		if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
			return nil, usageErrorf("--log-level %q: want debug, info, warn or error", f.logLevel)
		}
	}
	if format := strings.ToLower(f.logFormat); format != "text" && format != "json" {
		return nil, usageErrorf("--log-format %q: want text or json", f.logFormat)
	}
	return config.NewLogger(stderr, f.logFormat, level), nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func formatNames() string {
	names := make([]string, len(integration.Formats))
	for i, f := range integration.Formats {
		names[i] = string(f)
	}
	return strings.Join(names, ", ")
}
