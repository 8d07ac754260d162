package integration

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/go-sql-driver/mysql"

	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
	"github.com/cachewarden/cachewarden/source/binlog"
)

// DemoParams configures RunDemo. Every field but Seed and Verbose is
// required; RunDemo does not fill in defaults.
type DemoParams struct {
	// ConfigPath is the daemon config whose rules, topics, group and
	// dead-letter topic the demo uses. Its brokers, memcached servers and
	// DSN are replaced by the live ones below.
	ConfigPath string
	// Memcached is the memcached server, host:port.
	Memcached string
	// MySQLDSN is a go-sql-driver DSN of a user that may create databases;
	// its database name is ignored.
	MySQLDSN string
	// Database is the database the demo drops and creates: it must satisfy
	// ValidDemoDatabase.
	Database string
	// Kafka lists the brokers; empty starts a broker in this process.
	Kafka []string
	// Format is the CDC format published: one of Formats.
	Format Format
	// Rounds is the number of rounds of changes, Size the transactions per
	// round.
	Rounds, Size int
	// Seed seeds the workload; 0 picks one at random.
	Seed uint64
	// Verbose prints every transaction of a round instead of the first 4.
	Verbose bool
	// Source is where the daemon reads: config.SourceKafka (default) or
	// config.SourceBinlog, the binary log of the server MySQLDSN names
	// (a MariaDB with GTIDs): no broker; Kafka and Format are unused.
	Source config.SourceKind
}

// demoDatabase is a plain MySQL identifier: the demo drops and creates it.
var demoDatabase = regexp.MustCompile(`^[A-Za-z0-9_]{1,64}$`)

// ValidDemoDatabase reports whether name may be DemoParams.Database: 1 to
// 64 ASCII letters, digits and underscores, so that it can be quoted into
// DROP DATABASE and CREATE DATABASE as it is.
func ValidDemoDatabase(name string) bool { return demoDatabase.MatchString(name) }

// ErrDemoFailed means the demo's final check found the cache disagreeing
// with the database. RunDemo has printed the details.
var ErrDemoFailed = errors.New("demo: the cache disagrees with the database")

// RunDemo runs cachewarden end to end on live services and prints for
// people, to out, what happens: it drops and creates p.Database, creates
// the example schema there, starts or connects to a broker, runs a daemon
// in this process on the config's rules, and prints the events, cache
// operations and sample keys round by round, then a broken message landing
// in the dead-letter topic (when the config names one). It ends by checking
// that every set and counter in memcached equals the database and that the
// namespace of every changed entity moved, and returns ErrDemoFailed when
// not. The daemon and the harness log to log. It blocks until done or ctx
// ends; concurrent calls must use distinct databases.
func RunDemo(ctx context.Context, p DemoParams, out io.Writer, log *slog.Logger) error {
	switch {
	case p.Source == config.SourceBinlog && p.Format != Debezium:
		return fmt.Errorf("demo: format %q: the binary log source reads no published format", p.Format)
	case !slices.Contains(Formats, p.Format):
		return fmt.Errorf("demo: unknown format %q", p.Format)
	case !ValidDemoDatabase(p.Database):
		return fmt.Errorf("demo: database %q: want letters, digits and _", p.Database)
	}
	d := &demo{out: out, verbose: p.Verbose, format: p.Format, binlog: p.Source == config.SourceBinlog}
	return d.run(ctx, log, p)
}

// demo prints the run for people.
type demo struct {
	out     io.Writer
	verbose bool
	format  Format
	// binlog says the daemon reads the binary log, not Kafka.
	binlog bool
	step   int
}

func (d *demo) printf(format string, args ...any) { fmt.Fprintf(d.out, format, args...) }

func (d *demo) section(format string, args ...any) {
	d.step++
	d.printf("\n%d. %s\n", d.step, fmt.Sprintf(format, args...))
}

