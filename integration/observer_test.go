package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http/httptest"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/client"
	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/observer"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/source/kafka"
	"github.com/cachewarden/cachewarden/wiring"
)

// The consistency observer end to end: daemons with the observer at 100%
// sampling and one short window, a clean run, then each fault the
// observer exists to catch. A fault must be reported within the window,
// logged with the keys it hit.

// observerSection is the tests' observer section: every change sampled,
// checked once after window, budgets that never bind.
func observerSection(window time.Duration) map[string]any {
	return map[string]any{
		"enabled": true, "sample": 1, "max_per_second": 1e6, "windows": []string{window.String()},
		"mysql_queries_per_second": 1e6, "memcached_reads_per_second": 1e6,
		"clock_skew": "200ms", "report_every": "5s",
	}
}

// logBuffer keeps what a daemon logs, for the evidence of
// inconsistencies.
type logBuffer struct{ testsvc.LogBuffer }

// inconsistencyLine matches the observer's record of an inconsistency.
var (
	inconsistencyLine = regexp.MustCompile(`msg="cache inconsistent with an applied change".*`)
	keyAttr           = regexp.MustCompile(` key=("(?:[^"\\]|\\.)*"|\S+)`)
	ruleAttr          = regexp.MustCompile(` rule=("(?:[^"\\]|\\.)*"|\S+)`)
)

// inconsistencies returns the keys the observer logged as inconsistent,
// with their rule, and the log lines.
func (l *logBuffer) inconsistencies() (map[string]string, []string) {
	keys := map[string]string{}
	var lines []string
	for _, line := range inconsistencyLine.FindAllString(l.String(), -1) {
		lines = append(lines, line)
		k, r := keyAttr.FindStringSubmatch(line), ruleAttr.FindStringSubmatch(line)
		if k == nil || r == nil {
			continue
		}
		keys[unquoteAttr(k[1])] = unquoteAttr(r[1])
	}
	return keys, lines
}

func unquoteAttr(s string) string {
	if u, err := strconv.Unquote(s); err == nil {
		return u
	}
	return s
}

// observedLog returns a logger writing to the test log (warn and above)
// and to a buffer the test reads.
func observedLog(t *testing.T) (*slog.Logger, *logBuffer) {
	buf := &logBuffer{}
	return slog.New(slog.NewTextHandler(io.MultiWriter(buf, testWriter{t}), &slog.HandlerOptions{Level: slog.LevelWarn})), buf
}

