package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/go-sql-driver/mysql"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/counters"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

// The readers of other languages under examples/, run with Debian's
// interpreters and memcached clients (scripts/services.sh installs them).
var otherReaders = []struct {
	name  string
	check []string // a command that fails when the language's client is missing
	cmd   []string // the reader, run from the repository root
}{
	{"python", []string{"/usr/bin/python3", "-c", "import pymemcache.client.base"},
		[]string{"/usr/bin/python3", "examples/python/cachewarden_reader.py"}},
	{"php", []string{"php", "-r", "exit(class_exists('Memcached') ? 0 : 1);"},
		[]string{"php", "examples/php/cachewarden_reader.php"}},
}

// requireReader fails (CI) or skips the test when a reader's language or
// memcached client is missing.
func requireReader(t *testing.T, check []string) {
	t.Helper()
	if out, err := exec.Command(check[0], check[1:]...).CombinedOutput(); err != nil {
		msg := fmt.Sprintf("%s is needed (scripts/services.sh installs python3-pymemcache, php-cli and php-memcached): %v %s", strings.Join(check, " "), err, out)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
}

// TestReadersFollowVectors runs each reader against the shared test
// vectors.
func TestReadersFollowVectors(t *testing.T) {
	for _, r := range otherReaders {
		t.Run(r.name, func(t *testing.T) {
			requireReader(t, r.check)
			cmd := exec.Command(r.cmd[0], append(r.cmd[1:], "--vectors", "testdata/formats/vectors.json")...)
			cmd.Dir = ".."
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("%s disagrees with the vectors: %v\n%s", r.name, err, out)
			}
		})
	}
}

// readerProc is a running reader answering JSON requests.
type readerProc struct {
	t   *testing.T
	in  io.WriteCloser
	out *bufio.Scanner
}

func startReader(t *testing.T, cmdline []string, server string) *readerProc {
	t.Helper()
	cmd := exec.Command(cmdline[0], append(cmdline[1:], "--server", server)...)
	cmd.Dir = ".."
	cmd.Stderr = t.Output()
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		in.Close()
		cmd.Wait()
	})
	sc := bufio.NewScanner(out)
	sc.Buffer(nil, 1<<20)
	return &readerProc{t: t, in: in, out: sc}
}

// ask sends one request and decodes the answer.
func (p *readerProc) ask(req map[string]any) map[string]any {
	p.t.Helper()
	line, _ := json.Marshal(req)
	if _, err := p.in.Write(append(line, '\n')); err != nil {
		p.t.Fatal(err)
	}
	if !p.out.Scan() {
		p.t.Fatalf("reader gave no answer to %s: %v", line, p.out.Err())
	}
	var ans map[string]any
	if err := json.Unmarshal(p.out.Bytes(), &ans); err != nil {
		p.t.Fatalf("answer %q: %v", p.out.Bytes(), err)
	}
	return ans
}