func (d *demo) run(ctx context.Context, log *slog.Logger, p DemoParams) error {
	began := time.Now()
	cfg, err := config.Load(p.ConfigPath)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	dsn, err := recreateDemoDatabase(ctx, p.MySQLDSN, p.Database)
	if err != nil {
		return err
	}
	cfg.Memcached.Servers = []string{p.Memcached}
	cfg.MySQL.DSN = dsn

	if d.binlog {
		d.printf("cachewarden demo: row changes in MySQL -> its binary log -> cachewarden, reading as a replica -> memcached\n")
	} else {
		d.printf("cachewarden demo: row changes in MySQL -> CDC events in Kafka -> cachewarden -> memcached\n")
	}
	s, err := NewScenario(ctx, Services{Memcached: p.Memcached, MySQLDSN: dsn, Brokers: p.Kafka},
		ScenarioOptions{
			Format:   d.format,
			Group:    cfg.Kafka.Group,
			Rules:    cfg.Rules,
			Snapshot: true,
			Workload: WorkloadOptions{Seed: p.Seed, KeyMoves: d.format.HasBefore()},
			Source:   p.Source,
			Log:      log,
		})
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	defer s.Close()
	if d.binlog {
		return d.runBinlog(ctx, log, p, cfg, s, began)
	}
	for _, t := range s.Topics {
		if !slices.Contains(cfg.Kafka.Topics, t) {
			return fmt.Errorf("demo: %s does not consume topic %s, where the demo publishes %s changes", p.ConfigPath, t, strings.TrimPrefix(t, s.Opts.TopicPrefix+"."))
		}
	}
	cfg.Kafka.Brokers = s.Broker.Addrs()
	if d.format == DebeziumFlatRow {
		cfg.Kafka.TopicTables = s.ConfigFile("").Kafka.TopicTables
	}
	if s.Registry != nil {
		cfg.Kafka.SchemaRegistry.URLs = []string{s.Registry.URL()}
	}

	d.printSetup(p, cfg, s)

	d.section("initial data: %s", countChangesByTable(s.Snapshot))
	if d.format.SupportsSnapshot() {
		d.printf("   published as %d %s snapshot events\n", len(s.Snapshot), d.format)
	}
	return d.runDaemon(ctx, log, p, cfg, s, began)
}

// runBinlog points the daemon's config at the scenario's binary log
// source and runs the demo on it.
func (d *demo) runBinlog(ctx context.Context, log *slog.Logger, p DemoParams, cfg *config.Config, s *Scenario, began time.Time) error {
	b := s.Binlog
	cfg.Source = config.SourceBinlog
	cfg.Rules = s.Opts.Rules
	var err error
	if cfg.RuleSet, cfg.RulesDigest, err = rulefile.LoadPathsDigest(cfg.Rules...); err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	cfg.Binlog = config.Binlog{DSN: b.DSN, ServerID: int(b.ServerID), Name: b.Name, CheckpointDatabase: b.CheckpointDatabase,
		CheckpointTable: binlog.DefaultCheckpointTable, Lease: binlog.DefaultLeaseDuration, Purged: config.PurgedFail, Start: b.Start}
	d.printSetup(p, cfg, s)
	d.section("initial data: %s", countChangesByTable(s.Snapshot))
	d.printf("   inserted before the daemon starts: it reads the binary log from %s on\n", b.Start)
	return d.runDaemon(ctx, log, p, cfg, s, began)
}

// runDaemon starts the daemon in this process, shows the cache, runs the
// rounds (and the broken message, with Kafka) and checks the cache.
func (d *demo) runDaemon(ctx context.Context, log *slog.Logger, p DemoParams, cfg *config.Config, s *Scenario, began time.Time) error {
	start := time.Now()
	daemon, err := StartDaemon(ctx, cfg, log, FastGroupTiming)
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
	if d.binlog {
		d.section("daemon running in this process (binlog.name %s): started in %s", cfg.Binlog.Name, demoElapsed(start))
	} else {
		d.section("daemon running in this process (group %s): caught up in %s", cfg.Kafka.Group, demoElapsed(start))
	}
	d.printCounts(counts)

	if err := d.showReads(ctx, s); err != nil {
		return err
	}

	for r := 1; r <= p.Rounds; r++ {
		if err := d.round(ctx, s, daemon, r, p.Size); err != nil {
			return err
		}
	}

	if !d.binlog {
		if err := d.poison(ctx, s, cfg, daemon); err != nil {
			return err
		}
	}

	return d.check(ctx, s, daemon, p, began)
}