// startObservedDaemon runs an in-process daemon with stack options until
// the test ends.
func startObservedDaemon(t *testing.T, cfg *config.Config, log *slog.Logger, opts wiring.StackOptions, adjust func(*kafka.Config)) *Daemon {
	t.Helper()
	d, err := StartDaemonWith(context.Background(), cfg, log, opts, func(c *kafka.Config) {
		FastGroupTiming(c)
		if adjust != nil {
			adjust(c)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Stop() })
	return d
}

// settleObserver waits until the observer has checked every change it
// sampled and returns its totals of the first window.
func settleObserver(t *testing.T, o *observer.Observer) observer.Counts {
	t.Helper()
	if o == nil {
		t.Fatal("the daemon runs no observer")
	}
	deadline := time.Now().Add(2 * time.Minute)
	// A change applied just now is sampled once its batch is done.
	time.Sleep(200 * time.Millisecond)
	for o.Pending() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d sampled changes still unchecked", o.Pending())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return o.Totals()[0]
}

// TestObserverClean: a clean run of a few thousand changes is judged 100%
// consistent, and /status says so.
func TestObserverClean(t *testing.T) {
	s := newScenario(t, ScenarioOptions{Snapshot: true, Workload: WorkloadOptions{KeyMoves: true}})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cf := s.ConfigFile("")
	cf.Observer = observerSection(time.Second)
	cfg, _ := loadConfig(t, cf)
	log, logs := observedLog(t)
	d := startObservedDaemon(t, cfg, log, wiring.StackOptions{}, nil)
	if err := s.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	changes := 0
	var c observer.Counts
	for range 4 {
		txs, err := s.Round(ctx, 700)
		if err != nil {
			t.Fatal(err)
		}
		for _, tx := range txs {
			changes += len(tx.Changes)
		}
		// The workload writes a whole round to the database before it
		// publishes it: an upstream lag of seconds, which the observer
		// would rightly see as sets and counters behind MySQL. The
		// checks of a round end before the next one starts.
		c = settleObserver(t, d.Stack.Observer)
	}
	t.Logf("%d row changes: %d items judged (%d consistent, %d missing, %d inconsistent), %d not judged; nines %s",
		changes, c.Judged(), c.Consistent, c.Missing, c.Inconsistent, c.NotJudged, c.NinesText())
	if changes < 2000 {
		t.Errorf("only %d row changes: the run is too small to mean anything", changes)
	}
	if c.Inconsistent != 0 {
		_, lines := logs.inconsistencies()
		t.Errorf("a clean run reported %d inconsistent items:\n%s", c.Inconsistent, strings.Join(lines, "\n"))
	}
	if c.Consistent < 500 {
		t.Errorf("only %d items judged consistent", c.Consistent)
	}
	rec := httptest.NewRecorder()
	d.Stack.HTTPHandler(d.Daemon.NotReady).ServeHTTP(rec, httptest.NewRequest("GET", "/status", nil))
	var status struct {
		Observer struct {
			Enabled bool
			Windows []struct {
				Window     string
				Total      observer.Counts
				TotalNines json.RawMessage `json:"total_nines"`
			}
		}
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &status); err != nil {
		t.Fatalf("/status: %v\n%s", err, rec.Body.String())
	}
	if w := status.Observer.Windows; !status.Observer.Enabled || len(w) != 1 || w[0].Window != "1s" || w[0].Total.Consistent < c.Consistent ||
		(c.Inconsistent == 0 && string(w[0].TotalNines) != `"+Inf"`) {
		t.Errorf("/status does not show the checks:\n%s", rec.Body.String())
	}
	check(t, ctx, s)
}

// TestObserverLostInvalidations: the bumps of one rule lost on their way
// to memcached (a fault hook in the apply path) are reported, naming the
// rule's keys and no other.
func TestObserverLostInvalidations(t *testing.T) {
	s := newScenario(t, ScenarioOptions{Snapshot: true})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cf := s.ConfigFile("")
	cf.Observer = observerSection(time.Second)
	cfg, _ := loadConfig(t, cf)
	log, logs := observedLog(t)
	var dropping atomic.Bool
	drop := func(op *rules.Op) bool {
		return dropping.Load() && op.Kind == rules.OpBump && op.Rule != nil && op.Rule.Name == "product"
	}
	d := startObservedDaemon(t, cfg, log, wiring.StackOptions{DropOps: drop}, nil)
	if err := s.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	dropping.Store(true)
	start := time.Now()
	txs, err := s.Round(ctx, 300)
	if err != nil {
		t.Fatal(err)
	}
	c := settleObserver(t, d.Stack.Observer)
	t.Logf("after %s: %+v", time.Since(start).Round(time.Millisecond), c)
	bumped, err := ExpectedBumps(s.Rules, s.Opts.Format, txs)
	if err != nil {
		t.Fatal(err)
	}
	keys, lines := logs.inconsistencies()
	if len(keys) == 0 {
		t.Fatalf("no lost bump reported (%+v)", c)
	}
	for k, rule := range keys {
		if rule != "product" || !bumped[k] {
			t.Errorf("reported %s (rule %s), which no lost bump of the round concerns", k, rule)
		}
	}
	t.Logf("%d namespaces reported, e.g.\n%s", len(keys), lines[0])
	for _, want := range []string{"server=" + s.Services.Memcached, "topic=" + s.Opts.TopicPrefix, "offset=", "binlog_file=", "expected=", "seen="} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("the evidence lacks %q: %s", want, lines[0])
		}
	}
}

