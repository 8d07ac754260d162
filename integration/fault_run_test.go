package integration

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/decode"

	"github.com/go-sql-driver/mysql"
	"github.com/segmentio/kafka-go"

	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/verify"
)

// faultSizes are the sizes of the fault scenarios: the CI size that `make
// test` runs, or the soak size (CACHEWARDEN_SOAK=1, `make soak`).
type faultSizes struct {
	Soak bool
	// KillEvents is the length of the SIGKILL scenario in row-change
	// events, Kills the SIGKILLs in it.
	KillEvents, Kills int
	// Events is the length of the other single-daemon scenarios;
	// GroupEvents that of the three-daemon one.
	Events, GroupEvents int
	// Outage is how long memcached is frozen and MariaDB unreachable;
	// MemcachedDown how long memcached stays down before its empty
	// restart.
	Outage, MemcachedDown time.Duration
	// RoundTxs is the number of transactions per workload round.
	RoundTxs int
	// ExpireSessions removes a killed daemon's group member at once (what
	// the broker does when its session times out) instead of waiting for
	// the session timeout, 30 s by default.
	ExpireSessions bool
}

func (z faultSizes) String() string {
	return fmt.Sprintf("kill run %d events / %d SIGKILLs, other runs %d events (group %d), outages %v, memcached down %v, %d transactions per round",
		z.KillEvents, z.Kills, z.Events, z.GroupEvents, z.Outage, z.MemcachedDown, z.RoundTxs)
}

// faultSizesFromEnv returns the soak sizes when CACHEWARDEN_SOAK=1, the CI
// sizes otherwise.
func faultSizesFromEnv() faultSizes {
	if os.Getenv("CACHEWARDEN_SOAK") == "1" {
		return faultSizes{Soak: true, KillEvents: 200_000, Kills: 10, Events: 40_000, GroupEvents: 60_000,
			Outage: 30 * time.Second, MemcachedDown: 10 * time.Second, RoundTxs: 500}
	}
	return faultSizes{KillEvents: 20_000, Kills: 5, Events: 4_000, GroupEvents: 8_000,
		Outage: 5 * time.Second, MemcachedDown: 2 * time.Second, RoundTxs: 400, ExpireSessions: true}
}

// faultOptions shape a fault scenario.
type faultOptions struct {
	// Name is the scenario's name in the reliability table.
	Name       string
	Partitions int
	// DLQ gives the daemons a dead-letter topic.
	DLQ bool
	// Proxy puts a faultProxy between the daemons and MariaDB.
	Proxy bool
	// Posts sizes the workload's posts (comment counters); default 300.
	Posts int
	// BinlogOff runs on the MariaDB without a binary log: events carry
	// made-up positions and recounts cannot be fenced, as before fences.
	BinlogOff bool
	// Seed fixes the workload's random choices; 0 picks one.
	Seed uint64
	// DriftExpected measures counter drift instead of failing on it
	// (counters only; every other check still applies).
	DriftExpected bool
	// Rules is the rules directory; default testdata/rules.
	Rules string
	// WarmShare is the share of sets and counters warmed at the start;
	// default 0.5.
	WarmShare float64
	// Binlog runs the daemons with source: binlog, reading the
	// binary-log MariaDB directly (no broker; Partitions, DLQ and Proxy
	// do not apply), with a lease of Lease (zero: the default).
	Binlog bool
	Lease  time.Duration
}

// faultScenario is a Scenario on the fault suite's own memcached and the
// binary-log MariaDB (so events carry real binlog positions), with daemons
// run as `cachewarden run` processes, and the bookkeeping of what it
// injected and found.
type faultScenario struct {
	*Scenario
	t     *testing.T
	opts  faultOptions
	sizes faultSizes
	mc    *memcachedProc
	proxy *faultProxy
	bin   string
	dir   string
	rng   *rand.Rand
	// daemonDSN is the daemons' MySQL DSN (through the proxy, if any).
	daemonDSN string
	dlq       string
	started   int
	// verifyConfig is the config file `cachewarden verify` reads.
	verifyConfig string

	// Results.
	events     int
	faults     []string
	notes      []string
	nsMoved    int
	nsLost     int
	nsProblems []string
	// emptied says memcached lost its items during the current round, so
	// a namespace may be missing rather than moved.
	emptied bool
	// With source binlog the daemons apply a round while it is being
	// made, so the namespaces are read before it (preRead): every one
	// warmed or bumped so far (nsKnown).
	nsKnown map[string]bool
	preRead map[string]uint64
}

