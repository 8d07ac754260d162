package client

import (
	"database/sql"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

// testRules are the rules the client tests read by; %PREFIX% becomes a
// prefix of the test's own.
const testRules = `version: 1
prefix: "%PREFIX%"
rules:
  - name: user
    table: users
    bump: "ns:user:{id}"
    ttl: 60
  - name: user-interests
    table: user_interests
    when: "active == 1"
    set:
      key: "interests:{user_id}"
      member: "{interest}"
      load: "SELECT interest FROM user_interests WHERE user_id = ? AND active = 1 ORDER BY seq"
      args: [user_id]
    ttl: 60
  - name: tags
    table: tags
    set: {key: "tags:{id}", member: "{tag}"}
  - name: post-comments
    table: comments
    when: "approved == 1"
    count:
      key: "comments:{post_id}"
      recount: "SELECT COUNT(*) FROM comments WHERE post_id = ? AND approved = 1"
    ttl: 60
  - name: likes
    table: likes
    count: {key: "likes:{post_id}"}
`

// testEnv is a Client on the test memcached with testRules under a
// prefix of its own, and a direct gomemcache client to look at the items.
type testEnv struct {
	c      *Client
	mc     *memcache.Client
	rs     *rules.RuleSet
	prefix string
	addr   string
}

// newTestEnv builds a testEnv; db may be nil. adjust, when set, changes
// the Config before the Client is built.
func newTestEnv(t *testing.T, db Querier, adjust func(*Config)) *testEnv {
	t.Helper()
	return newTestEnvAt(t, testsvc.Memcached(t), db, adjust)
}

// newTestEnvAt is newTestEnv on the memcached at addr.
func newTestEnvAt(t *testing.T, addr string, db Querier, adjust func(*Config)) *testEnv {
	t.Helper()
	prefix := "cwtest:client:" + testsvc.Unique() + ":"
	rs, err := rulefile.Parse("client-test.yaml", []byte(strings.ReplaceAll(testRules, "%PREFIX%", prefix)))
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Servers: []itemformat.Server{{Addr: addr}}, Rules: rs, DB: db, Timeout: 2 * time.Second}
	if adjust != nil {
		adjust(&cfg)
	}
	c, err := New(cfg, slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	mc := memcache.New(addr)
	mc.Timeout = 2 * time.Second
	if err := mc.Ping(); err != nil {
		t.Fatalf("memcached does not answer: %v", err)
	}
	return &testEnv{c: c, mc: mc, rs: rs, prefix: prefix, addr: addr}
}

// set stores value at the prefixed key.
func (e *testEnv) set(t *testing.T, key, value string) {
	t.Helper()
	if err := e.mc.Set(&memcache.Item{Key: key, Value: []byte(value), Expiration: 60}); err != nil {
		t.Fatal(err)
	}
}

// value returns the item at key; ok is false when it is missing.
func (e *testEnv) value(t *testing.T, key string) (string, bool) {
	t.Helper()
	it, err := e.mc.Get(key)
	if err == memcache.ErrCacheMiss {
		return "", false
	}
	if err != nil {
		t.Fatal(err)
	}
	return string(it.Value), true
}

// testDB creates the tables testRules query in a fresh database.
func testDB(t *testing.T) *sql.DB {
	t.Helper()
	db, _ := testsvc.MySQL(t)
	for _, q := range []string{
		"CREATE TABLE user_interests (user_id BIGINT, seq INT, interest VARCHAR(64), active TINYINT(1), PRIMARY KEY (user_id, seq))",
		"CREATE TABLE comments (id BIGINT PRIMARY KEY, post_id BIGINT, approved TINYINT(1))",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	return db
}

// countingClient counts the round trips the Client makes through
// gomemcache.
type countingClient struct {
	readClient
	gets, getMultis, adds, sets, cass atomic.Int64
}

func (c *countingClient) Get(key string) (*memcache.Item, error) {
	c.gets.Add(1)
	return c.readClient.Get(key)
}

func (c *countingClient) GetMulti(keys []string) (map[string]*memcache.Item, error) {
	c.getMultis.Add(1)
	return c.readClient.GetMulti(keys)
}

func (c *countingClient) Add(it *memcache.Item) error {
	c.adds.Add(1)
	return c.readClient.Add(it)
}

func (c *countingClient) Set(it *memcache.Item) error {
	c.sets.Add(1)
	return c.readClient.Set(it)
}

func (c *countingClient) CompareAndSwap(it *memcache.Item) error {
	c.cass.Add(1)
	return c.readClient.CompareAndSwap(it)
}

// count makes e's Client count its round trips.
func (e *testEnv) count() *countingClient {
	cc := &countingClient{readClient: e.c.mc}
	e.c.mc = cc
	return cc
}

// generation returns the current generation of the named rule's table,
// creating it (docs/formats.md, "Generations") when it is missing.
func (e *testEnv) generation(t *testing.T, rule string) uint64 {
	t.Helper()
	r, ok := e.c.rules[rule]
	if !ok {
		t.Fatalf("no rule %q", rule)
	}
	g, err := e.c.generation(t.Context(), r.rule.Generation, nil)
	if err != nil {
		if it, gerr := e.mc.Get(r.rule.Generation); gerr == nil {
			if g, ok := itemformat.ParseGeneration(it.Value); ok {
				return g
			}
		}
		t.Fatal(err)
	}
	return g
}

// stamped returns tokens after the generation token of rule's current
// generation: a set as the daemon or a reader loads it.
func (e *testEnv) stamped(t *testing.T, rule, tokens string) string {
	t.Helper()
	return string(itemformat.AppendGenerationToken(nil, e.generation(t, rule))) + tokens
}

// counterKey returns the key of the counter at the rendered key under
// rule's current generation.
func (e *testEnv) counterKey(t *testing.T, rule, key string) string {
	t.Helper()
	return itemformat.CounterKey(key, e.generation(t, rule))
}
