package config

import (
	"bytes"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Redacted is what EffectiveYAML writes in place of a secret: the MySQL
// DSN's password, the SASL password and the schema registry's password.
const Redacted = redacted

// EffectiveYAML returns c as a config file that Parse reads back into the
// same Config: every setting with its value after ${NAME} expansion and
// with the defaults Parse filled in, in the file's key order, secrets
// replaced by Redacted. A "${" in a value is written "$${" so that it is
// not expanded again; rule paths are absolute, so the file loads from
// anywhere. Settings whose default is decided where they are used, not
// by Parse (the Kafka group timers, kafka.handoff_timeout and
// stall_timeout, the observer's tunables), are written only when the
// file set them. The TLS sections name their key files by path: the keys
// themselves are never in the config.
func (c *Config) EffectiveYAML() ([]byte, error) {
	var rulePaths []string
	for _, p := range c.Rules {
		abs, err := filepath.Abs(p)
		if err != nil {
			return nil, fmt.Errorf("config: rules: %w", err)
		}
		rulePaths = append(rulePaths, abs)
	}
	k, m := &c.Kafka, &c.Memcached
	root := mapping(
		"kafka", mapping(
			"brokers", strList(k.Brokers),
			"group", str(k.Group),
			"topics", strList(k.Topics),
			"format", str(k.Format),
			"topic_formats", strMap(k.TopicFormats),
			"topic_tables", strMap(k.TopicTables),
			"dlq_topic", optStr(k.DLQTopic),
			"client_id", str(k.ClientID),
			"tls", tlsNode(k.TLS),
			"sasl", saslNode(k.SASL),
			"schema_registry", registryNode(k.SchemaRegistry),
			"start_offset", str(string(k.StartOffset)),
			"offset_reset", str(string(k.OffsetReset)),
			"balancer", str(string(k.Balancer)),
			"session_timeout", optDuration(k.SessionTimeout),
			"heartbeat_interval", optDuration(k.HeartbeatInterval),
			"rebalance_timeout", optDuration(k.RebalanceTimeout),
			"handoff_timeout", optDuration(k.HandoffTimeout),
			"stall_timeout", optDuration(k.StallTimeout),
			"unordered_sets", str(string(k.UnorderedSets)),
			"check_crcs", boolean(k.CheckCRCs),
			"max_decompressed_batch_bytes", integer(k.MaxDecompressedBatchBytes),
		),
		"memcached", mapping(
			"servers", strList(m.Servers),
			"distribution", str(m.Distribution),
			"weights", intMap(m.Weights),
			"tls", tlsNode(m.TLS),
			"protocol", str(string(m.Protocol)),
			"max_concurrency", integer(m.MaxConcurrency),
			"timeout", duration(m.Timeout),
			"compact_ratio", float(m.CompactRatio),
			"compact_sample", float(m.CompactSample),
		),
		"mysql", mapping(
			"dsn", optStr(RedactDSN(c.MySQL.DSN)),
			"max_open_conns", integer(c.MySQL.MaxOpenConns),
			"query_timeout", duration(c.MySQL.QueryTimeout),
		),
		"counters", mapping(
			"fencing", str(string(c.Counters.Fencing)),
			"fence_ttl", duration(c.Counters.FenceTTL),
		),
		"rules", strList(rulePaths),
		"batch", mapping(
			"max_events", integer(c.Batch.MaxEvents),
			"max_wait", duration(c.Batch.MaxWait),
		),
		"http", mapping(
			"listen", str(c.HTTP.Listen),
			"pprof", boolean(c.HTTP.Pprof),
		),
		"log", mapping(
			"format", str(string(c.Log.Format)),
			"level", str(c.Log.Level),
		),
		"observer", observerNode(c.Observer),
	)
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(root); err != nil {
		return nil, fmt.Errorf("config: write YAML: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("config: write YAML: %w", err)
	}
	return buf.Bytes(), nil
}

func tlsNode(t TLS) *yaml.Node {
	if t == (TLS{}) {
		return nil
	}
	return mapping(
		"enabled", boolean(t.Enabled),
		"ca_file", optStr(t.CAFile),
		"cert_file", optStr(t.CertFile),
		"key_file", optStr(t.KeyFile),
		"server_name", optStr(t.ServerName),
		"insecure_skip_verify", optBool(t.InsecureSkipVerify),
	)
}

func saslNode(s SASL) *yaml.Node {
	if s.Mechanism == "" {
		return nil
	}
	return mapping(
		"mechanism", str(string(s.Mechanism)),
		"username", optStr(s.Username),
		"password", optStr(redactPassword(s.Password)),
		"token_file", optStr(s.TokenFile),
	)
}

func registryNode(r SchemaRegistry) *yaml.Node {
	if len(r.URLs) == 0 {
		return nil // its timeout is filled in, but refused without URLs
	}
	return mapping(
		"urls", strList(r.URLs),
		"username", optStr(r.Username),
		"password", optStr(redactPassword(r.Password)),
		"tls", tlsNode(r.TLS),
		"timeout", duration(r.Timeout),
	)
}

func observerNode(o Observer) *yaml.Node {
	var windows *yaml.Node
	if len(o.Windows) > 0 {
		windows = &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
		for _, w := range o.Windows {
			windows.Content = append(windows.Content, duration(w))
		}
	}
	return mapping(
		"enabled", boolean(o.Enabled),
		"sample", optFloat(o.Sample),
		"max_per_second", optFloat(o.MaxPerSecond),
		"windows", windows,
		"confirm_after", optDuration(o.ConfirmAfter),
		"mysql_queries_per_second", optFloat(o.MySQLQueriesPerSecond),
		"memcached_reads_per_second", optFloat(o.MemcachedReadsPerSecond),
		"max_pending", optInt(o.MaxPending),
		"clock_skew", optDuration(o.ClockSkew),
		"report_every", optDuration(o.ReportEvery),
		"group", optStr(o.Group),
	)
}

// mapping makes a mapping of key, value pairs, leaving out nil values.
func mapping(pairs ...any) *yaml.Node {
	n := &yaml.Node{Kind: yaml.MappingNode}
	for i := 0; i < len(pairs); i += 2 {
		v := pairs[i+1].(*yaml.Node)
		if v == nil {
			continue
		}
		n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: pairs[i].(string)}, v)
	}
	return n
}

