package main

import (
	"context"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/integration"
)

// Environment variables the demo reads for its services when no flag
// names them; `make services` writes the first two to .services/env.
const (
	envMemcached = "CACHEWARDEN_TEST_MEMCACHED"
	envMySQLDSN  = "CACHEWARDEN_TEST_MYSQL_DSN"
	envKafka     = "CACHEWARDEN_TEST_KAFKA"
)

// demoCmd implements `demo`: the whole pipeline on local services, shown
// as it happens, then checked.
func (a *app) demoCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo",
		"demo [-c FILE] [--memcached ADDR] [--mysql DSN] [--database NAME] [--kafka ADDRS] [--format FORMAT] [--rounds N] [--size N]",
		"Runs cachewarden end to end and shows what happens: starts an in-process\n"+
			"Kafka-protocol broker (or uses --kafka), creates the example schema in a\n"+
			"fresh MySQL database, changes rows and publishes the matching CDC events,\n"+
			"runs the daemon in this process on the config's rules (its brokers,\n"+
			"memcached servers and DSN replaced by the live ones), and prints the\n"+
			"events, the cache operations and sample keys round by round. At the end it\n"+
			"checks that every set and counter in memcached equals the database and\n"+
			"that the namespace of every changed entity moved; exit status 1 if not.\n"+
			"Services default to $"+envMemcached+", $"+envMySQLDSN+" and\n"+
			"$"+envKafka+" (what `make services` writes), else the local defaults.\n"+
			"Before it starts, it checks that memcached, MySQL and --kafka answer, and\n"+
			"fails within seconds naming each one that does not.\n"+
			"The daemon logs errors only (-v: from info; a global --log-level sets it).",
		stderr)
	configPath := fs.String("c", "configs/cachewarden.yaml", "daemon config whose rules, topics and group the demo uses")
	mcAddr := fs.String("memcached", envOr(envMemcached, "127.0.0.1:11311"), "memcached host:port")
	dsn := fs.String("mysql", envOr(envMySQLDSN, "root@tcp(127.0.0.1:3306)/"), "MySQL DSN of a user that may create databases (its database name is ignored)")
	dbName := fs.String("database", "cachewarden_demo", "database the demo drops and creates")
	kafkaAddrs := fs.String("kafka", os.Getenv(envKafka), "comma-separated Kafka brokers (default: an in-process broker)")
	formatName := fs.String("format", string(integration.Debezium), "CDC format published: "+formatNames())
	rounds := fs.Int("rounds", 6, "rounds of changes")
	size := fs.Int("size", 12, "transactions per round")
	seed := fs.Uint64("seed", 0, "workload seed (0: random)")
	verbose := fs.Bool("v", false, "print every transaction, and the daemon's logs down to level info on stderr")
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	format := integration.Format(*formatName)
	switch {
	case fs.NArg() > 0:
		fs.Usage()
		return usageErrorf("demo: unexpected argument %q", fs.Arg(0))
	case !slices.Contains(integration.Formats, format):
		return usageErrorf("demo: --format %q: want one of %s", *formatName, formatNames())
	case !integration.ValidDemoDatabase(*dbName):
		return usageErrorf("demo: --database %q: want letters, digits and _", *dbName)
	case *rounds < 1 || *size < 1:
		return usageErrorf("demo: --rounds and --size must be at least 1")
	}
	// The daemon's warnings (a poison message, say) would interleave with
	// the report; -v shows them, and a global --log-level sets the level.
	logCfg := config.Log{Level: "error"}
	if *verbose {
		logCfg.Level = "info"
	}
	log := a.configLogger(logCfg, stderr)
	if err := demoPreflight(ctx, *mcAddr, *dsn, splitList(*kafkaAddrs)); err != nil {
		return err
	}
	return integration.RunDemo(ctx, integration.DemoParams{
		ConfigPath: *configPath, Memcached: *mcAddr, MySQLDSN: *dsn, Database: *dbName,
		Kafka: splitList(*kafkaAddrs), Format: format, Rounds: *rounds, Size: *size, Seed: *seed,
		Verbose: *verbose,
	}, stdout, log)
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