// TestReadersAgreeOnDaemonItems has the daemon's pipelined writer apply
// planned row changes (namespace bumps, set tokens with escaped members,
// counter deltas recounted from MariaDB), then reads every item with the
// Go client and with the Python and PHP readers, which must agree; and
// values GetOrCompute stores are shared between Go and Python.
func TestReadersAgreeOnDaemonItems(t *testing.T) {
	db := testDB(t)
	for _, q := range []string{
		"INSERT INTO user_interests VALUES (1, 1, 'rock climbing', 1), (1, 2, '100%', 1), (1, 3, 'Zürich', 1), (1, 4, 'tab\there', 1)",
		"INSERT INTO comments VALUES (1, 9, 1), (2, 9, 1), (3, 9, 1)",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	e := newHotEnvDB(t, db, nil)
	ctx := t.Context()
	mysql := counters.NewMySQL(db, counters.DBConfig{}, nil)
	pw := cacheops.NewMetaApplier(e.c.sel, mysql, mysql, cacheops.Config{}, nil)
	defer pw.Close()

	str := func(s string) rules.Value { return rules.Value{Kind: rules.KindString, Text: s} }
	num := func(s string) rules.Value { return rules.Value{Kind: rules.KindInt, Text: s} }
	// A user id too long for a key, and one that spells its hashed key.
	long := strings.Repeat("l", 260)
	longKey, err := e.c.Key("user", Row{"id": long})
	if err != nil {
		t.Fatal(err)
	}
	spelled := strings.TrimPrefix(longKey, e.prefix+"ns:user:")
	events := []rules.Event{
		{Table: "users", Operation: rules.Insert, After: rules.Row{{Name: "id", Value: str(long)}}},
		{Table: "users", Operation: rules.Insert, After: rules.Row{{Name: "id", Value: str(spelled)}}},
		{Table: "users", Operation: rules.Insert, After: rules.Row{{Name: "id", Value: num("42")}}},
		{Table: "users", Operation: rules.Update, Before: rules.Row{{Name: "id", Value: num("42")}}, After: rules.Row{{Name: "id", Value: num("42")}}},
		{Table: "users", Operation: rules.Insert, After: rules.Row{{Name: "id", Value: str("a b%")}}},
		// The set is missing: the first token loads it whole from MariaDB,
		// then the remove is appended.
		{Table: "user_interests", Operation: rules.Insert, After: rules.Row{
			{Name: "user_id", Value: num("1")}, {Name: "interest", Value: str("tab\there")}, {Name: "active", Value: num("1")}}},
		{Table: "user_interests", Operation: rules.Delete, Before: rules.Row{
			{Name: "user_id", Value: num("1")}, {Name: "interest", Value: str("100%")}, {Name: "active", Value: num("1")}}},
		{Table: "comments", Operation: rules.Insert, After: rules.Row{
			{Name: "post_id", Value: num("9")}, {Name: "approved", Value: num("1")}}},
		{Table: "products", Operation: rules.Insert, After: rules.Row{{Name: "id", Value: num("1")}}},
		{Table: "members", Operation: rules.Insert, After: rules.Row{{Name: "id", Value: num("2")}}},
	}
	// The master exists before the bump of member 2 marks it.
	if _, err := e.c.Namespace(ctx, "member", Row{"id": "1"}); err != nil {
		t.Fatal(err)
	}
	// The tables' generations exist, so the daemon loads the missing set
	// under its generation; counter ops go to their generation's key, as
	// the daemon's pipeline sends them (docs/formats.md, "Generations").
	gens := map[string]uint64{}
	for _, r := range e.rs.Rules() {
		if r.Generation != "" {
			gens[r.Generation] = e.generation(t, r.Name)
		}
	}
	for _, ev := range events {
		ops, _, err := e.rs.Plan(nil, &ev)
		if err != nil {
			t.Fatal(err)
		}
		for i := range ops {
			if ops[i].Kind == rules.OpCount || ops[i].Kind == rules.OpRecount {
				ops[i].Key = itemformat.CounterKey(ops[i].Key, gens[ops[i].Rule.Generation])
			}
		}
		if err := pw.Apply(ctx, ops, make([]cacheops.Result, len(ops))); err != nil {
			t.Fatal(err)
		}
	}
	// The daemon loaded the missing set under the table's generation.
	setKey, _ := e.c.Key("user-interests", Row{"user_id": "1"})
	if v, _ := e.value(t, setKey); !strings.HasPrefix(v, string(itemformat.AppendGenerationToken(nil, gens[e.rs.Rule("user-interests").Generation]))) {
		t.Fatalf("the daemon's set %q does not start with its generation", v)
	}
	if _, err := db.Exec("DELETE FROM user_interests WHERE interest = '100%'"); err != nil {
		t.Fatal(err)
	}

	// What the Go client reads.
	type query struct {
		op, rule string
		row      Row
	}
	queries := []query{
		{"namespace", "user", Row{"id": "42"}},
		{"namespace", "user", Row{"id": "a b%"}},
		{"namespace", "user", Row{"id": "7"}}, // missing: created by the first reader
		{"members", "user-interests", Row{"user_id": "1"}},
		{"count", "post-comments", Row{"post_id": "9"}},
		{"namespace", "catalog", Row{}},           // copies, created alike by the bump
		{"namespace", "member", Row{"id": "1"}},   // bit clear: the master's
		{"namespace", "member", Row{"id": "2"}},   // bumped: its own
		{"namespace", "member", Row{"id": "18"}},  // bit 2 too: its own, created by the reader
		{"namespace", "user", Row{"id": long}},    // a hashed key
		{"namespace", "user", Row{"id": spelled}}, // its text as a value: a key of its own
	}
	want := make([]map[string]any, len(queries))
	for i, q := range queries {
		key, err := e.c.Key(q.rule, q.row)
		if err != nil {
			t.Fatal(err)
		}
		ans := map[string]any{"key": key}
		switch q.op {
		case "namespace":
			v, err := e.c.Namespace(ctx, q.rule, q.row)
			if err != nil {
				t.Fatal(err)
			}
			ans["version"] = v
		case "members":
			ms, err := e.c.Members(ctx, q.rule, q.row)
			if err != nil {
				t.Fatal(err)
			}
			ans["members"] = ms
		case "count":
			n, err := e.c.Count(ctx, q.rule, q.row)
			if err != nil {
				t.Fatal(err)
			}
			ans["count"] = fmt.Sprint(n)
		}
		want[i] = ans
	}
	if m := want[3]["members"].([]string); !slices.Equal(m, []string{"rock climbing", "Zürich", "tab\there"}) {
		t.Fatalf("the daemon's set holds %q", m)
	}
	if want[4]["count"] != "3" {
		t.Fatalf("the daemon's counter holds %v", want[4]["count"])
	}
	if m1, m2 := want[6]["version"].(string), want[7]["version"].(string); !strings.HasPrefix(m1, "m") || strings.HasPrefix(m2, "m") {
		t.Fatalf("member versions %q and %q: want the master's and the member's own", m1, m2)
	}
	if k1, k2 := want[9]["key"].(string), want[10]["key"].(string); k1 != longKey || len(k1) != rules.HashedKeyLen || k2 == k1 {
		t.Fatalf("keys of a long id and of its hashed key's text: %q, %q", k1, k2)
	}

	// Values cached with GetOrCompute, shared with the Python reader.
	fromGo := e.prefix + "page:go"
	if _, err := e.c.GetOrCompute(ctx, fromGo, time.Minute, constant("computed by Go")); err != nil {
		t.Fatal(err)
	}

	for _, r := range otherReaders {
		t.Run(r.name, func(t *testing.T) {
			requireReader(t, r.check)
			p := startReader(t, r.cmd, e.addr)
			for i, q := range queries {
				rule := e.rs.Rule(q.rule)
				req := map[string]any{"op": q.op, "prefix": rule.Prefix, "template": rule.Key.String(), "row": q.row}
				if rule.Generation != "" {
					req["database"], req["table"] = rule.Database, rule.Table
				}
				if rule.Copies > 0 {
					req["copies"] = rule.Copies
				}
				if ev := rule.Evidence; ev != nil {
					req["evidence"] = map[string]any{"master": ev.MasterKey, "bits": ev.Bits, "column": ev.Column}
				}
				got := p.ask(req)
				want := want[i]
				if ms, ok := want["members"].([]string); ok {
					want = map[string]any{"key": want["key"], "members": toAny(ms)}
				}
				if g, w := fmt.Sprint(got), fmt.Sprint(want); g != w {
					t.Errorf("%s %s %v: %s reads %s, Go %s", q.op, q.rule, q.row, r.name, g, w)
				}
			}
			// A lost change bumps the tables' generations: the set and
			// the counter above are then missing to every reader.
			genOf := func(rule string) string { return e.rs.Rule(rule).Generation }
			for _, rule := range []string{"user-interests", "post-comments"} {
				if _, err := e.mc.Increment(genOf(rule), 1); err != nil {
					t.Fatal(err)
				}
			}
			for _, i := range []int{3, 4} {
				q := queries[i]
				rule := e.rs.Rule(q.rule)
				got := p.ask(map[string]any{"op": q.op, "prefix": rule.Prefix, "template": rule.Key.String(), "row": q.row,
					"database": rule.Database, "table": rule.Table})
				if got[q.op] != nil {
					t.Errorf("%s %s %v after its generation moved: %s reads %v, want it missing", q.op, q.rule, q.row, r.name, got)
				}
			}
			for _, rule := range []string{"user-interests", "post-comments"} {
				if _, err := e.mc.Decrement(genOf(rule), 1); err != nil {
					t.Fatal(err)
				}
			}
			if r.name == "php" {
				got := p.ask(map[string]any{"op": "get", "prefix": "", "template": fromGo})
				if got["value"] != "computed by Go" {
					t.Errorf("php reads %v at %s", got, fromGo)
				}
				return
			}
			got := p.ask(map[string]any{"op": "get_or_compute", "prefix": "", "template": fromGo, "lifetime": 60, "compute": "computed by Python"})
			if got["value"] != "computed by Go" || got["computed"] != false {
				t.Errorf("python's get_or_compute of Go's value: %v", got)
			}
			fromPython := e.prefix + "page:python"
			got = p.ask(map[string]any{"op": "get_or_compute", "prefix": "", "template": fromPython, "lifetime": 60, "compute": "computed by Python"})
			if got["value"] != "computed by Python" || got["computed"] != true {
				t.Errorf("python's get_or_compute of a missing value: %v", got)
			}
			v, err := e.c.GetOrCompute(ctx, fromPython, time.Minute, func(context.Context) ([]byte, error) {
				return nil, fmt.Errorf("computed again")
			})
			if err != nil || string(v) != "computed by Python" {
				t.Errorf("Go reads Python's value: %q, %v", v, err)
			}
			// A delete while Python computes: its value is not stored.
			deleted := e.prefix + "page:python-deleted"
			got = p.ask(map[string]any{"op": "get_or_compute", "prefix": "", "template": deleted, "lifetime": 60,
				"compute": "outdated", "delete_during_compute": true})
			if got["value"] != "outdated" || got["computed"] != true {
				t.Errorf("python's get_or_compute with a delete: %v", got)
			}
			v, err = e.c.GetOrCompute(ctx, deleted, time.Minute, constant("current"))
			if err != nil || string(v) != "current" {
				t.Errorf("after a delete during Python's computation Go reads %q, %v; want a recomputation", v, err)
			}
		})
	}
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// TestOtherClientsReadFencedCounters: the daemon's counters (with exact
// counters on: recounted in a snapshot of a binlog-enabled MariaDB,
// fenced, then incremented) and a counter client.Count stored are read by
// php-memcached (defaults, and OPT_BINARY_PROTOCOL off and on), pylibmc
// (text and binary) and pymemcache (HashClient with its default serde,
// and a Client with pickle_serde, which interprets flags): each returns
// the number the counter holds, as its text or as an integer.
func TestOtherClientsReadFencedCounters(t *testing.T) {
	const posts = 8
	db, _ := testsvc.MySQLBinlog(t)
	if _, err := db.Exec("CREATE TABLE comments (id BIGINT PRIMARY KEY AUTO_INCREMENT, post_id BIGINT, approved TINYINT(1))"); err != nil {
		t.Fatal(err)
	}
	for post := 1; post <= posts+1; post++ {
		for range post {
			if _, err := db.Exec("INSERT INTO comments (post_id, approved) VALUES (?, 1)", post); err != nil {
				t.Fatal(err)
			}
		}
	}
	e := newTestEnv(t, db, nil)
	ctx := t.Context()
	mc := memcache.New(e.addr)
	daemon := counters.New(mc, counters.NewMySQL(db, counters.DBConfig{}, nil), counters.Config{}, nil)
	comment := func(post int) rules.Event {
		return rules.Event{Table: "comments", Operation: rules.Insert, After: rules.Row{
			{Name: "post_id", Value: rules.Value{Kind: rules.KindInt, Text: strconv.Itoa(post)}},
			{Name: "approved", Value: rules.Value{Kind: rules.KindInt, Text: "1"}}}}
	}
	apply := func(ev rules.Event) {
		t.Helper()
		ops, _, err := e.rs.Plan(nil, &ev)
		if err != nil {
			t.Fatal(err)
		}
		for i := range ops {
			// As the daemon's pipeline does: counters live under their
			// table's generation.
			ops[i].Key = e.counterKey(t, "post-comments", ops[i].Key)
		}
		if err := daemon.Apply(ctx, ops, make([]cacheops.Result, len(ops))); err != nil {
			t.Fatal(err)
		}
	}
	// Each counter is missing: the daemon's delta recounts it, fenced. Then
	// one more comment on the even posts is applied with incr.
	want := map[string]string{}
	var keys []string
	for post := 1; post <= posts; post++ {
		apply(comment(post))
		n := post
		if post%2 == 0 {
			if _, err := db.Exec("INSERT INTO comments (post_id, approved) VALUES (?, 1)", post); err != nil {
				t.Fatal(err)
			}
			apply(comment(post))
			n++
		}
		key, _ := e.c.Key("post-comments", Row{"post_id": post})
		key = e.counterKey(t, "post-comments", key)
		want[key] = strconv.Itoa(n)
		keys = append(keys, key)
	}
	// And one a reader counted.
	if n, err := e.c.Count(ctx, "post-comments", Row{"post_id": posts + 1}); err != nil || n != posts+1 {
		t.Fatalf("Count = %d, %v", n, err)
	}
	key, _ := e.c.Key("post-comments", Row{"post_id": posts + 1})
	key = e.counterKey(t, "post-comments", key)
	want[key] = strconv.Itoa(posts + 1)
	keys = append(keys, key)

	readers := []struct {
		name  string
		check []string
		cmd   []string
	}{
		{"python", []string{"/usr/bin/python3", "-c", "import pylibmc, pymemcache.client.hash"},
			[]string{"/usr/bin/python3", "client/testdata/read_counters.py"}},
		{"php", otherReaders[1].check, []string{"php", "client/testdata/read_counters.php"}},
	}
	for _, r := range readers {
		t.Run(r.name, func(t *testing.T) {
			requireReader(t, r.check)
			cmd := exec.Command(r.cmd[0], append(r.cmd[1:], append([]string{e.addr}, keys...)...)...)
			cmd.Dir = ".."
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%v: %v\n%s", r.cmd, err, out)
			}
			var got map[string]map[string][]string
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("%s: %v", out, err)
			}
			for client, values := range got {
				for _, k := range keys {
					v := values[k]
					okType := len(v) == 2 && (v[0] == "bytes" || v[0] == "string" || v[0] == "int" || v[0] == "integer")
					if !okType || v[1] != want[k] {
						t.Errorf("%s reads %s as %q, want the number %s", client, k, v, want[k])
					}
				}
			}
			if len(got) < 2 {
				t.Errorf("%d clients answered: %s", len(got), out)
			}
		})
	}
	// The counters were fenced (so the clients above read fenced items).
	for _, k := range keys[:posts] {
		it, err := mc.Get(k)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := mc.Get(counters.FenceKey(k)); err != nil || it.Flags == 0 {
			t.Errorf("counter %s: flags %#x, fence: %v; want a fenced counter", k, it.Flags, err)
		}
	}
}

