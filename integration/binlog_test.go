package integration

import (
	"context"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The binary log source end to end: `cachewarden run` with source: binlog
// reads the binary-log MariaDB that the workload writes (no broker), and
// the fault suite's checks (faultScenario.finish: namespaces, sets and
// counters against MariaDB, `cachewarden verify`) apply unchanged.

// binlogTestLease is the lease of these tests: short, so that takeovers
// happen within seconds.
const binlogTestLease = 3 * time.Second

// binlogWait bounds the waits for what must happen eventually (a daemon
// becoming active, a log line): generous, the machine may be loaded.
const binlogWait = 2 * time.Minute

// waitActive waits until d reports cachewarden_binlog_active = want and
// returns how long that took.
func waitActive(t *testing.T, d *faultDaemon, want float64) time.Duration {
	t.Helper()
	start := time.Now()
	waitMetric(t, d, d.httpAddr(t), "cachewarden_binlog_active", func(v float64) bool { return v == want }, binlogWait)
	return time.Since(start)
}

// TestBinlogEndToEnd runs the daemon on the binary log source over the
// workload: every round's namespaces move, and at the end every set and
// counter equals MariaDB. The counters' deltas are fenced by the binary
// log positions the stream gives them: some must have been applied as
// deltas after their fence (not only recounted).
func TestBinlogEndToEnd(t *testing.T) {
	fs := newFaultScenario(t, faultOptions{Name: "binlog source", Binlog: true, Lease: binlogTestLease})
	ctx := context.Background()
	d := fs.startDaemon()
	waitActive(t, d, 1)
	fs.start(ctx)
	fs.roundsUntil(ctx, fs.sizes.Events)
	fs.finish(ctx, d)
	addr := d.httpAddr(t)
	applied, err := d.metric(addr, "cachewarden_binlog_events_total", `outcome="applied"`)
	if err != nil {
		t.Fatal(err)
	}
	rows := 0
	for _, tx := range fs.Txs {
		rows += len(tx.Changes)
	}
	if applied < float64(rows) {
		t.Errorf("the daemon applied %.0f row changes from the binary log, the workload made %d", applied, rows)
	}
	counts := map[string]float64{}
	for _, outcome := range []string{"incr", "decr", "fenced", "recounted", "recount_needed"} {
		if counts[outcome], err = d.metric(addr, "cachewarden_ops_total", `kind="count",outcome="`+outcome+`"`); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("row changes applied %.0f (workload %d); counter deltas by outcome: %v", applied, rows, counts)
	if counts["incr"]+counts["decr"] == 0 {
		t.Errorf("no counter delta was applied after its fence: the counters were only recounted, the fences prove nothing (%v)", counts)
	}
}

// TestBinlogDaemonKill kills the binary log daemon with SIGKILL five
// times at random points of a stream of at least 20,000 row changes (the
// fault suite's kill sizes), restarting it each time: after the last
// restart it catches up with nothing lost and nothing wrong, namespaces,
// sets and counters checked against MariaDB. As TestFaultDaemonKill, for
// the binary log source: a restart reads on from the checkpoint.
func TestBinlogDaemonKill(t *testing.T) {
	fs := newFaultScenario(t, faultOptions{Name: "binlog daemon killed (SIGKILL)", Binlog: true, Lease: binlogTestLease})
	ctx := context.Background()
	sz := fs.sizes
	d := fs.startDaemon()
	fs.start(ctx)

	rounds := max(sz.KillEvents/sz.RoundTxs, sz.Kills+2)
	killIn := map[int]bool{}
	for len(killIn) < sz.Kills {
		killIn[1+fs.rng.IntN(rounds-1)] = true
	}
	kills := 0
	var at []string
	for r := 0; fs.events < sz.KillEvents || kills < sz.Kills; r++ {
		var h roundHooks
		if killIn[r] || (fs.events >= sz.KillEvents && kills < sz.Kills) {
			// The round is committed; the daemon may be reading, applying
			// or checkpointing it.
			h.mid = func([]Tx) {
				time.Sleep(time.Duration(fs.rng.IntN(20)) * time.Millisecond)
				ck, _, err := fs.ReadCheckpoint(ctx)
				if err != nil {
					t.Fatal(err)
				}
				d.sigkill(t)
				kills++
				at = append(at, ck.Position)
				d = fs.restart(ctx, d)
			}
		}
		fs.round(ctx, sz.RoundTxs, h)
	}
	fs.fault("%d × SIGKILL at random points of %d row changes, restarted each time (checkpoints at the kills: %s)",
		kills, fs.events, strings.Join(at, ", "))
	if kills < 5 || fs.events < 20_000 {
		t.Errorf("%d kills over %d row changes: want at least 5 over 20,000", kills, fs.events)
	}
	row := fs.finish(ctx, d)
	if row.Lost != 0 || row.Wrong != 0 {
		t.Errorf("after the kills: %d lost, %d wrong; want 0 and 0", row.Lost, row.Wrong)
	}
}

// refusedRE matches what a resumed active logs when it finds its lease
// gone: a write refused by the guard, the lease lost, or its checkpoint
// fenced.
var refusedRE = regexp.MustCompile(`write refused|lease lost|lease not held|checkpoint fenced|no longer active`)

// epochRE finds the epochs a daemon acquired its checkpoint with.
var epochRE = regexp.MustCompile(`checkpoint acquired.* epoch=([0-9]+)`)

// lastEpoch returns the last checkpoint epoch d logged acquiring (0:
// none).
func lastEpoch(d *faultDaemon) int64 {
	m := epochRE.FindAllStringSubmatch(d.stderr.String(), -1)
	if len(m) == 0 {
		return 0
	}
	n, _ := strconv.ParseInt(m[len(m)-1][1], 10, 64)
	return n
}

// TestBinlogFailover runs daemons sharing one binlog.name. Killed with
// SIGKILL, the active's standby applies the changes made after the kill
// within twice the lease. Frozen with SIGSTOP past its lease, the active
// is replaced by a standby, and once resumed it writes nothing: the
// values its standby left stay, it logs that its lease is gone, and the
// checkpoint row keeps the standby's epoch.
func TestBinlogFailover(t *testing.T) {
	fs := newFaultScenario(t, faultOptions{Name: "binlog failover", Binlog: true, Lease: binlogTestLease})
	ctx := context.Background()
	a := fs.startDaemon()
	waitActive(t, a, 1)
	b := fs.startDaemon()
	waitActive(t, b, 0)
	fs.start(ctx)
	fs.round(ctx, 100, roundHooks{})

	// SIGKILL: b takes over.
	a.sigkill(t)
	killed := time.Now()
	fs.round(ctx, 100, roundHooks{})
	took := time.Since(killed)
	t.Logf("SIGKILL of the active: the standby applied the next round %v after the kill (lease %v)", took.Round(time.Millisecond), binlogTestLease)
	if took > 2*binlogTestLease {
		t.Errorf("the standby applied the changes after the kill %v later, more than twice the lease (%v)", took.Round(time.Millisecond), 2*binlogTestLease)
	}
	waitActive(t, b, 1)
	fs.fault("SIGKILL of the active; the standby applied %v later", took.Round(time.Millisecond))

	// SIGSTOP past the lease: c takes over, b resumes and writes nothing.
	c := fs.startDaemon()
	waitActive(t, c, 0)
	b.signal(t, syscall.SIGSTOP)
	stopped := time.Now()
	frozen := fs.round(ctx, 100, roundHooks{}) // applied by c once b's lease passed
	took = time.Since(stopped)
	cAddr := c.httpAddr(t)
	waitMetric(t, c, cAddr, "cachewarden_binlog_active", func(v float64) bool { return v == 1 }, binlogWait)
	time.Sleep(400 * time.Millisecond) // c's delayed second bumps (rebump_after 300ms)
	bumped, err := ExpectedBumps(fs.Rules, fs.Opts.Format, frozen)
	if err != nil {
		t.Fatal(err)
	}
	keys := sortedKeys(bumped)
	if len(keys) == 0 {
		t.Fatal("the round made while the active was frozen bumps no namespace: the check proves nothing")
	}
	left := fs.readNamespaces(keys)
	ck, _, err := fs.ReadCheckpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("SIGSTOP of the active: the new active applied the round %v after the freeze; checkpoint epoch %d", took.Round(time.Millisecond), ck.Epoch)

	b.signal(t, syscall.SIGCONT)
	deadline := time.Now().Add(binlogWait)
	for !refusedRE.MatchString(b.stderr.String()) {
		if time.Now().After(deadline) || b.exited() {
			t.Fatalf("the resumed daemon logged no refused write or lost lease; stderr:\n%s", lastLines(b.stderr.String(), 40))
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitActive(t, b, 0)
	t.Logf("the resumed daemon: %s", refusedRE.FindString(b.stderr.String()))
	now := fs.readNamespaces(keys)
	for _, k := range keys {
		if now[k] != left[k] {
			t.Errorf("%s moved from %d to %d after the frozen active resumed: it wrote", k, left[k], now[k])
		}
	}
	after, _, err := fs.ReadCheckpoint(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if cEpoch := lastEpoch(c); after.Epoch != cEpoch || after.Epoch != ck.Epoch {
		t.Errorf("checkpoint epoch %d after the resume, want the new active's %d (it was %d)", after.Epoch, cEpoch, ck.Epoch)
	}
	fs.fault("SIGSTOP of the active past its lease (the standby applied %v later), then SIGCONT", took.Round(time.Millisecond))
	fs.note("the resumed daemon wrote none of %d namespaces and logged %q", len(keys), refusedRE.FindString(b.stderr.String()))

	fs.round(ctx, 100, roundHooks{})
	fs.finish(ctx, b, c)
}
