// Package config loads the cachewarden daemon's YAML configuration file.
//
// The file's keys are declared once, as the yaml tags of Config and its
// sections: Parse decodes through them (yamlfile.Decoder) and
// EffectiveYAML writes through them (a field tagged omitempty is written
// only when set). The settings that take one of a few words have types
// of their own (enums.go).
//
// Decoding is strict: an unknown or duplicate key, a value of the wrong
// type, a bad duration or address, or a missing required setting is an
// error, and every such problem in the file is reported at once as
// "file:line:col: message". Scalar values may refer to the environment
// with ${NAME} or ${NAME:-default} (see Parse). Secrets (the MySQL DSN's
// password, the SASL password) are redacted by every String and LogValue
// method, so a Config may be logged as a whole.
//
// A loaded Config is read-only; it is safe for concurrent use.
//
// It builds nothing from the settings it reads (package wiring's
// NewStack does), and it does not parse rule files (package rulefile
// does, called by Load).
package config

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"time"

	"github.com/cachewarden/cachewarden/internal/readfile"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/source/kafka"
)

// Defaults applied by Parse to settings the file leaves out, for the
// settings no package below config uses on its own. The defaults of the
// memcached, mysql and counters settings are the packages' that use them
// (cacheops.DefaultMaxConcurrency, metaproto.DefaultTimeout,
// itemformat.DefaultCompactRatio, cacheops.DefaultCompactSample,
// itemformat.DefaultDistribution, counters.DefaultMaxOpenConns,
// counters.DefaultQueryTimeout, counters.DefaultFenceTTL). The batch,
const (
	DefaultFormat                    = "auto"
	DefaultClientID                  = kafka.DefaultClientID
	DefaultMemcachedProtocol         = ProtocolMeta
	DefaultHTTPListen                = "127.0.0.1:9464"
	DefaultLogFormat                 = LogText
	DefaultLogLevel                  = "info"
	DefaultSchemaRegistryTimeout     = kafka.DefaultSchemaRegistryTimeout
	DefaultMaxDecompressedBatchBytes = kafka.DefaultMaxDecompressedBatchBytes
)

// Limits checked by validation.
const (
	// MinDecompressedBatchBytes and MaxDecompressedBatchBytes bound
	// kafka.max_decompressed_batch_bytes: a batch of one record of
	// Kafka's default max.message.bytes must fit; the Kafka client
	// takes at most 2 GiB - 1.
	MinDecompressedBatchBytes = 1 << 20
	MaxDecompressedBatchBytes = 1 << 30
	MaxBatchEvents            = 100_000
	MaxBatchWait              = time.Minute
	MaxMemcachedConcurrent    = 1024
)

// Config is the whole daemon configuration.
type Config struct {
	// File is the path the config was read from ("" when parsed from
	// memory without a name).
	File string
	// Source is where change events come from: "kafka" (default) or
	// "binlog" (the binlog section; no kafka section needed).
	Source SourceKind `yaml:"source"`
	Kafka  Kafka      `yaml:"kafka"`
	// Binlog is the binary log source, read when Source is binlog.
	Binlog    Binlog    `yaml:"binlog,omitempty"`
	Memcached Memcached `yaml:"memcached"`
	MySQL     MySQL     `yaml:"mysql"`
	// Counters tunes exact counters (key `counters`).
	Counters Counters `yaml:"counters"`
	// Rules are the rule file or directory paths (key `rules`), relative
	// paths resolved against the config file's directory.
	Rules []string `yaml:"rules,commas"`
	// RuleSet holds the loaded rules (set by Load and LoadEnv, nil after
	// Parse).
	RuleSet *rules.RuleSet
	// RulesDigest identifies the rule files RuleSet was loaded from
	// (rulefile.Digest); "" after Parse.
	RulesDigest string
	Batch       Batch `yaml:"batch"`
	HTTP        HTTP  `yaml:"http"`
	Log         Log   `yaml:"log"`
	// Observer is the consistency observer (key `observer`); off unless
	// enabled.
	Observer Observer `yaml:"observer"`
}

