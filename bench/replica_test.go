package bench

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/client"
	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/integration"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

// Flags of BenchmarkReplicaReaders (docs/benchmarks.md, "Readers on
// replicas").
var (
	replicaLags     = flag.String("replica.lags", "0,100ms,1s,5s", "replica lags to measure, comma-separated; empty: none")
	replicaPhase    = flag.Duration("replica.phase", 15*time.Second, "how long each lag is measured")
	replicaRate     = flag.Int("replica.rate", 100, "row changes per second on the primary while readers read")
	replicaReaders  = flag.Int("replica.readers", 32, "readers per mode")
	replicaE2ERates = flag.String("replica.e2e", "1000,10000", "offered rates (changes/s) of the commit-to-invalidation measurement; empty: none")
	replicaE2ERows  = flag.Int("replica.e2e.rows", 20, "rows changed per transaction (one UPDATE) in the commit-to-invalidation measurement; each row is its own event and bump")
)

// replicaBenchRules bump one namespace per post and mode. rebump_after
// is 2s, as in issue 33's measurement.
const replicaBenchRules = `version: 1
prefix: "rb:"
rules:
  - {name: plain, table: DB.posts, bump: "ns:plain:{id}"}
  - {name: rebump, table: DB.posts, bump: "ns:rebump:{id}", rebump_after: 2s}
  - {name: fenced, table: DB.posts, bump: "ns:fenced:{id}"}
  - {name: sample, table: DB.samples, bump: "ns:sample:{id}"}
`

var replicaBenchModes = []string{"plain", "rebump", "fenced"}

// replicaMaxWait is the fenced readers' bound: lags above it read the
// primary.
const replicaMaxWait = 2 * time.Second

// BenchmarkReplicaReaders measures readers that fill their cache from a
// GTID replica of the primary the daemon's changes come from: plain
// (GetOrCompute), rebump_after: 2s, and fenced (GetOrComputeFrom with
// Config.Replica), in the same run, at each replica lag. It needs the
// replica pair of scripts/services.sh (CACHEWARDEN_TEST_MYSQL_BINLOG_DSN,
// CACHEWARDEN_TEST_MYSQL_REPLICA_DSN) and prints its tables; run it with
// -benchtime 1x:
//
//	go test ./bench -run '^$' -bench ReplicaReaders -benchtime 1x
//
// The daemon, an in-process Kafka-protocol broker and memcached run on
// the same machine as both MariaDBs.
func BenchmarkReplicaReaders(b *testing.B) {
	for b.Loop() {
		runReplicaBench(b)
	}
}

// rbEnv is the benchmark's primary and replica, daemon and clients.
type rbEnv struct {
	b       *testing.B
	rep     *testsvc.Replica
	db      string
	mc      *memcache.Client
	broker  *integration.Broker
	q       *eventQueue // the events of the primary's changes
	clients map[string]*client.Client
	topic   string
	group   string
	posts   int
	base    map[string]map[int]uint64 // mode -> post -> version after the seed change
	baseV   map[int]int               // post -> v after the seed change
	commits sync.Map                  // "post:v" -> commit time
}

