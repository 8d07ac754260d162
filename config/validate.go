package config

import (
	"fmt"
	"maps"
	"math"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/pipeline"
	"github.com/go-sql-driver/mysql"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/counters"
	"github.com/cachewarden/cachewarden/decode"
	"github.com/cachewarden/cachewarden/internal/metaproto"
	"github.com/cachewarden/cachewarden/internal/yamlfile"
)

// validate applies defaults to settings the file left out and reports every
// value that is wrong on its own or together with others.
func (d *decoder) validate(c *Config) {
	oneOf(d, "source", &c.Source, SourceKafka, SourceKinds)
	// A source misspelt is reported once; the section written is checked.
	binlogSource := c.Source == SourceBinlog || !slices.Contains(SourceKinds, c.Source) && d.Set("binlog")
	switch {
	case binlogSource:
		d.validateBinlog(&c.Binlog)
		if d.Set("kafka") {
			d.validateKafka(&c.Kafka)
		}
	case d.Set("binlog"):
		d.problem(d.KeyPlace("binlog"), "binlog: this section is read with source: binlog only (source is %s)", c.Source)
		fallthrough
	default:
		d.validateKafka(&c.Kafka)
	}
	d.validateMemcached(&c.Memcached)
	d.validateMySQL(&c.MySQL)
	d.validateCounters(&c.Counters)
	if len(c.Rules) == 0 && d.Readable("rules") {
		d.required("rules", "list at least one rule file or directory")
	}
	d.validateBatch(&c.Batch)
	d.validateHTTP(&c.HTTP)
	d.validateLog(&c.Log)
	d.validateObserver(&c.Observer, &c.Kafka)
}

// wrong reports the setting at path where it was written, the message
// after its path ("memcached.timeout: 2h is outside (0, 1m]").
func (d *decoder) wrong(path, format string, args ...any) {
	d.problem(d.Place(path), "%s: %s", path, fmt.Sprintf(format, args...))
}

// required reports a required setting that is empty: as a missing key
// (in yamlfile's wording) when it is not written, else with emptyMsg.
func (d *decoder) required(path, emptyMsg string) {
	if d.Set(path) {
		d.wrong(path, "%s", emptyMsg)
		return
	}
	parent, key := "", path
	if i := strings.LastIndexByte(path, '.'); i >= 0 {
		parent, key = path[:i], path[i+1:]
	}
	if !d.Readable(parent) {
		return // the section itself was unreadable, and reported
	}
	d.problem(d.Place(path), "%s", yamlfile.In(parent, yamlfile.MissingKey(key)))
}

// validateAddresses checks a required list of host:port addresses at
// path; missing says what to list.
func (d *decoder) validateAddresses(addrs []string, path, missing string) {
	if len(addrs) == 0 && d.Readable(path) {
		d.required(path, missing)
	}
	for i, a := range addrs {
		at := path + "[" + strconv.Itoa(i) + "]"
		if msg := checkHostPort(a, false); msg != "" {
			d.wrong(at, "%q %s", a, msg)
		}
	}
}

