package bench

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/client"
	"github.com/cachewarden/cachewarden/integration"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

// Flags of BenchmarkBinlogSource (docs/benchmarks.md, "The binary log
// source").
var (
	binlogDaemon  = flag.String("binlog.daemon", "", "cachewarden binary the benchmark runs; empty: build ../cmd/cachewarden")
	binlogE2E     = flag.String("binlog.e2e", "1000/20,10000/20,1000/1", "commit-to-namespace measurements, comma-separated rate/rows: offered changes/s and rows per transaction; empty: none")
	binlogCPU     = flag.Int("binlog.cpu", 100_000, "row changes of the CPU-per-event comparison; 0: none")
	binlogCPURate = flag.Int("binlog.cpu.rate", 10_000, "offered changes/s of the CPU-per-event comparison (20 rows per transaction)")
	binlogProfile = flag.String("binlog.profile", "", "directory for the daemons' CPU profiles (one per second, http.pprof; binlog-NNN.pprof, and kafka-NNN.pprof of the CPU comparison) and execution traces; empty: none")
)

// binlogBenchRules bump one namespace per sample row, and one for the
// caught-up marker. PREFIX tells the two daemons' keys apart.
const binlogBenchRules = `version: 1
prefix: "PREFIX"
rules:
  - {name: sample, table: DB.samples, bump: "ns:sample:{id}"}
  - {name: mark, table: DB.marks, bump: "ns:mark:{id}"}
`

// BenchmarkBinlogSource measures the daemon on the binary log source
// (`source: binlog`), run as users run it (`cachewarden run -c FILE`, a
// process of its own) against the MariaDB with the binary log
// (CACHEWARDEN_TEST_MYSQL_BINLOG_DSN), in a database of its own:
//
//   - commit to namespace moved, p50 and p99, with the writers and the
//     sampler of BenchmarkReplicaReaders' measurement (-binlog.e2e);
//   - the daemon's CPU time per row event, from /proc/PID/stat, against
//     a Kafka-source daemon's that gets the same changes as Debezium
//     events through an in-process broker, both running during the same
//     writes (-binlog.cpu).
//
// Run it with -benchtime 1x:
//
//	go test ./bench -run '^$' -bench BinlogSource -benchtime 1x
//
// The daemons, the broker, memcached and MariaDB share the machine.
func BenchmarkBinlogSource(b *testing.B) {
	for b.Loop() {
		runBinlogBench(b)
	}
}

// blEnv is the benchmark's database, memcached and daemons.
type blEnv struct {
	b        *testing.B
	db       *sql.DB
	dbName   string
	baseDSN  string // the server, no database
	dir      string
	bin      string
	mcAddr   string
	mc       *memcache.Client
	binlog   *consumerProc
	kafka    *consumerProc
	broker   *integration.Broker
	q        *eventQueue
	clients  map[string]*client.Client // prefix -> reader of its keys
	serverID uint32
}