func runReplicaBench(b *testing.B) {
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	rep := testsvc.MySQLReplica(b)
	e := &rbEnv{b: b, rep: rep, topic: "replica", group: "replica", posts: 40}
	_, e.db, _ = strings.Cut(rep.PrimaryDSN, ")/")
	e.db, _, _ = strings.Cut(e.db, "?")
	for _, q := range []string{
		"CREATE TABLE posts (id INT PRIMARY KEY, v INT NOT NULL)",
		"CREATE TABLE samples (id INT PRIMARY KEY AUTO_INCREMENT, v INT NOT NULL)",
	} {
		if _, err := rep.Primary.Exec(q); err != nil {
			b.Fatal(err)
		}
	}
	for id := 1; id <= e.posts; id++ {
		if _, err := rep.Primary.Exec("INSERT INTO posts VALUES (?, 0)", id); err != nil {
			b.Fatal(err)
		}
	}
	rep.CatchUp(b)
	mcAddr := testsvc.PrivateMemcached(b, testsvc.MemcachedOptions{MemoryMB: 256, Threads: 2, Args: []string{"-c", "4096"}}).Addr
	e.mc = memcache.New(mcAddr)
	e.mc.MaxIdleConns = 64
	var err error
	if e.broker, err = integration.StartBroker(ctx, log, integration.BrokerOptions{Topics: []string{e.topic}, Partitions: 4}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(e.broker.Close)
	dir := b.TempDir()
	rulesText := []byte(strings.ReplaceAll(replicaBenchRules, "DB.", e.db+"."))
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rulesText, 0o644); err != nil {
		b.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "cachewarden.yaml")
	if err := os.WriteFile(cfgPath, fmt.Appendf(nil, "kafka:\n  brokers: [%q]\n  group: %s\n  topics: [%q]\nmemcached:\n  servers: [%q]\n"+
		"rules: [rules.yaml]\nbatch:\n  max_wait: 2ms\nhttp:\n  listen: \"127.0.0.1:0\"\nlog:\n  level: error\n",
		e.broker.Addrs()[0], e.group, e.topic, mcAddr), 0o644); err != nil {
		b.Fatal(err)
	}
	cfg, err := config.Load(cfgPath)
	if err != nil {
		b.Fatal(err)
	}
	d, err := integration.StartDaemon(ctx, cfg, log, integration.FastGroupTiming)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { d.Stop() })
	pub, err := integration.NewPublisher(e.broker.Addrs(), integration.Debezium, nil, log)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { pub.Close() })
	e.q = newEventQueue(b, pub, e.topic, e.db, rep.ServerID)
	rs, err := rulefile.Parse("rules.yaml", rulesText)
	if err != nil {
		b.Fatal(err)
	}
	e.clients = map[string]*client.Client{}
	for _, mode := range replicaBenchModes {
		// Readers waiting for another's fill look again every 5ms (the
		// default 50ms would make a slower fill cost the waiting readers
		// whole ticks of the 20ms schedule).
		cc := client.Config{Servers: []itemformat.Server{{Addr: mcAddr}}, Rules: rs, MaxIdleConns: 64,
			Turnstile: client.TurnstileOptions{Wait: 5 * time.Millisecond}}
		if mode == "fenced" {
			cc.Replica = &client.ReplicaConfig{DB: rep.Replica, Primary: rep.Primary, SourceServerID: rep.ServerID, MaxWait: replicaMaxWait}
		}
		c, err := client.New(cc, log)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { c.Close() })
		e.clients[mode] = c
	}
	rep.Replica.SetMaxOpenConns(4 * *replicaReaders)
	rep.Primary.SetMaxOpenConns(4 * *replicaReaders)

	stopPub := e.q.start(ctx)
	defer stopPub()
	e.seed(ctx)

	if *replicaLags != "" {
		fmt.Printf("\nReaders on replicas: %d posts, %d changes/s on the primary, %d readers per mode, %v per lag, fenced MaxWait %v (then the primary)\n\n",
			e.posts, *replicaRate, *replicaReaders, *replicaPhase, replicaMaxWait)
		fmt.Println("| lag | mode | reads | hit rate | fills | stale values stored / stored | stale reads served | stale for p50 / p99 / max | fills from the primary | fill latency p50 / p99 |")
		fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
		for _, lagText := range strings.Split(*replicaLags, ",") {
			lag, err := time.ParseDuration(strings.TrimSpace(lagText))
			if err != nil {
				b.Fatalf("-replica.lags: %v", err)
			}
			e.phase(ctx, lag)
		}
	}
	if *replicaE2ERates != "" {
		fmt.Printf("\nCommit to namespace moved: %d connections, %d rows per transaction\n\n", e2eConns, e2eRowsPerTx())
		fmt.Println(e2eHeader)
		src := &e2eSource{b: b, db: rep.Primary, mc: e.mc, caughtUp: e.caughtUp, committed: e.q.queue,
			key: func(id int) string {
				k, _ := e.clients["plain"].Key("sample", client.Row{"id": id})
				return k
			}}
		for _, r := range strings.Split(*replicaE2ERates, ",") {
			rate, err := strconv.Atoi(strings.TrimSpace(r))
			if err != nil {
				b.Fatalf("-replica.e2e: %v", err)
			}
			fmt.Println(src.endToEnd(ctx, rate, e2eRowsPerTx()).row())
		}
	}
}

// change updates one row on conn and queues its Debezium event. It
// returns the row's new v and the commit time.
func (e *rbEnv) change(ctx context.Context, conn *sql.Conn, table string, id int) (int, time.Time) {
	res, err := conn.ExecContext(ctx, "UPDATE "+table+" SET v = LAST_INSERT_ID(v + 1) WHERE id = ?", id)
	if err != nil {
		e.b.Fatal(err)
	}
	committed := time.Now()
	v64, _ := res.LastInsertId()
	v := int(v64)
	e.q.queue(ctx, conn, table, committed, rowChange{id, v})
	return v, committed
}

