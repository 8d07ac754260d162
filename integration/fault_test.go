package integration

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/go-sql-driver/mysql"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/counters"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/pipeline"
	"github.com/cachewarden/cachewarden/rules"
)

// The fault suite: each scenario drives the workload (inserts, updates
// that move rows between keys, predicate flips, deletes) through MariaDB
// with its binary log on, publishes the change events in commit order with
// their real binlog positions, injects its fault while the daemons consume
// them, and ends with quiesce, verify and the namespace check
// (faultScenario.finish). CACHEWARDEN_SOAK=1 selects the soak sizes;
// CACHEWARDEN_RELIABILITY_REPORT=path writes the results table
// (docs/reliability.md).

// Scenario names, as the report lists them.
const (
	scenarioKill             = "daemon killed (SIGKILL)"
	scenarioMemcachedStop    = "memcached frozen (SIGSTOP)"
	scenarioMemcachedRestart = "memcached restarted empty"
	scenarioMySQLOutage      = "MariaDB unreachable"
	scenarioGroup            = "3 daemons, 1 killed under load"
	scenarioHostile          = "hostile input"
	scenarioDrift            = "counter drift (stream behind MariaDB, flush_all mid-run)"
)

// TestFaultDaemonKill kills `cachewarden run` with SIGKILL at random points
// of the run, restarting it each time: nothing may be lost, the first
// batch after each restart must not count a counter delta twice, and the
// delayed second bumps (rebump_after) pending at a kill, which the daemon
// recorded in memcached, are applied by the restarted daemon. The first
// kill waits until such a bump is pending.
func TestFaultDaemonKill(t *testing.T) {
	started := time.Now()
	fs := newFaultScenario(t, faultOptions{Name: scenarioKill})
	ctx := context.Background()
	sz := fs.sizes
	d := fs.startDaemon()
	fs.start(ctx)
	journal := cacheops.NewTokenLog(fs.MC, nil)
	var atKill []pipeline.PendingRebump // recorded, not applied, at the last kill
	var pendingAtKills []string

	// Kill rounds spread over the run's expected length.
	rounds := max(sz.KillEvents/sz.RoundTxs, sz.Kills+2)
	killIn := map[int]bool{}
	for len(killIn) < sz.Kills {
		killIn[1+fs.rng.IntN(rounds-1)] = true
	}
	kills := 0
	var waiting []string
	for r := 0; fs.events < sz.KillEvents || kills < sz.Kills; r++ {
		var h roundHooks
		if killIn[r] || (fs.events >= sz.KillEvents && kills < sz.Kills) {
			h.mid = func([]Tx) {
				// A random point: part of the round is published, and the
				// daemon may be fetching, applying or committing it; the
				// rest is published while no daemon runs.
				if kills == 0 {
					fs.waitRebumpRecorded(ctx, journal, 2*time.Second)
				} else {
					time.Sleep(time.Duration(fs.rng.IntN(20)) * time.Millisecond)
				}
				lag, err := fs.Broker.GroupLag(ctx, fs.Opts.Group, fs.Topics...)
				if err != nil {
					t.Fatal(err)
				}
				d.sigkill(t)
				if atKill, err = pipeline.PendingRebumps(journal, fs.Rules, fs.Opts.Group); err != nil {
					t.Fatal(err)
				}
				pendingAtKills = append(pendingAtKills, strconv.Itoa(len(atKill)))
				kills++
				waiting = append(waiting, strconv.FormatInt(lag.Total, 10))
				d = fs.restart(ctx, d)
			}
		}
		fs.round(ctx, sz.RoundTxs, h)
		fs.checkRebumpsApplied(ctx, journal, atKill)
		atKill = nil
	}
	total := 0
	for _, n := range pendingAtKills {
		k, _ := strconv.Atoi(n)
		total += k
	}
	if total == 0 {
		t.Errorf("no delayed bump was pending at any of the kills: the check of their recovery proves nothing")
	}
	if recovered, err := d.metric(d.httpAddr(t), "cachewarden_rebumps_recovered_total", ""); err == nil {
		fs.note("Delayed second bumps recorded in memcached and not yet applied at the kills: %s; every one was applied after the restart (the last daemon found %.0f in the journal when it started).",
			strings.Join(pendingAtKills, ", "), recovered)
	}
	fs.fault("%d × SIGKILL at random points, restarted each time (uncommitted messages at the kills: %s; delayed bumps pending: %s)",
		kills, strings.Join(waiting, ", "), strings.Join(pendingAtKills, ", "))
	row := fs.finish(ctx, d)
	recordRow(t, started, row)
}

