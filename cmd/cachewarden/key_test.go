package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/go-sql-driver/mysql"

	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/inspect"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

// opsToolsFixture is two memcached pools of two servers each (pool A
// distributes by ketama over two private servers, pool B by
// modula-crc32 over the shared server and a private one), one config per
// pool with the same rules, and a fresh MariaDB database they query.
type opsToolsFixture struct {
	db, prefix string
	cfgA, cfgB string
	a, b       *config.Config
}

func newOpsToolsFixture(t *testing.T) *opsToolsFixture {
	t.Helper()
	a1 := testsvc.PrivateMemcached(t, testsvc.MemcachedOptions{})
	a2 := testsvc.PrivateMemcached(t, testsvc.MemcachedOptions{})
	shared := testsvc.Memcached(t)
	b2 := testsvc.PrivateMemcached(t, testsvc.MemcachedOptions{})
	sqlDB, dsn := testsvc.MySQL(t)
	for _, q := range []string{
		"CREATE TABLE comments (id BIGINT PRIMARY KEY, post_id BIGINT, approved TINYINT(1))",
		"INSERT INTO comments VALUES (1, 7, 1), (2, 7, 1), (3, 7, 0), (4, 8, 1)",
		"CREATE TABLE user_interests (user_id BIGINT, interest VARCHAR(64), PRIMARY KEY (user_id, interest))",
		"INSERT INTO user_interests VALUES (5, 'rock'), (5, 'jazz'), (6, 'folk')",
	} {
		if _, err := sqlDB.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	parsed, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	f := &opsToolsFixture{db: parsed.DBName, prefix: "cwops:" + testsvc.Unique() + ":"}
	dir := t.TempDir()
	write(t, filepath.Join(dir, "rules.yaml"), fmt.Sprintf(`version: 1
prefix: %q
fallback: "ns:table:{db}.{table}"
rules:
  - name: user
    table: %[2]s.users
    when: "active == 1"
    bump: "ns:user:{id}"
  - name: product
    table: %[2]s.products
    bump: "ns:product:{id}"
    copies: 3
  - name: post-comments
    table: %[2]s.comments
    when: "approved == 1"
    count:
      key: "comments:{post_id}"
      recount: "SELECT COUNT(*) FROM comments WHERE post_id = ? AND approved = 1"
  - name: interests
    table: %[2]s.user_interests
    set:
      key: "interests:{user_id}"
      member: "{interest}"
      load: "SELECT interest FROM user_interests WHERE user_id = ?"
`, f.prefix, f.db))
	pool := func(name, distribution string, servers ...string) string {
		path := filepath.Join(dir, name)
		write(t, path, fmt.Sprintf(`kafka:
  brokers: [127.0.0.1:9]
  group: cw-ops-%s
  topics: [cdc.users]
memcached:
  servers: [%s]
  distribution: %s
mysql:
  dsn: %q
rules: [rules.yaml]
`, name, strings.Join(servers, ", "), distribution, dsn))
		return path
	}
	f.cfgA = pool("zone-a.yaml", "ketama", a1.Addr, a2.Addr)
	f.cfgB = pool("zone-b.yaml", "modula-crc32", shared, b2.Addr)
	if f.a, err = config.Load(f.cfgA); err != nil {
		t.Fatal(err)
	}
	if f.b, err = config.Load(f.cfgB); err != nil {
		t.Fatal(err)
	}
	return f
}

// client returns a memcached client over cfg's pool that reads each key
// where the configured distribution puts it (as readers do).
func poolClient(t *testing.T, cfg *config.Config) *memcache.Client {
	t.Helper()
	sel, err := cfg.Memcached.Selector()
	if err != nil {
		t.Fatal(err)
	}
	return memcache.NewFromSelector(sel)
}

// getAt reads key from the one server addr, bypassing any distribution.
func getAt(t *testing.T, addr, key string) *memcache.Item {
	t.Helper()
	it, err := memcache.New(addr).Get(key)
	if err == memcache.ErrCacheMiss {
		return nil
	}
	if err != nil {
		t.Fatalf("get %q from %s: %v", key, addr, err)
	}
	return it
}

func invokeJSON[T any](t *testing.T, wantCode int, args ...string) T {
	t.Helper()
	out, errOut, err := invoke(t, "", args...)
	if code := exitCode(err); code != wantCode {
		t.Fatalf("%s: exit status %d (%v), want %d\n%s%s", strings.Join(args, " "), code, err, wantCode, out, errOut)
	}
	var v T
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatalf("%s: output is not JSON: %v\n%s", strings.Join(args, " "), err, out)
	}
	return v
}