// caughtUp waits until the daemon has applied everything published.
func (e *rbEnv) caughtUp(ctx context.Context) {
	e.q.published()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := e.broker.WaitCaughtUp(ctx, e.group, 20*time.Millisecond, e.topic); err != nil {
		e.b.Fatal(err)
	}
}

// seed changes every post once and records its versions: the base the
// staleness oracle counts bumps from.
func (e *rbEnv) seed(ctx context.Context) {
	conn, err := e.rep.Primary.Conn(ctx)
	if err != nil {
		e.b.Fatal(err)
	}
	defer conn.Close()
	e.baseV = map[int]int{}
	for id := 1; id <= e.posts; id++ {
		e.baseV[id], _ = e.change(ctx, conn, "posts", id)
	}
	e.caughtUp(ctx)
	e.rep.CatchUp(e.b)
	e.base = map[string]map[int]uint64{}
	for _, mode := range replicaBenchModes {
		e.base[mode] = map[int]uint64{}
		for id := 1; id <= e.posts; id++ {
			e.base[mode][id] = e.version(mode, id)
		}
	}
}

func (e *rbEnv) version(mode string, id int) uint64 {
	key, err := e.clients["plain"].Key(mode, client.Row{"id": id})
	if err != nil {
		e.b.Fatal(err)
	}
	it, err := e.mc.Get(key)
	if err != nil {
		e.b.Fatalf("namespace %s: %v", key, err)
	}
	v, ok := itemformat.ParseVersion(it.Value)
	if !ok {
		e.b.Fatalf("namespace %s = %q", key, it.Value)
	}
	return v
}

// rbStats is what one mode's readers saw in one phase.
type rbStats struct {
	mu          sync.Mutex
	reads       int
	fills       int
	staleFills  []string // keys of values computed older than their version
	staleReads  int
	staleAges   map[string]time.Duration // "post:v" of the change missing -> longest read after its commit
	fillLatency []time.Duration
}

// phase measures every mode for *replicaPhase with the replica's SQL
// thread stopped for lag in every lag+1s (lag 0: never).
func (e *rbEnv) phase(ctx context.Context, lag time.Duration) {
	stats := map[string]*rbStats{}
	primaryBefore := e.clients["fenced"].ReplicaStats()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	// Keys are per phase, so each phase fills its own values.
	phaseTag := testsvc.Unique()
	for _, mode := range replicaBenchModes {
		st := &rbStats{staleAges: map[string]time.Duration{}}
		stats[mode] = st
		c := e.clients[mode]
		for range *replicaReaders {
			wg.Go(func() { e.reader(ctx, c, mode, phaseTag, st, stop) })
		}
	}
	// The writer: one connection, so events leave in commit order.
	wg.Go(func() {
		conn, err := e.rep.Primary.Conn(ctx)
		if err != nil {
			e.b.Error(err)
			return
		}
		defer conn.Close()
		tick := time.NewTicker(time.Second / time.Duration(*replicaRate))
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			id := 1 + rand.IntN(e.posts)
			v, at := e.change(ctx, conn, "posts", id)
			e.commits.Store(strconv.Itoa(id)+":"+strconv.Itoa(v), at)
		}
	})
	// The lag: the SQL thread stopped for lag, then running for 1s.
	if lag > 0 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Second):
				}
				e.rep.StopSQL(e.b)
				select {
				case <-stop:
				case <-time.After(lag):
				}
				e.rep.StartSQL(e.b)
			}
		})
	}
	time.Sleep(*replicaPhase)
	close(stop)
	wg.Wait()
	e.rep.StartSQL(e.b)
	e.caughtUp(ctx)
	e.rep.CatchUp(e.b)
	primaryAfter := e.clients["fenced"].ReplicaStats()

	for _, mode := range replicaBenchModes {
		st := stats[mode]
		stored := 0
		for _, key := range st.staleFills {
			if _, err := e.mc.Get(key); err == nil {
				stored++
			}
		}
		var ages []time.Duration
		for _, a := range st.staleAges {
			ages = append(ages, a)
		}
		slices.Sort(ages)
		slices.Sort(st.fillLatency)
		staleFor := "—"
		if len(ages) > 0 {
			staleFor = fmt.Sprintf("%s / %s / %s", fmtDur(Percentile(ages, 0.5)), fmtDur(Percentile(ages, 0.99)), fmtDur(ages[len(ages)-1]))
		}
		primary := "0"
		if mode == "fenced" {
			primary = strconv.FormatUint(primaryAfter.PrimaryReads-primaryBefore.PrimaryReads, 10)
		}
		allStored := e.countStored(mode, phaseTag)
		fmt.Printf("| %v | %s | %d | %.2f %% | %d | %d / %d | %d | %s | %s | %s / %s |\n",
			lag, mode, st.reads, 100*float64(st.reads-st.fills)/float64(max(st.reads, 1)), st.fills, stored, allStored,
			st.staleReads, staleFor, primary, fmtDur(Percentile(st.fillLatency, 0.5)), fmtDur(Percentile(st.fillLatency, 0.99)))
	}
}