// TestFaultMemcachedStop freezes memcached with SIGSTOP while a round is
// published: the daemon must commit nothing that needs it, report not
// ready, and recover by itself when it resumes, skipping nothing.
func TestFaultMemcachedStop(t *testing.T) {
	started := time.Now()
	fs := newFaultScenario(t, faultOptions{Name: scenarioMemcachedStop})
	ctx := context.Background()
	sz := fs.sizes
	d := fs.startDaemon()
	addr := d.httpAddr(t)
	fs.start(ctx)
	fs.roundsUntil(ctx, sz.Events/3)
	var waiting int64
	var notReady bool
	var stopped, resumed time.Time
	fs.round(ctx, sz.RoundTxs, roundHooks{
		before: func([]Tx) {
			fs.mc.Signal(syscall.SIGSTOP)
			stopped = time.Now()
		},
		during: func([]Tx) {
			waiting, notReady = fs.holdDown(ctx, d, addr, sz.Outage)
			fs.mc.Signal(syscall.SIGCONT)
			resumed = time.Now()
		},
	})
	caughtUp := time.Since(resumed).Round(10 * time.Millisecond)
	ready, notReadyAfter := waitReady(t, d, addr, 30*time.Second)
	if !notReady && !notReadyAfter {
		t.Errorf("/readyz never answered 503 while memcached was frozen")
	}
	fs.fault("memcached frozen (SIGSTOP) for %v during a round: %d messages waiting, none with cache ops committed, /readyz 503; caught up %v after SIGCONT, ready again after %v",
		resumed.Sub(stopped).Round(100*time.Millisecond), waiting, caughtUp, (ready + caughtUp).Round(10*time.Millisecond))
	fs.roundsUntil(ctx, sz.Events)
	recordRow(t, started, fs.finish(ctx, d))
}

// TestFaultMemcachedRestart kills memcached in the middle of a round and
// starts it again empty after a while: the same guarantees as a freeze,
// and the namespaces, sets and counters it lost are simply missing.
func TestFaultMemcachedRestart(t *testing.T) {
	started := time.Now()
	fs := newFaultScenario(t, faultOptions{Name: scenarioMemcachedRestart})
	ctx := context.Background()
	sz := fs.sizes
	d := fs.startDaemon()
	addr := d.httpAddr(t)
	fs.start(ctx)
	fs.roundsUntil(ctx, sz.Events/3)
	var waiting int64
	var notReady bool
	var killed, restarted time.Time
	fs.round(ctx, sz.RoundTxs, roundHooks{
		mid: func([]Tx) {
			time.Sleep(time.Duration(fs.rng.IntN(20)) * time.Millisecond)
			fs.mc.Kill()
			killed = time.Now()
			fs.emptied = true
		},
		during: func([]Tx) {
			waiting, notReady = fs.holdDown(ctx, d, addr, sz.MemcachedDown)
			fs.mc.Start()
			restarted = time.Now()
		},
	})
	caughtUp := time.Since(restarted).Round(10 * time.Millisecond)
	ready, notReadyAfter := waitReady(t, d, addr, 2*time.Minute)
	if !notReady && !notReadyAfter {
		t.Errorf("/readyz never answered 503 while memcached was down")
	}
	fs.fault("memcached killed mid-round, down %v (%d messages waiting, none with cache ops committed, /readyz 503), restarted empty; caught up %v later, ready again after %v",
		restarted.Sub(killed).Round(100*time.Millisecond), waiting, caughtUp, (ready + caughtUp).Round(10*time.Millisecond))
	fs.rewarm(ctx)
	fs.roundsUntil(ctx, sz.Events)
	recordRow(t, started, fs.finish(ctx, d))
}

