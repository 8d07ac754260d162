package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cachewarden/cachewarden/internal/yamlfile"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
	"go.yaml.in/yaml/v3"
)

// Load reads the config file at path, expands ${NAME} references from the
// process environment, validates it and loads the rule files it names. The
// error lists every problem of the config and of the rule files at once
// (an *Error and/or a *rules.LoadError, joined).
func Load(path string) (*Config, error) {
	return LoadEnv(path, os.LookupEnv)
}

// LoadEnv is Load with ${NAME} references resolved by lookup.
func LoadEnv(path string, lookup LookupFunc) (*Config, error) {
	data, err := yamlfile.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return LoadBytes(path, data, lookup)
}

// LoadBytes is LoadEnv with the config file's contents given; name locates
// problems and anchors relative rule paths (use a path in the directory
// the rule paths are relative to).
func LoadBytes(name string, data []byte, lookup LookupFunc) (*Config, error) {
	d, cfg := parse(name, data, lookup)
	var rulesErr error
	if len(cfg.Rules) > 0 {
		cfg.RuleSet, cfg.RulesDigest, rulesErr = rulefile.LoadPathsDigest(cfg.Rules...)
		if rulesErr == nil {
			if err := cfg.CheckRuleNeeds(cfg.RuleSet); err != nil {
				if key := err.Setting; !d.bad[key] {
					d.problem(d.place(key), "%v", err)
				}
			}
		}
	}
	if len(d.problems) > 0 {
		sortProblems(d.problems)
		return nil, errors.Join(&Error{Problems: d.problems}, rulesErr)
	}
	if rulesErr != nil {
		return nil, rulesErr
	}
	return cfg, nil
}

// Parse decodes and validates one config file's contents without reading
// the rule files (RuleSet stays nil); name is used in problem locations
// and to resolve relative rule paths. lookup resolves ${NAME} references;
// nil means no variable is set.
//
// Every problem found is returned at once in an *Error. On success the
// Config has every default applied.
func Parse(name string, data []byte, lookup LookupFunc) (*Config, error) {
	d, cfg := parse(name, data, lookup)
	if len(d.problems) > 0 {
		sortProblems(d.problems)
		return nil, &Error{Problems: d.problems}
	}
	return cfg, nil
}

func parse(name string, data []byte, lookup LookupFunc) (*decoder, *Config) {
	if lookup == nil {
		lookup = func(string) (string, bool) { return "", false }
	}
	d := &decoder{file: name, lookup: lookup}
	cfg := &Config{File: name}
	d.decodeFile(data, cfg)
	if d.parsed {
		d.validate(cfg)
	}
	cfg.resolvePaths()
	return d, cfg
}

// CheckRuleNeeds reports rule files that hold no rule at all (the daemon
// would consume and apply nothing), and a setting that rs requires and c
// lacks: a rule with a load or recount query needs mysql.dsn. It
// returns nil when the rules can run. Load checks the rules it loads;
// the daemon checks the rules it reloads.
func (c *Config) CheckRuleNeeds(rs *rules.RuleSet) *RuleNeedError {
	if len(rs.Rules()) == 0 {
		return &RuleNeedError{Setting: "rules", Reason: fmt.Sprintf("no rule in %s: nothing would be applied (a rule file of comments alone holds none)",
			strings.Join(c.Rules, ", "))}
	}
	if c.MySQL.DSN != "" {
		return nil
	}
	for _, r := range rs.Rules() {
		if r.Query != "" {
			return &RuleNeedError{Setting: "mysql.dsn", Reason: fmt.Sprintf("required: rule %q (%s:%d:%d) queries MySQL", r.Name, r.File, r.Line, r.Column)}
		}
	}
	return nil
}

// RuleNeedError is CheckRuleNeeds' finding: the setting it concerns
// ("rules" or "mysql.dsn") and why.
type RuleNeedError struct {
	Setting, Reason string
}

func (e *RuleNeedError) Error() string { return e.Setting + ": " + e.Reason }

// resolvePaths makes relative rule paths relative to the config file.
func (c *Config) resolvePaths() {
	if c.File == "" {
		return
	}
	dir := filepath.Dir(c.File)
	for i, p := range c.Rules {
		if !filepath.IsAbs(p) {
			c.Rules[i] = filepath.Join(dir, p)
		}
	}
}