// Kafka is the `kafka` section.
type Kafka struct {
	// Brokers are the bootstrap broker addresses (host:port); required.
	// A single string is split on commas, so `brokers: ${KAFKA_BROKERS}`
	// works.
	Brokers []string `yaml:"brokers,commas"`
	// Group is the consumer group ID; required.
	Group string `yaml:"group"`
	// Topics are the CDC topics to consume; required.
	Topics []string `yaml:"topics,commas"`
	// Format is the CDC format of every topic without an entry in
	// TopicFormats; one of decode.Names, default "auto" (detected per message).
	Format string `yaml:"format"`
	// TopicFormats fixes the format per topic.
	TopicFormats map[string]string `yaml:"topic_formats,omitempty"`
	// TopicTables maps a topic to "db.table" (or "table"), for formats
	// whose messages do not name their table (flattened Debezium rows).
	TopicTables map[string]string `yaml:"topic_tables,omitempty"`
	// DLQTopic receives poison messages; "" means poison messages are only
	// logged and counted.
	DLQTopic string `yaml:"dlq_topic,omitempty"`
	// ClientID identifies the daemon to the brokers; default "cachewarden".
	ClientID string `yaml:"client_id"`
	// TLS, when Enabled, encrypts broker connections.
	TLS TLS `yaml:"tls,omitempty"`
	// SASL, when Mechanism is set, authenticates to the brokers.
	SASL SASL `yaml:"sasl,omitempty"`
	// SchemaRegistry is where the schemas of Avro messages are read
	// (Confluent's REST API); needed when a topic carries Avro.
	SchemaRegistry SchemaRegistry `yaml:"schema_registry,omitempty"`
	// StartOffset is where a partition the group never committed starts:
	// "earliest" (default) or "latest".
	StartOffset StartOffset `yaml:"start_offset"`
	// OffsetReset is what happens when a committed offset is no longer
	// in the partition's log (removed by retention before it was read,
	// or beyond a recreated partition's end): "fail" (default: the
	// partition stops and the daemon reports not ready), "earliest" or
	// "latest" (continue there, after bumping the fallback namespaces of
	// the topic's tables).
	OffsetReset OffsetReset `yaml:"offset_reset"`
	// Balancer is the partition assignor: "cooperative-sticky"
	// (default: partitions that stay put keep being consumed during a
	// rebalance), "sticky", "range" or "roundrobin". Every member of a
	// group must use the same.
	Balancer Balancer `yaml:"balancer"`
	// SessionTimeout, HeartbeatInterval and RebalanceTimeout are the
	// group protocol's timers; zero means the client's defaults (45s, 3s,
	// 60s).
	SessionTimeout    time.Duration `yaml:"session_timeout,omitempty"`
	HeartbeatInterval time.Duration `yaml:"heartbeat_interval,omitempty"`
	RebalanceTimeout  time.Duration `yaml:"rebalance_timeout,omitempty"`
	// HandoffTimeout bounds how long a released partition may take to
	// finish the batch it is applying; default 10s.
	HandoffTimeout time.Duration `yaml:"handoff_timeout,omitempty"`
	// StallTimeout is how long a partition may apply nothing while
	// messages wait before the daemon reports not ready; default 1m.
	StallTimeout time.Duration `yaml:"stall_timeout,omitempty"`
	// UnorderedSets is what happens to the changes of a set rule whose
	// changes of one member may arrive out of order (several partitions
	// and a message key not made of the set's key and member columns):
	// "delete" (default: the set is deleted, readers load it again) or
	// "append" (tokens appended anyway).
	UnorderedSets UnorderedSets `yaml:"unordered_sets"`
	// CheckCRCs verifies the CRC32C of every fetched record batch;
	// default false, as librdkafka's check.crcs. Brokers verify batches
	// when they are produced and when a log is recovered, and TCP (and
	// TLS, when on) guards the wire; checking costs a pass over every
	// fetched byte (docs/benchmarks.md, "Where the time goes"). A batch
	// that fails the check is a fetch error of its partition.
	CheckCRCs bool `yaml:"check_crcs"`
	// MaxDecompressedBatchBytes is the most bytes one fetched record
	// batch may decompress to; default DefaultMaxDecompressedBatchBytes
	// (16 MiB). A batch over it is poison: it goes to the DLQ as a
	// record naming it (not its contents), the fallback namespaces of
	// the topic's tables are bumped, and the partition moves past it. It
	// bounds the memory a compression bomb can take.
	MaxDecompressedBatchBytes int `yaml:"max_decompressed_batch_bytes"`
}

