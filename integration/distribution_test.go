package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// The distribution proof: applications on three memcached servers write
// items through the client libraries other languages use (pylibmc,
// pymemcache, php-memcached) in each of their key distributions; the
// daemon, configured with the matching memcached.distribution, bumps,
// appends to and counts every one of them; each item read back through the
// same client shows the change. The client scripts live in
// testdata/clients (scripts/services.sh installs the Debian packages).

// clientPython is Debian's interpreter, which has python3-pylibmc and
// python3-pymemcache.
const clientPython = "/usr/bin/python3"

type distributionCase struct {
	client       string // the client configuration (pyclient.py / phpclient.php)
	distribution string // the daemon's memcached.distribution
	weights      []int  // server weights (nil: 1 each)
	protocol     string // the daemon's memcached.protocol ("": meta)
	unicode      bool   // the client accepts non-ASCII keys
}

var distributionCases = []distributionCase{
	{client: "gomemcache", distribution: "modula-crc32", unicode: true},
	{client: "pylibmc", distribution: "modula-oaat", unicode: true},
	{client: "pylibmc-ketama", distribution: "libmemcached-consistent", unicode: true},
	{client: "pylibmc-ketama-weighted", distribution: "ketama", unicode: true},
	{client: "pymemcache", distribution: "rendezvous", unicode: true},
	{client: "php-memcached", distribution: "modula-oaat"},
	{client: "php-memcached-ketama", distribution: "ketama"},
	{client: "php-memcached-consistent", distribution: "libmemcached-consistent", protocol: "text"},
	{client: "php-memcached-ketama", distribution: "ketama", weights: []int{1, 2, 5}, protocol: "text"},
}

// requireClients fails (CI) or skips the test when a client library is
// missing.
func requireClients(t *testing.T) {
	t.Helper()
	checks := [][]string{
		{clientPython, "-c", "import pylibmc, pymemcache.client.hash"},
		{"php", "-r", "exit(class_exists('Memcached') ? 0 : 1);"},
	}
	for _, c := range checks {
		if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
			msg := fmt.Sprintf("%s is needed (scripts/services.sh installs python3-pylibmc, python3-pymemcache, php-cli and php-memcached): %v %s", strings.Join(c, " "), err, out)
			if os.Getenv("CI") == "true" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
}

// runClient runs a client script in mode over keys and decodes its JSON
// answer into out.
func runClient(t *testing.T, client, mode string, servers []string, keys []string, out any) {
	t.Helper()
	if client == "gomemcache" {
		goClient(t, mode, servers, keys, out)
		return
	}
	var cmd *exec.Cmd
	if strings.HasPrefix(client, "php") {
		cmd = exec.Command("php", filepath.Join("testdata", "clients", "phpclient.php"), client, mode, strings.Join(servers, ","))
	} else {
		cmd = exec.Command(clientPython, filepath.Join("testdata", "clients", "pyclient.py"), client, mode, strings.Join(servers, ","))
	}
	in, err := json.Marshal(keys)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdin = strings.NewReader(string(in))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	res, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", client, mode, err, stderr.String())
	}
	if err := json.Unmarshal(res, out); err != nil {
		t.Fatalf("%s %s: %v in %q", client, mode, err, res)
	}
}

// distributionGenKey and distributionGen are the generation item of the
// shop.items table and the generation every client seeds in it.
const distributionGenKey, distributionGen = "%gen:shop.items", "1782579200000000000"