func (d *decoder) validateKafka(k *Kafka) {
	d.validateAddresses(k.Brokers, "kafka.brokers", "list at least one broker address (host:port)")
	if k.Group == "" && d.Readable("kafka.group") {
		d.required("kafka.group", "a consumer group ID is required")
	}
	if len(k.Topics) == 0 && d.Readable("kafka.topics") {
		d.required("kafka.topics", "list at least one topic")
	}
	topics := make(map[string]bool, len(k.Topics))
	for i, t := range k.Topics {
		path := "kafka.topics[" + strconv.Itoa(i) + "]"
		if msg := checkTopicName(t); msg != "" {
			d.wrong(path, "%q %s", t, msg)
		}
		if topics[t] {
			d.wrong(path, "topic %q is listed twice", t)
		}
		topics[t] = true
	}
	if d.orDefault("kafka.format", func() { k.Format = DefaultFormat }) && !isFormat(k.Format) {
		d.wrong("kafka.format", "%q is not one of %s", k.Format, strings.Join(decode.Names(), ", "))
	}
	for _, t := range sortedKeys(k.TopicFormats) {
		path := "kafka.topic_formats[" + strconv.Quote(t) + "]"
		if !topics[t] {
			d.problem(d.KeyPlace(path), "kafka.topic_formats: topic %q is not in kafka.topics", t)
		}
		if f := k.TopicFormats[t]; !isFormat(f) {
			d.wrong(path, "%q is not one of %s", f, strings.Join(decode.Names(), ", "))
		}
	}
	for _, t := range sortedKeys(k.TopicTables) {
		path := "kafka.topic_tables[" + strconv.Quote(t) + "]"
		if !topics[t] {
			d.problem(d.KeyPlace(path), "kafka.topic_tables: topic %q is not in kafka.topics", t)
		}
		if tbl := k.TopicTables[t]; !validTableName(tbl) {
			d.wrong(path, "%q is not a table name (write db.table or table)", tbl)
		}
	}
	if k.DLQTopic != "" {
		if msg := checkTopicName(k.DLQTopic); msg != "" {
			d.wrong("kafka.dlq_topic", "%q %s", k.DLQTopic, msg)
		} else if topics[k.DLQTopic] {
			d.wrong("kafka.dlq_topic", "%q is also a consumed topic; poison messages would come back", k.DLQTopic)
		}
	}
	if d.orDefault("kafka.client_id", func() { k.ClientID = DefaultClientID }) && k.ClientID == "" {
		d.wrong("kafka.client_id", "must not be empty")
	}
	d.validateTLS("kafka.tls", &k.TLS)
	oneOf(d, "kafka.start_offset", &k.StartOffset, StartEarliest, StartOffsets)
	oneOf(d, "kafka.offset_reset", &k.OffsetReset, ResetFail, OffsetResets)
	oneOf(d, "kafka.balancer", &k.Balancer, BalancerCooperativeSticky, Balancers)
	oneOf(d, "kafka.unordered_sets", &k.UnorderedSets, UnorderedSetsDelete, UnorderedSetPolicies)
	if k.SessionTimeout > 0 && k.HeartbeatInterval > 0 && k.HeartbeatInterval*3 > k.SessionTimeout {
		d.wrong("kafka.heartbeat_interval", "%s is more than a third of kafka.session_timeout (%s); the member would be dropped between heartbeats",
			k.HeartbeatInterval, k.SessionTimeout)
	}
	if k.RebalanceTimeout > 0 && k.HandoffTimeout >= k.RebalanceTimeout {
		d.wrong("kafka.handoff_timeout", "%s must be below kafka.rebalance_timeout (%s), or a released partition could outlast the rebalance",
			k.HandoffTimeout, k.RebalanceTimeout)
	}
	if d.orDefault("kafka.max_decompressed_batch_bytes", func() { k.MaxDecompressedBatchBytes = DefaultMaxDecompressedBatchBytes }) &&
		(k.MaxDecompressedBatchBytes < MinDecompressedBatchBytes || k.MaxDecompressedBatchBytes > MaxDecompressedBatchBytes) {
		d.wrong("kafka.max_decompressed_batch_bytes", "%d is outside %d..%d (1 MiB to 1 GiB)",
			k.MaxDecompressedBatchBytes, MinDecompressedBatchBytes, MaxDecompressedBatchBytes)
	}
	d.validateSASL(&k.SASL)
	d.validateSchemaRegistry(k)
}

// validateSchemaRegistry checks kafka.schema_registry, and that topics
// fixed to format avro have a registry.
func (d *decoder) validateSchemaRegistry(k *Kafka) {
	const path = "kafka.schema_registry"
	r := &k.SchemaRegistry
	for i, u := range r.URLs {
		p := path + ".urls[" + strconv.Itoa(i) + "]"
		switch parsed, err := url.Parse(u); {
		case err != nil:
			d.wrong(p, "%q is not a URL: %v", u, err)
		case parsed.Scheme != "http" && parsed.Scheme != "https":
			d.wrong(p, "%q: want an http:// or https:// URL", u)
		case parsed.Host == "":
			d.wrong(p, "%q has no host", u)
		case parsed.User != nil:
			d.wrong(p, "credentials go in %s.username and password, not in the URL", path)
		case parsed.Scheme == "http" && r.TLS.Enabled:
			d.wrong(p, "%q is plain http, but %s.tls.enabled is true", u, path)
		}
	}
	d.validateTLS(path+".tls", &r.TLS)
	if (r.Username == "") != (r.Password == "") {
		d.wrong(path, "username and password go together")
	}
	if len(r.URLs) == 0 {
		var set []string
		for _, s := range []struct {
			name string
			on   bool
		}{
			{"username", r.Username != ""},
			{"password", r.Password != ""},
			{"tls.enabled", r.TLS.Enabled},
			{"timeout", d.Set(path + ".timeout")},
		} {
			if s.on {
				set = append(set, path+"."+s.name)
			}
		}
		if len(set) > 0 {
			d.problem(d.Place(set[0]), "%s.urls: list the registry's URLs, or remove %s (set, but used only with a registry)", path, strings.Join(set, " and "))
		}
	}
	d.positiveDuration(&r.Timeout, path+".timeout", DefaultSchemaRegistryTimeout, 10*time.Minute)
	if len(r.URLs) > 0 || !d.Readable(path+".urls") {
		return
	}
	if needsRegistry(k.Format) {
		d.wrong("kafka.format", "avro needs %s.urls, where the messages' schemas are read", path)
	}
	for _, t := range sortedKeys(k.TopicFormats) {
		if needsRegistry(k.TopicFormats[t]) {
			p := "kafka.topic_formats[" + strconv.Quote(t) + "]"
			d.wrong(p, "avro needs %s.urls, where the messages' schemas are read", path)
		}
	}
}