// printSetup shows what the demo runs on: the broker, the schema
// registry, memcached, the database, the rules and the workload's seed.
func (d *demo) printSetup(p DemoParams, cfg *config.Config, s *Scenario) {
	if s.Binlog != nil {
		addr := "?"
		if mcfg, err := mysql.ParseDSN(s.Binlog.DSN); err == nil {
			addr = mcfg.Addr
		}
		d.printf("  source     binary log of the MariaDB at %s, read as replica server_id %d (binlog.name %s)\n", addr, s.Binlog.ServerID, s.Binlog.Name)
		d.printf("  memcached  %s\n", p.Memcached)
		d.printf("  database   %s (checkpoint table %s.%s)\n", p.Database, s.Binlog.CheckpointDatabase, binlog.DefaultCheckpointTable)
		d.printf("  rules      %s: %s\n", strings.Join(cfg.Rules, ", "), describeRuleKinds(s.Rules))
		d.printf("  workload   seed %d, ids from %d on (keys of earlier runs are not reused)\n", s.Workload.Seed(), s.Workload.IDBase()+1)
		return
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
	if s.Registry != nil {
		d.printf("  registry   in-process schema registry at %s (Confluent REST API); kafka.format %s reads the Avro by its magic byte\n", s.Registry.URL(), cfg.Kafka.Format)
	}
	d.printf("  memcached  %s\n", p.Memcached)
	d.printf("  database   %s (%s)\n", p.Database, positions)
	d.printf("  rules      %s: %s\n", strings.Join(cfg.Rules, ", "), describeRuleKinds(s.Rules))
	d.printf("  workload   seed %d, ids from %d on (keys of earlier runs are not reused)\n", s.Workload.Seed(), s.Workload.IDBase()+1)
}

// showReads reads the cache as an application would and shows a
// namespace, a set and a counter.
func (d *demo) showReads(ctx context.Context, s *Scenario) error {
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
	return nil
}

// check compares memcached with the database, stops the daemon and
// reports the verdict: ErrDemoFailed when they disagree.
func (d *demo) check(ctx context.Context, s *Scenario, daemon *Daemon, p DemoParams, began time.Time) error {
	d.section("check: memcached against %s", p.Database)
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
		d.printf("\nFAILED after %s: the cache disagrees with the database (workload seed %d)\n", demoElapsed(began), s.Workload.Seed())
		return ErrDemoFailed
	}
	d.printf("\nOK after %s: every set and counter equals the database, every changed entity's namespace moved\n", demoElapsed(began))
	return nil
}

// round makes one round of changes, shows them, waits for the daemon and
// shows what it did.
func (d *demo) round(ctx context.Context, s *Scenario, daemon *Daemon, n, size int) error {
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
	ops, err := PlanOps(s.Rules, d.format, txs)
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	sample := sampleOpKeys(ops, 3)
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
	if d.binlog {
		d.section("round %d: %d transactions, %d row changes in the binary log", n, len(txs), rows)
	} else {
		d.section("round %d: %d transactions, %d row changes, %d messages published", n, len(txs), rows, msgs)
	}
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
	took := demoElapsed(start)
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
		if d.binlog {
			// The daemon reads each transaction as it commits: the values
			// read after the round was made may be the new ones already.
			d.printf("   %-34s now %s\n", k, now[k])
			continue
		}
		d.printf("   %-34s %s -> %s\n", k, old[k], now[k])
	}
	return nil
}

