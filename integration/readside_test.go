package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/client"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

// readSideRules keep a hot namespace in copies and the items' namespaces
// under a master with evidence.
const readSideRules = `version: 1
rules:
  - {name: hot, table: shop.items, on: [insert, update], bump: "ns:hot", copies: 4}
  - name: item
    table: shop.items
    on: [insert, update]
    bump: "ns:item:{name}"
    evidence: {master: "ns:item:master", bits: 64, max_set: 8}
`

// TestReadSideHotKeysAndEvidence runs the daemon over two memcached
// servers (ketama) and reads with package client from the same rule
// file: an item change bumps every copy of the hot namespace, and moves
// that item (only) from the master version to its own namespace.
func TestReadSideHotKeysAndEvidence(t *testing.T) {
	ctx := context.Background()
	servers := []string{startMemcached(t).addr, startMemcached(t).addr}
	b, err := StartBroker(ctx, testLog(t), BrokerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const topic = "readside"
	if err := b.CreateTopics(ctx, 1, topic); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rulesPath := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte(readSideRules), 0o644); err != nil {
		t.Fatal(err)
	}
	startDaemonYAML(t, ctx, filepath.Join(dir, "cachewarden.yaml"), fmt.Sprintf(
		"kafka:\n  brokers: [%q]\n  group: readside\n  topics: [%q]\nmemcached:\n  servers: [%q, %q]\n  distribution: ketama\n"+
			"rules: [rules.yaml]\nhttp:\n  listen: \"127.0.0.1:0\"\n", b.Addrs()[0], topic, servers[0], servers[1]))

	rs, err := rulefile.LoadPaths(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(client.Config{
		Servers:      []itemformat.Server{{Addr: servers[0]}, {Addr: servers[1]}},
		Distribution: "ketama",
		Rules:        rs,
	}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	hot, _ := c.Rule("hot")
	copyKeys, err := hot.CopyKeys(client.Row{})
	if err != nil {
		t.Fatal(err)
	}
	copies := func() []string {
		var vs []string
		for _, k := range copyKeys {
			it, err := c.Memcache().Get(k)
			if err != nil {
				vs = append(vs, "missing")
				continue
			}
			vs = append(vs, string(it.Value))
		}
		return vs
	}

	// The first change creates the copies and the items' namespaces;
	// the readers then create the master.
	publishUpdates(t, ctx, b, topic, []string{"1"})
	waitCaughtUp(t, ctx, b, "readside", topic)
	before := copies()
	names := []client.Row{{"name": "1"}, {"name": "2"}, {"name": "3"}, {"name": "66"}}
	vs, err := c.Namespaces(ctx, "item", names)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vs {
		if v != vs[0] || !strings.HasPrefix(v, "m") {
			t.Fatalf("before any change under the master: %q", vs)
		}
	}

	// Item 2 changes (bit 2, which item 66 shares).
	publishUpdates(t, ctx, b, topic, []string{"2"})
	waitCaughtUp(t, ctx, b, "readside", topic)
	after := copies()
	for i := range before {
		if before[i] == "missing" || after[i] == before[i] {
			t.Errorf("copy %d: %s then %s; every copy must be bumped", i, before[i], after[i])
		}
	}
	if v, err := c.Namespace(ctx, "hot", client.Row{}); err != nil || !contains(after, v) {
		t.Errorf("hot namespace read %q, %v; copies hold %q", v, err, after)
	}
	again, err := c.Namespaces(ctx, "item", names)
	if err != nil {
		t.Fatal(err)
	}
	own, err := c.Memcache().Get(clientKey(t, c, "item", names[1]))
	if err != nil {
		t.Fatal(err)
	}
	if again[0] != vs[0] || again[2] != vs[2] || again[1] != string(own.Value) || strings.HasPrefix(again[3], "m") {
		t.Errorf("after item 2 changed: %q (before %q; item 2's own namespace %s)", again, vs, own.Value)
	}
}

func waitCaughtUp(t *testing.T, ctx context.Context, b *Broker, group, topic string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := b.WaitCaughtUp(ctx, group, 20*time.Millisecond, topic); err != nil {
		t.Fatal(err)
	}
}

func clientKey(t *testing.T, c *client.Client, rule string, row client.Row) string {
	t.Helper()
	k, err := c.Key(rule, row)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