// TestReadersUsage: each reader describes its flags with --help, and run
// without arguments says what to do (and fails).
func TestReadersUsage(t *testing.T) {
	for _, r := range otherReaders {
		t.Run(r.name, func(t *testing.T) {
			requireReader(t, r.check)
			cmd := exec.Command(r.cmd[0], append(r.cmd[1:], "--help")...)
			cmd.Dir = ".."
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("--help: %v\n%s", err, out)
			}
			for _, want := range []string{"--vectors FILE", "--server HOST:PORT", "test vectors", "JSON requests", "docs/formats.md"} {
				if !strings.Contains(string(out), want) {
					t.Errorf("--help does not say %q:\n%s", want, out)
				}
			}
			cmd = exec.Command(r.cmd[0], r.cmd[1:]...)
			cmd.Dir = ".."
			var stderr strings.Builder
			cmd.Stderr = &stderr
			err = cmd.Run()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 2 {
				t.Errorf("without arguments: %v, want exit status 2", err)
			}
			for _, want := range []string{"nothing to do", "--vectors FILE", "--server HOST:PORT", "--help"} {
				if !strings.Contains(stderr.String(), want) {
					t.Errorf("without arguments it does not say %q:\n%s", want, stderr.String())
				}
			}
		})
	}
}

// TestReadersAgreeOnReplicaWaits has the Go client and the Python and PHP
// readers read position items and say what they would wait for on a
// replica: the same statement with the same arguments.
func TestReadersAgreeOnReplicaWaits(t *testing.T) {
	addr := testsvc.PrivateMemcached(t, testsvc.MemcachedOptions{}).Addr
	mc := memcache.New(addr)
	items := map[uint32]string{
		11: "gtid=0-11-1040,1-11-7 binlog=mysql-bin.000042:8812",
		12: "binlog=mysql-bin.000003:4",
		13: "gtid=3e11fa47-71ca-11e1-9e33-c80aa9429562:23",
		14: "binlog=mysql-bin.000003", // no offset: not a position
	}
	for id, v := range items {
		if err := mc.Set(&memcache.Item{Key: itemformat.PositionKey(id), Value: []byte(v)}); err != nil {
			t.Fatal(err)
		}
	}
	c, err := New(Config{Servers: []itemformat.Server{{Addr: addr}}, Rules: mustRules(t)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	goWait := func(id uint32) any {
		w, why := c.sourceWait(t.Context(), &ReplicaConfig{SourceServerID: id, MaxWait: 1500 * time.Millisecond})
		if why != "" {
			return nil
		}
		b, _ := json.Marshal(map[string]any{"function": w.Function, "query": w.Query, "args": w.Args})
		var out any
		json.Unmarshal(b, &out)
		return out
	}
	for _, r := range otherReaders {
		t.Run(r.name, func(t *testing.T) {
			requireReader(t, r.check)
			p := startReader(t, r.cmd, addr)
			for id := range items {
				ans := p.ask(map[string]any{"op": "replica_wait", "prefix": "", "template": "x", "server_id": id, "max_wait": 1.5})
				if got, want := ans["wait"], goWait(id); fmt.Sprint(got) != fmt.Sprint(want) {
					t.Errorf("server %d (%q): %s waits %v, Go %v", id, items[id], r.name, got, want)
				}
			}
		})
	}
}

// TestReadersWaitOnReplica has the Python (PyMySQL) and PHP (PDO)
// readers wait for a position item on the real replica: timed out while
// the replica's SQL thread is stopped behind the position, reached once
// it applied it, unfenced without a position item.
func TestReadersWaitOnReplica(t *testing.T) {
	e := newReplicaEnv(t)
	cfg, err := mysqlConfig(e.ReplicaDSN)
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := strings.Cut(cfg.Addr, ":")
	portN, _ := strconv.Atoi(port)
	my := map[string]any{"host": host, "port": portN, "user": cfg.User, "database": cfg.DBName}
	e.StopSQL(t)
	e.change(t, "INSERT INTO comments VALUES (4, 1, 1)")
	readers := []struct {
		name  string
		check []string
		cmd   []string
	}{
		{"python", []string{"/usr/bin/python3", "-c", "import pymemcache.client.base, pymysql"}, otherReaders[0].cmd},
		{"php", []string{"php", "-r", "exit(class_exists('Memcached') && in_array('mysql', PDO::getAvailableDrivers()) ? 0 : 1);"}, otherReaders[1].cmd},
	}
	procs := make([]*readerProc, len(readers))
	for i, r := range readers {
		requireReader(t, r.check)
		procs[i] = startReader(t, r.cmd, e.addr)
	}
	ask := func(serverID uint32, maxWait float64) []string {
		var out []string
		for i, p := range procs {
			ans := p.ask(map[string]any{"op": "wait_for_position", "prefix": "", "template": "x", "server_id": serverID,
				"max_wait": maxWait, "mysql": my})
			out = append(out, readers[i].name+":"+fmt.Sprint(ans["outcome"]))
		}
		return out
	}
	if got := ask(e.ServerID, 0.3); !slices.Equal(got, []string{"python:timed_out", "php:timed_out"}) {
		t.Errorf("replica behind the position: %q, want both timed_out", got)
	}
	e.StartSQL(t)
	if got := ask(e.ServerID, 30); !slices.Equal(got, []string{"python:reached", "php:reached"}) {
		t.Errorf("replica catching up: %q, want both reached", got)
	}
	if got := ask(e.ServerID+1, 0.3); !slices.Equal(got, []string{"python:unfenced", "php:unfenced"}) {
		t.Errorf("no position item: %q, want both unfenced", got)
	}
}

// mysqlConfig parses a go-sql-driver DSN.
func mysqlConfig(dsn string) (*mysql.Config, error) { return mysql.ParseDSN(dsn) }