// pos is a location in the file, kept for validation messages.
type pos struct{ line, col int }

func at(n *yaml.Node) pos { return pos{n.Line, n.Column} }

type decoder struct {
	file     string
	lookup   LookupFunc
	problems []Problem
	// parsed is set once the YAML itself was read, so that validation
	// still runs (and reports more) when only values were wrong.
	parsed bool
	// values and keys remember where each setting read was written, for
	// validation messages about values that are individually fine; a
	// missing setting is reported at its section's key, or at 1:1.
	values map[string]pos
	keys   map[string]pos
	// bad marks settings whose value could not be decoded.
	bad map[string]bool
}

// unreadable reports a value that cannot be decoded and marks its setting
// so that validation does not report it again.
func (d *decoder) unreadable(n *yaml.Node, path, format string, args ...any) {
	if d.bad == nil {
		d.bad = make(map[string]bool)
	}
	d.bad[path] = true
	d.problem(at(n), format, args...)
}

func (d *decoder) problem(p pos, format string, args ...any) {
	d.problems = append(d.problems, Problem{File: d.file, Line: p.line, Column: p.col, Msg: fmt.Sprintf(format, args...)})
}

func (d *decoder) remember(path string, key, val *yaml.Node) {
	if d.values == nil {
		d.values = make(map[string]pos)
		d.keys = make(map[string]pos)
	}
	if key != nil {
		d.keys[path] = at(key)
	}
	d.values[path] = at(yamlfile.Resolve(val))
}

// place returns where a setting's value was written or, for a setting left
// out, the key of the closest enclosing section that is present, and
// finally the top of the file.
func (d *decoder) place(path string) pos {
	if p, ok := d.values[path]; ok {
		return p
	}
	if i := strings.IndexByte(path, '['); i > 0 {
		if p, ok := d.values[path[:i]]; ok {
			return p // an element of a list given as one string
		}
	}
	for {
		i := strings.LastIndexByte(path, '.')
		if i < 0 {
			return pos{1, 1}
		}
		path = path[:i]
		if p, ok := d.keys[path]; ok {
			return p
		}
	}
}

func (d *decoder) decodeFile(data []byte, cfg *Config) {
	root, err := yamlfile.Parse(data)
	var ye *yamlfile.Error
	if errors.As(err, &ye) {
		d.problem(pos{ye.Line, ye.Column}, "%s", ye.Msg)
	}
	if err != nil && root == nil {
		return
	}
	d.parsed = true
	if root == nil {
		return // an empty file: report what is missing
	}
	d.mapping(root, "", map[string]func(*yaml.Node){
		"kafka":     func(n *yaml.Node) { d.kafka(n, &cfg.Kafka) },
		"memcached": func(n *yaml.Node) { d.memcached(n, &cfg.Memcached) },
		"mysql":     func(n *yaml.Node) { d.mysql(n, &cfg.MySQL) },
		"counters":  func(n *yaml.Node) { d.counters(n, &cfg.Counters) },
		"rules":     func(n *yaml.Node) { cfg.Rules = d.strings(n, "rules") },
		"batch":     func(n *yaml.Node) { d.batch(n, &cfg.Batch) },
		"http":      func(n *yaml.Node) { d.http(n, &cfg.HTTP) },
		"log":       func(n *yaml.Node) { d.log(n, &cfg.Log) },
		"observer":  func(n *yaml.Node) { d.observer(n, &cfg.Observer) },
	})
}