func scalar(tag, v string) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: v}
}

// str writes a string as a quoted scalar, with "${" escaped as "$${" so
// that Parse does not expand it again.
func str(s string) *yaml.Node {
	n := scalar("!!str", strings.ReplaceAll(s, "${", "$${"))
	n.Style = yaml.DoubleQuotedStyle
	return n
}

func optStr(s string) *yaml.Node {
	if s == "" {
		return nil
	}
	return str(s)
}

func strList(l []string) *yaml.Node {
	n := &yaml.Node{Kind: yaml.SequenceNode}
	for _, s := range l {
		n.Content = append(n.Content, str(s))
	}
	return n
}

func strMap(m map[string]string) *yaml.Node {
	if len(m) == 0 {
		return nil
	}
	n := &yaml.Node{Kind: yaml.MappingNode}
	for _, k := range sortedKeys(m) {
		n.Content = append(n.Content, str(k), str(m[k]))
	}
	return n
}

func intMap(m map[string]int) *yaml.Node {
	if len(m) == 0 {
		return nil
	}
	n := &yaml.Node{Kind: yaml.MappingNode}
	for _, k := range slices.Sorted(maps.Keys(m)) {
		n.Content = append(n.Content, str(k), integer(m[k]))
	}
	return n
}

func integer(v int) *yaml.Node { return scalar("!!int", strconv.Itoa(v)) }

func optInt(v int) *yaml.Node {
	if v == 0 {
		return nil
	}
	return integer(v)
}

func float(v float64) *yaml.Node { return scalar("!!float", strconv.FormatFloat(v, 'g', -1, 64)) }

func optFloat(v float64) *yaml.Node {
	if v == 0 {
		return nil
	}
	return float(v)
}

func boolean(v bool) *yaml.Node { return scalar("!!bool", strconv.FormatBool(v)) }

func optBool(v bool) *yaml.Node {
	if !v {
		return nil
	}
	return boolean(v)
}

func duration(d time.Duration) *yaml.Node { return scalar("!!str", d.String()) }

func optDuration(d time.Duration) *yaml.Node {
	if d == 0 {
		return nil
	}
	return duration(d)
}
