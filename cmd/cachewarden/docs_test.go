package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

// fencedBlock returns the first ```lang block of the markdown file path
// that follows the line heading.
func fencedBlock(t *testing.T, path, heading, lang string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	start := -1
	for i, l := range lines {
		if l == heading {
			start = i
			break
		}
	}
	if start < 0 {
		t.Fatalf("%s has no line %q", path, heading)
	}
	var block []string
	in := false
	for _, l := range lines[start+1:] {
		switch {
		case !in && l == "```"+lang:
			in = true
		case in && l == "```":
			return strings.Join(block, "\n") + "\n"
		case in:
			block = append(block, l)
		}
	}
	t.Fatalf("%s: no ```%s block after %q", path, lang, heading)
	return ""
}

// TestREADMEConfigExample loads README.md's full configuration example as
// the daemon would, rule paths relative to configs/.
func TestREADMEConfigExample(t *testing.T) {
	example := fencedBlock(t, "../../README.md", "## Configuration", "yaml")
	if !strings.Contains(example, "schema_registry:") || !strings.Contains(example, "log:") {
		t.Fatalf("the first yaml block of README's Configuration is not the full example:\n%s", example)
	}
	env := map[string]string{"MYSQL_DSN": "cachewarden:pw@tcp(127.0.0.1:3306)/app"}
	lookup := func(name string) (string, bool) { v, ok := env[name]; return v, ok }
	// rules: [rules] resolves next to the name: configs/rules.
	cfg, err := config.LoadBytes(filepath.Join("..", "..", "configs", "README-example.yaml"), []byte(example), lookup)
	if err != nil {
		t.Fatalf("README's configuration example fails validation:\n%v", err)
	}
	if len(cfg.RuleSet.Rules()) == 0 {
		t.Error("README's example loads no rule")
	}
}

// TestRulesDocExampleTest runs the rule unit test docs/rules.md shows, as
// written, against the example rules it names.
func TestRulesDocExampleTest(t *testing.T) {
	example := fencedBlock(t, "../../docs/rules.md", "## Rule unit tests", "yaml")
	dir := t.TempDir()
	blog, err := os.ReadFile("../../configs/rules/blog.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// The example names ../blog.yaml, as a file in configs/rules/tests would.
	os.WriteFile(filepath.Join(dir, "blog.yaml"), blog, 0o644)
	os.Mkdir(filepath.Join(dir, "tests"), 0o755)
	testFile := filepath.Join(dir, "tests", "doc.yaml")
	os.WriteFile(testFile, []byte(example), 0o644)
	out, errOut, err := invoke(t, "", "rules", "test", testFile)
	if err != nil {
		t.Fatalf("docs/rules.md's example rule test fails: %v\nstdout:\n%s\nstderr:\n%s", err, out, errOut)
	}
	if !strings.Contains(out, "1 passed, 0 failed") {
		t.Errorf("output:\n%s", out)
	}
}

// TestExampleConfigNamesQuickStartServices checks that the example config
// and the Go reader example default to what the quick start leaves
// running: the memcached port of scripts/services.sh, the MariaDB it
// reuses or starts, and the database `make demo` creates.
func TestExampleConfigNamesQuickStartServices(t *testing.T) {
	script, err := os.ReadFile("../../scripts/services.sh")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`mc_port=\$\{CACHEWARDEN_MEMCACHED_PORT:-(\d+)\}`).FindSubmatch(script)
	if m == nil {
		t.Fatal("scripts/services.sh: no default memcached port found")
	}
	mcAddr := "127.0.0.1:" + string(m[1])
	demoDB := "cachewarden_demo" // cmd/cachewarden-demo holds its flags to this config

	cfg, err := config.LoadEnv("../../configs/cachewarden.yaml", func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.Memcached.Servers, ","); got != mcAddr {
		t.Errorf("configs/cachewarden.yaml: memcached.servers = %s, want %s (scripts/services.sh)", got, mcAddr)
	}
	if want := "@tcp(127.0.0.1:3306)/" + demoDB; !strings.Contains(cfg.MySQL.DSN, want) {
		t.Errorf("configs/cachewarden.yaml: mysql.dsn = %s, want one with %s", cfg.MySQL.DSN, want)
	}
	readside, err := os.ReadFile("../../examples/readside/main.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`flag.String("memcached", "` + mcAddr + `"`, "127.0.0.1:3306)/" + demoDB} {
		if !strings.Contains(string(readside), want) {
			t.Errorf("examples/readside/main.go lacks %s", want)
		}
	}
}

