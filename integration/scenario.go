package integration

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"reflect"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/go-sql-driver/mysql"
	"go.yaml.in/yaml/v3"

	"github.com/cachewarden/cachewarden/client"
	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/counters"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
	"github.com/cachewarden/cachewarden/verify"
)

// Services are the live services a scenario uses.
type Services struct {
	// Memcached is a memcached host:port.
	Memcached string
	// MySQLDSN names a database the scenario may fill: its workload
	// tables are dropped and created.
	MySQLDSN string
	// Brokers are Kafka bootstrap addresses; nil starts an in-process
	// broker.
	Brokers []string
}

// ScenarioOptions shape a scenario. Zero fields take the defaults named.
type ScenarioOptions struct {
	// Format is the CDC format published; default Debezium.
	Format Format
	// TopicPrefix starts every topic name: "<prefix>.<db>.<table>";
	// default "cdc". Give each scenario sharing a broker its own.
	TopicPrefix string
	// Partitions per topic; default 2.
	Partitions int
	// Group is the daemons' consumer group; default "cachewarden".
	Group string
	// Rules are the rule file or directory paths the daemons use.
	Rules    []string
	Workload WorkloadOptions
	// Snapshot publishes the initial rows as snapshot reads (when the
	// format has them).
	Snapshot bool
	// WarmShare is the share of sets and counters an application reads
	// before the workload; default 0.5, negative none.
	WarmShare float64
	// Source is where the daemons read changes: config.SourceKafka
	// (default: the events published to the broker) or
	// config.SourceBinlog (the server's binary log: no broker, nothing
	// published; the MySQL DSN must name a MariaDB with GTIDs, the rule
	// files are copied with their tables in its database, Format only
	// plans what the daemons should do, and Snapshot is off).
	Source config.SourceKind
	// BinlogLease is the binlog source's lease; zero: the default.
	BinlogLease time.Duration
	Log         *slog.Logger
}

// Scenario is a workload run end to end: a database the workload changes,
// a broker its change events are published to, and the cache that the
// daemons (started by the caller, from Config) keep. It is not safe for
// concurrent use.
type Scenario struct {
	Opts     ScenarioOptions
	Services Services
	Broker   *Broker
	MySQL    *counters.MySQL
	MC       *memcache.Client
	// Client reads the cache as an application does.
	Client    *client.Client
	Schema    *Schema
	Workload  *Workload
	Publisher *Publisher
	// Registry is the schema registry of an Avro format; nil otherwise.
	Registry *AvroRegistry
	Rules    *rules.RuleSet
	// Topics are the CDC topics, one per table, in schema order.
	Topics []string
	// Snapshot holds the initial rows as snapshot reads.
	Snapshot []Change
	// Warmed is what Warm read; nil before.
	Warmed *Warmed
	// Txs are the transactions published since Warm.
	Txs []Tx
	// Binlog is where the daemons read with source binlog; nil with
	// Kafka (then Broker and Publisher are set).
	Binlog *BinlogSource
	// tmp holds the rule files of a binlog scenario.
	tmp string
}