func runBinlogBench(b *testing.B) {
	ctx := context.Background()
	e := &blEnv{b: b, dir: b.TempDir(), baseDSN: testsvc.MySQLBinlogDSN(b), clients: map[string]*client.Client{}}
	e.db, _ = testsvc.MySQLBinlog(b)
	if err := e.db.QueryRowContext(ctx, "SELECT DATABASE(), @@server_id").Scan(&e.dbName, &e.serverID); err != nil {
		b.Fatal(err)
	}
	for _, q := range []string{
		"CREATE TABLE samples (id INT PRIMARY KEY AUTO_INCREMENT, v INT NOT NULL)",
		"CREATE TABLE marks (id INT PRIMARY KEY, v INT NOT NULL)",
		"INSERT INTO marks VALUES (1, 0)",
	} {
		if _, err := e.db.ExecContext(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	e.bin = e.daemonBinary()
	e.mcAddr = testsvc.PrivateMemcached(b, testsvc.MemcachedOptions{MemoryMB: 256, Threads: 2, Args: []string{"-c", "4096"}}).Addr
	e.mc = memcache.New(e.mcAddr)
	e.mc.MaxIdleConns = 64

	// The binary log daemon reads from the server's current position:
	// everything above is before it.
	e.binlog = e.startDaemon(ctx, "binlog", "bl:", fmt.Sprintf("source: binlog\nbinlog:\n  dsn: %q\n  server_id: %d\n  name: cwbench_%s\n  checkpoint_database: %s\n",
		e.baseDSN, 100_000+int(e.serverID)+os.Getpid()%100_000, testsvc.Unique(), e.dbName), *binlogProfile != "")
	defer e.profile(ctx, e.binlog, "binlog")()
	fmt.Printf("\nBinary log source, commit to namespace moved: %d connections, one change in %d sampled; load average %s\n\n",
		e2eConns, e2eSampleEvery, LoadAverage())
	if *binlogE2E != "" {
		fmt.Println("| rows per transaction " + strings.Replace(e2eHeader, "|---", "|---|---", 1))
		src := e.source("bl:", nil, e.binlogCaughtUp)
		for _, m := range strings.Split(*binlogE2E, ",") {
			rate, rows, err := parseRateRows(m)
			if err != nil {
				b.Fatalf("-binlog.e2e: %v", err)
			}
			fmt.Printf("| %d %s\n", rows, src.endToEnd(ctx, rate, rows).row())
		}
	}
	if *binlogCPU > 0 {
		e.compareCPU(ctx)
	}
	for _, d := range []*consumerProc{e.binlog, e.kafka} {
		if d == nil {
			continue
		}
		if n, first := logProblems(d.logPath); n > 0 {
			fmt.Printf("%s: %d warnings or errors in its log, the first: %s\n", d.Name, n, first)
		}
	}
}

// profile takes CPU profiles of d into -binlog.profile, named
// group-NNN.pprof, until the returned stop is called; nothing without the
// flag.
func (e *blEnv) profile(ctx context.Context, d *consumerProc, group string) (stop func()) {
	if *binlogProfile == "" {
		return func() {}
	}
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan []string)
	go func() { done <- collectProfiles(pctx, d.metricsURL, *binlogProfile, group) }()
	return func() {
		cancel()
		fmt.Printf("\nprofiles of %s: %d files in %s\n", d.Name, len(<-done), *binlogProfile)
	}
}

// parseRateRows parses "rate/rows" of -binlog.e2e.
func parseRateRows(s string) (rate, rows int, err error) {
	r, n, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return 0, 0, fmt.Errorf("%q: want rate/rows, e.g. 1000/20", s)
	}
	if rate, err = strconv.Atoi(r); err != nil || rate <= 0 {
		return 0, 0, fmt.Errorf("%q: rate %q is not a positive number", s, r)
	}
	if rows, err = strconv.Atoi(n); err != nil || rows <= 0 {
		return 0, 0, fmt.Errorf("%q: rows %q is not a positive number", s, n)
	}
	return rate, rows, nil
}

// daemonBinary returns -binlog.daemon, or a cachewarden it builds.
func (e *blEnv) daemonBinary() string {
	if *binlogDaemon != "" {
		return *binlogDaemon
	}
	out := filepath.Join(e.dir, "cachewarden")
	cmd := exec.Command("go", "build", "-o", out, "../cmd/cachewarden")
	if msg, err := cmd.CombinedOutput(); err != nil {
		e.b.Fatalf("go build ../cmd/cachewarden: %v\n%s", err, msg)
	}
	return out
}

