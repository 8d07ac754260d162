package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/cachewarden/cachewarden/config"
)

// TestConfigPrint prints a config whose values come from the environment
// and which leaves most settings out: the output holds the expanded
// values and the defaults, no secret, and loads again (rules included,
// as `run` loads it, from another directory) into the same configuration
// with the secrets redacted.
func TestConfigPrint(t *testing.T) {
	dir := t.TempDir()
	if err := os.Mkdir(filepath.Join(dir, "rules"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(dir, "rules", "r.yaml"), `version: 1
prefix: "cwprint:"
rules:
  - name: post-comments
    table: blog.comments
    count:
      key: "comments:{post_id}"
      recount: "SELECT COUNT(*) FROM comments WHERE post_id = ?"
`)
	path := filepath.Join(dir, "cachewarden.yaml")
	write(t, path, `kafka:
  brokers: ${CWPRINT_BROKERS}
  group: cw
  topics: [cdc.blog.comments]
  sasl:
    mechanism: plain
    username: cw
    password: ${CWPRINT_SASL}
memcached:
  servers: ["${CWPRINT_MC:-127.0.0.1:11211}"]
mysql:
  dsn: "cw:${CWPRINT_DB_PASSWORD}@tcp(127.0.0.1:3306)/blog"
rules: [rules]
`)
	t.Setenv("CWPRINT_BROKERS", "k1:9092,k2:9092")
	t.Setenv("CWPRINT_SASL", "sasl-secret")
	t.Setenv("CWPRINT_DB_PASSWORD", "db-secret")
	out, errOut, err := invoke(t, "", "config", "print", "-c", path)
	if err != nil {
		t.Fatalf("config print: %v\n%s", err, errOut)
	}
	for _, want := range []string{`- "k1:9092"`, `- "127.0.0.1:11211"`, `distribution: "modula-crc32"`, `max_concurrency: 32`,
		`query_timeout: 5s`, `fence_ttl: 1h0m0s`, `password: "xxxxx"`, `dsn: "cw:xxxxx@tcp(127.0.0.1:3306)/blog"`, filepath.Join(dir, "rules")} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, secret := range []string{"sasl-secret", "db-secret"} {
		if strings.Contains(out, secret) {
			t.Errorf("output holds the secret %q:\n%s", secret, out)
		}
	}
	want, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	printed := filepath.Join(t.TempDir(), "printed.yaml")
	write(t, printed, out)
	again, err := loadConfig(printed, os.Stderr)
	if err != nil {
		t.Fatalf("the output does not load: %v\n%s", err, out)
	}
	want.File, want.MySQL.DSN, want.Kafka.SASL.Password = printed, config.RedactDSN(want.MySQL.DSN), config.Redacted
	if len(again.RuleSet.Rules()) != 1 || again.RuleSet.Rules()[0].Generation != want.RuleSet.Rules()[0].Generation {
		t.Errorf("rules loaded again: %v", again.RuleSet.Rules())
	}
	want.RuleSet, again.RuleSet = nil, nil
	if !reflect.DeepEqual(again, want) {
		t.Errorf("loaded again:\n%#v\nwant\n%#v", *again, *want)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"config"}, "give a subcommand: print"},
		{[]string{"config", "show", "-c", path}, `unknown subcommand "show"`},
		{[]string{"config", "print"}, "-c FILE is required"},
	} {
		_, errOut, err := invoke(t, "", tc.args...)
		if code := exitCode(err); code != 2 || !strings.Contains(err.Error()+errOut, tc.want) {
			t.Errorf("%q: exit status %d (%v), want 2 and %q", tc.args, code, err, tc.want)
		}
	}
}