// NewScenario connects to the services (starting a broker when none is
// given), creates the workload tables and the initial rows, and publishes
// those as a snapshot when asked. Close releases everything.
func NewScenario(ctx context.Context, svc Services, opts ScenarioOptions) (s *Scenario, err error) {
	if opts.Format == "" {
		opts.Format = Debezium
	}
	if opts.TopicPrefix == "" {
		opts.TopicPrefix = "cdc"
	}
	if opts.Partitions <= 0 {
		opts.Partitions = 2
	}
	if opts.Group == "" {
		opts.Group = "cachewarden"
	}
	if opts.WarmShare == 0 {
		opts.WarmShare = 0.5
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	s = &Scenario{Opts: opts, Services: svc}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	s.Schema = NewSchema("", "")
	if opts.Source == config.SourceBinlog {
		if err := s.binlogRules(); err != nil {
			return nil, err
		}
	}
	if s.Rules, err = rulefile.LoadPaths(s.Opts.Rules...); err != nil {
		return nil, fmt.Errorf("integration: rules: %w", err)
	}
	if s.MySQL, err = counters.OpenMySQL(svc.MySQLDSN, counters.DBConfig{MaxOpenConns: 8}, opts.Log); err != nil {
		return nil, fmt.Errorf("integration: %w", err)
	}
	s.MC = memcache.New(svc.Memcached)
	s.MC.Timeout = 2 * time.Second
	s.MC.MaxIdleConns = 8
	s.Client, err = client.New(client.Config{
		Servers: []itemformat.Server{{Addr: svc.Memcached}}, Rules: s.Rules, DB: s.MySQL.DB(), Timeout: 2 * time.Second,
	}, opts.Log)
	if err != nil {
		return nil, fmt.Errorf("integration: %w", err)
	}
	if opts.Source != config.SourceBinlog {
		if err := s.startBroker(ctx); err != nil {
			return nil, err
		}
	}
	if err := s.Schema.Create(ctx, s.MySQL.DB()); err != nil {
		return nil, err
	}
	if s.Workload, err = NewWorkload(ctx, s.MySQL.DB(), s.Schema, opts.Workload, opts.Log); err != nil {
		return nil, err
	}
	if s.Snapshot, err = s.Workload.Initial(ctx); err != nil {
		return nil, err
	}
	if opts.Source == config.SourceBinlog {
		s.Binlog, err = newBinlogSource(ctx, s.MySQL.DB(), svc.MySQLDSN, opts.BinlogLease)
		return s, err
	}
	if opts.Snapshot && opts.Format.SupportsSnapshot() {
		if _, err := s.Publisher.Publish(ctx, Tx{Desc: "snapshot", Changes: s.Snapshot}); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// binlogRules readies a binlog scenario: the tables are named by the
// database the DSN names, as the binary log names them, and so are the
// rule files' tables, in copies; nothing is published, so no snapshot.
func (s *Scenario) binlogRules() error {
	if s.Opts.Format != Debezium {
		return fmt.Errorf("integration: source binlog: format %s is published to Kafka only", s.Opts.Format)
	}
	mcfg, err := mysql.ParseDSN(s.Services.MySQLDSN)
	if err != nil || mcfg.DBName == "" {
		return fmt.Errorf("integration: source binlog: the MySQL DSN must name the scenario's database (%v)", err)
	}
	s.Schema = NewSchema(mcfg.DBName, mcfg.DBName)
	if s.tmp, err = os.MkdirTemp("", "cachewarden-binlog-rules-"); err != nil {
		return fmt.Errorf("integration: %w", err)
	}
	if s.Opts.Rules, err = rulesForDatabase(s.Opts.Rules, s.tmp, mcfg.DBName); err != nil {
		return err
	}
	s.Opts.Snapshot = false
	return nil
}

// startBroker starts or connects to the broker, with a topic per table,
// and the publisher (and schema registry) of the scenario's format.
func (s *Scenario) startBroker(ctx context.Context) (err error) {
	for _, t := range s.Schema.Tables() {
		s.Topics = append(s.Topics, s.topic(t))
	}
	opts := s.Opts
	if s.Broker, err = StartBroker(ctx, opts.Log, BrokerOptions{Addrs: s.Services.Brokers, Topics: s.Topics, Partitions: opts.Partitions}); err != nil {
		return err
	}
	if s.Publisher, err = NewPublisher(s.Broker.Addrs(), opts.Format, s.topic, opts.Log); err != nil {
		return err
	}
	if opts.Format.Avro() {
		if s.Registry, err = StartAvroRegistry(); err != nil {
			return err
		}
		s.Publisher.WithRegistry(s.Registry)
	}
	return nil
}

func (s *Scenario) topic(t *Table) string {
	return s.Opts.TopicPrefix + "." + t.Database + "." + t.Name
}

// Close releases the scenario's clients and stops an in-process broker.
func (s *Scenario) Close() {
	if s.Publisher != nil {
		s.Publisher.Close()
	}
	if s.Broker != nil {
		s.Broker.Close()
	}
	if s.Registry != nil {
		s.Registry.Close()
	}
	if s.MySQL != nil {
		s.MySQL.Close()
	}
	if s.MC != nil {
		s.MC.Close()
	}
	if s.Client != nil {
		s.Client.Close()
	}
	if s.tmp != "" {
		os.RemoveAll(s.tmp)
	}
}

// Failover moves the scenario's database to the server at dsn, an empty
// database on another server (in a test, one whose binary log has the
// same base name): the tables are created there and their rows copied,
// then the workload continues there, with that server's binary log
// positions and server_id, and Check reads it. Call it while nothing is
// in flight: every change made published and applied. The daemons keep
// the DSN of their config; restart them with the new one.
func (s *Scenario) Failover(ctx context.Context, dsn string) error {
	db, err := counters.OpenMySQL(dsn, counters.DBConfig{MaxOpenConns: 8}, s.Opts.Log)
	if err != nil {
		return fmt.Errorf("integration: failover: %w", err)
	}
	if err := s.Schema.Create(ctx, db.DB()); err != nil {
		db.Close()
		return err
	}
	if err := s.Schema.CopyTables(ctx, s.MySQL.DB(), db.DB()); err != nil {
		db.Close()
		return err
	}
	if err := s.Workload.MoveTo(ctx, db.DB()); err != nil {
		db.Close()
		return err
	}
	s.MySQL.Close()
	s.MySQL, s.Services.MySQLDSN = db, dsn
	return nil
}

// ConfigFile is a daemon config file's contents (the keys of
// cachewarden.yaml that the harness sets).
type ConfigFile struct {
	// Source is "binlog" with Binlog set, else left out (Kafka).
	Source string `yaml:"source,omitempty"`
	// Binlog is the binlog section of a binlog scenario.
	Binlog *BinlogConfigFile `yaml:"binlog,omitempty"`
	Kafka  struct {
		Brokers     []string          `yaml:"brokers"`
		Group       string            `yaml:"group"`
		Topics      []string          `yaml:"topics"`
		Format      string            `yaml:"format,omitempty"`
		TopicTables map[string]string `yaml:"topic_tables,omitempty"`
		DLQTopic    string            `yaml:"dlq_topic,omitempty"`
		// SchemaRegistry is set for an Avro format.
		SchemaRegistry *struct {
			URLs []string `yaml:"urls"`
		} `yaml:"schema_registry,omitempty"`
	} `yaml:"kafka,omitempty"`
	Memcached struct {
		Servers      []string `yaml:"servers"`
		Distribution string   `yaml:"distribution,omitempty"`
	} `yaml:"memcached"`
	MySQL struct {
		DSN string `yaml:"dsn"`
	} `yaml:"mysql"`
	Rules []string `yaml:"rules"`
	Batch struct {
		MaxEvents int    `yaml:"max_events,omitempty"`
		MaxWait   string `yaml:"max_wait,omitempty"`
	} `yaml:"batch"`
	HTTP struct {
		Listen string `yaml:"listen"`
	} `yaml:"http"`
	Log struct {
		Format string `yaml:"format,omitempty"`
		Level  string `yaml:"level,omitempty"`
	} `yaml:"log"`
	// Observer is the observer section, as written; nil leaves it out.
	Observer map[string]any `yaml:"observer,omitempty"`
}

// ConfigFile returns a daemon config for the scenario: its broker, group,
// topics and format (with the topic → table map flattened rows need), the
// services, the rules, an HTTP listener on a free loopback port, and
// dlqTopic ("" for none).
func (s *Scenario) ConfigFile(dlqTopic string) ConfigFile {
	var c ConfigFile
	if s.Binlog != nil {
		c.Source = string(config.SourceBinlog)
		c.Binlog = s.Binlog.configFile()
		s.fillConfigFile(&c)
		return c
	}
	c.Kafka.Brokers = s.Broker.Addrs()
	c.Kafka.Group = s.Opts.Group
	c.Kafka.Topics = s.Topics
	c.Kafka.Format = s.Opts.Format.ConfigFormat()
	if s.Opts.Format == DebeziumFlatRow {
		c.Kafka.TopicTables = map[string]string{}
		for _, t := range s.Schema.Tables() {
			c.Kafka.TopicTables[s.topic(t)] = t.Qualified()
		}
	}
	c.Kafka.DLQTopic = dlqTopic
	if s.Registry != nil {
		c.Kafka.SchemaRegistry = &struct {
			URLs []string `yaml:"urls"`
		}{URLs: []string{s.Registry.URL()}}
	}
	s.fillConfigFile(&c)
	return c
}

// fillConfigFile sets the sections every source shares.
func (s *Scenario) fillConfigFile(c *ConfigFile) {
	c.Memcached.Servers = []string{s.Services.Memcached}
	c.MySQL.DSN = s.Services.MySQLDSN
	c.Rules = s.Opts.Rules
	c.Batch.MaxWait = "10ms"
	c.HTTP.Listen = "127.0.0.1:0"
	c.Log.Level = "warn"
}

// Write writes the config as YAML to path.
func (c ConfigFile) Write(path string) error {
	data, err := yaml.Marshal(c)
	if err != nil {
		return fmt.Errorf("integration: config: %w", err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("integration: config: %w", err)
	}
	return nil
}

// WaitCaughtUp waits until the scenario's group has committed every
// message of its topics.
func (s *Scenario) WaitCaughtUp(ctx context.Context) error {
	if s.Binlog != nil {
		return s.waitBinlogCaughtUp(ctx)
	}
	return s.Broker.WaitCaughtUp(ctx, s.Opts.Group, 20*time.Millisecond, s.Topics...)
}

// Warm reads the cache as an application would (see the function Warm).
// Call it once the daemons have caught up with the snapshot.
func (s *Scenario) Warm(ctx context.Context) error {
	share := max(s.Opts.WarmShare, 0)
	rng := rand.New(rand.NewPCG(s.Workload.Seed(), 1))
	w, err := Warm(ctx, s.Rules, s.Client, s.MySQL, s.Snapshot, share, rng)
	if err != nil {
		return err
	}
	s.Warmed = w
	return nil
}

// Change makes up to n transactions in the database (one round of the
// workload) and records them in Txs; PublishTxs publishes them.
func (s *Scenario) Change(ctx context.Context, n int) ([]Tx, error) {
	txs, err := s.Workload.Round(ctx, n)
	if s.Binlog != nil {
		txs = dropUnchanged(txs)
	}
	s.Txs = append(s.Txs, txs...)
	return txs, err
}

// PublishTxs publishes transactions in order and returns how many
// messages it wrote. With source binlog it writes nothing: the
// transactions are in the server's binary log already.
func (s *Scenario) PublishTxs(ctx context.Context, txs []Tx) (int, error) {
	if s.Binlog != nil {
		return 0, nil
	}
	return s.Publisher.Publish(ctx, txs...)
}

// Publish makes up to n transactions and publishes them. It does not wait
// for the daemons; WaitCaughtUp does.
func (s *Scenario) Publish(ctx context.Context, n int) ([]Tx, int, error) {
	txs, err := s.Change(ctx, n)
	if err != nil {
		return txs, 0, err
	}
	msgs, err := s.PublishTxs(ctx, txs)
	return txs, msgs, err
}

// Round publishes one round and waits for the daemons to catch up.
func (s *Scenario) Round(ctx context.Context, n int) ([]Tx, error) {
	txs, _, err := s.Publish(ctx, n)
	if err != nil {
		return txs, err
	}
	return txs, s.WaitCaughtUp(ctx)
}

// Check compares the cache with the database once the daemons have caught
// up: every set and counter the rules' keys queries list (verify), and the
// namespaces of every changed entity (CheckNamespaces).
func (s *Scenario) Check(ctx context.Context) (*verify.Report, *NamespaceReport, error) {
	v := verify.New(s.MC, s.MySQL, s.MySQL.DB(), s.Opts.Log)
	rep, err := v.Verify(ctx, s.Rules.Rules(), verify.Options{Concurrency: 4})
	if err != nil {
		return nil, nil, err
	}
	bumped, err := ExpectedBumps(s.Rules, s.Opts.Format, s.Txs)
	if err != nil {
		return nil, nil, err
	}
	// A namespace the snapshot bumped under a rule with a delayed second
	// bump may still move.
	unsettled := map[string]bool{}
	if s.Opts.Snapshot && s.Opts.Format.SupportsSnapshot() {
		var ops []rules.Op
		for _, ev := range s.Opts.Format.Events(s.Snapshot) {
			ops, _, err = s.Rules.Plan(ops[:0], &ev)
			if err != nil {
				return nil, nil, err
			}
			for _, op := range ops {
				if op.Kind == rules.OpBump && op.Rule.RebumpAfter > 0 {
					unsettled[op.Key] = true
				}
			}
		}
	}
	var warmed map[string]uint64
	if s.Warmed != nil {
		warmed = s.Warmed.Namespaces
	}
	ns, err := CheckNamespaces(s.MC, warmed, bumped, unsettled)
	if err != nil {
		return nil, nil, err
	}
	return rep, ns, nil
}

// dropUnchanged removes the updates that left their row as it was (an
// edit that drew the value already there): the server logs no row change
// for them, so a binary log reader sees none. Transactions left without
// changes are removed.
func dropUnchanged(txs []Tx) []Tx {
	out := txs[:0]
	for _, tx := range txs {
		kept := tx.Changes[:0]
		for _, c := range tx.Changes {
			if c.Event.Operation == rules.Update && reflect.DeepEqual(c.Event.Before, c.Event.After) {
				continue
			}
			kept = append(kept, c)
		}
		if tx.Changes = kept; len(kept) > 0 {
			out = append(out, tx)
		}
	}
	return out
}
