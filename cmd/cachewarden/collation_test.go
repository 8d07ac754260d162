package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/segmentio/kafka-go"

	"github.com/cachewarden/cachewarden/client"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

// foldingRule is a set of the active rows of each tag, tags.tag being
// utf8mb4_general_ci, with load's and keys' comparisons folding; extra
// is more fields of the rule.
const foldingRule = `  - name: tag-members
    table: tags
    when: "active == 1"
    set:
      key: "tag:{tag}"
      member: "{id}"
      load: "SELECT id FROM tags WHERE tag = ? AND active = 1"
      keys: "SELECT DISTINCT tag FROM tags"
%s`

// TestRunCollations is the scenario of a key column under a collation
// that folds case, against the real daemon, MariaDB and memcached: rows 1
// ('t1') and 2 ('T1') are active; readers load the sets of tag "t1" and
// "T1", as applications do with what users type; row 1 is deactivated.
//
//   - With load's `tag = ?` run refuses the rule, naming the fix.
//   - With the fix it names (COLLATE utf8mb4_nopad_bin in load and keys),
//     the rule docs/rules.md shows under "Collations", the daemon runs;
//     afterwards "t1" holds no member, "T1" holds 2, and verify lists and
//     checks both keys.
//   - With the folding accepted instead, "T1" keeps the deactivated row
//     1 (what the refusal prevents), and verify, whose DISTINCT lists one
//     spelling, reports nothing wrong.
func TestRunCollations(t *testing.T) {
	db, dsn := testsvc.MySQL(t)
	ctx := t.Context()
	for _, q := range []string{
		"CREATE TABLE tags (id BIGINT PRIMARY KEY, tag VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci NOT NULL, active TINYINT(1) NOT NULL, KEY (tag))",
		"INSERT INTO tags VALUES (1, 't1', 1), (2, 'T1', 1)",
	} {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	mcAddr := testsvc.Memcached(t)
	fixed := fencedBlock(t, "../../docs/rules.md", "### Collations", "yaml")

	// setup writes the config and the rule of one case and returns the
	// config's path, its topic and brokers, and the rules' prefix.
	setup := func(t *testing.T, rule string) (cfgPath, topic string, brokers []string, prefix string) {
		dir := t.TempDir()
		prefix = "cwcoll:" + testsvc.Unique() + ":"
		topic = "cdc-" + testsvc.Unique()
		brokers = testsvc.KafkaTopics(t, 1, topic)
		if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), fmt.Appendf(nil, "version: 1\nprefix: %q\nrules:\n%s", prefix, rule), 0o644); err != nil {
			t.Fatal(err)
		}
		cfgPath = filepath.Join(dir, "cachewarden.yaml")
		if err := os.WriteFile(cfgPath, fmt.Appendf(nil, `kafka:
  brokers: [%s]
  group: cw-%s
  topics: [%s]
memcached:
  servers: [%s]
mysql:
  dsn: %q
rules: [rules.yaml]
http:
  listen: "127.0.0.1:0"
`, strings.Join(brokers, ", "), testsvc.Unique(), topic, mcAddr, dsn), 0o644); err != nil {
			t.Fatal(err)
		}
		return cfgPath, topic, brokers, prefix
	}

	t.Run("refused", func(t *testing.T) {
		cfgPath, _, _, _ := setup(t, fmt.Sprintf(foldingRule, ""))
		// A run that does not refuse stops after 20s, when rctx ends.
		rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		var stderr syncBuffer
		err := runWithInput(rctx, strings.NewReader(""), []string{"run", "-c", cfgPath}, io.Discard, &stderr)
		errOut := stderr.String()
		if code := exitCode(err); code != exitConfig {
			t.Fatalf("run: exit code %d (%v), want %d; stderr:\n%s", code, err, exitConfig, errOut)
		}
		rulesPath := filepath.Join(filepath.Dir(cfgPath), "rules.yaml")
		for _, want := range []string{
			rulesPath + ":8:12: error: rule \"tag-members\": key placeholder {tag}: column tags.tag has collation utf8mb4_general_ci",
			"in load, compare tag = ? COLLATE utf8mb4_nopad_bin",
			"collation: accept-folding",
			rulesPath + ":11:13: error: rule \"tag-members\": keys: its DISTINCT",
			"select tag COLLATE utf8mb4_nopad_bin",
			"run: refusing rules whose keys fold",
		} {
			if !strings.Contains(errOut, want) {
				t.Errorf("stderr lacks %q:\n%s", want, errOut)
			}
		}
	})

	// scenario runs the daemon of one case through the scenario and
	// returns the members of "t1" and "T1" afterwards and verify's report.
	scenario := func(t *testing.T, rule string) (t1, T1 []string, verified string) {
		if _, err := db.ExecContext(ctx, "UPDATE tags SET active = 1"); err != nil {
			t.Fatal(err)
		}
		cfgPath, topic, brokers, prefix := setup(t, rule)
		d := startDaemon(t, cfgPath)
		waitUntil(t, 20*time.Second, func() string {
			if code, body := d.get("/readyz"); code != 200 {
				return fmt.Sprintf("/readyz = %d %s", code, body)
			}
			return ""
		})
		rs, err := rulefile.LoadPaths(filepath.Join(filepath.Dir(cfgPath), "rules.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		cl, err := client.New(client.Config{Servers: []itemformat.Server{{Addr: mcAddr}}, Rules: rs, DB: db}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		members := func(tag string) []string {
			m, err := cl.Members(ctx, "tag-members", client.Row{"tag": tag})
			if err != nil {
				t.Fatal(err)
			}
			slices.Sort(m)
			return m
		}
		members("t1") // readers fill both sets
		members("T1")

		if _, err := db.ExecContext(ctx, "UPDATE tags SET active = 0 WHERE id = 1"); err != nil {
			t.Fatal(err)
		}
		w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, BatchTimeout: time.Millisecond}
		defer w.Close()
		ev := `{"op":"u","before":{"id":1,"tag":"t1","active":1},"after":{"id":1,"tag":"t1","active":0},"source":{"db":"app","table":"tags"},"ts_ms":1}`
		if err := w.WriteMessages(ctx, kafka.Message{Value: []byte(ev)}); err != nil {
			t.Fatal(err)
		}
		mc := memcache.New(mcAddr)
		waitUntil(t, 20*time.Second, func() string {
			it, err := mc.Get(prefix + "tag:t1")
			if err != nil {
				return "tag:t1: " + err.Error()
			}
			if m := itemformat.DecodeSet(it.Value).Members; slices.Contains(m, "1") {
				return fmt.Sprintf("tag:t1 still holds 1: %q", m)
			}
			return ""
		})
		out, errOut, err := invoke(t, "", "verify", "-c", cfgPath, "--recheck", "0")
		if err != nil {
			t.Fatalf("verify: %v\n%s%s", err, out, errOut)
		}
		return members("t1"), members("T1"), out
	}

	t.Run("fixed", func(t *testing.T) {
		t1, T1, verified := scenario(t, fixed)
		if len(t1) != 0 || !slices.Equal(T1, []string{"2"}) {
			t.Errorf("members after row 1 left: t1 %q (want none), T1 %q (want [2])", t1, T1)
		}
		if !strings.Contains(verified, "checked 2, present 2 (100.0%), missing 0, consistent 2, wrong 0") {
			t.Errorf("verify does not check both spellings:\n%s", verified)
		}
	})

	t.Run("accepted folding leaves T1 stale", func(t *testing.T) {
		t1, T1, verified := scenario(t, fmt.Sprintf(foldingRule, "    collation: accept-folding\n"))
		if !slices.Equal(t1, []string{"2"}) || !slices.Equal(T1, []string{"1", "2"}) {
			t.Errorf("members after row 1 left: t1 %q (want [2]), T1 %q (want the stale [1 2])", t1, T1)
		}
		if !strings.Contains(verified, "checked 1, present 1 (100.0%), missing 0, consistent 1, wrong 0") {
			t.Errorf("verify, whose DISTINCT lists one spelling:\n%s", verified)
		}
	})
}