// TestInvalidateAndKeyBumpAcrossPools invalidates a user whose key is
// longer than memcached allows and a product with hot-key copies in two
// pools: every op lands on the keys the planner renders for a change of
// that row, on the server each pool's distribution names (read there
// directly), and `key` reports each item there with its version. A dry
// run sends nothing.
func TestInvalidateAndKeyBumpAcrossPools(t *testing.T) {
	f := newOpsToolsFixture(t)
	long := strings.Repeat("u", 300)
	for _, tc := range []struct {
		rule, table, column, value string
	}{
		{"user", "users", "id", long},
		{"product", "products", "id", "42"},
	} {
		entity := tc.column + "=" + tc.value
		acts := invokeJSON[[]inspect.Action](t, 0, "invalidate", "-c", f.cfgA, "-c", f.cfgB, "--rule", tc.rule, entity, "--json")
		row := rules.Row{{Name: tc.column, Value: rules.Value{Kind: rules.KindString, Text: tc.value}}, {Name: "active", Value: rules.Value{Kind: rules.KindInt, Text: "1"}}}
		planned, _, err := f.a.RuleSet.Plan(nil, &rules.Event{Database: f.db, Table: tc.table, Operation: rules.Insert, After: row})
		if err != nil {
			t.Fatal(err)
		}
		var want []string
		for _, op := range planned {
			want = append(want, op.Key)
		}
		for _, pool := range []struct {
			path string
			cfg  *config.Config
		}{{f.cfgA, f.a}, {f.cfgB, f.b}} {
			var keys []string
			versions := map[string]uint64{}
			for _, a := range acts {
				if a.Pool != pool.path {
					continue
				}
				keys = append(keys, a.Key)
				if a.Result != "added" || !slices.Contains(pool.cfg.Memcached.Servers, a.Server) {
					t.Errorf("%s: %+v: want added on one of %v", tc.rule, a, pool.cfg.Memcached.Servers)
					continue
				}
				it := getAt(t, a.Server, a.Key)
				if it == nil {
					t.Errorf("%s: %s not on %s, the server invalidate named", tc.rule, a.Key, a.Server)
					continue
				}
				versions[a.Key], _ = itemformat.ParseVersion(it.Value)
			}
			if !slices.Equal(keys, want) {
				t.Errorf("%s in %s: keys\n %q\nwant the planner's\n %q", tc.rule, pool.path, keys, want)
			}
			rep := invokeJSON[inspect.Report](t, 0, "key", "-c", pool.path, "--rule", tc.rule, entity, "--json")
			if len(rep.Pools) != 1 || len(rep.Pools[0].Items) != len(want) {
				t.Fatalf("%s: key report %+v, want %d items", tc.rule, rep, len(want))
			}
			for _, it := range rep.Pools[0].Items {
				if !it.Present || it.Version == nil || *it.Version != versions[it.Key] || it.Server != serverOf(t, pool.cfg, it.Key) {
					t.Errorf("%s: key reports %+v; invalidate wrote version %d", tc.rule, it, versions[it.Key])
				}
			}
		}
	}
	acts := invokeJSON[[]inspect.Action](t, 0, "invalidate", "-c", f.cfgA, "--rule", "user", "id=dry", "--dry-run", "--json")
	if len(acts) != 1 || acts[0].Result != "dry run" || getAt(t, acts[0].Server, acts[0].Key) != nil {
		t.Errorf("dry run: %+v, want one op not sent", acts)
	}
}

// serverOf returns the server cfg's distribution puts key on.
func serverOf(t *testing.T, cfg *config.Config, key string) string {
	t.Helper()
	sel, err := cfg.Memcached.Selector()
	if err != nil {
		t.Fatal(err)
	}
	addr, err := sel.PickServer(key)
	if err != nil {
		t.Fatal(err)
	}
	return addr.String()
}