func (d *decoder) kafka(n *yaml.Node, k *Kafka) {
	d.mapping(n, "kafka", map[string]func(*yaml.Node){
		"brokers":       func(v *yaml.Node) { k.Brokers = d.strings(v, "kafka.brokers") },
		"group":         func(v *yaml.Node) { k.Group = d.str(v, "kafka.group") },
		"topics":        func(v *yaml.Node) { k.Topics = d.strings(v, "kafka.topics") },
		"format":        func(v *yaml.Node) { k.Format = d.str(v, "kafka.format") },
		"topic_formats": func(v *yaml.Node) { k.TopicFormats = d.stringMap(v, "kafka.topic_formats") },
		"topic_tables":  func(v *yaml.Node) { k.TopicTables = d.stringMap(v, "kafka.topic_tables") },
		"dlq_topic":     func(v *yaml.Node) { k.DLQTopic = d.str(v, "kafka.dlq_topic") },
		"client_id":     func(v *yaml.Node) { k.ClientID = d.str(v, "kafka.client_id") },
		"tls":           func(v *yaml.Node) { d.tls(v, "kafka.tls", &k.TLS) },
		"start_offset":  func(v *yaml.Node) { k.StartOffset = d.str(v, "kafka.start_offset") },
		"offset_reset":  func(v *yaml.Node) { k.OffsetReset = d.str(v, "kafka.offset_reset") },
		"balancer":      func(v *yaml.Node) { k.Balancer = d.str(v, "kafka.balancer") },
		"session_timeout": func(v *yaml.Node) {
			k.SessionTimeout = d.duration(v, "kafka.session_timeout")
		},
		"heartbeat_interval": func(v *yaml.Node) {
			k.HeartbeatInterval = d.duration(v, "kafka.heartbeat_interval")
		},
		"rebalance_timeout": func(v *yaml.Node) {
			k.RebalanceTimeout = d.duration(v, "kafka.rebalance_timeout")
		},
		"handoff_timeout": func(v *yaml.Node) { k.HandoffTimeout = d.duration(v, "kafka.handoff_timeout") },
		"stall_timeout":   func(v *yaml.Node) { k.StallTimeout = d.duration(v, "kafka.stall_timeout") },
		"unordered_sets":  func(v *yaml.Node) { k.UnorderedSets = d.str(v, "kafka.unordered_sets") },
		"check_crcs":      func(v *yaml.Node) { k.CheckCRCs = d.boolean(v, "kafka.check_crcs") },
		"max_decompressed_batch_bytes": func(v *yaml.Node) {
			k.MaxDecompressedBatchBytes = d.integer(v, "kafka.max_decompressed_batch_bytes")
		},
		"schema_registry": func(v *yaml.Node) { d.schemaRegistry(v, &k.SchemaRegistry) },
		"sasl": func(v *yaml.Node) {
			d.mapping(v, "kafka.sasl", map[string]func(*yaml.Node){
				"mechanism":  func(v *yaml.Node) { k.SASL.Mechanism = d.str(v, "kafka.sasl.mechanism") },
				"username":   func(v *yaml.Node) { k.SASL.Username = d.str(v, "kafka.sasl.username") },
				"password":   func(v *yaml.Node) { k.SASL.Password = d.str(v, "kafka.sasl.password") },
				"token_file": func(v *yaml.Node) { k.SASL.TokenFile = d.str(v, "kafka.sasl.token_file") },
			})
		},
	})
}

func (d *decoder) schemaRegistry(n *yaml.Node, r *SchemaRegistry) {
	const path = "kafka.schema_registry"
	d.mapping(n, path, map[string]func(*yaml.Node){
		"urls":     func(v *yaml.Node) { r.URLs = d.strings(v, path+".urls") },
		"username": func(v *yaml.Node) { r.Username = d.str(v, path+".username") },
		"password": func(v *yaml.Node) { r.Password = d.str(v, path+".password") },
		"tls":      func(v *yaml.Node) { d.tls(v, path+".tls", &r.TLS) },
		"timeout":  func(v *yaml.Node) { r.Timeout = d.duration(v, path+".timeout") },
	})
}

// tls decodes a TLS section at path.
func (d *decoder) tls(n *yaml.Node, path string, t *TLS) {
	d.mapping(n, path, map[string]func(*yaml.Node){
		"enabled":              func(v *yaml.Node) { t.Enabled = d.boolean(v, path+".enabled") },
		"ca_file":              func(v *yaml.Node) { t.CAFile = d.str(v, path+".ca_file") },
		"cert_file":            func(v *yaml.Node) { t.CertFile = d.str(v, path+".cert_file") },
		"key_file":             func(v *yaml.Node) { t.KeyFile = d.str(v, path+".key_file") },
		"server_name":          func(v *yaml.Node) { t.ServerName = d.str(v, path+".server_name") },
		"insecure_skip_verify": func(v *yaml.Node) { t.InsecureSkipVerify = d.boolean(v, path+".insecure_skip_verify") },
	})
}