// TLS is the `kafka.tls` section.
type TLS struct {
	Enabled bool `yaml:"enabled"`
	// CAFile is a PEM bundle of CAs to trust instead of the system pool.
	CAFile string `yaml:"ca_file,omitempty"`
	// CertFile and KeyFile are a client certificate, both or neither.
	CertFile string `yaml:"cert_file,omitempty"`
	KeyFile  string `yaml:"key_file,omitempty"`
	// ServerName overrides the name checked in the server's certificate
	// (default: the host dialled).
	ServerName string `yaml:"server_name,omitempty"`
	// InsecureSkipVerify disables certificate checks (tests only).
	InsecureSkipVerify bool `yaml:"insecure_skip_verify,omitempty"`
}

// SASL is the `kafka.sasl` section.
type SASL struct {
	// Mechanism is "plain" (use it over TLS), "scram-sha-256",
	// "scram-sha-512" or "oauthbearer"; "" means no SASL.
	Mechanism SASLMechanism `yaml:"mechanism"`
	// Username and Password authenticate plain and SCRAM.
	Username string `yaml:"username,omitempty"`
	// Password is secret: String and LogValue redact it.
	Password string `yaml:"password,omitempty"`
	// TokenFile holds the OAUTHBEARER token; it is read again at every
	// authentication, so that a sidecar can rotate it.
	TokenFile string `yaml:"token_file,omitempty"`
}

// SchemaRegistry is the `kafka.schema_registry` section: a registry
// speaking Confluent Schema Registry's REST API (Confluent, Apicurio's
// compatible API, Redpanda, Karapace). Each schema id is asked for once;
// decoding does not wait for the registry afterwards.
type SchemaRegistry struct {
	// URLs are the registry's base URLs (http:// or https://), tried in
	// order; empty: no registry (Avro messages cannot be decoded). A
	// single string is split on commas.
	URLs []string `yaml:"urls,commas"`
	// Username and Password authenticate with HTTP basic auth, both or
	// neither.
	Username string `yaml:"username,omitempty"`
	// Password is secret: String and LogValue redact it.
	Password string `yaml:"password,omitempty"`
	// TLS configures https:// URLs: CAs, a client certificate, the
	// server name. Its Enabled must be true when any is set.
	TLS TLS `yaml:"tls,omitempty"`
	// Timeout bounds one request; default 5s. A registry that does not
	// answer in time is asked again (the partition waits).
	Timeout time.Duration `yaml:"timeout"`
}

// Memcached is the `memcached` section.
type Memcached struct {
	// Servers are memcached addresses (host:port); required. Keys are
	// spread over them by Distribution, in list order.
	Servers []string `yaml:"servers,commas"`
	// Distribution is how keys are spread over Servers; it must be the
	// one the applications' clients use (README, "memcached"). One of
	// itemformat.Distributions; default "modula-crc32" (gomemcache's).
	Distribution string `yaml:"distribution"`
	// Weights gives servers a weight other than 1, by address (ketama
	// only); may be nil.
	Weights map[string]int `yaml:"weights,omitempty"`
	// TLS encrypts every connection to the servers (memcached 1.6 built
	// with TLS, started with -Z); off by default.
	TLS TLS `yaml:"tls,omitempty"`
	// Protocol is how the daemon writes: "meta" (default) pipelines many
	// meta commands per write and reads the replies in bulk; "text" sends
	// one classic text command per round trip (for servers or proxies
	// without the meta protocol, memcached < 1.6).
	Protocol MemcachedProtocol `yaml:"protocol"`
	// MaxConcurrency bounds the keys applied concurrently by each
	// partition's batch (and the memcached client's idle connections);
	// default 32.
	MaxConcurrency int `yaml:"max_concurrency"`
	// Timeout is the per-operation network timeout; default
	// metaproto.DefaultTimeout.
	Timeout time.Duration `yaml:"timeout"`
	// CompactRatio is the share of removal tokens (0 < r <= 1) above which
	// a set item counts as dirty and is compacted; default 0.5.
	CompactRatio float64 `yaml:"compact_ratio"`
	// CompactSample is the share of set appends (0 <= s <= 1) after which
	// the daemon checks whether the set is dirty; 0 never checks (readers
	// still compact); default 0.01.
	CompactSample float64 `yaml:"compact_sample"`
}

