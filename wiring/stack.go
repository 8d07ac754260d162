package wiring

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/go-sql-driver/mysql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/oauth"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/counters"
	"github.com/cachewarden/cachewarden/decode"
	"github.com/cachewarden/cachewarden/internal/metaproto"
	"github.com/cachewarden/cachewarden/internal/readfile"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/observer"
	"github.com/cachewarden/cachewarden/pipeline"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
	"github.com/cachewarden/cachewarden/source/kafka"
)

// Stack is everything the daemon, replay and demo build from one
// configuration: clients, appliers, the pipeline and the metrics. Build it
// with NewStack and release it with Close once nothing uses it.
type Stack struct {
	Config *config.Config
	Logger *slog.Logger
	// Registry holds the cachewarden metrics plus the Go runtime and
	// process collectors; serve it with HTTPHandler.
	Registry *prometheus.Registry
	Metrics  *pipeline.Metrics
	// KafkaMetrics are the Kafka source's metrics, on the same Registry.
	KafkaMetrics *kafka.Metrics
	// Memcache is the client every applier shares.
	Memcache *memcache.Client
	// MySQL runs load and recount queries; nil when mysql.dsn is empty.
	MySQL *counters.MySQL
	// Applier applies every op of the pipeline's batches, the delayed
	// bumps and replay's set rebuilds: bumps, set tokens, set rebuilds and
	// deletes, counter deltas. One state machine over the transport
	// memcached.protocol names: the pipelined meta protocol ("meta") or
	// the text protocol ("text").
	Applier *cacheops.Applier
	// Counters does every counter recount when mysql.dsn is set, fenced
	// for exact counters (docs/exact-counters.md): a delta whose counter
	// needs one comes back from Applier as OutcomeRecountNeeded and the
	// pipeline recounts it here. nil without mysql.dsn, and with
	// StackOptions.ObserveOnly.
	Counters *counters.Counters
	Rebump   *pipeline.Rebumper
	// DLQ receives poison messages; nil without kafka.dlq_topic or with
	// StackOptions.NoDLQ.
	DLQ      *kafka.DLQ
	Pipeline *pipeline.Pipeline
	// Kafka is how to reach the brokers (TLS and SASL included).
	Kafka kafka.KafkaConn
	// SchemaRegistry reads the schemas of Avro messages; nil without
	// kafka.schema_registry.
	SchemaRegistry *kafka.SchemaRegistry
	// Observer checks a share of the applied changes (the config's
	// observer section, or StackOptions.ObserveOnly); nil when off.
	Observer *observer.Observer
	// observeOnly is StackOptions.ObserveOnly: readiness pings memcached
	// without the meta probe, which writes a key.
	observeOnly bool
	// closers close what the stack opened for a source (NewBinlogDaemon).
	closers []func() error
	// build is StackOptions.Build, served at /version.
	build BuildInfo
}

// StackOptions adjust NewStack for commands other than `run`.
type StackOptions struct {
	// NoDLQ leaves poison messages to the log even when the config names
	// a DLQ topic.
	NoDLQ bool
	// RecountReason labels the recounts that the pipeline makes of
	// counter deltas (cachewarden_recounts_total); default "reassigned",
	// replay uses "replay".
	RecountReason string
	// MemoryRebumps keeps delayed bumps in memory only, without the
	// journal in memcached that lets a restarted daemon find them (replay:
	// it applies them when it ends, and commits nothing).
	MemoryRebumps bool
	// ObserveOnly builds the stack of `cachewarden observe`: the
	// observer checks every op the pipeline plans and nothing is written
	// (no op reaches the Applier; no Counters, delayed bumps, DLQ or
	// fences, and counters.fencing is not checked: nothing recounts).
	ObserveOnly bool
	// DropOps, for fault-injection tests only (no config setting reaches
	// it), loses the ops it selects as if memcached never got them,
	// while the pipeline takes them for applied.
	DropOps func(*rules.Op) bool
	// Build identifies the binary: exported as cachewarden_build_info and
	// served at /version. An empty Version is reported as "unknown".
	Build BuildInfo
}