// startDaemon writes name's rule file (keys under prefix) and config
// (source, memcached, rules, http; defaults otherwise), runs `cachewarden
// run -c` on it, waits until it is ready and stops it when b ends.
func (e *blEnv) startDaemon(ctx context.Context, name, prefix, source string, pprof bool) *consumerProc {
	rulesText := e.rulesText(prefix)
	rulesPath := filepath.Join(e.dir, name+"-rules.yaml")
	if err := os.WriteFile(rulesPath, rulesText, 0o644); err != nil {
		e.b.Fatal(err)
	}
	rs, err := rulefile.Parse(rulesPath, rulesText)
	if err != nil {
		e.b.Fatal(err)
	}
	c, err := client.New(client.Config{Servers: []itemformat.Server{{Addr: e.mcAddr}}, Rules: rs}, slog.New(slog.DiscardHandler))
	if err != nil {
		e.b.Fatal(err)
	}
	e.b.Cleanup(func() { c.Close() })
	e.clients[prefix] = c
	port, err := freePort()
	if err != nil {
		e.b.Fatal(err)
	}
	httpAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	cfg := fmt.Sprintf("%smemcached:\n  servers: [%q]\nrules: [%q]\nhttp:\n  listen: %q\n  pprof: %t\nlog:\n  level: info\n",
		source, e.mcAddr, rulesPath, httpAddr, pprof)
	cfgPath := filepath.Join(e.dir, name+".yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		e.b.Fatal(err)
	}
	logPath := filepath.Join(e.dir, name+".log")
	log, err := os.Create(logPath)
	if err != nil {
		e.b.Fatal(err)
	}
	cmd := exec.Command(e.bin, "run", "-c", cfgPath)
	cmd.Stdout, cmd.Stderr = log, log
	p, err := startProcess("cachewarden "+name, cmd)
	log.Close()
	if err != nil {
		e.b.Fatal(err)
	}
	d := &consumerProc{Process: p, logPath: logPath, metricsURL: "http://" + httpAddr}
	e.b.Cleanup(func() {
		if err := d.Stop(10 * time.Second); err != nil {
			e.b.Errorf("%s: %v", d.Name, err)
		}
	})
	if err := d.waitReady(ctx, time.Minute); err != nil {
		logText, _ := os.ReadFile(logPath)
		e.b.Fatalf("%v\n%s", err, logText)
	}
	return d
}

// rulesText is the benchmark's rule file with keys under prefix.
func (e *blEnv) rulesText(prefix string) []byte {
	return []byte(strings.NewReplacer("PREFIX", prefix, "DB.", e.dbName+".").Replace(binlogBenchRules))
}

// key is the key of rule's namespace of row id, under prefix.
func (e *blEnv) key(prefix, rule string, id int) string {
	k, err := e.clients[prefix].Key(rule, client.Row{"id": id})
	if err != nil {
		e.b.Fatal(err)
	}
	return k
}

// source is the commit-to-namespace measurement of the daemon whose keys
// are under prefix.
func (e *blEnv) source(prefix string, committed func(context.Context, *sql.Conn, string, time.Time, ...rowChange), caughtUp func(context.Context)) *e2eSource {
	return &e2eSource{b: e.b, db: e.db, mc: e.mc, committed: committed, caughtUp: caughtUp,
		key: func(id int) string { return e.key(prefix, "sample", id) }}
}