func (d *decoder) memcached(n *yaml.Node, m *Memcached) {
	d.mapping(n, "memcached", map[string]func(*yaml.Node){
		"servers":         func(v *yaml.Node) { m.Servers = d.strings(v, "memcached.servers") },
		"distribution":    func(v *yaml.Node) { m.Distribution = d.str(v, "memcached.distribution") },
		"weights":         func(v *yaml.Node) { m.Weights = d.intMap(v, "memcached.weights") },
		"tls":             func(v *yaml.Node) { d.tls(v, "memcached.tls", &m.TLS) },
		"max_concurrency": func(v *yaml.Node) { m.MaxConcurrency = d.integer(v, "memcached.max_concurrency") },
		"timeout":         func(v *yaml.Node) { m.Timeout = d.duration(v, "memcached.timeout") },
		"protocol":        func(v *yaml.Node) { m.Protocol = d.str(v, "memcached.protocol") },
		"compact_ratio":   func(v *yaml.Node) { m.CompactRatio = d.float(v, "memcached.compact_ratio") },
		"compact_sample":  func(v *yaml.Node) { m.CompactSample = d.float(v, "memcached.compact_sample") },
	})
}

func (d *decoder) mysql(n *yaml.Node, m *MySQL) {
	d.mapping(n, "mysql", map[string]func(*yaml.Node){
		"dsn":            func(v *yaml.Node) { m.DSN = d.str(v, "mysql.dsn") },
		"max_open_conns": func(v *yaml.Node) { m.MaxOpenConns = d.integer(v, "mysql.max_open_conns") },
		"query_timeout":  func(v *yaml.Node) { m.QueryTimeout = d.duration(v, "mysql.query_timeout") },
	})
}

func (d *decoder) batch(n *yaml.Node, b *Batch) {
	d.mapping(n, "batch", map[string]func(*yaml.Node){
		"max_events": func(v *yaml.Node) { b.MaxEvents = d.integer(v, "batch.max_events") },
		"max_wait":   func(v *yaml.Node) { b.MaxWait = d.duration(v, "batch.max_wait") },
	})
}

func (d *decoder) http(n *yaml.Node, h *HTTP) {
	d.mapping(n, "http", map[string]func(*yaml.Node){
		"listen": func(v *yaml.Node) { h.Listen = d.str(v, "http.listen") },
		"pprof":  func(v *yaml.Node) { h.Pprof = d.boolean(v, "http.pprof") },
	})
}

func (d *decoder) log(n *yaml.Node, l *Log) {
	d.mapping(n, "log", map[string]func(*yaml.Node){
		"format": func(v *yaml.Node) { l.Format = d.str(v, "log.format") },
		"level":  func(v *yaml.Node) { l.Level = d.str(v, "log.level") },
	})
}

// errorf records a problem at n; it is the yamlfile.Errorf of the
// config.
func (d *decoder) errorf(n *yaml.Node, format string, args ...any) {
	d.problem(at(n), format, args...)
}

// mapping walks a mapping's keys in file order, calling fields[key] with
// each value; yamlfile reports unknown, duplicate and merge keys. A null
// value is an empty mapping.
func (d *decoder) mapping(n *yaml.Node, path string, fields map[string]func(*yaml.Node)) {
	if yamlfile.IsNull(n) {
		return
	}
	known := make([]string, 0, len(fields))
	for name := range fields {
		known = append(known, name)
	}
	slices.Sort(known)
	fs, ok := yamlfile.Mapping(n, path, known, d.errorf)
	if !ok {
		if d.bad == nil {
			d.bad = make(map[string]bool)
		}
		d.bad[path] = true // its settings are not reported missing
	}
	for _, f := range fs {
		full := f.Key.Value
		if path != "" {
			full = path + "." + f.Key.Value
		}
		d.remember(full, f.Key, f.Value)
		fields[f.Key.Value](f.Value)
	}
}

// scalar returns a scalar's expanded text, or false after reporting a
// problem.
func (d *decoder) scalar(n *yaml.Node, path string) (string, bool) {
	n = yamlfile.Resolve(n)
	if n.Kind != yaml.ScalarNode {
		d.unreadable(n, path, "%s", yamlfile.WrongKind(path, "a single value", n))
		return "", false
	}
	if yamlfile.IsNull(n) {
		return "", true
	}
	s, err := expandEnv(n.Value, d.lookup)
	if err != nil {
		d.unreadable(n, path, "%s: %v", path, err)
		return "", false
	}
	return s, true
}