// NewStack builds the stack for cfg, which must come from config.Load (its
// RuleSet loaded). It does not connect to anything: memcached, MySQL and
// Kafka are dialled when first used, so a service that is down at start-up
// only delays readiness.
func NewStack(cfg *config.Config, logger *slog.Logger, opts StackOptions) (*Stack, error) {
	if cfg.RuleSet == nil {
		return nil, errors.New("wiring: config has no loaded rules")
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if opts.Build.Version == "" {
		opts.Build.Version = "unknown"
	}
	s := &Stack{Config: cfg, Logger: logger, Registry: prometheus.NewRegistry(), observeOnly: opts.ObserveOnly, build: opts.Build}
	s.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	registerBuildInfo(s.Registry, opts.Build)
	s.Metrics = pipeline.NewMetrics(s.Registry)
	s.KafkaMetrics = kafka.NewMetrics(s.Registry)

	kc, err := KafkaConnFromConfig(cfg.Kafka)
	if err != nil {
		return nil, err
	}
	s.Kafka = kc

	servers, dial, err := s.openMemcached()
	if err != nil {
		return nil, err
	}
	if err := s.openAppliers(servers, dial); err != nil {
		return nil, err
	}
	// writer is what the pipeline and the delayed bumps apply through:
	// the Applier, unless a test drops ops or the stack only observes.
	var writer pipeline.Applier = s.Applier
	if opts.DropOps != nil {
		writer = droppingApplier{Applier: writer, drop: opts.DropOps}
	}
	if opts.ObserveOnly {
		writer, opts.NoDLQ = observeOnly{}, true
	}
	s.registerClientStats()
	if !opts.ObserveOnly {
		if err := checkFencing(s.Counters, cfg); err != nil {
			s.Close()
			return nil, err
		}
	}

	if !opts.ObserveOnly { // observing delays no bump
		s.Rebump = pipeline.NewRebumper(writer, s.Metrics, logger.With("component", "rebump"))
		if !opts.MemoryRebumps {
			s.Rebump.EnableJournal(cacheops.NewTokenLog(s.Memcache, logger.With("component", "rebump")), cfg.RuleSet, cfg.DeploymentName())
		}
	}
	if cfg.Kafka.DLQTopic != "" && !opts.NoDLQ {
		if s.DLQ, err = kafka.NewDLQ(kc, cfg.Kafka.DLQTopic, logger.With("component", "dlq")); err != nil {
			s.Close()
			return nil, err
		}
	}

	if err := s.buildPipeline(writer, servers, opts); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// openMemcached makes the gomemcache client (Stack.Memcache) and returns
// the server selector and dialer that every other memcached client of the
// stack shares, so that all of them find a key on the same server.
func (s *Stack) openMemcached() (*itemformat.Selector, func(ctx context.Context, network, addr string) (net.Conn, error), error) {
	cfg := s.Config
	servers, err := cfg.Memcached.Selector()
	if err != nil {
		return nil, nil, err
	}
	dial, err := cfg.Memcached.Dialer()
	if err != nil {
		return nil, nil, err
	}
	mc := memcache.NewFromSelector(servers)
	mc.DialContext = dial
	mc.Timeout = cfg.Memcached.Timeout
	// The writer and the counters of every partition share the client.
	mc.MaxIdleConns = 2 * cfg.Memcached.MaxConcurrency
	s.Memcache = mc
	return servers, dial, nil
}

// openAppliers opens MySQL when the config names it, and makes the one
// Applier (Stack.Applier, on the configured protocol) and, with MySQL,
// the Counters that do the exact recounts (not for a stack that only
// observes: it recounts nothing).
func (s *Stack) openAppliers(servers *itemformat.Selector, dial func(ctx context.Context, network, addr string) (net.Conn, error)) error {
	cfg, logger, mc := s.Config, s.Logger, s.Memcache
	var err error
	var loader cacheops.SetLoader
	var recounter counters.Recounter
	if cfg.MySQL.DSN != "" {
		s.MySQL, err = counters.OpenMySQL(cfg.MySQL.DSN, counters.DBConfig{
			MaxOpenConns: cfg.MySQL.MaxOpenConns,
			QueryTimeout: cfg.MySQL.QueryTimeout,
		}, logger.With("component", "mysql"))
		if err != nil {
			return err
		}
		timed := &timedMySQL{db: s.MySQL, m: s.Metrics}
		loader, recounter = timed, timed
	}
	compactSample := cfg.Memcached.CompactSample
	if compactSample == 0 {
		compactSample = -1 // the writer's "never"
	}
	ac := cacheops.Config{
		MaxConcurrency: cfg.Memcached.MaxConcurrency,
		CompactRatio:   cfg.Memcached.CompactRatio,
		CompactSample:  compactSample,
		LoadTimeout:    cfg.MySQL.QueryTimeout,

		ObserveRoundTrip: s.Metrics.ObserveMemcached,
		// With MySQL, Counters does every recount, fenced at its
		// snapshot's binary log position; the Applier does not.
		RecountElsewhere: recounter != nil,
		Meta:             metaPool(cfg, dial),
	}
	switch cfg.Memcached.Protocol {
	case config.ProtocolText:
		s.Applier = cacheops.NewTextApplier(mc, loader, nil, ac, logger.With("component", "cacheops"))
	default: // config.ProtocolMeta
		// The same selector as the gomemcache client above, so the
		// pipelined writes land where the counters and readers look.
		s.Applier = cacheops.NewMetaApplier(servers, loader, nil, ac, logger.With("component", "cacheops"))
	}
	if recounter != nil && !s.observeOnly {
		s.Counters = counters.New(mc, recounter, countersConfig(cfg, s.Metrics, servers, dial), logger.With("component", "counters"))
	}
	return nil
}

// metaPool is the settings of the stack's meta-protocol connections to
// memcached (the Applier's and the counters' pools): memcached.timeout
// and dial, the number of connections metaproto's default.
func metaPool(cfg *config.Config, dial func(ctx context.Context, network, addr string) (net.Conn, error)) metaproto.PoolConfig {
	return metaproto.PoolConfig{Timeout: cfg.Memcached.Timeout, Dial: dial}
}

// buildPipeline makes the decoders, the schema registry client and the
// observer the config asks for, and the Pipeline that applies through
// writer.
func (s *Stack) buildPipeline(writer pipeline.Applier, servers *itemformat.Selector, opts StackOptions) error {
	cfg, logger := s.Config, s.Logger
	var err error
	var schemas decode.AvroSchemas // nil without a registry, not a nil cache
	if len(cfg.Kafka.SchemaRegistry.URLs) > 0 {
		if s.SchemaRegistry, err = newSchemaRegistry(cfg.Kafka.SchemaRegistry, s.KafkaMetrics, logger.With("component", "schema-registry")); err != nil {
			return err
		}
		schemas = s.SchemaRegistry.Cache()
	}
	dec, topicDecoders, err := decodersFromConfig(cfg.Kafka, cfg.RuleSet, schemas)
	if err != nil {
		return err
	}
	pc := pipeline.Config{
		Rules:          cfg.RuleSet,
		Decoder:        dec,
		TopicDecoders:  topicDecoders,
		Writer:         writer,
		DeltasToWriter: s.Counters != nil,
		Rebump:         s.Rebump,
		Metrics:        s.Metrics,
		Logger:         logger.With("component", "pipeline"),
		RecountReason:  opts.RecountReason,
		UnorderedSets:  string(cfg.Kafka.UnorderedSets),
		Generations:    pipeline.MemcacheGenerations(s.Memcache),
		Positions:      pipeline.MemcachePositions(s.Memcache),
	}
	if s.Counters != nil {
		pc.Counters, pc.Fences = s.Counters, s.Counters
	}
	if cfg.Observer.Enabled || opts.ObserveOnly {
		if s.Observer, err = newObserver(s, servers, opts.ObserveOnly); err != nil {
			return err
		}
		pc.Observer = s.Observer
		if s.Rebump != nil {
			s.Rebump.SetObserver(s.Observer)
		}
	}
	if s.DLQ != nil {
		pc.Poison = s.DLQ
	}
	if s.SchemaRegistry != nil {
		pc.Schemas = s.SchemaRegistry
	}
	if s.Pipeline, err = pipeline.New(pc); err != nil {
		return err
	}
	s.Metrics.SetRules(cfg.RulesDigest)
	return nil
}

// ReloadRules loads the config's rule files again and, when they load,
// pass the config's own checks (Config.CheckRuleNeeds) and check (nil:
// none), makes them the rules of the batches the pipeline plans from now
// on; batches being planned or applied finish with the rules they
// started with. On any error the rules stay as they were. It returns the
// new rules and their digest (rulefile.Digest), counts the reload in
// cachewarden_rules_reload_total and sets cachewarden_rules_info. The
// caller logs the result. Reloads must not run at once.
//
// Rules removed or added change which keys later changes touch (and
// which fallback namespaces and generations cover them); items written
// under the old rules stay until their TTL or a bump
// (docs/operations.md, "Reloading the rules").
func (s *Stack) ReloadRules(check func(*rules.RuleSet) error) (*rules.RuleSet, string, error) {
	rs, digest, err := s.loadRules(check)
	result := "ok"
	if err != nil {
		result = "error"
	} else {
		s.Metrics.SetRules(digest)
	}
	s.Metrics.CountReload(result)
	return rs, digest, err
}

func (s *Stack) loadRules(check func(*rules.RuleSet) error) (*rules.RuleSet, string, error) {
	rs, digest, err := rulefile.LoadPathsDigest(s.Config.Rules...)
	if err != nil {
		return nil, "", err
	}
	if err := s.Config.CheckRuleNeeds(rs); err != nil {
		return nil, "", err
	}
	if check != nil {
		if err := check(rs); err != nil {
			return nil, "", err
		}
	}
	var schemas decode.AvroSchemas // nil without a registry, not a nil cache
	if s.SchemaRegistry != nil {
		schemas = s.SchemaRegistry.Cache()
	}
	dec, topicDecoders, err := decodersFromConfig(s.Config.Kafka, rs, schemas)
	if err != nil {
		return nil, "", err
	}
	if err := s.Pipeline.SetRules(rs, dec, topicDecoders); err != nil {
		return nil, "", err
	}
	return rs, digest, nil
}

// DaemonConfig returns the daemon configuration the config file describes.
func (s *Stack) DaemonConfig() kafka.Config {
	k := s.Config.Kafka
	c := kafka.Config{
		Kafka:             s.Kafka,
		Group:             k.Group,
		Topics:            k.Topics,
		MaxEvents:         s.Config.Batch.MaxEvents,
		MaxWait:           s.Config.Batch.MaxWait,
		Balancers:         balancers(k.Balancer),
		SessionTimeout:    k.SessionTimeout,
		HeartbeatInterval: k.HeartbeatInterval,
		RebalanceTimeout:  k.RebalanceTimeout,
		HandoffTimeout:    k.HandoffTimeout,
		StallTimeout:      k.StallTimeout,
	}
	if k.StartOffset == config.StartLatest {
		c.StartOffset = kafka.StartLatest
	}
	switch k.OffsetReset {
	case config.ResetEarliest:
		c.OffsetReset = kafka.ResetEarliest
	case config.ResetLatest:
		c.OffsetReset = kafka.ResetLatest
	}
	return c
}

// NewDaemon returns a daemon over the stack's pipeline with cfg (usually
// DaemonConfig, adjusted).
func (s *Stack) NewDaemon(cfg kafka.Config) (*kafka.Daemon, error) {
	h, err := s.newHealth()
	if err != nil {
		return nil, err
	}
	return kafka.New(cfg, kafka.Deps{Pipeline: s.Pipeline, Health: h, Metrics: s.KafkaMetrics, Logger: s.Logger.With("component", "consumer")})
}

// mysqlHealth returns the daemon's MySQL readiness check: nil unless
// some rule runs a load or recount query.
func (s *Stack) mysqlHealth() *pipeline.MySQLHealth {
	if s.MySQL == nil {
		return nil
	}
	var needing []string
	for _, r := range s.Config.RuleSet.Rules() {
		if r.Query != "" {
			needing = append(needing, r.Name)
		}
	}
	if len(needing) == 0 {
		return nil
	}
	addr := "mysql"
	if c, err := mysql.ParseDSN(s.Config.MySQL.DSN); err == nil {
		addr = c.Addr
	}
	return &pipeline.MySQLHealth{DB: s.MySQL, Addr: addr, Rules: needing}
}

// metaPinger is the daemon's readiness check with memcached.protocol meta:
// memcached answers, and every server speaks the meta commands the
// pipelined writer sends (probed until that has held once). A server that
// does not (memcached before 1.6, a proxy that does not route them) keeps
// the daemon not ready, and the health log names memcached.protocol: text.
type metaPinger struct {
	*memcache.Client
	probe  func(context.Context) error
	probed atomic.Bool
}

// metaProbeTimeout bounds one probe of every server.
const metaProbeTimeout = 5 * time.Second

func (p *metaPinger) Ping() error {
	if err := p.Client.Ping(); err != nil {
		return err
	}
	if p.probed.Load() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), metaProbeTimeout)
	defer cancel()
	if err := p.probe(ctx); err != nil {
		return err
	}
	p.probed.Store(true)
	return nil
}

