package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/go-sql-driver/mysql"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/integration"
	"github.com/cachewarden/cachewarden/rules"
)

// Environment variables the demo reads for its services when no flag
// names them; `make services` writes the first two to .services/env.
const (
	envMemcached = "CACHEWARDEN_TEST_MEMCACHED"
	envMySQLDSN  = "CACHEWARDEN_TEST_MYSQL_DSN"
	envKafka     = "CACHEWARDEN_TEST_KAFKA"
)

// demoDatabase is a plain MySQL identifier: the demo drops and creates it.
var demoDatabase = regexp.MustCompile(`^[A-Za-z0-9_]{1,64}$`)

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
			"$"+envKafka+" (what `make services` writes), else the local defaults.",
		stderr)
	configPath := fs.String("c", "configs/cachewarden.yaml", "daemon config whose rules, topics and group the demo uses")
	mcAddr := fs.String("memcached", envOr(envMemcached, "127.0.0.1:11211"), "memcached host:port")
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
	case !demoDatabase.MatchString(*dbName):
		return usageErrorf("demo: --database %q: want letters, digits and _", *dbName)
	case *rounds < 1 || *size < 1:
		return usageErrorf("demo: --rounds and --size must be at least 1")
	}
	// The daemon's warnings (a poison message, say) would interleave with
	// the report; -v shows them.
	level := slog.LevelError
	if *verbose {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	d := &demo{out: stdout, verbose: *verbose, format: format}
	return d.run(ctx, log, demoParams{
		configPath: *configPath, memcached: *mcAddr, dsn: *dsn, database: *dbName,
		kafka: splitList(*kafkaAddrs), rounds: *rounds, size: *size, seed: *seed,
	})
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

type demoParams struct {
	configPath, memcached, dsn, database string
	kafka                                []string
	rounds, size                         int
	seed                                 uint64
}

// demo prints the run for people.
type demo struct {
	out     io.Writer
	verbose bool
	format  integration.Format
	step    int
}

func (d *demo) printf(format string, args ...any) { fmt.Fprintf(d.out, format, args...) }

func (d *demo) section(format string, args ...any) {
	d.step++
	d.printf("\n%d. %s\n", d.step, fmt.Sprintf(format, args...))
}

// errDemoFailed means the final check found the cache wrong.
var errDemoFailed = errors.New("demo: the cache disagrees with the database")

func (d *demo) run(ctx context.Context, log *slog.Logger, p demoParams) error {
	began := time.Now()
	cfg, err := config.Load(p.configPath)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	dsn, err := createDatabase(ctx, p.dsn, p.database)
	if err != nil {
		return err
	}
	cfg.Memcached.Servers = []string{p.memcached}
	cfg.MySQL.DSN = dsn

	d.printf("cachewarden demo: row changes in MySQL -> CDC events in Kafka -> cachewarden -> memcached\n")
	s, err := integration.NewScenario(ctx, integration.Services{Memcached: p.memcached, MySQLDSN: dsn, Brokers: p.kafka},
		integration.ScenarioOptions{
			Format:   d.format,
			Group:    cfg.Kafka.Group,
			Rules:    cfg.Rules,
			Snapshot: true,
			Workload: integration.WorkloadOptions{Seed: p.seed, KeyMoves: d.format.HasBefore()},
			Log:      log,
		})
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer s.Close()
	for _, t := range s.Topics {
		if !slices.Contains(cfg.Kafka.Topics, t) {
			return fmt.Errorf("demo: %s does not consume topic %s, where the demo publishes %s changes", p.configPath, t, strings.TrimPrefix(t, s.Opts.TopicPrefix+"."))
		}
	}
	cfg.Kafka.Brokers = s.Broker.Addrs()
	if d.format == integration.DebeziumFlatRow {
		cfg.Kafka.TopicTables = s.ConfigFile("").Kafka.TopicTables
	}

	broker := "in-process Kafka-protocol broker"
	if !s.Broker.InProcess() {
		broker = "Kafka"
	}
	positions := "binary log off: event positions are made up"
	if s.Workload.BinlogPositions() {
		positions = "binary log positions from SHOW MASTER STATUS"
	}
	d.printf("  broker     %s at %s, %d topics x %d partitions\n", broker, strings.Join(s.Broker.Addrs(), ","), len(s.Topics), s.Opts.Partitions)
	d.printf("  memcached  %s\n", p.memcached)
	d.printf("  database   %s (%s)\n", p.database, positions)
	d.printf("  rules      %s: %s\n", strings.Join(cfg.Rules, ", "), describeRules(s.Rules))
	d.printf("  workload   seed %d, ids from %d on (keys of earlier runs are not reused)\n", s.Workload.Seed(), s.Workload.IDBase()+1)

	d.section("initial data: %s", countTables(s.Snapshot))
	if d.format.SupportsSnapshot() {
		d.printf("   published as %d %s snapshot events\n", len(s.Snapshot), d.format)
	}

	start := time.Now()
	daemon, err := integration.StartDaemon(ctx, cfg, log, integration.FastGroupTiming)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer daemon.Stop()
	if err := s.WaitCaughtUp(ctx); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	counts, err := daemon.Counts()
	if err != nil {
		return err
	}
	d.section("daemon running in this process (group %s): caught up in %s", cfg.Kafka.Group, since(start))
	d.printCounts(counts)

	if err := s.Warm(ctx); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	d.section("an application reads the cache: %d namespaces, %d sets, %d counters",
		len(s.Warmed.Namespaces), len(s.Warmed.Sets), len(s.Warmed.Counters))
	var samples []string
	if len(s.Warmed.Namespaces) > 0 {
		keys := make([]string, 0, len(s.Warmed.Namespaces))
		for k := range s.Warmed.Namespaces {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		samples = append(samples, keys[0])
	}
	if len(s.Warmed.Sets) > 0 {
		samples = append(samples, s.Warmed.Sets[0])
	}
	if len(s.Warmed.Counters) > 0 {
		samples = append(samples, s.Warmed.Counters[0])
	}
	values, err := d.read(s.MC, s.Rules, samples)
	if err != nil {
		return err
	}
	for _, k := range samples {
		d.printf("   %-34s %s\n", k, values[k])
	}

	for r := 1; r <= p.rounds; r++ {
		if err := d.round(ctx, s, daemon, r, p.size); err != nil {
			return err
		}
	}

	if err := d.poison(ctx, s, cfg, daemon); err != nil {
		return err
	}

	d.section("check: memcached against %s", p.database)
	rep, ns, err := s.Check(ctx)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	var tbl strings.Builder
	rep.WriteText(&tbl)
	for _, line := range strings.Split(strings.TrimRight(tbl.String(), "\n"), "\n") {
		d.printf("   %s\n", line)
	}
	d.printf("   namespaces: %d bumped as planned, %d untouched kept their version\n", ns.Moved, ns.Stayed)
	for _, prob := range ns.Problems {
		d.printf("   NAMESPACE %s\n", prob)
	}
	if err := daemon.Stop(); err != nil {
		return fmt.Errorf("demo: daemon: %w", err)
	}
	if !rep.OK() || !ns.OK() || rep.Checked == 0 {
		d.printf("\nFAILED after %s: the cache disagrees with the database (workload seed %d)\n", since(began), s.Workload.Seed())
		return errDemoFailed
	}
	d.printf("\nOK after %s: every set and counter equals the database, every changed entity's namespace moved\n", since(began))
	return nil
}

// round makes one round of changes, shows them, waits for the daemon and
// shows what it did.
func (d *demo) round(ctx context.Context, s *integration.Scenario, daemon *integration.Daemon, n, size int) error {
	before, err := daemon.Counts()
	if err != nil {
		return err
	}
	// Pick the keys to show before publishing, so their old values can be
	// read: the changes are planned here as the daemon will plan them.
	txs, err := s.Change(ctx, size)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	ops, err := integration.PlanOps(s.Rules, d.format, txs)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	sample := sampleKeys(ops, 3)
	old, err := d.read(s.MC, s.Rules, sample)
	if err != nil {
		return err
	}
	start := time.Now()
	msgs, err := s.PublishTxs(ctx, txs)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	rows := 0
	for _, tx := range txs {
		rows += len(tx.Changes)
	}
	d.section("round %d: %d transactions, %d row changes, %d messages published", n, len(txs), rows, msgs)
	shown := txs
	if !d.verbose && len(shown) > 4 {
		shown = shown[:4]
	}
	for _, tx := range shown {
		d.printf("   - %s\n", tx.Desc)
	}
	if len(shown) < len(txs) {
		d.printf("   - ... %d more (-v shows all)\n", len(txs)-len(shown))
	}
	if err := s.WaitCaughtUp(ctx); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	took := since(start)
	after, err := daemon.Counts()
	if err != nil {
		return err
	}
	d.printf("   daemon caught up in %s:\n", took)
	d.printCounts(after.Sub(before))
	now, err := d.read(s.MC, s.Rules, sample)
	if err != nil {
		return err
	}
	for _, k := range sample {
		d.printf("   %-34s %s -> %s\n", k, old[k], now[k])
	}
	return nil
}

// poison publishes a message that cannot be decoded and shows it land in
// the dead-letter topic.
func (d *demo) poison(ctx context.Context, s *integration.Scenario, cfg *config.Config, daemon *integration.Daemon) error {
	if cfg.Kafka.DLQTopic == "" {
		return nil
	}
	topic := s.Topics[len(s.Topics)-1]
	d.section("a broken message on %s", topic)
	msg := integration.OutMessage{Topic: topic, Key: []byte(`{"id":0}`), Value: []byte(`{"before":null,"after":{"id":`)}
	if err := s.Publisher.PublishRaw(ctx, msg); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	if err := s.WaitCaughtUp(ctx); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	dead, err := s.Broker.ReadAll(ctx, cfg.Kafka.DLQTopic)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	for _, m := range dead {
		if string(m.Value) == string(msg.Value) {
			d.printf("   skipped and copied to %s with headers:\n", cfg.Kafka.DLQTopic)
			for _, h := range []string{"cachewarden.error", "cachewarden.topic", "cachewarden.partition", "cachewarden.offset"} {
				d.printf("     %s: %s\n", h, m.Headers[h])
			}
			return nil
		}
	}
	return fmt.Errorf("demo: the broken message is not in %s", cfg.Kafka.DLQTopic)
}

func (d *demo) printCounts(c integration.Counts) {
	d.printf("     events %.0f (%s)\n", integration.Total(c.Events), integration.Summary(c.Events))
	kinds := map[string]float64{}
	for k, v := range c.Ops {
		kind, outcome, _ := strings.Cut(k, "/")
		kinds[kind+" "+outcome] += v
	}
	d.printf("     cache ops %.0f (%s)\n", integration.Total(c.Ops), integration.Summary(kinds))
	if len(c.Recounts) > 0 {
		d.printf("     recounts: %s\n", integration.Summary(c.Recounts))
	}
}

// sampleKeys picks up to n keys of planned ops, one per op kind first.
func sampleKeys(ops []rules.Op, n int) []string {
	var out []string
	seenKind := map[rules.RuleKind]bool{}
	seen := map[string]bool{}
	for pass := 0; pass < 2 && len(out) < n; pass++ {
		for _, op := range ops {
			if len(out) == n {
				break
			}
			if seen[op.Key] || (pass == 0 && seenKind[op.Rule.Kind]) {
				continue
			}
			seen[op.Key], seenKind[op.Rule.Kind] = true, true
			out = append(out, op.Key)
		}
	}
	return out
}

// read renders the items at keys for people: a namespace or counter as its
// number, a set as its members, "(missing)" when absent.
func (d *demo) read(mc *memcache.Client, rs *rules.RuleSet, keys []string) (map[string]string, error) {
	items, err := mc.GetMulti(keys)
	if err != nil {
		return nil, fmt.Errorf("demo: read memcached: %w", err)
	}
	out := make(map[string]string, len(keys))
	for _, k := range keys {
		it, ok := items[k]
		switch {
		case !ok:
			out[k] = "(missing)"
		case isSetKey(rs, k):
			members := cacheops.DecodeSet(it.Value).Members
			for i, m := range members {
				members[i] = cacheops.Unescape(m)
			}
			sort.Strings(members)
			out[k] = "{" + strings.Join(members, ", ") + "}"
		default:
			out[k] = strings.TrimRight(string(it.Value), " ")
		}
	}
	return out, nil
}

// isSetKey reports whether key belongs to a set rule: its prefix and the
// literal start of its template match.
func isSetKey(rs *rules.RuleSet, key string) bool {
	for _, r := range rs.Rules() {
		if r.Kind != rules.SetRule {
			continue
		}
		lit, _, _ := strings.Cut(r.Key.String(), "{")
		if strings.HasPrefix(key, r.Prefix+lit) {
			return true
		}
	}
	return false
}

func describeRules(rs *rules.RuleSet) string {
	n := map[rules.RuleKind]int{}
	for _, r := range rs.Rules() {
		n[r.Kind]++
	}
	return fmt.Sprintf("%d rules (%d bump, %d set, %d count)", len(rs.Rules()), n[rules.BumpRule], n[rules.SetRule], n[rules.CountRule])
}

func countTables(changes []integration.Change) string {
	var order []string
	n := map[string]int{}
	for _, c := range changes {
		if n[c.Event.Table] == 0 {
			order = append(order, c.Event.Table)
		}
		n[c.Event.Table]++
	}
	parts := make([]string, len(order))
	for i, t := range order {
		parts[i] = fmt.Sprintf("%d %s", n[t], t)
	}
	return strings.Join(parts, ", ")
}

func since(t time.Time) string { return time.Since(t).Round(time.Millisecond).String() }

// createDatabase drops and creates the demo's database and returns the
// DSN naming it.
func createDatabase(ctx context.Context, dsn, name string) (string, error) {
	mcfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "", fmt.Errorf("demo: MySQL DSN: %w", err)
	}
	mcfg.DBName = ""
	db, err := sql.Open("mysql", mcfg.FormatDSN())
	if err != nil {
		return "", fmt.Errorf("demo: MySQL: %w", err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// name matched demoDatabase: a plain identifier.
	for _, q := range []string{"DROP DATABASE IF EXISTS `" + name + "`", "CREATE DATABASE `" + name + "` CHARACTER SET utf8mb4"} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return "", fmt.Errorf("demo: MySQL at %s: %w", mcfg.Addr, err)
		}
	}
	mcfg.DBName = name
	return mcfg.FormatDSN(), nil
}