// validateTLS checks a TLS section at path (kafka.tls, memcached.tls).
func (d *decoder) validateTLS(path string, t *TLS) {
	files := []struct{ path, name string }{
		{path + ".ca_file", t.CAFile},
		{path + ".cert_file", t.CertFile},
		{path + ".key_file", t.KeyFile},
	}
	for _, f := range files {
		if f.name == "" {
			continue
		}
		if !t.Enabled {
			d.wrong(f.path, "set, but %s.enabled is not true", path)
			continue
		}
		if _, err := os.Stat(f.name); err != nil {
			d.wrong(f.path, "%v", err)
		}
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		d.wrong(path, "cert_file and key_file go together")
	}
}

// oneOf checks that the setting at path, when written, is one of values,
// and sets it to def when it was not written.
func oneOf[T ~string](d *decoder, path string, v *T, def T, values []T) {
	if d.orDefault(path, func() { *v = def }) && !slices.Contains(values, *v) {
		d.wrong(path, "%q is not one of %s", *v, joinValues(values))
	}
}

// joinValues lists an enumeration's values as messages do: "a, b, c".
func joinValues[T ~string](values []T) string {
	s := make([]string, len(values))
	for i, v := range values {
		s[i] = string(v)
	}
	return strings.Join(s, ", ")
}

func (d *decoder) validateSASL(s *SASL) {
	if s.Mechanism == "" {
		if s.Username != "" || s.Password != "" || s.TokenFile != "" {
			d.wrong("kafka.sasl", "credentials need a mechanism (%s)", joinValues(SASLMechanisms))
		}
		return
	}
	if !slices.Contains(SASLMechanisms, s.Mechanism) {
		d.wrong("kafka.sasl.mechanism", "%q is not one of %s", s.Mechanism, joinValues(SASLMechanisms))
		return
	}
	if s.Mechanism == SASLOAuthBearer {
		if s.TokenFile == "" {
			d.problem(d.Place("kafka.sasl"), "kafka.sasl.token_file: required with mechanism oauthbearer")
		}
		if s.Username != "" || s.Password != "" {
			d.wrong("kafka.sasl", "oauthbearer takes token_file, not username and password")
		}
		return
	}
	if s.TokenFile != "" {
		d.wrong("kafka.sasl.token_file", "only for mechanism oauthbearer")
	}
	if s.Username == "" {
		d.wrong("kafka.sasl.username", "required with a mechanism")
	}
	if s.Password == "" {
		d.wrong("kafka.sasl.password", "required with a mechanism")
	}
}

func (d *decoder) validateMemcached(m *Memcached) {
	d.validateAddresses(m.Servers, "memcached.servers", "list at least one server address (host:port)")
	d.validateTLS("memcached.tls", &m.TLS)
	if d.orDefault("memcached.distribution", func() { m.Distribution = itemformat.DefaultDistribution }) && !slices.Contains(itemformat.Distributions, m.Distribution) {
		d.wrong("memcached.distribution", "%q is not one of %s", m.Distribution, strings.Join(itemformat.Distributions, ", "))
	}
	for _, addr := range slices.Sorted(maps.Keys(m.Weights)) {
		path := "memcached.weights[" + strconv.Quote(addr) + "]"
		w := m.Weights[addr]
		switch {
		case !slices.Contains(m.Servers, addr):
			d.wrong(path, "%q is not one of memcached.servers", addr)
		case w < 1 || w > math.MaxUint16:
			d.wrong(path, "%d is outside 1..%d", w, math.MaxUint16)
		case w != 1 && m.Distribution != itemformat.DistributionKetama && m.Distribution != "":
			d.wrong(path, "weights apply to memcached.distribution ketama only, not %s", m.Distribution)
		}
	}
	if d.orDefault("memcached.max_concurrency", func() { m.MaxConcurrency = cacheops.DefaultMaxConcurrency }) && (m.MaxConcurrency < 1 || m.MaxConcurrency > MaxMemcachedConcurrent) {
		d.wrong("memcached.max_concurrency", "%d is outside 1..%d", m.MaxConcurrency, MaxMemcachedConcurrent)
	}
	d.positiveDuration(&m.Timeout, "memcached.timeout", metaproto.DefaultTimeout, time.Minute)
	oneOf(d, "memcached.protocol", &m.Protocol, DefaultMemcachedProtocol, MemcachedProtocols)
	if d.orDefault("memcached.compact_ratio", func() { m.CompactRatio = itemformat.DefaultCompactRatio }) && !(m.CompactRatio > 0 && m.CompactRatio <= 1) {
		d.wrong("memcached.compact_ratio", "%g is outside (0, 1]", m.CompactRatio)
	}
	if d.orDefault("memcached.compact_sample", func() { m.CompactSample = cacheops.DefaultCompactSample }) && !(m.CompactSample >= 0 && m.CompactSample <= 1) {
		d.wrong("memcached.compact_sample", "%g is outside [0, 1]", m.CompactSample)
	}
}