// HTTPHandler serves /metrics from the stack's registry, /healthz,
// /readyz (ready reports readiness, usually Daemon.Ready) and, with
// http.pprof, /debug/pprof/.
//
// It also serves /status: the consistency observer's counts and nines as
// JSON (observer.StatusHandler), and /version: StackOptions.Build as JSON.
func (s *Stack) HTTPHandler(ready func() []string) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /status", observer.StatusHandler(s.Observer))
	mux.Handle("GET /version", versionHandler(s.build))
	mux.Handle("/", NewHTTPHandler(s.Registry, ready, s.Config.HTTP.Pprof))
	return mux
}

// Close releases the stack's clients. Pending delayed bumps are not
// applied here; Daemon.Run does that when it stops (or call
// Rebump.Flush).
func (s *Stack) Close() error {
	var errs []error
	if s.Observer != nil {
		s.Observer.Close()
	}
	if s.DLQ != nil {
		errs = append(errs, s.DLQ.Close())
	}
	if s.Counters != nil {
		s.Counters.Close()
	}
	if s.MySQL != nil {
		errs = append(errs, s.MySQL.Close())
	}
	if s.Memcache != nil {
		errs = append(errs, s.Memcache.Close())
	}
	if s.Applier != nil {
		errs = append(errs, s.Applier.Close())
	}
	for _, c := range s.closers {
		errs = append(errs, c())
	}
	return errors.Join(errs...)
}