// TestKeyCounterAndSetAgainstMySQL stores a counter and a set under their
// tables' generations as the daemon would, one wrong and one stale, and
// checks what `key` makes of them and of MySQL's answer; `invalidate`
// deletes the counter (at its key under the generation) and bumps the
// set's table, after which `key` finds nothing valid and MySQL agrees.
func TestKeyCounterAndSetAgainstMySQL(t *testing.T) {
	f := newOpsToolsFixture(t)
	mc := poolClient(t, f.a)
	counts, interests := f.a.RuleSet.Rule("post-comments"), f.a.RuleSet.Rule("interests")
	counter := itemformat.CounterKey(f.prefix+"comments:7", 1000)
	set := f.prefix + "interests:5"
	for _, it := range []*memcache.Item{
		{Key: counts.Generation, Value: []byte("1000")},
		{Key: counter, Value: []byte("5")},
		{Key: interests.Generation, Value: []byte("2000")},
		{Key: set, Value: []byte("g2000 +rock +jazz -rock +pop ")},
	} {
		if err := mc.Set(it); err != nil {
			t.Fatal(err)
		}
	}

	rep := invokeJSON[inspect.Report](t, 0, "key", "-c", f.cfgA, "--rule", "post-comments", "post_id=7", "--json")
	items := rep.Pools[0].Items
	if len(items) != 3 || items[0].Role != "generation" || *items[0].Version != 1000 ||
		items[1].Key != counter || items[1].Count == nil || *items[1].Count != 5 || items[1].Server != serverOf(t, f.a, counter) ||
		items[2].Role != "fence" || items[2].Present {
		t.Errorf("counter items: %+v", items)
	}
	if m := rep.Pools[0].MySQL; m == nil || m.Result != "2" || m.Agrees || !slices.Equal(m.Args, []string{"7"}) {
		t.Errorf("counter's MySQL: %+v, want 2, disagreeing", m)
	}
	rep = invokeJSON[inspect.Report](t, 0, "key", "-c", f.cfgA, "--rule", "interests", "user_id=5", "--json")
	if it := rep.Pools[0].Items[1]; !slices.Equal(it.Members, []string{"jazz", "pop"}) {
		t.Errorf("set item: %+v, want members jazz pop", it)
	}
	if m := rep.Pools[0].MySQL; m == nil || m.Result != "{jazz rock}" || m.Agrees {
		t.Errorf("set's MySQL: %+v, want {jazz rock}, disagreeing", m)
	}

	acts := invokeJSON[[]inspect.Action](t, 0, "invalidate", "-c", f.cfgA, "--rule", "post-comments", "post_id=7", "--json")
	if len(acts) != 1 || acts[0].Key != counter || acts[0].Op != "delete" || acts[0].Result != "deleted" {
		t.Errorf("counter invalidation: %+v", acts)
	}
	rep = invokeJSON[inspect.Report](t, 0, "key", "-c", f.cfgA, "--rule", "post-comments", "post_id=7", "--json")
	if it := rep.Pools[0].Items[1]; it.Present || !rep.Pools[0].MySQL.Agrees {
		t.Errorf("after the delete: %+v, MySQL %+v; want missing, agreeing", it, rep.Pools[0].MySQL)
	}

	// Pool B holds no generation of the table: no counter of it is valid.
	out, errOut, err := invoke(t, "", "invalidate", "-c", f.cfgB, "--rule", "post-comments", "post_id=7")
	if err != nil || out != "" || !strings.Contains(errOut, "nothing to invalidate: no counter of rule \"post-comments\" is valid") {
		t.Errorf("counter without a generation: %v\n%s%s", err, out, errOut)
	}

	acts = invokeJSON[[]inspect.Action](t, 0, "invalidate", "-c", f.cfgA, "--table", f.db+".user_interests", "--json")
	var keys []string
	for _, a := range acts {
		keys = append(keys, a.Key)
	}
	if want := []string{f.prefix + "ns:table:" + f.db + ".user_interests", interests.Generation}; !slices.Equal(keys, want) {
		t.Errorf("table invalidation keys %q, want %q", keys, want)
	}
	rep = invokeJSON[inspect.Report](t, 0, "key", "-c", f.cfgA, "--rule", "interests", "user_id=5", "--json")
	if gen, it := rep.Pools[0].Items[0], rep.Pools[0].Items[1]; *gen.Version != 2001 || len(it.Members) != 0 ||
		!strings.Contains(it.Meaning, "not the current generation 2001") || !rep.Pools[0].MySQL.Agrees {
		t.Errorf("after the table's bump: %+v %+v %+v", gen, it, rep.Pools[0].MySQL)
	}
}

// TestInvalidateNamesFailedServer gives invalidate a pool whose one
// server is down: the op fails, the exit status is 1, and both the error
// and the log line name the server.
func TestInvalidateNamesFailedServer(t *testing.T) {
	f := newOpsToolsFixture(t)
	down := closedAddr(t)
	data, err := os.ReadFile(f.cfgB)
	if err != nil {
		t.Fatal(err)
	}
	cfgDown := filepath.Join(filepath.Dir(f.cfgB), "down.yaml")
	write(t, cfgDown, strings.Replace(string(data), "servers: [", "servers: ["+down+"]\n  # was: [", 1))
	out, errOut, err := invoke(t, "", "--log-format", "json", "invalidate", "-c", f.cfgA, "-c", cfgDown, "--rule", "user", "id=1")
	if code := exitCode(err); code != 1 || !strings.Contains(fmt.Sprint(err), down) {
		t.Fatalf("exit status %d (%v), want 1 naming %s\n%s%s", code, err, down, out, errOut)
	}
	recs, _ := jsonRecords(errOut)
	var failed, done bool
	for _, r := range recs {
		switch r["msg"] {
		case "invalidation by hand failed":
			failed = failed || r["server"] == down && r["pool"] == cfgDown && r["key"] == f.prefix+"ns:user:1"
		case "invalidated by hand":
			done = done || r["pool"] == f.cfgA && r["result"] == "added"
		}
	}
	if !failed || !done {
		t.Errorf("log lines: want pool A's bump and down.yaml's failure on %s:\n%s", down, errOut)
	}
	out, _, err = invoke(t, "", "key", "-c", f.cfgA, "-c", cfgDown, "--rule", "user", "id=1")
	if code := exitCode(err); code != 1 || !strings.Contains(out, "error: pool "+cfgDown) || !strings.Contains(out, down) {
		t.Errorf("key with a pool down: exit status %d (%v), want 1 and the pool's error naming %s:\n%s", code, err, down, out)
	}
}