// TestFaultMySQLOutage cuts the daemon off MariaDB (a proxy drops its
// traffic, then refuses connections) while a round is consumed: sets and
// counters that need a query are left missing, never wrong, the stream
// does not stop, and recounts resume when MariaDB is back.
func TestFaultMySQLOutage(t *testing.T) {
	started := time.Now()
	fs := newFaultScenario(t, faultOptions{Name: scenarioMySQLOutage, Proxy: true})
	ctx := context.Background()
	sz := fs.sizes
	d := fs.startDaemon()
	addr := d.httpAddr(t)
	fs.start(ctx)
	fs.roundsUntil(ctx, sz.Events/3)
	errorsBefore, err := d.metric(addr, "cachewarden_mysql_query_duration_seconds_count", `outcome="error"`)
	if err != nil {
		t.Fatal(err)
	}
	var outageStart time.Time
	fs.round(ctx, sz.RoundTxs, roundHooks{
		before: func([]Tx) {
			fs.proxy.SetMode(proxyBlackhole)
			outageStart = time.Now()
		},
		during: func([]Tx) {
			time.Sleep(sz.Outage / 2)
			fs.proxy.SetMode(proxyRefuse)
		},
	})
	// Still cut off: whatever is cached must be right.
	mid := fs.verifyNow(ctx)
	if !mid.OK() {
		t.Errorf("during the outage %d items are wrong: %+v", mid.Wrong, mid.Mismatches[:min(5, len(mid.Mismatches))])
	}
	errorsDuring, err := d.metric(addr, "cachewarden_mysql_query_duration_seconds_count", `outcome="error"`)
	if err != nil {
		t.Fatal(err)
	}
	if errorsDuring == errorsBefore {
		t.Errorf("no load or recount query failed during the outage: the fault proved nothing")
	}
	if rest := sz.Outage - time.Since(outageStart); rest > 0 {
		time.Sleep(rest)
	}
	outage := time.Since(outageStart).Round(100 * time.Millisecond)
	fs.proxy.SetMode(proxyPass)

	// Recounts resume: counters the next round changes that are missing
	// (some are evicted here first, as memcached would) are recounted and
	// present again.
	var missing []string
	fs.round(ctx, sz.RoundTxs, roundHooks{before: func(txs []Tx) {
		ops, err := PlanOps(fs.Rules, fs.Opts.Format, txs)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		var keys []string
		for _, op := range ops {
			if op.Kind != rules.OpCount {
				continue
			}
			// Under the table's generation (docs/formats.md, "Generations").
			key, err := CounterItemKey(fs.MC, &op)
			if err != nil {
				t.Fatal(err)
			}
			if !seen[key] {
				seen[key] = true
				keys = append(keys, key)
			}
		}
		items, err := fs.MC.GetMulti(keys)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if items[k] == nil {
				missing = append(missing, k)
			} else if len(missing) < 20 {
				if err := fs.MC.Delete(k); err != nil {
					t.Fatal(err)
				}
				missing = append(missing, k)
			}
		}
	}})
	items, err := fs.MC.GetMulti(missing)
	if err != nil {
		t.Fatal(err)
	}
	recounted := len(items)
	if len(missing) == 0 || recounted != len(missing) {
		t.Errorf("%d of the %d missing counters the round after the outage changed were recounted", recounted, len(missing))
	}
	fs.fault("MariaDB cut off for %v (traffic dropped for half of it, connections refused for the rest) during a round: %.0f load/recount queries failed; during the outage %d sets and counters missing, 0 wrong; after it %d of %d missing counters recounted",
		outage, errorsDuring-errorsBefore, mid.Missing, recounted, len(missing))
	fs.roundsUntil(ctx, sz.Events)
	recordRow(t, started, fs.finish(ctx, d))
}