// TestObserverOutsideWriters: a counter changed and a set member appended
// by a writer other than the daemon are reported, naming their keys.
func TestObserverOutsideWriters(t *testing.T) {
	s := newScenario(t, ScenarioOptions{Snapshot: true})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cf := s.ConfigFile("")
	cf.Observer = observerSection(time.Second)
	cfg, _ := loadConfig(t, cf)
	log, logs := observedLog(t)
	d := startObservedDaemon(t, cfg, log, wiring.StackOptions{}, nil)
	if err := s.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	s.Opts.WarmShare = 1
	if err := s.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	txs, err := s.Change(ctx, 300)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := PlanOps(s.Rules, s.Opts.Format, txs)
	if err != nil {
		t.Fatal(err)
	}
	// Before the changes are published: a few of the counters and sets
	// they touch are changed by someone else.
	counters, sets := map[string]bool{}, map[string]bool{}
	for _, op := range ops {
		switch {
		case (op.Kind == rules.OpCount || op.Kind == rules.OpRecount) && len(counters) < 5:
			// The counter lives under its table's generation
			// (docs/formats.md, "Generations").
			gen, err := Generation(s.MC, op.Rule.Generation)
			if err != nil {
				t.Fatal(err)
			}
			key := itemformat.CounterKey(op.Key, gen)
			if counters[key] {
				continue
			}
			it, err := s.MC.Get(key)
			if err != nil {
				continue
			}
			n, _ := strconv.Atoi(strings.TrimSpace(string(it.Value)))
			if err := s.MC.Set(&memcache.Item{Key: key, Value: []byte(strconv.Itoa(n + 1000))}); err != nil {
				t.Fatal(err)
			}
			counters[key] = true
		case (op.Kind == rules.OpSetAdd || op.Kind == rules.OpSetRemove) && len(sets) < 5 && !sets[op.Key]:
			if err := s.MC.Append(&memcache.Item{Key: op.Key, Value: []byte("+outsider ")}); err != nil {
				continue // missing: nothing to append to
			}
			sets[op.Key] = true
		}
	}
	if len(counters) == 0 || len(sets) == 0 {
		t.Fatalf("the round touched %d present counters and %d present sets: nothing to corrupt", len(counters), len(sets))
	}
	if _, err := s.PublishTxs(ctx, txs); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	c := settleObserver(t, d.Stack.Observer)
	t.Logf("%+v", c)
	keys, lines := logs.inconsistencies()
	for k := range keys {
		if !counters[k] && !sets[k] {
			t.Errorf("reported %s, which no outside writer changed", k)
		}
	}
	for what, corrupted := range map[string]map[string]bool{"counter": counters, "set": sets} {
		found := 0
		for k := range corrupted {
			if _, ok := keys[k]; ok {
				found++
			}
		}
		t.Logf("%ss changed by an outside writer: %d, reported: %d", what, len(corrupted), found)
		if found == 0 {
			t.Errorf("no %s an outside writer changed was reported (%v)", what, sortedSet(corrupted))
		}
	}
	for _, line := range lines {
		if strings.Contains(line, "outsider") {
			t.Logf("e.g. %s", line)
			return
		}
	}
	t.Errorf("no evidence names the member the outside writer appended:\n%s", strings.Join(lines, "\n"))
}