// TestOpsToolsUsage checks the command-line mistakes of key and
// invalidate: they change nothing and exit with status 2.
func TestOpsToolsUsage(t *testing.T) {
	f := newOpsToolsFixture(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"key", "--rule", "user", "id=1"}, "-c FILE is required"},
		{[]string{"key", "-c", f.cfgA, "id=1"}, "--rule NAME is required"},
		{[]string{"key", "-c", f.cfgA, "--rule", "user"}, "give the entity as COLUMN=VALUE"},
		{[]string{"key", "-c", f.cfgA, "--rule", "nope", "id=1"}, `no rule named "nope" (rules: user, product, post-comments, interests)`},
		{[]string{"key", "-c", f.cfgA, "--rule", "user", "uid=1"}, `"uid" is not a column of its key`},
		{[]string{"invalidate", "-c", f.cfgA}, "give --rule NAME COLUMN=VALUE... or --table DB.TABLE"},
		{[]string{"invalidate", "-c", f.cfgA, "--rule", "user", "--table", "t"}, "not both"},
		{[]string{"invalidate", "-c", f.cfgA, "--table", "t", "x=1"}, `unexpected argument "x=1"`},
	} {
		_, errOut, err := invoke(t, "", tc.args...)
		if code := exitCode(err); code != 2 || !strings.Contains(err.Error()+errOut, tc.want) {
			t.Errorf("%q: exit status %d (%v), want 2 and %q\n%s", tc.args, code, err, tc.want, errOut)
		}
	}
	_, _, err := invoke(t, "", "invalidate", "-c", f.cfgA, "--table", "nowhere.t")
	if code := exitCode(err); code != 1 || !strings.Contains(err.Error(), `no rule of table "nowhere.t" has a fallback namespace or a generation`) {
		t.Errorf("unknown table: exit status %d (%v)", code, err)
	}
}

// TestDocsOpsCommandsNameExampleRules checks every `cachewarden key` and
// `cachewarden invalidate` line of docs/operations.md and the README
// against the example config's rules (configs/): the rule exists and the
// entity names its key columns, or the table has rules that cover it.
func TestDocsOpsCommandsNameExampleRules(t *testing.T) {
	cfg, err := config.Load("../../configs/cachewarden.yaml")
	if err != nil {
		t.Fatal(err)
	}
	pool := &inspect.Pool{Name: "example", Rules: cfg.RuleSet}
	checked := 0
	for _, doc := range []string{"../../docs/operations.md", "../../README.md"} {
		data, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			line = strings.Trim(strings.TrimSpace(line), "`")
			if i := strings.Index(line, "cachewarden invalidate "); i >= 0 {
				line = line[i:]
			} else if i := strings.Index(line, "cachewarden key "); i >= 0 {
				line = line[i:]
			} else {
				continue
			}
			f := strings.Fields(strings.SplitN(line, "`", 2)[0])
			var rule, table string
			var entity []string
			for i := 2; i < len(f); i++ {
				switch {
				case f[i] == "--rule" && i+1 < len(f):
					rule, i = f[i+1], i+1
				case f[i] == "--table" && i+1 < len(f):
					table, i = f[i+1], i+1
				case f[i] == "-c" || f[i] == "--config":
					i++
				case strings.Contains(f[i], "=") && !strings.HasPrefix(f[i], "-"):
					entity = append(entity, f[i])
				}
			}
			switch {
			case strings.HasPrefix(table, "DB.TABLE") || rule == "R" || rule == "NAME":
				continue // a synopsis
			case table != "":
				_, err = pool.TableOps(table)
			case rule != "":
				var r *rules.Rule
				if r, err = pool.Rule(rule); err == nil {
					_, err = r.EntityRow(entity)
				}
			default:
				continue
			}
			checked++
			if err != nil {
				t.Errorf("%s: %q: %v", doc, line, err)
			}
		}
	}
	if checked < 5 {
		t.Errorf("checked %d command lines; the docs should show more", checked)
	}
}