func (d *decoder) str(n *yaml.Node, path string) string {
	s, _ := d.scalar(n, path)
	return s
}

// strings decodes a list of strings; a single scalar is split on commas
// (after expansion) so that a list can come from one variable. Empty
// elements are dropped.
func (d *decoder) strings(n *yaml.Node, path string) []string {
	n = yamlfile.Resolve(n)
	var out []string
	switch n.Kind {
	case yaml.SequenceNode:
		for i, item := range n.Content {
			itemPath := fmt.Sprintf("%s[%d]", path, len(out))
			s, ok := d.scalar(item, fmt.Sprintf("%s[%d]", path, i))
			d.remember(itemPath, nil, item)
			if ok {
				if s = strings.TrimSpace(s); s != "" {
					out = append(out, s)
				}
			}
		}
	case yaml.ScalarNode:
		s, ok := d.scalar(n, path)
		if !ok {
			return nil
		}
		for _, part := range strings.Split(s, ",") {
			if part = strings.TrimSpace(part); part != "" {
				out = append(out, part)
			}
		}
	default:
		d.unreadable(n, path, "%s", yamlfile.WrongKind(path, "a list", n))
	}
	return out
}

// intMap decodes a mapping of names to integers.
func (d *decoder) intMap(n *yaml.Node, path string) map[string]int {
	strs := d.stringMap(n, path)
	if strs == nil {
		return nil
	}
	out := make(map[string]int, len(strs))
	for k, s := range strs {
		full := path + "[" + strconv.Quote(k) + "]"
		v, err := strconv.Atoi(s)
		if err != nil {
			d.problem(d.place(full), "%s: %q is not a whole number", full, s)
			continue
		}
		out[k] = v
	}
	return out
}

// stringMap decodes a mapping of names to strings.
func (d *decoder) stringMap(n *yaml.Node, path string) map[string]string {
	n = yamlfile.Resolve(n)
	if yamlfile.IsNull(n) {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		d.unreadable(n, path, "%s", yamlfile.WrongKind(path, "a mapping", n))
		return nil
	}
	out := make(map[string]string, len(n.Content)/2)
	for _, f := range yamlfile.Keys(n, path, d.errorf) {
		full := path + "[" + strconv.Quote(f.Key.Value) + "]"
		s, ok := d.scalar(f.Value, full)
		if !ok {
			continue
		}
		out[f.Key.Value] = s
		d.remember(full, f.Key, f.Value)
	}
	return out
}

func (d *decoder) integer(n *yaml.Node, path string) int {
	s, ok := d.scalar(n, path)
	if !ok {
		return 0
	}
	v, err := strconv.Atoi(strings.ReplaceAll(s, "_", ""))
	if err != nil {
		d.unreadable(n, path, "%s: %q is not an integer", path, s)
		return 0
	}
	return v
}

func (d *decoder) float(n *yaml.Node, path string) float64 {
	s, ok := d.scalar(n, path)
	if !ok {
		return 0
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		d.unreadable(n, path, "%s: %q is not a number", path, s)
		return 0
	}
	return v
}

func (d *decoder) boolean(n *yaml.Node, path string) bool {
	s, ok := d.scalar(n, path)
	if !ok {
		return false
	}
	switch strings.ToLower(s) {
	case "true", "yes", "on":
		return true
	case "false", "no", "off", "":
		return false
	}
	d.unreadable(n, path, "%s: %q is not true or false", path, s)
	return false
}

// duration decodes a Go duration ("20ms", "1m30s"). A bare number is
// refused: the unit is never guessed.
func (d *decoder) duration(n *yaml.Node, path string) time.Duration {
	s, ok := d.scalar(n, path)
	if !ok {
		return 0
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		if _, numErr := strconv.ParseFloat(s, 64); numErr == nil && s != "0" {
			d.unreadable(n, path, "%s: %q has no unit (write e.g. %sms or %ss)", path, s, s, s)
		} else {
			d.unreadable(n, path, "%s: %q is not a duration (e.g. 20ms, 5s, 1m)", path, s)
		}
		return 0
	}
	if v < 0 {
		d.unreadable(n, path, "%s: %s is negative", path, s)
		return 0
	}
	return v
}
