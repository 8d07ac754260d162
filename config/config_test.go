package config

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/counters"
	"github.com/cachewarden/cachewarden/internal/metaproto"
	"github.com/cachewarden/cachewarden/internal/yamlfile/yamlfiletest"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/source/binlog"
)

var update = flag.Bool("update", false, "rewrite testdata/*.errors golden files")

func env(vars map[string]string) LookupFunc {
	return func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
}

func TestLoadGood(t *testing.T) {
	cfg, err := LoadEnv("testdata/good.yaml", env(map[string]string{
		"CW_BROKERS":           "k1:9092, k2:9092",
		"CW_MYSQL_PASSWORD":    "s3cret",
		"CW_REGISTRY_PASSWORD": "r3gistry",
	}))
	if err != nil {
		t.Fatalf("LoadEnv: %v", err)
	}
	want := &Config{
		File:   "testdata/good.yaml",
		Source: SourceKafka,
		Kafka: Kafka{
			Brokers:      []string{"k1:9092", "k2:9092"},
			Group:        "cachewarden-shop",
			Topics:       []string{"dbserver1.shop.users", "blog.comments", "shop.flat", "shop.avro"},
			Format:       "auto",
			TopicFormats: map[string]string{"shop.flat": "debezium-flat", "shop.avro": "avro"},
			SchemaRegistry: SchemaRegistry{
				URLs:     []string{"http://registry-1:8081", "https://registry-2:8081"},
				Username: "cw", Password: "r3gistry", Timeout: 2 * time.Second,
			},
			TopicTables:   map[string]string{"shop.flat": "shop.users"},
			DLQTopic:      "cachewarden.dlq",
			ClientID:      "cw-local",
			StartOffset:   "earliest",
			OffsetReset:   "fail",
			Balancer:      "cooperative-sticky",
			UnorderedSets: "delete",
			CheckCRCs:     true,
			// 8 MiB
			MaxDecompressedBatchBytes: 8 << 20,
		},
		Memcached: Memcached{
			Servers:        []string{"127.0.0.1:11211", "127.0.0.1:11212"},
			MaxConcurrency: 32,
			Timeout:        250 * time.Millisecond,
			Protocol:       "text",
			Distribution:   "modula-crc32",
			CompactRatio:   0.4,
			CompactSample:  0.1,
		},
		MySQL: MySQL{
			DSN:          "cw:s3cret@tcp(127.0.0.1:3306)/shop",
			MaxOpenConns: 8,
			QueryTimeout: 3 * time.Second,
		},
		Counters: Counters{Fencing: DefaultCountersFencing, FenceTTL: counters.DefaultFenceTTL},
		Rules:    []string{"testdata/rules/shop.yaml", "testdata/rules/counts.yaml"},
		RuleSet:  cfg.RuleSet,
		// What `cat testdata/rules/shop.yaml testdata/rules/counts.yaml | sha256sum` prints.
		RulesDigest: catSHA256(t, "testdata/rules/shop.yaml", "testdata/rules/counts.yaml"),
		Batch:       Batch{MaxEvents: 500, MaxWait: 50 * time.Millisecond},
		HTTP:        HTTP{Listen: "127.0.0.1:0", Pprof: true},
		Log:         Log{Format: "json", Level: "debug"},
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("config:\n got %+v\nwant %+v", cfg, want)
	}
	if cfg.RuleSet == nil || len(cfg.RuleSet.Rules()) != 2 {
		t.Fatalf("RuleSet not loaded: %v", cfg.RuleSet)
	}
}