// registerClientStats exposes the appliers' own counts as metrics.
func (s *Stack) registerClientStats() {
	stats := func() (requests, compactions, deletes, drifts uint64) {
		st := s.Applier.Stats()
		requests, compactions, deletes, drifts = st.RoundTrips, st.Compactions, st.Deletes, st.Drifts
		if s.Counters != nil {
			c := s.Counters.Stats()
			requests, deletes, drifts = requests+c.Calls, deletes+c.Deletes, drifts+c.Drifts
		}
		return requests, compactions, deletes, drifts
	}
	s.Registry.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "cachewarden_memcached_requests_total",
			Help: "memcached round trips made by the appliers (one per command with protocol text, one per pipelined exchange with meta).",
		}, func() float64 { r, _, _, _ := stats(); return float64(r) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "cachewarden_set_compactions_total",
			Help: "Set items rewritten without their dropped tokens.",
		}, func() float64 { _, c, _, _ := stats(); return float64(c) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "cachewarden_items_deleted_total",
			Help: "Items deleted because they could not be kept correct (load or recount failed, set too large...).",
		}, func() float64 { _, _, d, _ := stats(); return float64(d) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "cachewarden_counter_drifts_total",
			Help: "Counters found possibly wrong (a decr reaching zero, a non-numeric item) and recounted.",
		}, func() float64 { _, _, _, d := stats(); return float64(d) }),
	)
	if c := s.Counters; c != nil {
		registerCounterMetrics(s.Registry, c)
	}
}