// poison publishes a message that cannot be decoded and shows it land in
// the dead-letter topic.
func (d *demo) poison(ctx context.Context, s *Scenario, cfg *config.Config, daemon *Daemon) error {
	if cfg.Kafka.DLQTopic == "" {
		return nil
	}
	topic := s.Topics[len(s.Topics)-1]
	d.section("a broken message on %s", topic)
	msg := OutMessage{Topic: topic, Key: []byte(`{"id":0}`), Value: []byte(`{"before":null,"after":{"id":`)}
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

func (d *demo) printCounts(c Counts) {
	d.printf("     events %.0f (%s)\n", Total(c.Events), Summary(c.Events))
	kinds := map[string]float64{}
	for k, v := range c.Ops {
		kind, outcome, _ := strings.Cut(k, "/")
		kinds[kind+" "+outcome] += v
	}
	d.printf("     cache ops %.0f (%s)\n", Total(c.Ops), Summary(kinds))
	if len(c.Recounts) > 0 {
		d.printf("     recounts: %s\n", Summary(c.Recounts))
	}
}

// sampleOpKeys picks up to n keys of planned ops, one per op kind first.
func sampleOpKeys(ops []rules.Op, n int) []string {
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
	// A counter lives at its key under its table's generation
	// (docs/formats.md, "Generations").
	at := make(map[string]string, len(keys))
	itemKeys := make([]string, 0, len(keys))
	for _, k := range keys {
		at[k] = k
		if r := ruleOfKey(rs, k, rules.CountRule); r != nil && r.Generation != "" {
			gen, err := Generation(mc, r.Generation)
			if err != nil {
				return nil, fmt.Errorf("demo: %w", err)
			}
			at[k] = itemformat.CounterKey(k, gen)
		}
		itemKeys = append(itemKeys, at[k])
	}
	items, err := mc.GetMulti(itemKeys)
	if err != nil {
		return nil, fmt.Errorf("demo: read memcached: %w", err)
	}
	out := make(map[string]string, len(keys))
	for _, k := range keys {
		it, ok := items[at[k]]
		switch {
		case !ok:
			out[k] = "(missing)"
		case isSetRuleKey(rs, k):
			members := itemformat.DecodeSet(it.Value).Members
			for i, m := range members {
				members[i] = itemformat.Unescape(m)
			}
			sort.Strings(members)
			out[k] = "{" + strings.Join(members, ", ") + "}"
		default:
			out[k] = strings.TrimRight(string(it.Value), " ")
		}
	}
	return out, nil
}

// isSetRuleKey reports whether key belongs to a set rule: its prefix and the
// literal start of its template match.
func isSetRuleKey(rs *rules.RuleSet, key string) bool {
	return ruleOfKey(rs, key, rules.SetRule) != nil
}

// ruleOfKey returns the first rule of kind whose prefix and literal
// template start key begins with, or nil.
func ruleOfKey(rs *rules.RuleSet, key string, kind rules.RuleKind) *rules.Rule {
	for _, r := range rs.Rules() {
		if r.Kind != kind {
			continue
		}
		lit, _, _ := strings.Cut(r.Key.String(), "{")
		if strings.HasPrefix(key, r.Prefix+lit) {
			return r
		}
	}
	return nil
}

// describeRuleKinds counts rs's rules, in all and per kind.
func describeRuleKinds(rs *rules.RuleSet) string {
	n := map[rules.RuleKind]int{}
	for _, r := range rs.Rules() {
		n[r.Kind]++
	}
	return fmt.Sprintf("%d rules (%d bump, %d set, %d count)", len(rs.Rules()), n[rules.BumpRule], n[rules.SetRule], n[rules.CountRule])
}

// countChangesByTable lists how many changes each table has, in the order
// the tables first appear.
func countChangesByTable(changes []Change) string {
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

// demoElapsed is the time since t, rounded to the millisecond, for people.
func demoElapsed(t time.Time) string { return time.Since(t).Round(time.Millisecond).String() }

// recreateDemoDatabase drops and creates the demo's database and returns the
// DSN naming it.
func recreateDemoDatabase(ctx context.Context, dsn, name string) (string, error) {
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
	// name satisfied ValidDemoDatabase: a plain identifier.
	for _, q := range []string{"DROP DATABASE IF EXISTS `" + name + "`", "CREATE DATABASE `" + name + "` CHARACTER SET utf8mb4"} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			return "", fmt.Errorf("demo: MySQL at %s: %w", mcfg.Addr, err)
		}
	}
	mcfg.DBName = name
	return mcfg.FormatDSN(), nil
}