// goClient is runClient's "seed" and "check" for Go applications:
// gomemcache's own client over the same server list.
func goClient(t *testing.T, mode string, servers []string, keys []string, out any) {
	t.Helper()
	mc := memcache.New(servers...)
	var res any
	switch mode {
	case "seed":
		// Counters live under their table's generation (docs/formats.md,
		// "Generations"): the generation item and the counter at its key.
		if err := mc.Set(&memcache.Item{Key: distributionGenKey, Value: []byte(distributionGen)}); err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			for _, it := range []memcache.Item{{Key: "ns:" + k, Value: []byte("1000")}, {Key: "set:" + k, Value: []byte("+a ")}, {Key: "cnt:" + k + "%@" + distributionGen, Value: []byte("5")}} {
				if err := mc.Set(&it); err != nil {
					t.Fatal(err)
				}
			}
		}
		res = len(keys)
	case "check":
		var vals [][]*string
		for _, k := range keys {
			var row []*string
			for _, item := range []string{"ns:" + k, "set:" + k, "cnt:" + k + "%@" + distributionGen} {
				it, err := mc.Get(item)
				if err != nil {
					row = append(row, nil)
					continue
				}
				v := string(it.Value)
				row = append(row, &v)
			}
			vals = append(vals, row)
		}
		res = vals
	}
	b, _ := json.Marshal(res)
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatal(err)
	}
}

// distributionKeys are the entity names of one case: rule-like ASCII
// names, long ones, and non-ASCII ones where the client takes them.
func distributionKeys(tag string, n int, unicode bool) []string {
	var keys []string
	for i := 0; len(keys) < n; i++ {
		switch {
		case unicode && i%10 == 3:
			keys = append(keys, fmt.Sprintf("%s:ключ:%d", tag, i))
		case unicode && i%10 == 7:
			keys = append(keys, fmt.Sprintf("%s:日本:%d", tag, i))
		case i%25 == 5:
			keys = append(keys, fmt.Sprintf("%s:%s:%d", tag, strings.Repeat("x", 150), i))
		default:
			keys = append(keys, fmt.Sprintf("%s:user:%d", tag, i))
		}
	}
	return keys
}

const distributionRules = `version: 1
rules:
  - name: item-ns
    table: shop.items
    on: [insert]
    bump: "ns:{name}"
  - name: item-set
    table: shop.items
    on: [insert]
    set:
      key: "set:{name}"
      member: "{m}"
  - name: item-count
    table: shop.items
    on: [insert]
    count:
      key: "cnt:{name}"
      recount: "SELECT COUNT(*) FROM items WHERE name = ?"
`

// distributionResult counts the keys of one case whose three items the
// client reads back changed by the daemon.
type distributionResult struct {
	keys, right int
	wrong       []string
}