// TestFaultGroupKill runs three daemons in one consumer group and kills
// one with SIGKILL while it applies a round: the others take its
// partitions over and nothing is lost or counted twice.
func TestFaultGroupKill(t *testing.T) {
	started := time.Now()
	fs := newFaultScenario(t, faultOptions{Name: scenarioGroup, Partitions: 4})
	ctx := context.Background()
	sz := fs.sizes
	daemons := []*faultDaemon{fs.startDaemon(), fs.startDaemon(), fs.startDaemon()}
	addrs := make([]string, len(daemons))
	for i, d := range daemons {
		addrs[i] = d.httpAddr(t)
	}
	total := float64(len(fs.Topics) * fs.Opts.Partitions)
	fs.start(ctx)
	holding := func(ds []int) (bool, string) {
		sum, parts := 0.0, make([]string, 0, len(ds))
		for _, i := range ds {
			n, err := daemons[i].metric(addrs[i], "cachewarden_assigned_partitions", "")
			if err != nil || n == 0 {
				return false, fmt.Sprint(err)
			}
			sum += n
			parts = append(parts, strconv.FormatFloat(n, 'f', 0, 64))
		}
		return sum == total, strings.Join(parts, "+")
	}
	var split string
	waitFor(t, time.Minute, "every daemon to hold partitions", func() (bool, error) {
		var ok bool
		ok, split = holding([]int{0, 1, 2})
		return ok, nil
	})
	fs.roundsUntil(ctx, sz.GroupEvents/2)
	victim := fs.rng.IntN(len(daemons))
	survivors := []int{}
	for i := range daemons {
		if i != victim {
			survivors = append(survivors, i)
		}
	}
	var killed time.Time
	var waiting int64
	fs.round(ctx, sz.RoundTxs, roundHooks{split: func(n int) int {
		// Under load: at least half of the round is in flight.
		return n/2 + fs.rng.IntN(max(1, n/2))
	}, mid: func([]Tx) {
		time.Sleep(time.Duration(fs.rng.IntN(5)) * time.Millisecond)
		lag, err := fs.Broker.GroupLag(ctx, fs.Opts.Group, fs.Topics...)
		if err != nil {
			t.Fatal(err)
		}
		waiting = lag.Total
		daemons[victim].sigkill(t)
		killed = time.Now()
		if sz.ExpireSessions {
			if _, err := expireMembers(ctx, fs.Broker, fs.Opts.Group, daemons[victim].ClientID); err != nil {
				t.Fatal(err)
			}
		}
	}})
	var after string
	waitFor(t, 2*time.Minute, "the survivors to hold every partition", func() (bool, error) {
		var ok bool
		ok, after = holding(survivors)
		return ok, nil
	})
	took := time.Since(killed).Round(100 * time.Millisecond)
	how := "its session expired at once"
	if !sz.ExpireSessions {
		how = "the broker's session timeout expired it"
	}
	fs.fault("1 of 3 daemons SIGKILLed under load (%d messages uncommitted), %s; partitions %s → %s (of %.0f), rebalanced within %v",
		waiting, how, split, after, total, took)
	fs.roundsUntil(ctx, sz.GroupEvents)
	alive := make([]*faultDaemon, 0, len(survivors))
	for _, i := range survivors {
		alive = append(alive, daemons[i])
	}
	recordRow(t, started, fs.finish(ctx, alive...))
}