// binlogCaughtUp changes the marker row and waits until the binary log
// daemon has bumped its namespace: it applies transactions in commit
// order, so every change committed before is applied.
func (e *blEnv) binlogCaughtUp(ctx context.Context) {
	key := e.key("bl:", "mark", 1)
	before := ""
	if it, err := e.mc.Get(key); err == nil {
		before = string(it.Value)
	}
	if _, err := e.db.ExecContext(ctx, "UPDATE marks SET v = v + 1 WHERE id = 1"); err != nil {
		e.b.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if it, err := e.mc.Get(key); err == nil && string(it.Value) != before {
			return
		}
		if e.binlog.Exited() {
			e.b.Fatalf("%s exited", e.binlog.Name)
		}
		if time.Now().After(deadline) {
			e.b.Fatalf("%s has not applied the marker change after 2 minutes", e.binlog.Name)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// kafkaCaughtUp waits until the Kafka-source daemon has committed every
// event queued.
func (e *blEnv) kafkaCaughtUp(ctx context.Context) {
	e.q.published()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := e.broker.WaitCaughtUp(ctx, "cwbench", 20*time.Millisecond, "changes"); err != nil {
		e.b.Fatal(err)
	}
}

// blDaemonMark is a daemon's CPU time and events so far.
type blDaemonMark struct {
	cpu       time.Duration
	planned   float64 // row events planned (matched a rule) and applied
	unmatched float64 // row events of other tables (the binary log holds the whole server's)
	batches   float64 // batches processed (binlog: a checkpoint saved after each that ends a transaction)
}

func (e *blEnv) mark(d *consumerProc) blDaemonMark {
	cpu, err := ProcCPU(d.Pid())
	if err != nil {
		e.b.Fatal(err)
	}
	counts, err := d.scrape()
	if err != nil {
		e.b.Fatal(err)
	}
	m := blDaemonMark{cpu: cpu, planned: counts.Events["planned"], unmatched: counts.Events["unmatched"]}
	if c := counts.BatchDuration.Counts; len(c) > 0 {
		m.batches = c[len(c)-1]
	}
	return m
}

// blCPUPerTx is the CPU comparison's rows per transaction.
const blCPUPerTx = 20

// compareCPU writes -binlog.cpu changes at -binlog.cpu.rate, blCPUPerTx
// rows per transaction, while both daemons run: the binary log daemon
// reads them from the server; a Kafka-source daemon gets their Debezium
// events through an in-process broker (its CPU time is the harness's).
// It prints each daemon's CPU time (utime + stime of its process, all
// threads) per row event applied, and their ratio.
func (e *blEnv) compareCPU(ctx context.Context) {
	log := slog.New(slog.DiscardHandler)
	var err error
	if e.broker, err = integration.StartBroker(ctx, log, integration.BrokerOptions{Topics: []string{"changes"}, Partitions: 4}); err != nil {
		e.b.Fatal(err)
	}
	e.b.Cleanup(e.broker.Close)
	pub, err := integration.NewPublisher(e.broker.Addrs(), integration.Debezium, nil, log)
	if err != nil {
		e.b.Fatal(err)
	}
	e.b.Cleanup(func() { pub.Close() })
	e.q = newEventQueue(e.b, pub, "changes", e.dbName, e.serverID)
	stop := e.q.start(ctx)
	defer stop()
	e.kafka = e.startDaemon(ctx, "kafka", "kf:", fmt.Sprintf("kafka:\n  brokers: [%q]\n  group: cwbench\n  topics: [changes]\n", e.broker.Addrs()[0]), *binlogProfile != "")
	defer e.profile(ctx, e.kafka, "kafka")()
	both := func(ctx context.Context) { e.binlogCaughtUp(ctx); e.kafkaCaughtUp(ctx) }
	src := e.source("kf:", e.q.queue, both)
	n := *binlogCPU
	rows := src.insertRows(ctx, n, blCPUPerTx)
	bl0, kf0 := e.mark(e.binlog), e.mark(e.kafka)
	queued0 := e.q.queued.Load()
	elapsed := src.write(ctx, rows, *binlogCPURate, n, func(int, time.Time) {})
	both(ctx)
	bl1, kf1 := e.mark(e.binlog), e.mark(e.kafka)
	if got := e.q.queued.Load() - queued0; got != int64(n) {
		e.b.Fatalf("%d events queued for %d changes", got, n)
	}
	fmt.Printf("\nCPU per row event: %d changes at %d/s offered (%.0f/s achieved), %d rows per transaction, both daemons running; load average %s\n\n",
		n, *binlogCPURate, float64(n)/elapsed.Seconds(), blCPUPerTx, LoadAverage())
	fmt.Println("| source | row events applied | other row events read | batches | daemon CPU | CPU per row event |")
	fmt.Println("|---|---|---|---|---|---|")
	per := map[string]float64{}
	for _, r := range []struct {
		name   string
		m0, m1 blDaemonMark
	}{{"binlog", bl0, bl1}, {"kafka", kf0, kf1}} {
		events := r.m1.planned - r.m0.planned
		if events < float64(n) {
			e.b.Fatalf("%s daemon applied %.0f row events of %d", r.name, events, n)
		}
		cpu := r.m1.cpu - r.m0.cpu
		per[r.name] = float64(cpu.Microseconds()) / events
		fmt.Printf("| %s | %.0f | %.0f | %.0f | %s | %.1f µs |\n", r.name, events, r.m1.unmatched-r.m0.unmatched, r.m1.batches-r.m0.batches,
			cpu.Round(10*time.Millisecond), per[r.name])
	}
	fmt.Printf("\nbinlog / kafka CPU per row event: %.2f\n", per["binlog"]/per["kafka"])
}