// TestREADMESendsApplicationsToClient checks that README.md names the
// read-side package by its import path, in the opening and the layout.
func TestREADMESendsApplicationsToClient(t *testing.T) {
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(data)
	const importPath = "github.com/cachewarden/cachewarden/client"
	if _, err := os.Stat("../../client"); err != nil {
		t.Fatal(err)
	}
	opening, _, _ := strings.Cut(readme, "## Quick start")
	if !strings.Contains(strings.ReplaceAll(opening, "\n", " "), importPath) {
		t.Errorf("README's opening does not give %s", importPath)
	}
	for _, stale := range []string{"`cacheops` (and `counters` for counter", "writes and the read-side package"} {
		if strings.Contains(strings.ReplaceAll(readme, "\n", " "), stale) {
			t.Errorf("README still says %q", stale)
		}
	}
	_, layout, ok := strings.Cut(readme, "Layout: ")
	if !ok || !strings.Contains(layout, "`client` (what applications import") {
		t.Errorf("README's layout does not list package client")
	}
}

// configSection matches the first line of a YAML block that is (part of) a
// daemon config: a top-level key of the config file.
var configSection = regexp.MustCompile(`^(kafka|memcached|mysql|counters|batch|http|log|observer):`)

// docYAMLBlock is one ```yaml block of README.md or docs/*.md.
type docYAMLBlock struct {
	where string   // file:line of the block's first line
	lines []string // the block's lines, without the fences
}

func (b docYAMLBlock) text() string { return strings.Join(b.lines, "\n") + "\n" }

// docYAMLBlocks returns every ```yaml block of README.md and docs/*.md.
func docYAMLBlocks(t *testing.T) []docYAMLBlock {
	t.Helper()
	docs, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []docYAMLBlock
	for _, path := range append([]string{"../../README.md"}, docs...) {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(data), "\n")
		for i := 0; i < len(lines); i++ {
			if lines[i] != "```yaml" {
				continue
			}
			b := docYAMLBlock{where: strings.TrimPrefix(path, "../../") + ":" + strconv.Itoa(i+2)}
			for i++; i < len(lines) && lines[i] != "```"; i++ {
				b.lines = append(b.lines, lines[i])
			}
			out = append(out, b)
		}
	}
	return out
}

// isConfigExample reports whether b's first line that is not a comment is
// a top-level config key.
func (b docYAMLBlock) isConfigExample() bool {
	for _, l := range b.lines {
		if l != "" && !strings.HasPrefix(l, "#") {
			return configSection.MatchString(l)
		}
	}
	return false
}

// TestDocConfigExamplesLoad loads every config example of README.md and
// docs/*.md: each block's sections laid over a minimal valid config (a
// block that shows part of a section keeps the minimal config's other
// settings), parsed and validated as the daemon does.
func TestDocConfigExamplesLoad(t *testing.T) {
	const minimal = "kafka: {brokers: [b:9092], group: g, topics: [t]}\nmemcached: {servers: [m:11211]}\nrules: [r]\n"
	lookup := func(name string) (string, bool) {
		if strings.HasSuffix(name, "_DSN") {
			return "u:p@tcp(localhost:3306)/shop", true
		}
		return "value-of-" + name, true
	}
	found := 0
	for _, b := range docYAMLBlocks(t) {
		if !b.isConfigExample() {
			continue
		}
		found++
		var base, shown map[string]any
		if err := yaml.Unmarshal([]byte(minimal), &base); err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal([]byte(b.text()), &shown); err != nil {
			t.Errorf("%s: not YAML: %v\n%s", b.where, err, b.text())
			continue
		}
		for key, v := range shown {
			section, isMap := v.(map[string]any)
			baseSection, baseIsMap := base[key].(map[string]any)
			if !isMap || !baseIsMap {
				base[key] = v
				continue
			}
			for k, sv := range section {
				baseSection[k] = sv
			}
		}
		merged, err := yaml.Marshal(base)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := config.Parse(b.where, merged, lookup); err != nil {
			t.Errorf("%s: the config example does not load: %v\n%s", b.where, err, b.text())
			continue
		}
		t.Logf("%s: loads", b.where)
	}
	if found < 8 {
		t.Errorf("found %d config examples in README.md and docs/, want at least 8", found)
	}
}

// TestDocRuleFilesLoad loads every rule file example of README.md and
// docs/*.md: the ```yaml blocks that start with `version:` as they are, and
// those that show rules only (a block starting with `  - name:`) inside a
// file of their own.
func TestDocRuleFilesLoad(t *testing.T) {
	found := 0
	for _, b := range docYAMLBlocks(t) {
		if len(b.lines) == 0 {
			continue
		}
		text := b.text()
		switch {
		case strings.HasPrefix(b.lines[0], "version:"):
		case strings.HasPrefix(b.lines[0], "  - name:"):
			text = "version: 1\nrules:\n" + text
		default:
			continue
		}
		found++
		if _, err := rulefile.Parse(b.where, []byte(text)); err != nil {
			t.Errorf("%s: the rule file example does not load: %v\n%s", b.where, err, text)
			continue
		}
		t.Logf("%s: loads", b.where)
	}
	if found < 4 {
		t.Errorf("found %d rule file examples in README.md and docs/, want at least 4", found)
	}
}