func (d *decoder) validateMySQL(m *MySQL) {
	if m.DSN != "" {
		if _, err := mysql.ParseDSN(m.DSN); err != nil {
			// The driver's messages name the problem, never the password.
			d.wrong("mysql.dsn", "%v", err)
		}
	}
	if d.orDefault("mysql.max_open_conns", func() { m.MaxOpenConns = counters.DefaultMaxOpenConns }) && m.MaxOpenConns < 1 {
		d.wrong("mysql.max_open_conns", "%d must be at least 1", m.MaxOpenConns)
	}
	d.positiveDuration(&m.QueryTimeout, "mysql.query_timeout", counters.DefaultQueryTimeout, 10*time.Minute)
}

func (d *decoder) validateBatch(b *Batch) {
	if d.orDefault("batch.max_events", func() { b.MaxEvents = pipeline.DefaultMaxEvents }) && (b.MaxEvents < 1 || b.MaxEvents > MaxBatchEvents) {
		d.wrong("batch.max_events", "%d is outside 1..%d", b.MaxEvents, MaxBatchEvents)
	}
	d.positiveDuration(&b.MaxWait, "batch.max_wait", pipeline.DefaultMaxWait, MaxBatchWait)
}

// orDefault is how every default is filled: when the file left the
// setting at path out, it calls fill (which sets the default) and returns
// false; else it returns whether the written value could be read, and so
// is to be checked. An explicit zero is checked, never replaced.
func (d *decoder) orDefault(path string, fill func()) bool {
	if !d.Set(path) {
		fill()
		return false
	}
	return d.Readable(path)
}

// positiveDuration defaults an unset duration and checks a set one against
// (0, max].
func (d *decoder) positiveDuration(v *time.Duration, path string, def, max time.Duration) {
	if d.orDefault(path, func() { *v = def }) && (*v <= 0 || *v > max) {
		d.wrong(path, "%s is outside (0, %s]", *v, max)
	}
}

func (d *decoder) validateHTTP(h *HTTP) {
	if !d.orDefault("http.listen", func() { h.Listen = DefaultHTTPListen }) {
		return
	}
	if msg := checkHostPort(h.Listen, true); msg != "" {
		d.wrong("http.listen", "%q %s", h.Listen, msg)
	}
}

func (d *decoder) validateLog(l *Log) {
	oneOf(d, "log.format", &l.Format, DefaultLogFormat, LogFormats)
	if _, ok := parseLevel(l.Level); d.orDefault("log.level", func() { l.Level = DefaultLogLevel }) && !ok {
		d.wrong("log.level", "%q is not debug, info, warn or error", l.Level)
	}
}

// checkHostPort returns why addr is not host:port, or "". A listen address
// may leave the host empty (all interfaces) and use port 0 (any port).
func checkHostPort(addr string, listen bool) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "is not host:port"
	}
	if host == "" && !listen {
		return "has no host"
	}
	if strings.ContainsAny(host, " \t/") {
		return "has a bad host"
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 || (n == 0 && !listen) {
		return "has a bad port"
	}
	return ""
}

// checkTopicName returns why t is not a legal Kafka topic name, or "".
func checkTopicName(t string) string {
	if t == "" || t == "." || t == ".." {
		return "is not a topic name"
	}
	if len(t) > 249 {
		return "is longer than 249 characters"
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !(c == '.' || c == '_' || c == '-' || '0' <= c && c <= '9' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			return "may hold only letters, digits, '.', '_' and '-'"
		}
	}
	return ""
}

// validTableName accepts "table" and "db.table" with non-empty parts and no
// whitespace.
func validTableName(s string) bool {
	if s == "" || strings.ContainsAny(s, " \t\r\n") {
		return false
	}
	db, table, qualified := strings.Cut(s, ".")
	if !qualified {
		return true
	}
	return db != "" && table != "" && !strings.Contains(table, ".")
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// isFormat reports whether name is a CDC format the decoders know.
func isFormat(name string) bool {
	_, err := decode.ParseFormat(name)
	return err == nil
}

// needsRegistry reports whether messages of the format named name are
// read with schemas from a schema registry (false for an unknown name,
// reported apart).
func needsRegistry(name string) bool {
	f, err := decode.ParseFormat(name)
	return err == nil && f.NeedsRegistry()
}