// MySQL is the `mysql` section. It is needed only when a rule has a `load`
// or `recount` query.
type MySQL struct {
	// DSN is a go-sql-driver/mysql DSN; secret: String and LogValue
	// redact its password.
	DSN string `yaml:"dsn,omitempty"`
	// MaxOpenConns bounds open connections; default 8.
	MaxOpenConns int `yaml:"max_open_conns"`
	// QueryTimeout bounds one load or recount query; default 5s.
	QueryTimeout time.Duration `yaml:"query_timeout"`
}

// Batch is the `batch` section.
type Batch struct {
	// MaxEvents is the most messages in one batch; default 2000.
	MaxEvents int `yaml:"max_events"`
	// MaxWait is how long a batch stays open after its first message;
	// default 5ms.
	MaxWait time.Duration `yaml:"max_wait"`
}

// HTTP is the `http` section.
type HTTP struct {
	// Listen is the address of /metrics, /healthz and /readyz; default
	// 127.0.0.1:9464.
	Listen string `yaml:"listen"`
	// Pprof serves Go's profiler under /debug/pprof/ on the same address;
	// default false.
	Pprof bool `yaml:"pprof"`
}

// Log is the `log` section.
type Log struct {
	// Format is "text" or "json"; default "text".
	Format LogFormat `yaml:"format"`
	// Level is "debug", "info", "warn" or "error"; default "info".
	Level string `yaml:"level"`
}

// Selector returns the server selector of m: every memcached client of
// the daemon, the counters, verify and the read side route keys with it.
func (m *Memcached) Selector() (*itemformat.Selector, error) {
	servers := make([]itemformat.Server, len(m.Servers))
	for i, addr := range m.Servers {
		servers[i] = itemformat.Server{Addr: addr, Weight: uint32(m.Weights[addr])}
	}
	sel, err := itemformat.NewSelector(m.Distribution, servers)
	if err != nil {
		return nil, fmt.Errorf("config: memcached: %w", err)
	}
	return sel, nil
}

// Config returns the crypto/tls configuration of t, reading the files it
// names; nil when t is not enabled. section names t in errors.
func (t TLS) Config(section string) (*tls.Config, error) {
	if !t.Enabled {
		return nil, nil
	}
	tc := &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         t.ServerName,
		InsecureSkipVerify: t.InsecureSkipVerify,
	}
	if t.CAFile != "" {
		pem, err := readfile.Read(t.CAFile, maxPEMBytes)
		if err != nil {
			return nil, fmt.Errorf("config: %s.ca_file: %w", section, err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("config: %s.ca_file %s: no PEM certificate", section, t.CAFile)
		}
	}
	if t.CertFile != "" {
		certPEM, err := readfile.Read(t.CertFile, maxPEMBytes)
		if err != nil {
			return nil, fmt.Errorf("config: %s.cert_file: %w", section, err)
		}
		keyPEM, err := readfile.Read(t.KeyFile, maxPEMBytes)
		if err != nil {
			return nil, fmt.Errorf("config: %s.key_file: %w", section, err)
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("config: %s client certificate: %w", section, err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// maxPEMBytes bounds a TLS file (ca_file, cert_file, key_file): 1 MiB,
// thousands of certificates.
const maxPEMBytes = 1 << 20

// Dialer returns how to connect to the memcached servers: over TLS when
// m.TLS is enabled, else plain TCP. Both the gomemcache client
// (memcache.Client.DialContext) and the pipelined writer
// (metaproto.PoolConfig.Dial, through cacheops.Config.Meta) take it.
func (m *Memcached) Dialer() (func(ctx context.Context, network, addr string) (net.Conn, error), error) {
	tc, err := m.TLS.Config("memcached.tls")
	if err != nil {
		return nil, err
	}
	if tc == nil {
		var d net.Dialer
		return d.DialContext, nil
	}
	d := &tls.Dialer{Config: tc}
	return d.DialContext, nil
}