func TestDefaults(t *testing.T) {
	cfg, err := LoadEnv("testdata/minimal.yaml", env(nil))
	if err != nil {
		t.Fatalf("LoadEnv: %v", err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"kafka.format", cfg.Kafka.Format, "auto"},
		{"kafka.client_id", cfg.Kafka.ClientID, "cachewarden"},
		{"kafka.check_crcs", cfg.Kafka.CheckCRCs, false},
		{"kafka.max_decompressed_batch_bytes", cfg.Kafka.MaxDecompressedBatchBytes, DefaultMaxDecompressedBatchBytes},
		{"kafka.schema_registry", cfg.Kafka.SchemaRegistry, SchemaRegistry{Timeout: DefaultSchemaRegistryTimeout}},
		{"memcached.max_concurrency", cfg.Memcached.MaxConcurrency, cacheops.DefaultMaxConcurrency},
		{"memcached.timeout", cfg.Memcached.Timeout, metaproto.DefaultTimeout},
		{"memcached.compact_ratio", cfg.Memcached.CompactRatio, itemformat.DefaultCompactRatio},
		{"memcached.compact_sample", cfg.Memcached.CompactSample, cacheops.DefaultCompactSample},
		{"mysql.max_open_conns", cfg.MySQL.MaxOpenConns, counters.DefaultMaxOpenConns},
		{"mysql.query_timeout", cfg.MySQL.QueryTimeout, counters.DefaultQueryTimeout},
		{"batch.max_events", cfg.Batch.MaxEvents, 2000},
		{"batch.max_wait", cfg.Batch.MaxWait, 5 * time.Millisecond},
		{"http.listen", cfg.HTTP.Listen, "127.0.0.1:9464"},
		{"http.pprof", cfg.HTTP.Pprof, false},
		{"log.format", cfg.Log.Format, LogFormat("text")},
		{"kafka.start_offset", cfg.Kafka.StartOffset, StartOffset("earliest")},
		{"kafka.offset_reset", cfg.Kafka.OffsetReset, OffsetReset("fail")},
		{"kafka.balancer", cfg.Kafka.Balancer, Balancer("cooperative-sticky")},
		{"kafka.unordered_sets", cfg.Kafka.UnorderedSets, UnorderedSets("delete")},
		{"memcached.protocol", cfg.Memcached.Protocol, MemcachedProtocol("meta")},
		{"counters.fencing", cfg.Counters.Fencing, counters.FencingMode("auto")},
		{"log.level", cfg.Log.Level, "info"},
		{"rules", cfg.Rules, []string{filepath.Join("testdata", "rules", "shop.yaml")}},
	}
	for _, c := range checks {
		if !reflect.DeepEqual(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

// TestProblems loads broken configs and compares every reported problem
// with testdata/NAME.errors (go test -update rewrites them).
func TestProblems(t *testing.T) {
	for _, name := range []string{"bad", "bad-rules", "bad-registry", "bad-registry-urls", "needs-mysql", "no-rules", "empty-rules", "env-missing", "syntax", "types", "binlog-bad", "binlog-missing"} {
		t.Run(name, func(t *testing.T) {
			_, err := LoadEnv(filepath.Join("testdata", name+".yaml"), env(map[string]string{"HOME": "/root"}))
			if err == nil {
				t.Fatal("no error")
			}
			yamlfiletest.Golden(t, filepath.Join("testdata", name+".errors"), err.Error()+"\n", *update)
		})
	}
}

func TestErrorTypes(t *testing.T) {
	_, err := LoadEnv("testdata/bad.yaml", env(nil))
	var ce *Error
	if !errors.As(err, &ce) {
		t.Fatalf("error %T is not a *config.Error", err)
	}
	for _, p := range ce.Problems {
		if p.File != "testdata/bad.yaml" || p.Line < 1 || p.Column < 1 {
			t.Errorf("problem without a position: %+v", p)
		}
	}
	// A broken rule file is reported with the config's own problems.
	_, err = LoadEnv("testdata/bad-rules.yaml", env(nil))
	var le *rules.LoadError
	if !errors.As(err, &le) || !errors.As(err, &ce) {
		t.Fatalf("want both a *rules.LoadError and a *config.Error, got %v", err)
	}
}

func TestExpandEnv(t *testing.T) {
	lookup := env(map[string]string{"A": "alpha", "EMPTY": "", "PORT": "11211"})
	cases := []struct {
		in, want, err string
	}{
		{in: "plain", want: "plain"},
		{in: "${A}", want: "alpha"},
		{in: "x-${A}-${A}", want: "x-alpha-alpha"},
		{in: "host:${PORT}", want: "host:11211"},
		{in: "${EMPTY}", want: ""},
		{in: "${EMPTY:-def}", want: "def"},
		{in: "${UNSET:-d:e-f}", want: "d:e-f"},
		{in: "${UNSET:-}", want: ""},
		{in: "${A:-def}", want: "alpha"},
		{in: "pa$$word", want: "pa$$word"},
		{in: "$A", want: "$A"},
		{in: "$${A}", want: "${A}"},
		{in: "${UNSET}", err: "environment variable UNSET is not set"},
		{in: "${A", err: "unterminated ${"},
		{in: "${}", err: "bad environment variable reference ${}"},
		{in: "${1A}", err: "bad environment variable reference ${1A}"},
	}
	for _, c := range cases {
		got, err := expandEnv(c.in, lookup)
		switch {
		case c.err != "":
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("expandEnv(%q) error = %v, want %q", c.in, err, c.err)
			}
		case err != nil:
			t.Errorf("expandEnv(%q): %v", c.in, err)
		case got != c.want:
			t.Errorf("expandEnv(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestExpansionKeepsStructure(t *testing.T) {
	// A value that looks like YAML stays one scalar.
	cfg, err := Parse("inline.yaml", []byte("kafka:\n  brokers: [b:1]\n  group: ${G}\n  topics: [t]\nmemcached:\n  servers: [m:1]\nrules: [r]\n"),
		env(map[string]string{"G": "x: [y]\nz: 1"}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Kafka.Group != "x: [y]\nz: 1" {
		t.Errorf("group = %q", cfg.Kafka.Group)
	}
}

func TestSecretsRedacted(t *testing.T) {
	cfg, err := Parse("s.yaml", []byte(`
kafka:
  brokers: [b:1]
  group: g
  topics: [t]
  sasl: {mechanism: plain, username: u, password: "kafka-pw-123"}
  schema_registry: {urls: ["https://r:8081"], username: u, password: "registry-pw-789"}
memcached:
  servers: [m:1]
mysql:
  dsn: "app:mysql-pw-456@tcp(db:3306)/shop?parseTime=true"
rules: [r]
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	var logged bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&logged, nil))
	logger.Info("config", "config", cfg)
	logger.Info("mysql", "mysql", cfg.MySQL, "sasl", cfg.Kafka.SASL)
	outputs := map[string]string{
		"log":          logged.String(),
		"String":       cfg.String(),
		"%v":           fmt.Sprintf("%v", cfg),
		"%+v mysql":    fmt.Sprintf("%+v", cfg.MySQL),
		"%#v mysql":    fmt.Sprintf("%#v", cfg.MySQL),
		"%+v kafka":    fmt.Sprintf("%+v", cfg.Kafka),
		"%v sasl":      fmt.Sprintf("%v", cfg.Kafka.SASL),
		"%#v registry": fmt.Sprintf("%#v", cfg.Kafka.SchemaRegistry),
		"%+v registry": fmt.Sprintf("%+v", cfg.Kafka.SchemaRegistry),
		"%+v *cfg val": fmt.Sprintf("%+v", *cfg),
	}
	for name, out := range outputs {
		for _, secret := range []string{"kafka-pw-123", "mysql-pw-456", "registry-pw-789"} {
			if strings.Contains(out, secret) {
				t.Errorf("%s reveals %q: %s", name, secret, out)
			}
		}
	}
	if !strings.Contains(logged.String(), "app:xxxxx@tcp(db:3306)/shop") {
		t.Errorf("log does not show the redacted DSN: %s", logged.String())
	}
}

func TestRedactDSN(t *testing.T) {
	cases := map[string]string{
		"":                                  "",
		"root@tcp(127.0.0.1:3306)/":         "root@tcp(127.0.0.1:3306)/",
		"u:p@tcp(h:1)/db":                   "u:xxxxx@tcp(h:1)/db",
		"u:p@ss:w@rd@tcp(h:1)/db":           "u:xxxxx@tcp(h:1)/db",
		"u:secret@tcp(h:1)/db?bad=%zz(":     "u:xxxxx@tcp(h:1)/db?bad=%zz(",
		"u:secret@unix(/tmp/sock)/db?x=%zz": "u:xxxxx@unix(/tmp/sock)/db?x=%zz",
	}
	for in, want := range cases {
		if got := RedactDSN(in); got != want {
			t.Errorf("RedactDSN(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestNewLogger(t *testing.T) {
	var buf bytes.Buffer
	l := Log{Format: "json", Level: "warn"}.NewLogger(&buf)
	l.Info("hidden")
	l.Warn("shown")
	out := buf.String()
	if strings.Contains(out, "hidden") || !strings.Contains(out, `"msg":"shown"`) {
		t.Errorf("json warn logger wrote %q", out)
	}
}

// FuzzParse feeds arbitrary bytes to the config decoder: it must report
// problems with positions, never panic.
func FuzzParse(f *testing.F) {
	for _, name := range []string{"good", "minimal", "bad", "types", "syntax", "env-missing"} {
		data, err := os.ReadFile(filepath.Join("testdata", name+".yaml"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("kafka: &a {brokers: *a}\n"))
	f.Add([]byte("kafka:\n  brokers: ${X:-a:1,b:2}\n  group: ${}\n"))
	lookup := env(map[string]string{"X": "h:1", "CW_BROKERS": "b:9092"})
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := Parse("f.yaml", data, lookup)
		if err == nil {
			if cfg.Batch.MaxEvents < 1 || cfg.Batch.MaxWait <= 0 || len(cfg.Kafka.Brokers) == 0 {
				t.Fatalf("accepted config without required settings: %+v", cfg)
			}
			return
		}
		var ce *Error
		if !errors.As(err, &ce) || len(ce.Problems) == 0 {
			t.Fatalf("error %v is not a *config.Error with problems", err)
		}
		for _, p := range ce.Problems {
			if p.Line < 1 || p.Column < 1 {
				t.Fatalf("problem without a position: %+v", p)
			}
		}
	})
}

func FuzzExpandEnv(f *testing.F) {
	for _, s := range []string{"", "${A}", "$${A}", "${A:-x}", "${", "a${B}c${A}", "$$$${A}"} {
		f.Add(s)
	}
	lookup := env(map[string]string{"A": "alpha"})
	f.Fuzz(func(t *testing.T, s string) {
		out, err := expandEnv(s, lookup)
		if err == nil && !strings.Contains(s, "${") && out != s {
			t.Fatalf("expandEnv(%q) = %q: text without ${ must not change", s, out)
		}
	})
}

func TestMemcachedProtocol(t *testing.T) {
	const base = "kafka: {brokers: [localhost:9092], group: cw, topics: [shop]}\nrules: [r.yaml]\nmemcached:\n  servers: [localhost:11211]\n"
	cfg, err := Parse("p.yaml", []byte(base), env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Memcached.Protocol != "meta" {
		t.Errorf("default protocol %q, want meta", cfg.Memcached.Protocol)
	}
	_, err = Parse("p.yaml", []byte(base+"  protocol: binary\n"), env(nil))
	want := `p.yaml:5:13: memcached.protocol: "binary" is not one of meta, text`
	if err == nil || err.Error() != want {
		t.Errorf("error %v, want %s", err, want)
	}
}

// TestYAMLMistakes parses testdata/yaml-mistakes/NAME.yaml, each a good
// config with one YAML mistake, and compares the problems with
// NAME.errors.
func TestYAMLMistakes(t *testing.T) {
	yamlfiletest.Mistakes(t, *update, func(path string, data []byte) error {
		_, err := Parse(path, data, nil)
		return err
	})
}

// TestREADMEQuotesDefaults loads the full config shown in README.md's
// Configuration section and checks that every setting it shows with its
// default value has the value Parse fills in when the setting is left
// out, so the docs quote each default as the code declares it.
func TestREADMEQuotesDefaults(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(readme), "\n## Configuration\n")
	_, block, ok := strings.Cut(section, "```yaml\n")
	block, _, ok2 := strings.Cut(block, "```")
	if !ok || !ok2 {
		t.Fatal("README.md: no yaml block in the Configuration section")
	}
	lookup := env(map[string]string{"MYSQL_DSN": "u:p@tcp(localhost:3306)/shop"})
	shown, err := Parse("README.md", []byte(block), lookup)
	if err != nil {
		t.Fatalf("README.md's config does not load: %v", err)
	}
	// The registry's timeout is shown commented out: it may be set only
	// with urls.
	registry := strings.NewReplacer("urls: []", "urls: [http://registry:8081]", "# timeout:", "timeout:").Replace(block)
	withRegistry, err := Parse("README.md", []byte(registry), lookup)
	if err != nil {
		t.Fatalf("README.md's config with a registry does not load: %v", err)
	}
	shown.Kafka.SchemaRegistry.Timeout = withRegistry.Kafka.SchemaRegistry.Timeout
	defaults, err := Parse("minimal.yaml", []byte("kafka: {brokers: [b:9092], group: g, topics: [t]}\nmemcached: {servers: [m:11211]}\nrules: [r]\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		setting     string
		shown, dflt any
	}{
		{"kafka.format", shown.Kafka.Format, defaults.Kafka.Format},
		{"kafka.client_id", shown.Kafka.ClientID, defaults.Kafka.ClientID},
		{"kafka.schema_registry.timeout", shown.Kafka.SchemaRegistry.Timeout, defaults.Kafka.SchemaRegistry.Timeout},
		{"kafka.start_offset", shown.Kafka.StartOffset, defaults.Kafka.StartOffset},
		{"kafka.offset_reset", shown.Kafka.OffsetReset, defaults.Kafka.OffsetReset},
		{"kafka.balancer", shown.Kafka.Balancer, defaults.Kafka.Balancer},
		{"kafka.unordered_sets", shown.Kafka.UnorderedSets, defaults.Kafka.UnorderedSets},
		{"kafka.max_decompressed_batch_bytes", shown.Kafka.MaxDecompressedBatchBytes, defaults.Kafka.MaxDecompressedBatchBytes},
		{"memcached.distribution", shown.Memcached.Distribution, defaults.Memcached.Distribution},
		{"memcached.protocol", shown.Memcached.Protocol, defaults.Memcached.Protocol},
		{"memcached.max_concurrency", shown.Memcached.MaxConcurrency, defaults.Memcached.MaxConcurrency},
		{"memcached.timeout", shown.Memcached.Timeout, defaults.Memcached.Timeout},
		{"memcached.compact_ratio", shown.Memcached.CompactRatio, defaults.Memcached.CompactRatio},
		{"memcached.compact_sample", shown.Memcached.CompactSample, defaults.Memcached.CompactSample},
		{"mysql.max_open_conns", shown.MySQL.MaxOpenConns, defaults.MySQL.MaxOpenConns},
		{"mysql.query_timeout", shown.MySQL.QueryTimeout, defaults.MySQL.QueryTimeout},
		{"counters.fencing", shown.Counters.Fencing, defaults.Counters.Fencing},
		{"counters.fence_ttl", shown.Counters.FenceTTL, defaults.Counters.FenceTTL},
		{"batch.max_events", shown.Batch.MaxEvents, defaults.Batch.MaxEvents},
		{"batch.max_wait", shown.Batch.MaxWait, defaults.Batch.MaxWait},
		{"http.listen", shown.HTTP.Listen, defaults.HTTP.Listen},
		{"log.format", shown.Log.Format, defaults.Log.Format},
		{"log.level", shown.Log.Level, defaults.Log.Level},
	} {
		if c.shown != c.dflt {
			t.Errorf("README.md shows %s: %v; its default is %v", c.setting, c.shown, c.dflt)
		}
	}
}

// catSHA256 returns the SHA-256 in hex of the files' contents one after
// the other.
func catSHA256(t *testing.T, paths ...string) string {
	t.Helper()
	h := sha256.New()
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		h.Write(data)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// TestLoadBinlog: a config with source binlog needs no kafka section and
// gets the binlog section's defaults.
func TestLoadBinlog(t *testing.T) {
	cfg, err := Load("testdata/binlog.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want := Binlog{DSN: "cachewarden:s3cret@tcp(db1:3306)/", ServerID: 4242, Name: DefaultBinlogName,
		CheckpointDatabase: DefaultBinlogCheckpointDatabase, CheckpointTable: binlog.DefaultCheckpointTable,
		Lease: binlog.DefaultLeaseDuration, Purged: PurgedFail}
	if cfg.Source != SourceBinlog || !reflect.DeepEqual(cfg.Binlog, want) {
		t.Errorf("source %q, binlog %+v; want binlog, %+v", cfg.Source, cfg.Binlog, want)
	}
}

// TestREADMEBinlogDefaults loads the binlog config shown in README.md
// ("Reading the binary log instead of Kafka") and checks that it loads
// and that every setting it shows with a default has that default.
func TestREADMEBinlogDefaults(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(readme), "\n### Reading the binary log instead of Kafka\n")
	_, block, ok := strings.Cut(section, "```yaml\n")
	block, _, ok2 := strings.Cut(block, "```")
	if !ok || !ok2 {
		t.Fatal("README.md: no yaml block in the binary log section")
	}
	shown, err := Parse("README.md", []byte(block), nil)
	if err != nil {
		t.Fatalf("README.md's binlog config does not load: %v", err)
	}
	defaults, err := Parse("minimal.yaml", []byte("source: binlog\nbinlog: {dsn: \"u:p@tcp(h:3306)/\", server_id: 9}\nmemcached: {servers: [m:11211]}\nrules: [r]\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	got, want := shown.Binlog, defaults.Binlog
	got.DSN, got.ServerID = want.DSN, want.ServerID
	if shown.Source != SourceBinlog || got != want {
		t.Errorf("README.md shows source %s, binlog %+v; the defaults are %+v", shown.Source, got, want)
	}
}