// TestFaultCounterDrift measures counter drift where it comes from: the
// change stream runs one round behind MariaDB (as a CDC pipeline always
// lags a little), and memcached is flushed twice mid-run, so the counters
// that the next deltas find missing are recounted from a database that is
// already ahead of the stream. Without fences the deltas MariaDB had
// already counted are applied on top; with them they are skipped. The
// same workload (same seed) runs twice: on the MariaDB without a binary
// log, where recounts cannot be fenced (the behaviour before fences), and
// on the one with it. The fenced run adds two faults: fences evicted
// alone (their counters stay, their flags naming the lost fence) before
// some rounds, and a failover: the database is copied to a second MariaDB
// whose binary log has the same base name (mysql-bin), the daemon's
// connections move there (its DSN names a proxy, retargeted as a virtual
// IP would be), and the workload and the change stream continue there,
// while memcached still holds fences at the first server's positions.
// After quiesce every present counter is compared with COUNT(*).
func TestFaultCounterDrift(t *testing.T) {
	started := time.Now()
	seed := uint64(time.Now().UnixNano()) | 1
	var before, after *reliabilityRow
	t.Run("unfenced", func(t *testing.T) {
		before = runDrift(t, false, seed)
	})
	t.Run("fenced", func(t *testing.T) {
		after = runDrift(t, true, seed)
	})
	if after == nil {
		return
	}
	row := after
	row.Scenario = scenarioDrift
	if before != nil {
		row.DriftBefore = before.DriftAfter
		row.Notes = append(row.Notes, fmt.Sprintf("The same workload (seed %d) on the MariaDB without a binary log (recounts cannot be fenced): %d events, %d counters wrong after quiesce, `cachewarden verify`: %s.",
			seed, before.Events, before.WrongCounters, before.VerifyCLI))
	}
	t.Logf("counter drift after quiesce: %s unfenced, %s fenced", orDash(row.DriftBefore), row.DriftAfter)
	if after.WrongCounters != 0 {
		t.Errorf("%d counters drifted with fences", after.WrongCounters)
	}
	recordRow(t, started, row)
}

// runDrift runs the drift scenario once, with fences (the binary-log
// MariaDB) or without.
func runDrift(t *testing.T, fenced bool, seed uint64) *reliabilityRow {
	name := scenarioDrift + " (unfenced)"
	if fenced {
		name = scenarioDrift
	}
	// Few posts: most rounds change most comment counters.
	fs := newFaultScenario(t, faultOptions{Name: name, Posts: 40, BinlogOff: !fenced, Seed: seed, DriftExpected: !fenced, Proxy: fenced})
	if !fenced && fs.Workload.BinlogPositions() {
		t.Skip("the MariaDB at CACHEWARDEN_TEST_MYSQL_DSN has its binary log on: recounts there are fenced, so the unfenced baseline cannot be measured")
	}
	ctx := context.Background()
	sz := fs.sizes
	d := fs.startDaemon()
	fs.start(ctx)
	rounds := max(sz.Events/sz.RoundTxs, 3)
	flushIn := map[int]bool{rounds / 3: true, 2 * rounds / 3: true}
	// Fenced, both flushes come before the failover, and no fence is
	// evicted for two rounds after it: a flush or an eviction then would
	// remove the first server's fences, and with them the deltas that
	// meet a position of another log.
	failoverAt := -1
	var second string // the failover target's DSN: the same database name
	if fenced {
		first := max(rounds/8, 1)
		flushIn = map[int]bool{first: true, first + 2: true}
		failoverAt = first + 4
		cfg, err := mysql.ParseDSN(fs.Services.MySQLDSN)
		if err != nil {
			t.Fatal(err)
		}
		_, second = testsvc.MySQLSecondBinlog(t, cfg.DBName)
	}
	flushes, evictions, fencesEvicted := 0, 0, 0
	var failedOver string
	var before map[string]float64
	pending, err := fs.Change(ctx, sz.RoundTxs)
	if err != nil {
		t.Fatal(err)
	}
	for r := 0; fs.events < sz.Events; r++ {
		if r == failoverAt {
			// Everything made on the first server is applied first:
			// then the copy is what a caught-up replica would hold.
			fs.publishRound(ctx, pending, roundHooks{})
			before = fs.fenceMetrics(d)
			failedOver = fs.failover(ctx, second)
			if pending, err = fs.Change(ctx, sz.RoundTxs); err != nil {
				t.Fatal(err)
			}
			continue
		}
		// MariaDB is a round ahead of the stream while the daemon applies
		// the round before.
		next, err := fs.Change(ctx, sz.RoundTxs)
		if err != nil {
			t.Fatal(err)
		}
		var h roundHooks
		switch {
		case flushIn[r]:
			h.before = func([]Tx) {
				if _, err := memcachedCommand(fs.mc.addr, "flush_all\r\n", "OK"); err != nil {
					t.Fatal(err)
				}
				fs.emptied = true
				flushes++
			}
		case fenced && r%2 == 0 && r > 0 && (r < failoverAt || r > failoverAt+2):
			h.before = func(txs []Tx) {
				fencesEvicted += fs.evictFences(txs)
				evictions++
			}
		}
		fs.publishRound(ctx, pending, h)
		pending = next
	}
	fs.publishRound(ctx, pending, roundHooks{})
	how := "fenced (binary log on)"
	if !fenced {
		how = "unfenced (binary log off)"
	}
	fs.fault("stream one round (%d transactions) behind MariaDB; memcached flushed (flush_all) %d times mid-run; recounts %s", sz.RoundTxs, flushes, how)
	if fenced {
		fs.fault("fences evicted alone before %d rounds (%d fence items deleted, their counters kept)", evictions, fencesEvicted)
		if failedOver == "" {
			t.Errorf("the run ended before its failover (round %d): the second MariaDB was never used", failoverAt)
		} else {
			fs.fault("%s", failedOver)
		}
	}
	row := fs.finish(ctx, d)
	if fenced {
		after := fs.fenceMetrics(d)
		row.Notes = append(row.Notes, fmt.Sprintf("With fences %.0f counter deltas were skipped because a recount already included them (%.0f after the failover). Counters recounted because their fence could not decide: %.0f with the fence gone while the counter named it, %.0f with a delta from another server's log than the fence (%.0f after the failover).",
			after["skipped"], after["skipped"]-before["skipped"], after["fence_missing"], after["other_server"], after["other_server"]-before["other_server"]))
		t.Logf("note: %s", row.Notes[len(row.Notes)-1])
		if fencesEvicted == 0 || after["fence_missing"] == 0 {
			t.Errorf("%d fences evicted, %.0f counters recounted for it: the fault proved nothing", fencesEvicted, after["fence_missing"])
		}
		if after["other_server"]-before["other_server"] == 0 {
			t.Errorf("no delta met a fence of the first server after the failover: the fault proved nothing")
		}
	}
	return row
}

