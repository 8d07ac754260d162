package integration

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/client"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

// replicaRules bump three namespaces per post, one per reading mode:
// plain, with a second bump (rebump_after), and fenced (the readers wait
// for the source position).
const replicaRules = `version: 1
prefix: "rf:"
rules:
  - {name: plain, table: DB.posts, bump: "ns:plain:{id}"}
  - {name: rebump, table: DB.posts, bump: "ns:rebump:{id}", rebump_after: 1s}
  - {name: fenced, table: DB.posts, bump: "ns:fenced:{id}"}
`

// replicaModes are the reading modes, by their rule's name.
var replicaModes = []string{"plain", "rebump", "fenced"}

// TestReplicaFenceEndToEnd runs the daemon over a real primary and its
// GTID replica: posts change on the primary, their Debezium events (with
// the source block: server_id, gtid, file, pos) go through the daemon,
// and readers of each mode fill values from the replica with
// GetOrCompute while the replica's SQL thread is stopped for 1.5 s at a
// time. A value stored under a namespace version is stale when it is
// older than the change that made that version. Plain and rebump_after
// readers store stale values (the control: the replica does lag); fenced
// readers store none.
func TestReplicaFenceEndToEnd(t *testing.T) {
	ctx := context.Background()
	rep := testsvc.MySQLReplica(t)
	dbName := databaseOf(t, rep.PrimaryDSN)
	const posts = 6
	if _, err := rep.Primary.Exec("CREATE TABLE posts (id INT PRIMARY KEY, v INT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	for id := 1; id <= posts; id++ {
		if _, err := rep.Primary.Exec("INSERT INTO posts VALUES (?, 0)", id); err != nil {
			t.Fatal(err)
		}
	}
	rep.CatchUp(t)

	mcAddr := startMemcached(t).addr
	b, err := StartBroker(ctx, testLog(t), BrokerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	const topic, group = "replica", "replica"
	if err := b.CreateTopics(ctx, 2, topic); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	rulesText := []byte(strings.ReplaceAll(replicaRules, "DB.", dbName+"."))
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rulesText, 0o644); err != nil {
		t.Fatal(err)
	}
	startDaemonYAML(t, ctx, filepath.Join(dir, "cachewarden.yaml"), fmt.Sprintf(
		"kafka:\n  brokers: [%q]\n  group: %s\n  topics: [%q]\nmemcached:\n  servers: [%q]\n"+
			"rules: [rules.yaml]\nbatch:\n  max_wait: 1ms\nhttp:\n  listen: \"127.0.0.1:0\"\n", b.Addrs()[0], group, topic, mcAddr))
	rs, err := rulefile.Parse("rules.yaml", rulesText)
	if err != nil {
		t.Fatal(err)
	}
	newClient := func(replica *client.ReplicaConfig) *client.Client {
		c, err := client.New(client.Config{Servers: []itemformat.Server{{Addr: mcAddr}}, Rules: rs, Replica: replica}, testLog(t))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	plainClient := newClient(nil)
	fencedClient := newClient(&client.ReplicaConfig{DB: rep.Replica, SourceServerID: rep.ServerID, MaxWait: 10 * time.Second})

	// The writer: one change at a time, applied by the daemon before the
	// next, so each namespace version comes from a known change.
	w := &postWriter{t: t, rep: rep, broker: b, topic: topic, group: group, db: dbName, mc: plainClient,
		expect: map[string]map[uint64]int{}}
	conn, err := rep.Primary.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for id := 1; id <= posts; id++ {
		w.change(ctx, conn, id)
	}

	// Readers: four per mode, reading random posts until stopped.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var fills [3]atomic.Int64
	for m, mode := range replicaModes {
		c := plainClient
		if mode == "fenced" {
			c = fencedClient
		}
		for range 4 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					id := 1 + rand.IntN(posts)
					v, err := c.Namespace(ctx, mode, client.Row{"id": id})
					if err != nil {
						t.Error(err)
						return
					}
					key := fmt.Sprintf("rf:val:%s:%d:%s", mode, id, v)
					read := func(ctx context.Context, q querier) ([]byte, error) {
						fills[m].Add(1)
						var val []byte
						err := q.QueryRowContext(ctx, "SELECT v FROM posts WHERE id = ?", id).Scan(&val)
						return val, err
					}
					if mode == "fenced" {
						_, err = c.GetOrComputeFrom(ctx, key, 0, func(ctx context.Context, db *sql.Conn) ([]byte, error) { return read(ctx, db) })
					} else {
						_, err = c.GetOrCompute(ctx, key, 0, func(ctx context.Context) ([]byte, error) { return read(ctx, rep.Replica) })
					}
					if err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
	}

	// Three lag windows of 1.5 s, changes all along.
	for window := range 3 {
		rep.StopSQL(t)
		lagEnd := time.Now().Add(1500 * time.Millisecond)
		for time.Now().Before(lagEnd) {
			w.change(ctx, conn, 1+rand.IntN(posts))
		}
		rep.StartSQL(t)
		rep.CatchUp(t)
		calm := time.Now().Add(time.Duration(500+500*window) * time.Millisecond)
		for time.Now().Before(calm) {
			w.change(ctx, conn, 1+rand.IntN(posts))
		}
	}
	rep.CatchUp(t)
	time.Sleep(1500 * time.Millisecond) // the last rebumps, and fills under them
	close(stop)
	wg.Wait()

	stored, stale := w.check(plainClient)
	for m, mode := range replicaModes {
		t.Logf("%s: %d fills, %d values stored, %d stale", mode, fills[m].Load(), stored[mode], stale[mode])
	}
	t.Logf("changes: %d; fenced fills: %+v", w.changes, fencedClient.ReplicaStats())
	if stale["plain"] == 0 || stale["rebump"] == 0 {
		t.Errorf("plain and rebump_after readers stored %d and %d stale values; want some (the control: is the replica lagging?)", stale["plain"], stale["rebump"])
	}
	if stored["fenced"] == 0 {
		t.Error("fenced readers stored no value")
	}
	if stale["fenced"] != 0 {
		t.Errorf("fenced readers stored %d stale values, want 0", stale["fenced"])
	}
	if st := fencedClient.ReplicaStats(); st.Unfenced != 0 || st.TimedOut != 0 {
		t.Errorf("fenced fills %+v: want every one fenced, none timed out", st)
	}
}

// querier is what the readers' computations query.
type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// databaseOf returns the database a go-sql-driver DSN names.
func databaseOf(t *testing.T, dsn string) string {
	t.Helper()
	_, name, _ := strings.Cut(dsn, ")/")
	name, _, _ = strings.Cut(name, "?")
	if name == "" {
		t.Fatalf("no database in %q", dsn)
	}
	return name
}

// postWriter changes posts on the primary one at a time and publishes
// each change's Debezium event, waiting until the daemon has applied it.
type postWriter struct {
	t       *testing.T
	rep     *testsvc.Replica
	broker  *Broker
	topic   string
	group   string
	db      string
	mc      *client.Client
	changes int
	// expect[mode:id][version] is v of the change that made version, for
	// each version read right after a change was applied.
	expect map[string]map[uint64]int
	pub    *Publisher
}

func (w *postWriter) change(ctx context.Context, conn *sql.Conn, id int) {
	t := w.t
	t.Helper()
	tx, err := testsvc.ExecLogged(ctx, conn, "UPDATE posts SET v = v + 1 WHERE id = ?", id)
	if err != nil {
		t.Fatal(err)
	}
	var v int
	if err := conn.QueryRowContext(ctx, "SELECT v FROM posts WHERE id = ?", id).Scan(&v); err != nil {
		t.Fatal(err)
	}
	row := func(v int) map[string]any { return map[string]any{"id": id, "v": v} }
	ev, err := json.Marshal(map[string]any{
		"op": "u", "before": row(v - 1), "after": row(v), "ts_ms": time.Now().UnixMilli(),
		"source": map[string]any{"connector": "mysql", "db": w.db, "table": "posts", "server_id": w.rep.ServerID,
			"gtid": tx.GTID, "file": tx.File, "pos": tx.RowsPos, "ts_ms": time.Now().UnixMilli()},
	})
	if err != nil {
		t.Fatal(err)
	}
	if w.pub == nil {
		if w.pub, err = NewPublisher(w.broker.Addrs(), Debezium, nil, testLog(t)); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.pub.Close() })
	}
	if err := w.pub.PublishRaw(ctx, OutMessage{Topic: w.topic, Key: []byte(strconv.Itoa(id)), Value: ev}); err != nil {
		t.Fatal(err)
	}
	waitCaughtUp(t, ctx, w.broker, w.group, w.topic)
	w.changes++
	for _, mode := range replicaModes {
		key, err := w.mc.Key(mode, client.Row{"id": id})
		if err != nil {
			t.Fatal(err)
		}
		it, err := w.mc.Memcache().Get(key)
		if err != nil {
			t.Fatalf("namespace %s after change %d: %v", key, w.changes, err)
		}
		ver, ok := itemformat.ParseVersion(it.Value)
		if !ok {
			t.Fatalf("namespace %s = %q", key, it.Value)
		}
		k := mode + ":" + strconv.Itoa(id)
		if w.expect[k] == nil {
			w.expect[k] = map[uint64]int{}
		}
		w.expect[k][ver] = v
	}
}

// check reads every value the readers could have stored, under every
// version from the first one a change made, and counts those stored and
// those older than the change that made their version: the latest
// change whose version, read right after it was applied, is at or below
// theirs.
func (w *postWriter) check(c *client.Client) (stored, stale map[string]int) {
	t := w.t
	stored, stale = map[string]int{}, map[string]int{}
	for _, mode := range replicaModes {
		for id := 1; ; id++ {
			versions := w.expect[mode+":"+strconv.Itoa(id)]
			if versions == nil {
				break
			}
			var first, last uint64
			for ver := range versions {
				if first == 0 || ver < first {
					first = ver
				}
				last = max(last, ver)
			}
			for ver := first; ver <= last+2; ver++ {
				it, err := c.Memcache().Get(fmt.Sprintf("rf:val:%s:%d:%d", mode, id, ver))
				if err != nil {
					continue
				}
				got, err := strconv.Atoi(string(it.Value))
				if err != nil {
					t.Fatalf("value %q", it.Value)
				}
				want, made := -1, uint64(0)
				for v2, val := range versions {
					if v2 <= ver && v2 >= made {
						want, made = val, v2
					}
				}
				stored[mode]++
				if got < want {
					stale[mode]++
				}
			}
		}
	}
	return stored, stale
}