// KafkaConnFromConfig translates the kafka section's connection settings,
// reading the TLS files it names.
func KafkaConnFromConfig(k config.Kafka) (kafka.KafkaConn, error) {
	kc := kafka.KafkaConn{Brokers: k.Brokers, ClientID: k.ClientID, CheckCRCs: k.CheckCRCs, MaxDecompressedBatchBytes: k.MaxDecompressedBatchBytes}
	tc, err := k.TLS.Config("kafka.tls")
	if err != nil {
		return kc, fmt.Errorf("wiring: %w", err)
	}
	kc.TLS = tc
	kc.SASLMechanism, kc.SASLUser = string(k.SASL.Mechanism), k.SASL.Username
	switch s := k.SASL; s.Mechanism {
	case "":
	case config.SASLPlain:
		kc.SASL = plain.Auth{User: s.Username, Pass: s.Password}.AsMechanism()
	case config.SASLScramSHA256:
		kc.SASL = scram.Auth{User: s.Username, Pass: s.Password}.AsSha256Mechanism()
	case config.SASLScramSHA512:
		kc.SASL = scram.Auth{User: s.Username, Pass: s.Password}.AsSha512Mechanism()
	case config.SASLOAuthBearer:
		path := s.TokenFile
		kc.SASL = oauth.Oauth(func(context.Context) (oauth.Auth, error) {
			token, err := readfile.Read(path, maxTokenBytes)
			if err != nil {
				return oauth.Auth{}, fmt.Errorf("kafka.sasl.token_file: %w", err)
			}
			return oauth.Auth{Token: strings.TrimSpace(string(token))}, nil
		})
	default:
		return kc, fmt.Errorf("wiring: sasl: unsupported mechanism %q", s.Mechanism)
	}
	return kc, nil
}