// fenceMetrics reads what the daemon's fences did: deltas skipped, and
// counters recounted because their fence was gone or from another server.
func (fs *faultScenario) fenceMetrics(d *faultDaemon) map[string]float64 {
	fs.t.Helper()
	addr := d.httpAddr(fs.t)
	out := map[string]float64{}
	for name, q := range map[string][2]string{
		"skipped":       {"cachewarden_ops_total", `outcome="fenced"`},
		"fence_missing": {"cachewarden_recounts_total", `reason="fence_missing"`},
		"other_server":  {"cachewarden_recounts_total", `reason="other_server"`},
	} {
		n, err := d.metric(addr, q[0], q[1])
		if err != nil {
			fs.t.Fatal(err)
		}
		out[name] = n
	}
	return out
}

// evictFences deletes the fence items of the counters that txs change,
// leaving the counters (memcached evicts per slab class, so a fence can go
// while its counter stays); it returns how many existed.
func (fs *faultScenario) evictFences(txs []Tx) int {
	fs.t.Helper()
	ops, err := PlanOps(fs.Rules, fs.Opts.Format, txs)
	if err != nil {
		fs.t.Fatal(err)
	}
	n := 0
	seen := map[string]bool{}
	for _, op := range ops {
		if op.Kind != rules.OpCount {
			continue
		}
		key, err := CounterItemKey(fs.MC, &op)
		if err != nil {
			fs.t.Fatal(err)
		}
		if seen[key] {
			continue
		}
		seen[key] = true
		switch err := fs.MC.Delete(counters.FenceKey(key)); {
		case err == nil:
			n++
		case !errors.Is(err, memcache.ErrCacheMiss):
			fs.t.Fatal(err)
		}
	}
	return n
}