// runDistributionCase seeds n entities through the client (namespace
// 1000, set "+a ", count 5), publishes one insert per entity, lets the
// daemon with daemonDistribution apply them, and reads every entity back
// through the client. The database holds six rows per entity, so the
// count is 6 whether the daemon applied the delta or recounted.
func runDistributionCase(t *testing.T, ctx context.Context, b *Broker, servers []string, c distributionCase, daemonDistribution string, tag string, n int) distributionResult {
	t.Helper()
	keys := distributionKeys(tag, n, c.unicode)
	db, dsn := testsvc.MySQL(t)
	if _, err := db.ExecContext(ctx, "CREATE TABLE items (name VARCHAR(400) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL, m VARCHAR(10), KEY (name))"); err != nil {
		t.Fatal(err)
	}
	for lo := 0; lo < len(keys); lo += 100 {
		hi := min(lo+100, len(keys))
		var q strings.Builder
		var args []any
		q.WriteString("INSERT INTO items (name, m) VALUES ")
		for i, k := range keys[lo:hi] {
			for j := range 6 {
				if i > 0 || j > 0 {
					q.WriteString(",")
				}
				q.WriteString("(?, 'b')")
				args = append(args, k)
			}
		}
		if _, err := db.ExecContext(ctx, q.String(), args...); err != nil {
			t.Fatal(err)
		}
	}
	spec := servers
	if c.weights != nil {
		spec = nil
		for i, s := range servers {
			spec = append(spec, fmt.Sprintf("%s/%d", s, c.weights[i]))
		}
	}
	var seeded int
	runClient(t, c.client, "seed", spec, keys, &seeded)

	topic := "dist-" + tag
	if err := b.CreateTopics(ctx, 3, topic); err != nil {
		t.Fatal(err)
	}
	var msgs []OutMessage
	for _, k := range keys {
		// Keyed by the row's primary key, as the connector keys it.
		key, err := json.Marshal(map[string]string{"name": k})
		if err != nil {
			t.Fatal(err)
		}
		msgs = append(msgs, debeziumChange(topic, "c", key, nil, map[string]any{"name": k, "m": "b"}))
	}
	pub, err := NewPublisher(b.Addrs(), Debezium, nil, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	if err := pub.PublishRaw(ctx, msgs...); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(distributionRules), 0o644); err != nil {
		t.Fatal(err)
	}
	var cfgText strings.Builder
	fmt.Fprintf(&cfgText, "kafka:\n  brokers: [%q]\n  group: %q\n  topics: [%q]\n", b.Addrs()[0], "dist-"+tag, topic)
	fmt.Fprintf(&cfgText, "memcached:\n  distribution: %s\n  servers:\n", daemonDistribution)
	for _, s := range servers {
		fmt.Fprintf(&cfgText, "    - %q\n", s)
	}
	if c.protocol != "" {
		fmt.Fprintf(&cfgText, "  protocol: %s\n", c.protocol)
	}
	if c.weights != nil && daemonDistribution == "ketama" {
		cfgText.WriteString("  weights:\n")
		for i, s := range servers {
			fmt.Fprintf(&cfgText, "    %q: %d\n", s, c.weights[i])
		}
	}
	fmt.Fprintf(&cfgText, "mysql:\n  dsn: %q\n", dsn)
	cfgText.WriteString("rules: [rules.yaml]\nhttp:\n  listen: \"127.0.0.1:0\"\n")
	d := startDaemonYAML(t, ctx, filepath.Join(dir, "cachewarden.yaml"), cfgText.String())
	waitCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := b.WaitCaughtUp(waitCtx, "dist-"+tag, 50*time.Millisecond, topic); err != nil {
		d.Stop()
		t.Fatal(err)
	}
	if err := d.Stop(); err != nil {
		t.Fatal(err)
	}

	var got [][]*string
	runClient(t, c.client, "check", spec, keys, &got)
	res := distributionResult{keys: len(keys)}
	for i, vals := range got {
		ns, set, cnt := deref(vals[0]), deref(vals[1]), deref(vals[2])
		if ns == "1001" && set == "+a +b " && cnt == "6" {
			res.right++
		} else if len(res.wrong) < 3 {
			res.wrong = append(res.wrong, fmt.Sprintf("%q: ns=%q set=%q count=%q", keys[i], ns, set, cnt))
		}
	}
	return res
}

func deref(s *string) string {
	if s == nil {
		return "<missing>"
	}
	return *s
}

func TestDistributionMatchesClients(t *testing.T) {
	requireClients(t)
	ctx := context.Background()
	var servers []string
	for range 3 {
		servers = append(servers, startMemcached(t).addr)
	}
	b, err := StartBroker(ctx, testLog(t), BrokerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	total, right := 0, 0
	for i, c := range distributionCases {
		name := c.client + "/" + c.distribution
		if c.weights != nil {
			name += "/weighted"
		}
		t.Run(name, func(t *testing.T) {
			res := runDistributionCase(t, ctx, b, servers, c, c.distribution, fmt.Sprintf("c%d", i), 300)
			total += res.keys
			right += res.right
			t.Logf("%s with memcached.distribution %s: %d/%d keys bumped, appended to and counted where the client reads them", c.client, c.distribution, res.right, res.keys)
			if res.right != res.keys {
				t.Errorf("%d of %d keys wrong through %s, e.g. %s", res.keys-res.right, res.keys, c.client, strings.Join(res.wrong, "; "))
			}
		})
	}
	t.Logf("all cases: %d/%d keys right", right, total)

	// A daemon left at the default distribution while the applications use
	// ketama: most writes go to servers the readers never ask.
	t.Run("mismatch", func(t *testing.T) {
		c := distributionCase{client: "pylibmc-ketama-weighted", unicode: true}
		res := runDistributionCase(t, ctx, b, servers, c, "modula-crc32", "mismatch", 300)
		t.Logf("pylibmc ketama read, daemon modula-crc32: %d/%d keys right", res.right, res.keys)
		if res.right == res.keys {
			t.Errorf("a mismatched distribution reached every key: the proof cannot fail")
		}
	})
}