// newFaultScenario sets a scenario up: its memcached, a fresh database on
// the binary-log MariaDB, a broker (in-process unless CACHEWARDEN_TEST_KAFKA
// names one), the tables and the initial rows, published as a snapshot.
func newFaultScenario(t *testing.T, opts faultOptions) *faultScenario {
	t.Helper()
	bin := cachewardenBinary(t)
	mc := startMemcached(t)
	var dsn string
	if opts.BinlogOff {
		_, dsn = testsvc.MySQL(t)
	} else {
		_, dsn = testsvc.MySQLBinlog(t)
	}
	if opts.Rules == "" {
		opts.Rules = testRules
	}
	rulesDir, err := filepath.Abs(opts.Rules)
	if err != nil {
		t.Fatal(err)
	}
	if opts.Partitions == 0 {
		opts.Partitions = 2
	}
	if opts.Posts == 0 {
		opts.Posts = 300
	}
	u := testsvc.Unique()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := NewScenario(ctx, Services{Memcached: mc.addr, MySQLDSN: dsn, Brokers: testsvc.Kafka()}, ScenarioOptions{
		TopicPrefix: "cwf" + u,
		Group:       "cachewarden-fault-" + u,
		Partitions:  opts.Partitions,
		Rules:       []string{rulesDir},
		Snapshot:    true,
		Workload:    WorkloadOptions{Seed: opts.Seed, KeyMoves: true, Users: 200, Posts: opts.Posts, Products: 200},
		WarmShare:   opts.WarmShare,
		Source:      sourceOf(opts),
		BinlogLease: opts.Lease,
		Log:         testLog(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	fs := &faultScenario{
		Scenario: s, t: t, opts: opts, sizes: faultSizesFromEnv(), mc: mc, bin: bin, dir: t.TempDir(),
		rng:       rand.New(rand.NewPCG(s.Workload.Seed(), 7)),
		daemonDSN: dsn,
	}
	if opts.DLQ {
		fs.dlq = s.Opts.TopicPrefix + ".dlq"
	}
	if opts.Proxy {
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatal(err)
		}
		fs.proxy = startProxy(t, cfg.Addr)
		cfg.Addr = fs.proxy.Addr()
		fs.daemonDSN = cfg.FormatDSN()
	}
	if !s.Workload.BinlogPositions() && !opts.BinlogOff {
		t.Fatal("the binary-log MariaDB has log_bin off")
	}
	t.Logf("fault scenario %q: workload seed %d, id base %d, memcached %s, %v", opts.Name, s.Workload.Seed(), s.Workload.IDBase(), mc.addr, fs.sizes)
	return fs
}

// sourceOf is the scenario's source for opts.
func sourceOf(opts faultOptions) config.SourceKind {
	if opts.Binlog {
		return config.SourceBinlog
	}
	return config.SourceKafka
}

// startDaemon starts a `cachewarden run` process with a Kafka client ID of
// its own (with source binlog, a replica server id of its own); it is
// killed when the test ends if still running.
func (fs *faultScenario) startDaemon() *faultDaemon {
	fs.t.Helper()
	fs.started++
	cf := fs.ConfigFile(fs.dlq)
	cf.MySQL.DSN = fs.daemonDSN
	cf.Log.Level = "info"
	id := fmt.Sprintf("cwfault-%d", fs.started)
	path := filepath.Join(fs.dir, id+".yaml")
	extra := map[string]any{"kafka.client_id": id}
	if fs.Binlog != nil {
		extra = map[string]any{"binlog.server_id": int(fs.Binlog.ServerID) + fs.started}
	}
	writeFaultConfig(fs.t, path, cf, extra)
	if fs.verifyConfig == "" {
		fs.verifyConfig = path
	}
	d := &faultDaemon{daemonProcess: startProcess(fs.t, fs.bin, path), ClientID: id, Config: path}
	fs.t.Cleanup(func() {
		if fs.t.Failed() {
			fs.t.Logf("daemon %s stderr (last lines):\n%s", id, lastLines(d.stderr.String(), 60))
		}
	})
	return d
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// restart replaces a daemon killed with SIGKILL: its group member is
// expired at once when the sizes say so (else the broker drops it when its
// session times out), and a new process starts.
func (fs *faultScenario) restart(ctx context.Context, dead *faultDaemon) *faultDaemon {
	fs.t.Helper()
	if fs.sizes.ExpireSessions && fs.Broker != nil {
		if _, err := expireMembers(ctx, fs.Broker, fs.Opts.Group, dead.ClientID); err != nil {
			fs.t.Fatal(err)
		}
	}
	return fs.startDaemon()
}

// fault records a fault injected, for the report.
func (fs *faultScenario) fault(format string, args ...any) {
	fs.t.Helper()
	msg := fmt.Sprintf(format, args...)
	fs.faults = append(fs.faults, msg)
	fs.t.Logf("fault: %s", msg)
}

// note records a detail for the report's notes under the table.
func (fs *faultScenario) note(format string, args ...any) {
	fs.t.Helper()
	msg := fmt.Sprintf(format, args...)
	fs.notes = append(fs.notes, msg)
	fs.t.Logf("note: %s", msg)
}

// settle waits until the daemons have caught up with everything
// published.
func (fs *faultScenario) settle(ctx context.Context, what string) {
	fs.t.Helper()
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute+2*fs.sizes.Outage)
	defer cancel()
	if err := fs.WaitCaughtUp(wctx); err != nil {
		fs.t.Fatalf("%s: %v", what, err)
	}
}

// start waits for the daemons to apply the snapshot, then warms the cache
// as an application would.
func (fs *faultScenario) start(ctx context.Context) {
	fs.t.Helper()
	fs.settle(ctx, "snapshot")
	if err := fs.Warm(ctx); err != nil {
		fs.t.Fatal(err)
	}
	if fs.Binlog != nil {
		fs.nsKnown = map[string]bool{}
		for k := range fs.Warmed.Namespaces {
			fs.nsKnown[k] = true
		}
	}
	fs.t.Logf("warmed %d namespaces, %d sets, %d counters", len(fs.Warmed.Namespaces), len(fs.Warmed.Sets), len(fs.Warmed.Counters))
}

// rewarm reads sets and counters into the cache again (after memcached
// lost them). The daemons must have caught up: a recount ahead of the
// stream would count in-flight changes twice.
func (fs *faultScenario) rewarm(ctx context.Context) {
	fs.t.Helper()
	w, err := Warm(ctx, fs.Rules, fs.Client, fs.MySQL, fs.Snapshot, max(fs.Opts.WarmShare, 0.5), fs.rng)
	if err != nil {
		fs.t.Fatal(err)
	}
	fs.t.Logf("re-warmed %d sets, %d counters", len(w.Sets), len(w.Counters))
}

// countEvents returns the row-change events a round's messages carry.
func (fs *faultScenario) countEvents(txs []Tx) int {
	n := 0
	for _, tx := range txs {
		n += len(fs.Opts.Format.Events(tx.Changes))
	}
	return n
}

// roundHooks inject faults into a round: before runs after the
// namespaces were read and before the round (txs) is published, mid (when
// set) between publishing the round's first part, of random length, and
// the rest, and during after it was published and before the daemons are
// waited for.
type roundHooks struct {
	before, mid, during func(txs []Tx)
	// split, when set, chooses how many of the round's n transactions
	// are published before mid; default a random number up to 9n/10.
	split func(n int) int
}

// round makes up to n transactions in MariaDB, publishes them in commit
// order and waits for the daemons; then every namespace the round's
// roundsUntil runs plain rounds (the scenario's RoundTxs transactions, no
// fault) until at least events change events have been published.
func (fs *faultScenario) roundsUntil(ctx context.Context, events int) {
	for fs.events < events {
		fs.round(ctx, fs.sizes.RoundTxs, roundHooks{})
	}
}

// changes bump must have moved (checkNamespaces). It returns the round.
func (fs *faultScenario) round(ctx context.Context, n int, h roundHooks) []Tx {
	fs.t.Helper()
	if fs.Binlog != nil {
		fs.preRead = fs.readNamespaces(sortedKeys(fs.nsKnown))
	}
	txs, err := fs.Change(ctx, n)
	if err != nil {
		fs.t.Fatal(err)
	}
	fs.publishRound(ctx, txs, h)
	return txs
}

// publishRound publishes transactions already made in MariaDB, waits for
// the daemons and checks the namespaces (see round).
func (fs *faultScenario) publishRound(ctx context.Context, txs []Tx, h roundHooks) {
	fs.t.Helper()
	bumped, err := ExpectedBumps(fs.Rules, fs.Opts.Format, txs)
	if err != nil {
		fs.t.Fatal(err)
	}
	pre := fs.preRead
	if pre == nil {
		pre = fs.readNamespaces(sortedKeys(bumped))
	}
	fs.preRead = nil
	if h.before != nil {
		h.before(txs)
	}
	split := len(txs)
	switch {
	case h.mid != nil && h.split != nil:
		split = min(max(h.split(len(txs)), 0), len(txs))
	case h.mid != nil:
		// At least a tenth of the round is published after mid.
		split = fs.rng.IntN(max(1, len(txs)*9/10))
	}
	if _, err := fs.PublishTxs(ctx, txs[:split]); err != nil {
		fs.t.Fatal(err)
	}
	if h.mid != nil {
		h.mid(txs)
		if _, err := fs.PublishTxs(ctx, txs[split:]); err != nil {
			fs.t.Fatal(err)
		}
	}
	fs.events += fs.countEvents(txs)
	if h.during != nil {
		h.during(txs)
	}
	fs.settle(ctx, "round")
	fs.checkNamespaces(pre, bumped)
	fs.emptied = false
	if fs.nsKnown != nil {
		for k := range bumped {
			fs.nsKnown[k] = true
		}
	}
}

// readNamespaces returns the versions of the keys that exist.
func (fs *faultScenario) readNamespaces(keys []string) map[string]uint64 {
	fs.t.Helper()
	out := make(map[string]uint64, len(keys))
	for len(keys) > 0 {
		n := min(100, len(keys))
		items, err := fs.MC.GetMulti(keys[:n])
		if err != nil {
			// A connection to a memcached restarted since breaks once.
			items, err = fs.MC.GetMulti(keys[:n])
		}
		if err != nil {
			fs.t.Fatalf("read namespaces: %v", err)
		}
		for k, it := range items {
			v, err := strconv.ParseUint(string(trimSpaces(it.Value)), 10, 64)
			if err != nil {
				fs.nsProblems = append(fs.nsProblems, fmt.Sprintf("%s holds %q, not a version", k, it.Value))
				continue
			}
			out[k] = v
		}
		keys = keys[n:]
	}
	return out
}

// checkNamespaces checks that every namespace in bumped moved from its
// version in pre: it exists and, if it existed before, holds another
// version. A namespace that memcached lost during the round (emptied) may
// be missing: every key built with it is gone too.
func (fs *faultScenario) checkNamespaces(pre map[string]uint64, bumped map[string]bool) {
	fs.t.Helper()
	post := fs.readNamespaces(sortedKeys(bumped))
	for k := range bumped {
		after, present := post[k]
		before, had := pre[k]
		switch {
		case present && (!had || after != before):
			fs.nsMoved++
		case !present && fs.emptied:
			fs.nsMoved++
		default:
			fs.nsLost++
			if len(fs.nsProblems) < 20 {
				fs.nsProblems = append(fs.nsProblems, fmt.Sprintf("%s not bumped (before %d/%v, after %d/%v)", k, before, had, after, present))
			}
		}
	}
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// committed returns the group's committed offsets.
func (fs *faultScenario) committed(ctx context.Context) map[string]map[int]int64 {
	fs.t.Helper()
	c, err := fs.Broker.CommittedOffsets(ctx, fs.Opts.Group, fs.Topics...)
	if err != nil {
		fs.t.Fatal(err)
	}
	return c
}

// committedWithOps lists the messages committed between two readings of
// the offsets whose row changes plan cache ops: committing them means ops
// were skipped or applied. Messages that plan nothing (an edit of a column
// no rule watches) may be committed whatever memcached's state.
func (fs *faultScenario) committedWithOps(ctx context.Context, from, to map[string]map[int]int64) []string {
	fs.t.Helper()
	var out []string
	dec := decode.Decoder{}
	var decoded decode.Decoded
	var ops []rules.Op
	for topic, parts := range to {
		for p, end := range parts {
			start := max(from[topic][p], 0)
			if end <= start {
				continue
			}
			msgs, err := readRange(ctx, fs.Broker, topic, p, start, end)
			if err != nil {
				fs.t.Fatal(err)
			}
			for _, m := range msgs {
				if err := dec.Decode(m.Value, rules.Position{Topic: topic}, &decoded); err != nil {
					continue
				}
				n := 0
				for i := range decoded.Events {
					ops, _, _ = fs.Rules.Plan(ops[:0], &decoded.Events[i])
					n += len(ops)
				}
				if n > 0 {
					out = append(out, fmt.Sprintf("%s/%d@%d (%d ops)", topic, p, m.Offset, n))
				}
			}
		}
	}
	return out
}

// readRange reads the messages [from, to) of one partition; maxBytes is
// large enough for the suite's biggest message.
func readRange(ctx context.Context, b *Broker, topic string, partition int, from, to int64) ([]Message, error) {
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: b.Addrs(), Topic: topic, Partition: partition,
		MaxBytes: 64 << 20, MaxWait: 100 * time.Millisecond,
	})
	defer r.Close()
	if err := r.SetOffset(from); err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	var out []Message
	for off := from; off < to; {
		m, err := r.ReadMessage(rctx)
		if err != nil {
			return out, fmt.Errorf("read %s/%d@%d: %w", topic, partition, off, err)
		}
		msg := Message{Partition: partition, Offset: m.Offset, Key: m.Key, Value: m.Value, Headers: map[string]string{}}
		for _, h := range m.Headers {
			msg.Headers[h.Key] = string(h.Value)
		}
		out = append(out, msg)
		off = m.Offset + 1
	}
	return out, nil
}

// pollReady polls a daemon's /readyz every 100ms for d and reports
// whether it answered 503 (not ready) and 200 (ready) at least once each.
func pollReady(d *faultDaemon, addr string, dur time.Duration) (sawNotReady, sawReady bool) {
	deadline := time.Now().Add(dur)
	for time.Now().Before(deadline) {
		status, _, err := d.httpGet(addr, "/readyz")
		switch {
		case err == nil && status == 503:
			sawNotReady = true
		case err == nil && status == 200:
			sawReady = true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return sawNotReady, sawReady
}

// waitReady polls /readyz until it answers 200, for up to dur, and
// reports whether it answered 503 before.
func waitReady(t *testing.T, d *faultDaemon, addr string, dur time.Duration) (took time.Duration, sawNotReady bool) {
	t.Helper()
	start := time.Now()
	for {
		status, _, err := d.httpGet(addr, "/readyz")
		if err == nil && status == 200 {
			return time.Since(start), sawNotReady
		}
		sawNotReady = sawNotReady || (err == nil && status == 503)
		if time.Since(start) > dur {
			t.Fatalf("daemon %s not ready %v after the fault ended; stderr:\n%s", d.ClientID, dur, d.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// holdDown checks, while a fault keeps memcached away, that the group
// commits nothing that needs memcached. Publishing continues meanwhile
// (the caller published a round). The fault lasts at least dur, and then
// until /readyz has answered 503 (the health check runs every 2s, and on
// a loaded machine a check or an answer may come late) or
// holdDownDeadline has passed: a fixed window could end before the daemon
// was seen not ready. It returns the messages waiting when the fault
// ended and whether /readyz answered 503 (the caller goes on looking
// after the fault, with waitReady).
func (fs *faultScenario) holdDown(ctx context.Context, d *faultDaemon, addr string, dur time.Duration) (waiting int64, sawNotReady bool) {
	fs.t.Helper()
	start := time.Now()
	notReady, _ := pollReady(d, addr, min(time.Second, dur/4))
	// A batch applied just before the fault may have committed by now.
	c1 := fs.committed(ctx)
	notReadyLater, _ := pollReady(d, addr, dur-time.Since(start))
	if !notReady && !notReadyLater {
		notReadyLater = pollNotReady(d, addr, max(holdDownDeadline, dur)-time.Since(start))
	}
	c2 := fs.committed(ctx)
	if bad := fs.committedWithOps(ctx, c1, c2); len(bad) > 0 {
		fs.t.Errorf("offsets were committed past %d messages with cache ops while memcached was away: %v", len(bad), bad)
	}
	lag, err := fs.Broker.GroupLag(ctx, fs.Opts.Group, fs.Topics...)
	if err != nil {
		fs.t.Fatal(err)
	}
	if lag.Total == 0 {
		fs.t.Errorf("nothing was waiting while memcached was away: the fault proved nothing")
	}
	return lag.Total, notReady || notReadyLater
}

// holdDownDeadline bounds how long holdDown keeps a fault on while waiting
// for /readyz to answer 503: 30 health check periods.
const holdDownDeadline = time.Minute

// pollNotReady polls /readyz until it answers 503, for up to dur, and
// reports whether it did.
func pollNotReady(d *faultDaemon, addr string, dur time.Duration) bool {
	deadline := time.Now().Add(dur)
	for time.Now().Before(deadline) {
		if status, _, err := d.httpGet(addr, "/readyz"); err == nil && status == 503 {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}

// finish quiesces the scenario and checks it: every offset committed,
// every namespace a change concerned moved, every present set and counter
// equal to MariaDB (package verify, then `cachewarden verify` as an
// operator runs it), no daemon crashed. It records the scenario's row of
// the reliability report.
func (fs *faultScenario) finish(ctx context.Context, daemons ...*faultDaemon) *reliabilityRow {
	fs.t.Helper()
	fs.settle(ctx, "quiesce")
	time.Sleep(400 * time.Millisecond) // delayed second bumps (rebump_after 300ms)
	for _, d := range daemons {
		if d.exited() {
			fs.t.Errorf("daemon %s exited on its own; stderr:\n%s", d.ClientID, d.stderr)
		}
	}
	var lag Lag // with source binlog, settled means the checkpoint covers every transaction
	if fs.Broker != nil {
		var err error
		if lag, err = fs.Broker.GroupLag(ctx, fs.Opts.Group, fs.Topics...); err != nil {
			fs.t.Fatal(err)
		}
	}
	rep := fs.verifyNow(ctx)
	var buf bytes.Buffer
	rep.WriteText(&buf)
	fs.t.Logf("verify:\n%s", buf.String())
	wrongCounters := 0
	for _, r := range rep.Rules {
		if r.Kind == rules.CountRule {
			wrongCounters += r.Wrong
		}
	}
	row := &reliabilityRow{
		Scenario: fs.opts.Name, Events: fs.events, Faults: strings.Join(fs.faults, "; "),
		Lost: fs.nsLost + int(lag.Total), Wrong: rep.Wrong + countNotVersion(fs.nsProblems),
		NamespacesMoved: fs.nsMoved, Checked: rep.Checked, Consistent: rep.Consistent, Missing: rep.Missing,
		WrongCounters: wrongCounters, Notes: fs.notes,
	}
	row.DriftAfter = strconv.Itoa(wrongCounters)
	out, err := exec.CommandContext(ctx, fs.bin, "verify", "-c", fs.verifyConfig, "--recheck", "0").CombinedOutput()
	row.VerifyCLI = verifySummary(string(out))
	if (err != nil || !strings.Contains(string(out), "consistency 100.000% (all)")) && !fs.opts.DriftExpected {
		fs.t.Errorf("cachewarden verify: %v\n%s", err, out)
	}
	fs.t.Logf("events %d, namespaces moved %d, lost %d (namespaces %d, uncommitted %d), wrong %d; cachewarden verify: %s",
		row.Events, row.NamespacesMoved, row.Lost, fs.nsLost, lag.Total, row.Wrong, row.VerifyCLI)
	for _, p := range fs.nsProblems {
		fs.t.Errorf("namespace: %s", p)
	}
	if lag.Total != 0 {
		fs.t.Errorf("%d messages never committed: %v", lag.Total, lag.Behind)
	}
	if fs.opts.DriftExpected {
		if rep.Wrong > wrongCounters {
			fs.t.Errorf("%d sets are wrong after quiesce (seed %d)", rep.Wrong-wrongCounters, fs.Workload.Seed())
		}
	} else if !rep.OK() {
		fs.t.Errorf("cache disagrees with MariaDB after quiesce (seed %d): %d wrong; first: %+v", fs.Workload.Seed(), rep.Wrong, rep.Mismatches[:min(5, len(rep.Mismatches))])
	}
	if rep.Consistent == 0 {
		fs.t.Errorf("no present set or counter was checked: the check proves nothing")
	}
	if fs.nsMoved == 0 {
		fs.t.Errorf("no namespace moved: the check proves nothing")
	}
	return row
}

// verifyNow compares every set and counter with MariaDB (package
// verify), reading MariaDB directly, not through a proxy.
func (fs *faultScenario) verifyNow(ctx context.Context) *verify.Report {
	fs.t.Helper()
	v := verify.New(fs.MC, fs.MySQL, fs.MySQL.DB(), fs.Opts.Log)
	rep, err := v.Verify(ctx, fs.Rules.Rules(), verify.Options{Concurrency: 4})
	if err != nil {
		fs.t.Fatal(err)
	}
	return rep
}

func countNotVersion(problems []string) int {
	n := 0
	for _, p := range problems {
		if strings.Contains(p, "not a version") {
			n++
		}
	}
	return n
}

// verifySummary returns the summary line of `cachewarden verify`.
func verifySummary(out string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "consistency") {
			return strings.TrimSpace(l)
		}
	}
	return strings.TrimSpace(out)
}