// failover moves the scenario to the second MariaDB at dsn (a database of
// the same name), once the daemons have applied everything, and points
// the daemons' proxy there; it says what was done, for the report.
func (fs *faultScenario) failover(ctx context.Context, dsn string) string {
	fs.t.Helper()
	var fromFile, toFile string
	var fromPos, toPos int64
	fromID := fs.Workload.ServerID()
	scanMaster := func(db *sql.DB, file *string, pos *int64) {
		rows, err := db.QueryContext(ctx, "SHOW MASTER STATUS")
		if err != nil {
			fs.t.Fatal(err)
		}
		defer rows.Close()
		cols, _ := rows.Columns()
		if !rows.Next() {
			fs.t.Fatal("SHOW MASTER STATUS: no row")
		}
		dest := make([]any, len(cols))
		for i := range dest {
			dest[i] = new(sql.RawBytes)
		}
		dest[0], dest[1] = file, pos
		if err := rows.Scan(dest...); err != nil {
			fs.t.Fatal(err)
		}
	}
	scanMaster(fs.MySQL.DB(), &fromFile, &fromPos)
	if err := fs.Failover(ctx, dsn); err != nil {
		fs.t.Fatal(err)
	}
	scanMaster(fs.MySQL.DB(), &toFile, &toPos)
	toID := fs.Workload.ServerID()
	base := func(f string) string { return strings.TrimRight(f, "0123456789") }
	if base(fromFile) != base(toFile) || fromID == toID {
		fs.t.Fatalf("the failover target must have the same binary log base name and another server_id: %s (server_id %d) → %s (server_id %d)", fromFile, fromID, toFile, toID)
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		fs.t.Fatal(err)
	}
	fs.proxy.Retarget(cfg.Addr)
	return fmt.Sprintf("failover after %d transactions to a second MariaDB: binary log %s:%d, server_id %d → %s:%d, server_id %d (same base name); the daemon's connections moved there, the first server's fences left in memcached",
		len(fs.Txs), fromFile, fromPos, fromID, toFile, toPos, toID)
}

// waitRebumpRecorded waits, up to max, until the daemon has recorded a
// delayed bump it has not applied yet.
func (fs *faultScenario) waitRebumpRecorded(ctx context.Context, journal *cacheops.TokenLog, max time.Duration) {
	fs.t.Helper()
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) {
		pending, err := pipeline.PendingRebumps(journal, fs.Rules, fs.Opts.Group)
		if err != nil {
			fs.t.Fatal(err)
		}
		if len(pending) > 0 {
			return
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// checkRebumpsApplied waits until none of the delayed bumps pending at a
// kill is recorded any more: the restarted daemon applied each (a bump
// leaves the journal only once applied, or replaced by a later bump of
// its key, still recorded). Their namespaces must exist.
func (fs *faultScenario) checkRebumpsApplied(ctx context.Context, journal *cacheops.TokenLog, atKill []pipeline.PendingRebump) {
	fs.t.Helper()
	if len(atKill) == 0 {
		return
	}
	type entry struct {
		journal, rule, key string
		due                int64
	}
	left := map[entry]bool{}
	for _, pr := range atKill {
		left[entry{pr.Journal, pr.Rule, pr.Key, pr.Due.UnixMilli()}] = true
	}
	deadline := time.Now().Add(30 * time.Second)
	for len(left) > 0 {
		pending, err := pipeline.PendingRebumps(journal, fs.Rules, fs.Opts.Group)
		if err != nil {
			fs.t.Fatal(err)
		}
		still := map[entry]bool{}
		for _, pr := range pending {
			if e := (entry{pr.Journal, pr.Rule, pr.Key, pr.Due.UnixMilli()}); left[e] {
				still[e] = true
			}
		}
		left = still
		if len(left) > 0 && time.Now().After(deadline) {
			fs.t.Errorf("%d of the %d delayed bumps pending at the kill were never applied after the restart: %v", len(left), len(atKill), left)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	keys := make([]string, 0, len(atKill))
	for _, pr := range atKill {
		keys = append(keys, pr.Key)
	}
	present := fs.readNamespaces(keys)
	for _, k := range keys {
		if _, ok := present[k]; !ok && !fs.emptied {
			fs.t.Errorf("namespace %s, whose delayed bump was pending at the kill, is missing", k)
		}
	}
}