// maxTokenBytes bounds kafka.sasl.token_file: 64 KiB, far more than a
// bearer token takes.
const maxTokenBytes = 64 << 10

// balancers returns the partition assignor kafka.balancer names.
func balancers(name config.Balancer) []kgo.GroupBalancer {
	switch name {
	case config.BalancerSticky:
		return []kgo.GroupBalancer{kgo.StickyBalancer()}
	case config.BalancerRange:
		return []kgo.GroupBalancer{kgo.RangeBalancer()}
	case config.BalancerRoundRobin:
		return []kgo.GroupBalancer{kgo.RoundRobinBalancer()}
	default:
		return []kgo.GroupBalancer{kgo.CooperativeStickyBalancer()}
	}
}

// decodersFromConfig returns the default decoder and the per-topic ones
// (kafka.format "", left unset with source binlog, whose row changes
// come decoded, is config.DefaultFormat).
// They keep in row images only the columns some rule of rs reads; schemas
// (nil without a registry) holds the schemas of Avro messages.
func decodersFromConfig(k config.Kafka, rs *rules.RuleSet, schemas decode.AvroSchemas) (*decode.Decoder, map[string]*decode.Decoder, error) {
	name := k.Format
	if name == "" {
		name = config.DefaultFormat
	}
	f, err := decode.ParseFormat(name)
	if err != nil {
		return nil, nil, err
	}
	keep := decode.NewColumnSet(rs.ColumnsRead())
	dec := &decode.Decoder{Format: f, TopicTables: k.TopicTables, Keep: keep, Schemas: schemas}
	var byTopic map[string]*decode.Decoder
	for topic, name := range k.TopicFormats {
		f, err := decode.ParseFormat(name)
		if err != nil {
			return nil, nil, fmt.Errorf("wiring: topic %s: %w", topic, err)
		}
		if byTopic == nil {
			byTopic = make(map[string]*decode.Decoder)
		}
		byTopic[topic] = &decode.Decoder{Format: f, TopicTables: k.TopicTables, Keep: keep, Schemas: schemas}
	}
	return dec, byTopic, nil
}

// timedMySQL records the latency of every load and recount query.
type timedMySQL struct {
	db *counters.MySQL
	m  *pipeline.Metrics
}

func (t *timedMySQL) LoadMembers(ctx context.Context, query string, args []rules.Value) ([]string, error) {
	start := time.Now()
	members, err := t.db.LoadMembers(ctx, query, args)
	t.m.ObserveMySQL("load", time.Since(start), err)
	return members, err
}

// CountInSnapshot makes timedMySQL a counters.SnapshotCounter, so that
// the counters fence their recounts.
func (t *timedMySQL) CountInSnapshot(ctx context.Context, query string, args []rules.Value, opts counters.SnapshotOptions) (counters.SnapshotCount, error) {
	start := time.Now()
	sc, err := t.db.CountInSnapshot(ctx, query, args, opts)
	t.m.ObserveMySQL("recount", time.Since(start), err)
	return sc, err
}

// CountAllInSnapshot makes timedMySQL a counters.SnapshotBatchCounter,
// so that the recounts of one batch share a snapshot. Each recount is
// recorded with its own outcome and the time they all took.
func (t *timedMySQL) CountAllInSnapshot(ctx context.Context, qs []counters.SnapshotQuery, opts counters.SnapshotOptions) ([]counters.SnapshotCount, []error) {
	start := time.Now()
	counts, errs := t.db.CountAllInSnapshot(ctx, qs, opts)
	d := time.Since(start)
	for _, err := range errs {
		t.m.ObserveMySQL("recount", d, err)
	}
	return counts, errs
}

func (t *timedMySQL) Count(ctx context.Context, query string, args []rules.Value) (int64, error) {
	start := time.Now()
	n, err := t.db.Count(ctx, query, args)
	t.m.ObserveMySQL("recount", time.Since(start), err)
	return n, err
}

// newSchemaRegistry returns a client of the registry the config's
// kafka.schema_registry section describes.
func newSchemaRegistry(c config.SchemaRegistry, m *kafka.Metrics, log *slog.Logger) (*kafka.SchemaRegistry, error) {
	tc, err := c.TLS.Config("kafka.schema_registry.tls")
	if err != nil {
		return nil, err
	}
	return kafka.NewSchemaRegistry(kafka.RegistryConfig{URLs: c.URLs, Username: c.Username, Password: c.Password, TLS: tc, Timeout: c.Timeout}, m, log)
}