// countStored counts the values of mode's readers in memcached for this
// phase: every key a reader could have filled.
func (e *rbEnv) countStored(mode, tag string) int {
	n := 0
	for id := 1; id <= e.posts; id++ {
		last := e.version(mode, id)
		var keys []string
		for ver := e.base[mode][id]; ver <= last; ver++ {
			keys = append(keys, fmt.Sprintf("rb:val:%s:%s:%d:%d", tag, mode, id, ver))
		}
		for len(keys) > 0 {
			chunk := keys[:min(len(keys), 500)]
			keys = keys[len(chunk):]
			items, err := e.mc.GetMulti(chunk)
			if err != nil {
				e.b.Fatal(err)
			}
			n += len(items)
		}
	}
	return n
}

// reader reads random posts, one read every 20ms, until stop: the plain
// namespace first (the staleness oracle), then its mode's (plain readers
// read theirs again, so that every mode makes the same round trips, and
// use the first read), then the value.
func (e *rbEnv) reader(ctx context.Context, c *client.Client, mode, tag string, st *rbStats, stop <-chan struct{}) {
	plain := e.clients["plain"]
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		id := 1 + rand.IntN(e.posts)
		row := client.Row{"id": id}
		oracle, err := plain.Namespace(ctx, "plain", row)
		if err != nil {
			e.b.Error(err)
			return
		}
		// Every mode reads its own namespace after the oracle's, plain
		// too (the same item again): the same round trips for all.
		ns, err := c.Namespace(ctx, mode, row)
		if err != nil {
			e.b.Error(err)
			return
		}
		if mode == "plain" {
			ns = oracle // the version the oracle counted
		}
		o, _ := strconv.ParseUint(oracle, 10, 64)
		// At least this many changes of the post had been applied when
		// the oracle was read: one bump per change, fewer when a batch
		// held several changes of the post (a lower bound, never more).
		want := e.baseV[id] + int(o-e.base["plain"][id])
		key := fmt.Sprintf("rb:val:%s:%s:%d:%s", tag, mode, id, ns)
		start := time.Now()
		var filled time.Duration
		var computed bool
		query := func(ctx context.Context, q interface {
			QueryRowContext(context.Context, string, ...any) *sql.Row
		}) ([]byte, error) {
			filled, computed = time.Since(start), true
			var v []byte
			err := q.QueryRowContext(ctx, "SELECT v FROM posts WHERE id = ?", id).Scan(&v)
			return v, err
		}
		var val []byte
		if mode == "fenced" {
			val, err = c.GetOrComputeFrom(ctx, key, time.Minute, func(ctx context.Context, db *sql.Conn) ([]byte, error) { return query(ctx, db) })
		} else {
			val, err = c.GetOrCompute(ctx, key, time.Minute, func(ctx context.Context) ([]byte, error) { return query(ctx, e.rep.Replica) })
		}
		if err != nil {
			continue // still being computed elsewhere after the wait: no value served
		}
		now := time.Now()
		got, _ := strconv.Atoi(string(val))
		st.mu.Lock()
		st.reads++
		if computed {
			st.fills++
			st.fillLatency = append(st.fillLatency, filled)
			if got < want {
				st.staleFills = append(st.staleFills, key)
			}
		}
		if got < want {
			st.staleReads++
			missing := strconv.Itoa(id) + ":" + strconv.Itoa(got+1)
			if at, ok := e.commits.Load(missing); ok {
				st.staleAges[missing] = max(st.staleAges[missing], now.Sub(at.(time.Time)))
			}
		}
		st.mu.Unlock()
	}
}

// e2eRowsPerTx is -replica.e2e.rows, at least 1.
func e2eRowsPerTx() int { return max(1, *replicaE2ERows) }