func sortedSet(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// threeServers starts three memcached servers of the test's own, the
// third behind a proxy, and a spare one.
func threeServers(t *testing.T) (servers []string, proxy *faultProxy, third, spare string) {
	a, b, c, d := startMemcached(t), startMemcached(t), startMemcached(t), startMemcached(t)
	proxy = startProxy(t, c.addr)
	return []string{a.addr, b.addr, proxy.Addr()}, proxy, c.addr, d.addr
}

// TestObserverServerReturnsWithOldItems: one memcached server of three
// is cut off (its address reaches an empty spare meanwhile, as after a
// failover) and comes back holding the items it had: the changes applied
// meanwhile are reported on that server's keys.
func TestObserverServerReturnsWithOldItems(t *testing.T) {
	s := newScenario(t, ScenarioOptions{Snapshot: true})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	servers, proxy, third, spare := threeServers(t)
	cf := s.ConfigFile("")
	cf.Memcached.Servers = servers
	const window = 4 * time.Second
	cf.Observer = observerSection(window)
	cfg, _ := loadConfig(t, cf)
	log, logs := observedLog(t)
	d := startObservedDaemon(t, cfg, log, wiring.StackOptions{}, nil)
	// The snapshot creates the namespaces and sets on all three.
	if err := s.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	before := settleObserver(t, d.Stack.Observer)
	if before.Inconsistent != 0 {
		t.Fatalf("inconsistent before the fault: %+v", before)
	}
	time.Sleep(500 * time.Millisecond) // the old items predate the clock skew allowed
	proxy.Retarget(spare)
	start := time.Now()
	// Enough changes that some bumps land on the cut-off server's keys
	// whatever the seed: a round of 200 left as few as one.
	if _, err := s.Round(ctx, 800); err != nil {
		t.Fatal(err)
	}
	proxy.Retarget(third)
	t.Logf("the round was applied while the server was cut off in %s", time.Since(start).Round(time.Millisecond))
	c := settleObserver(t, d.Stack.Observer)
	t.Logf("%+v", c)
	keys, lines := logs.inconsistencies()
	if len(keys) == 0 {
		t.Fatalf("nothing reported after the server came back with old items (%+v)", c)
	}
	sel, err := cfg.Memcached.Selector()
	if err != nil {
		t.Fatal(err)
	}
	for k := range keys {
		if addr, _ := sel.PickServer(k); addr.String() != proxy.Addr() {
			t.Errorf("reported %s, on %s: the server that came back is %s", k, addr, proxy.Addr())
		}
	}
	t.Logf("%d keys reported on the server that came back, e.g.\n%s", len(keys), lines[0])
	if !strings.Contains(lines[0], "server="+proxy.Addr()) {
		t.Errorf("the evidence does not name the server: %s", lines[0])
	}
}

// TestObserverDistributionMismatch: a daemon whose distribution differs
// from the applications' writes the changes, and a detached observer
// (`cachewarden observe`'s stack, its own consumer group, writing
// nothing) with the applications' distribution reports the items the
// applications read that the changes never reached.
func TestObserverDistributionMismatch(t *testing.T) {
	s := newScenario(t, ScenarioOptions{Snapshot: true})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	servers, _, _, _ := threeServers(t)
	cf := s.ConfigFile("")
	cf.Memcached.Servers = servers
	cf.Memcached.Distribution = "ketama"
	cf.Observer = observerSection(2 * time.Second)
	right, _ := loadConfig(t, cf)
	cf.Memcached.Distribution = "modula-crc32"
	cf.Observer = nil
	wrong, _ := loadConfig(t, cf)
	log, logs := observedLog(t)

	// The items as the applications' distribution places them.
	first := startObservedDaemon(t, right, log, wiring.StackOptions{}, nil)
	if err := s.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := first.Stop(); err != nil {
		t.Fatal(err)
	}
	// The applications read every set, counter and namespace through
	// their own client, with their distribution.
	var appServers []itemformat.Server
	for _, a := range servers {
		appServers = append(appServers, itemformat.Server{Addr: a})
	}
	app, err := client.New(client.Config{Servers: appServers, Distribution: "ketama", Rules: s.Rules, DB: s.MySQL.DB(), Timeout: 2 * time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	if _, err := Warm(ctx, s.Rules, app, s.MySQL, s.Snapshot, 1, rand.New(rand.NewPCG(1, 2))); err != nil {
		t.Fatal(err)
	}
	obs := startObservedDaemon(t, right, log, wiring.StackOptions{ObserveOnly: true}, func(c *kafka.Config) {
		c.Group, c.StartOffset = right.ObserverGroup(), kafka.StartLatest
	})
	waitAssigned(t, obs, s.Opts.Partitions*len(s.Topics))
	startObservedDaemon(t, wrong, log, wiring.StackOptions{}, nil)
	if _, err := s.Round(ctx, 300); err != nil {
		t.Fatal(err)
	}
	c := settleObserver(t, obs.Stack.Observer)
	t.Logf("%+v", c)
	for rule, ws := range obs.Stack.Observer.Status().Rules {
		t.Logf("rule %s: %+v", rule, ws[0].Total)
	}
	keys, lines := logs.inconsistencies()
	if len(keys) == 0 {
		t.Fatalf("a daemon with another distribution went unnoticed (%+v)", c)
	}
	wsel, err := wrong.Memcached.Selector()
	if err != nil {
		t.Fatal(err)
	}
	rsel, err := right.Memcached.Selector()
	if err != nil {
		t.Fatal(err)
	}
	// A set or counter is also wrong when its table's generation item
	// (docs/formats.md, "Generations") is placed differently: the two
	// daemons then read different generations.
	movedGen := map[string]bool{}
	for _, r := range s.Rules.Rules() {
		if r.Generation == "" {
			continue
		}
		w, _ := wsel.PickServer(r.Generation)
		rs, _ := rsel.PickServer(r.Generation)
		if w.String() != rs.String() {
			head, _, _ := strings.Cut(r.Key.String(), "{")
			movedGen[r.Prefix+head] = true
		}
	}
	for k := range keys {
		w, _ := wsel.PickServer(k)
		r, _ := rsel.PickServer(k)
		if w.String() == r.String() && !hasAnyPrefix(k, movedGen) {
			t.Errorf("reported %s, which both distributions place on %s (and its generation too)", k, w)
		}
	}
	t.Logf("%d keys reported, e.g.\n%s", len(keys), lines[0])
}

// waitAssigned waits until the daemon owns n partitions.
func waitAssigned(t *testing.T, d *Daemon, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		c, err := d.Counts()
		if err != nil {
			t.Fatal(err)
		}
		if int(c.Assigned) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(fmt.Sprintf("%v of %d partitions assigned after a minute", c.Assigned, n))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// hasAnyPrefix reports whether s starts with one of the prefixes.
func hasAnyPrefix(s string, prefixes map[string]bool) bool {
	for p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}
