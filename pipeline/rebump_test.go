package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/observer"
	"github.com/cachewarden/cachewarden/rules"
)

func bumpOp(r *rig, key string, after time.Duration) rules.Op {
	return rules.Op{Kind: rules.OpBump, Key: r.key(key), Rule: &rules.Rule{Name: "t", Kind: rules.BumpRule, RebumpAfter: after}}
}

// TestRebumperAppliesWhenDue runs the Rebumper and waits for the bumps.
func TestRebumperAppliesWhenDue(t *testing.T) {
	r := newRig(t, rebumpRules, rigOptions{})
	r.set("a", "10")
	r.set("b", "20")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.rebump.Run(ctx) }()
	r.rebump.Schedule(bumpOp(r, "a", 150*time.Millisecond))
	r.rebump.Schedule(bumpOp(r, "b", 30*time.Millisecond))
	r.rebump.Schedule(rules.Op{Kind: rules.OpBump, Key: r.key("c"), Rule: &rules.Rule{Name: "no-rebump"}})
	if n := r.rebump.Pending(); n != 2 {
		t.Fatalf("%d pending, want 2 (a rule without rebump_after schedules nothing)", n)
	}
	waitFor(t, 10*time.Second, func() string {
		if a, b := r.get("a"), r.get("b"); a != "11" || b != "21" {
			return "a=" + a + " b=" + b
		}
		return ""
	})
	if n := r.rebump.Pending(); n != 0 {
		t.Errorf("%d still pending", n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
	if n := metricValue(r.metrics.rebumps.WithLabelValues("ok")); n != 2 {
		t.Errorf("rebumps ok = %v, want 2", n)
	}
}

// TestRebumperOnePerKey checks that rescheduling a key keeps one bump, due
// at the later time, and that Flush applies it at once.
func TestRebumperOnePerKey(t *testing.T) {
	r := newRig(t, rebumpRules, rigOptions{})
	r.set("k", "1")
	r.rebump.Schedule(bumpOp(r, "k", time.Hour))
	r.rebump.Schedule(bumpOp(r, "k", 2*time.Hour))
	r.rebump.Schedule(bumpOp(r, "k", time.Minute))
	if n := r.rebump.Pending(); n != 1 {
		t.Fatalf("%d pending, want 1", n)
	}
	if due := r.rebump.queue[0].due; time.Until(due) < 90*time.Minute {
		t.Errorf("due in %s, want the latest (2h)", time.Until(due))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if dropped := r.rebump.Flush(ctx); dropped != 0 {
		t.Fatalf("Flush dropped %d", dropped)
	}
	if got := r.get("k"); got != "2" {
		t.Errorf("k = %q after Flush, want 2", got)
	}
}

// TestRebumperFlushGivesUp checks that Flush returns when memcached stays
// down past its context.
func TestRebumperFlushGivesUp(t *testing.T) {
	r := newRig(t, rebumpRules, rigOptions{mcAddr: testsvc.ClosedAddr(t)})
	r.rebump.Schedule(bumpOp(r, "x", time.Hour))
	r.rebump.Schedule(bumpOp(r, "y", time.Hour))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if dropped := r.rebump.Flush(ctx); dropped != 2 {
		t.Errorf("Flush dropped %d, want 2", dropped)
	}
	if n := metricValue(r.metrics.rebumps.WithLabelValues("dropped")); n != 2 {
		t.Errorf("dropped metric = %v, want 2", n)
	}
}

// TestRebumperRunStopsWithDueBumps ends Run's context while bumps are due:
// Run returns, and the bumps stay pending for Flush.
func TestRebumperRunStopsWithDueBumps(t *testing.T) {
	r := newRig(t, rebumpRules, rigOptions{})
	r.rebump.Schedule(bumpOp(r, "x", time.Nanosecond))
	r.rebump.Schedule(bumpOp(r, "y", time.Nanosecond))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan error, 1)
	go func() { done <- r.rebump.Run(ctx) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if n := r.rebump.Pending(); n != 2 {
		t.Errorf("%d bumps pending after Run, want 2 (left for Flush)", n)
	}
}

// TestRebumpJournalSurvivesCrash: a daemon records its delayed bumps in
// memcached before committing and is killed (it never applies or flushes
// them); the next daemon of the group applies each at its due time and
// empties the journal. A daemon that keeps running applies the bumps a
// stopped daemon left once they are overdue by the grace.
func TestRebumpJournalSurvivesCrash(t *testing.T) {
	r := newRig(t, rebumpRules, rigOptions{})
	rs := r.pipeline.cfg.Rules
	group := "cw-" + testsvc.Unique()
	store := cacheops.NewTokenLog(r.mc, r.log)
	newRebumper := func() (*Rebumper, *Metrics) {
		m := NewMetrics(nil)
		rb := NewRebumper(r.pipeline.cfg.Writer, m, r.log)
		rb.EnableJournal(store, rs, group)
		return rb, m
	}
	soon := *rs.Rules()[0] // user-profile, rebump_after 1h in the file
	soon.RebumpAfter = 50 * time.Millisecond
	op := func(key string, rule *rules.Rule, partition int) rules.Op {
		return rules.Op{Kind: rules.OpBump, Rule: rule, Key: r.key(key), Source: rules.Position{Topic: "t", Partition: partition}}
	}
	r.set("ns:user:1", "10")
	r.set("ns:user:2", "20")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	killed, _ := newRebumper()
	if err := killed.ScheduleBatch(ctx, []rules.Op{op("ns:user:1", &soon, 3), op("ns:user:2", rs.Rules()[0], 17)}); err != nil {
		t.Fatal(err)
	}
	pending, err := PendingRebumps(store, rs, group)
	if err != nil || len(pending) != 2 {
		t.Fatalf("journal holds %+v, %v; want the 2 bumps", pending, err)
	}
	if pending[0].Key != r.key("ns:user:1") || pending[0].Rule != "user-profile" || pending[0].Journal != RebumpJournalKey(r.prefix, group, 3) {
		t.Errorf("first pending bump %+v", pending[0])
	}

	restarted, m := newRebumper()
	done := make(chan error, 1)
	go func() { done <- restarted.Run(ctx) }()
	waitFor(t, 10*time.Second, func() string {
		if got := r.get("ns:user:1"); got != "11" {
			return "ns:user:1 = " + got + ", want the recovered bump"
		}
		return ""
	})
	if got := r.get("ns:user:2"); got != "20" {
		t.Errorf("ns:user:2 = %q: bumped before its due time (in an hour)", got)
	}
	if n := metricValue(m.rebumpsRecovered); n != 2 {
		t.Errorf("recovered = %v, want 2", n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	flushCtx, cancelFlush := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancelFlush()
	if dropped := restarted.Flush(flushCtx); dropped != 0 || r.get("ns:user:2") != "21" {
		t.Fatalf("Flush dropped %d; ns:user:2 = %q, want 21", dropped, r.get("ns:user:2"))
	}
	if pending, err := PendingRebumps(store, rs, group); err != nil || len(pending) != 0 {
		t.Fatalf("journal holds %+v, %v after every bump was applied", pending, err)
	}

	// A running daemon and one that stops with a bump recorded.
	running, m := newRebumper()
	running.scanEvery, running.orphanGrace = 20*time.Millisecond, 50*time.Millisecond
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	go func() { done <- running.Run(ctx) }()
	stopped, _ := newRebumper()
	if err := stopped.ScheduleBatch(ctx, []rules.Op{op("ns:user:1", &soon, 0)}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, func() string {
		if got := r.get("ns:user:1"); got != "12" {
			return "ns:user:1 = " + got + ", want the orphan bump applied"
		}
		return ""
	})
	if n := metricValue(m.rebumpsRecovered); n != 1 {
		t.Errorf("recovered = %v, want 1", n)
	}
	cancel()
	<-done
}

// TestRebumpMember round-trips journal members and rejects malformed ones.
func TestRebumpMember(t *testing.T) {
	due := time.UnixMilli(1_700_000_000_123)
	m := rebumpMember(due, "user profile", "shop:ns:user:%2542")
	if strings.ContainsAny(m, " \n") {
		t.Fatalf("member %q is not escaped", m)
	}
	got, err := parseRebumpMember("j", m)
	if err != nil || !got.Due.Equal(due) || got.Rule != "user profile" || got.Key != "shop:ns:user:%2542" {
		t.Fatalf("parse = %+v, %v", got, err)
	}
	for _, bad := range []string{"", "x", "123", "123 rule", "abc rule key", "-5 rule key", "123%20rule%20"} {
		if _, err := parseRebumpMember("j", bad); err == nil {
			t.Errorf("parseRebumpMember(%q) accepted", bad)
		}
	}
	if k := RebumpJournalKey("shop:", "cache warden", 3); k != "shop:%rebump:cache%20warden:3" {
		t.Errorf("RebumpJournalKey = %q", k)
	}
}

// TestRebumpJournalGuarded checks that ScheduleBatch asks the caller's
// write guard (cacheops.WithGuard) before recording bumps in the journal:
// a member whose session may have expired records nothing, schedules
// nothing, and returns the refusal, so that its batch is not committed.
func TestRebumpJournalGuarded(t *testing.T) {
	r := newRig(t, rebumpRules, rigOptions{})
	rs := r.pipeline.cfg.Rules
	group := "cw-" + testsvc.Unique()
	store := cacheops.NewTokenLog(r.mc, r.log)
	rb := NewRebumper(r.pipeline.cfg.Writer, NewMetrics(nil), r.log)
	rb.EnableJournal(store, rs, group)
	expired := errors.New("session expired")
	ctx := cacheops.WithGuard(context.Background(), func() error { return expired })
	op := rules.Op{Kind: rules.OpBump, Rule: rs.Rules()[0], Key: r.key("ns:user:1"), Source: rules.Position{Topic: "t", Partition: 1}}
	err := rb.ScheduleBatch(ctx, []rules.Op{op})
	if !errors.Is(err, cacheops.ErrWriteRefused) || !errors.Is(err, expired) {
		t.Fatalf("ScheduleBatch under a refusing guard = %v, want the refusal", err)
	}
	if pending, err := PendingRebumps(store, rs, group); err != nil || len(pending) != 0 {
		t.Fatalf("journal holds %+v, %v; want nothing recorded", pending, err)
	}
	if n := rb.Pending(); n != 0 {
		t.Errorf("%d bumps scheduled in memory for a refused batch, want 0", n)
	}
}

// TestRebumpJournalOneKeyManyChanges changes one key again and again,
// each change in its own batch, as a hot row does: the journal holds one
// entry, that of the one pending bump, and a restart recovers that bump
// at its due time. Against the shared memcached (1 MiB items) and one
// with 64 KiB items, where the entry of every change would have filled
// the item after about a thousand changes.
func TestRebumpJournalOneKeyManyChanges(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		changes int
	}{
		{"1MiB items", nil, 100_000},
		{"64KiB items", []string{"-I", "64k", "-o", "slab_chunk_max=32768"}, 20_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var opts rigOptions
			if tc.args != nil {
				opts.mcAddr = testsvc.PrivateMemcached(t, testsvc.MemcachedOptions{Args: tc.args}).Addr
			}
			r := newRig(t, rebumpRules, opts)
			rs := r.pipeline.cfg.Rules
			group := "cw-" + testsvc.Unique()
			store := cacheops.NewTokenLog(r.mc, r.log)
			rb := NewRebumper(r.pipeline.cfg.Writer, NewMetrics(nil), r.log)
			rb.EnableJournal(store, rs, group)
			clock := time.Now()
			rb.now = func() time.Time { clock = clock.Add(time.Millisecond); return clock }
			r.set("ns:user:1", "10")
			op := rules.Op{Kind: rules.OpBump, Rule: rs.Rules()[0], Key: r.key("ns:user:1"), Source: rules.Position{Topic: "t", Partition: 2}}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			for i := range tc.changes {
				if err := rb.ScheduleBatch(ctx, []rules.Op{op}); err != nil {
					t.Fatalf("change %d: %v", i+1, err)
				}
			}
			if n := rb.Pending(); n != 1 {
				t.Fatalf("%d bumps pending, want 1", n)
			}
			journal := RebumpJournalKey(r.prefix, group, 2)
			it, err := r.mc.Get(journal)
			if err != nil {
				t.Fatal(err)
			}
			pending, err := PendingRebumps(store, rs, group)
			if err != nil {
				t.Fatal(err)
			}
			if len(pending) != 1 {
				t.Fatalf("after %d changes of one key the journal holds %d entries (item of %d bytes), want 1", tc.changes, len(pending), len(it.Value))
			}
			t.Logf("after %d changes: 1 entry, journal item of %d bytes before a read compacted it", tc.changes, len(it.Value))
			if len(it.Value) > 2*rebumpJournalCompactBytes {
				t.Errorf("journal item of %d bytes, want it compacted as it grows (at most %d)", len(it.Value), 2*rebumpJournalCompactBytes)
			}
			due := clock.Add(time.Hour).Truncate(time.Millisecond)
			if !pending[0].Due.Equal(due) {
				t.Errorf("the entry is due %v, want the last change's %v", pending[0].Due, due)
			}
			if it, err = r.mc.Get(journal); err != nil || len(it.Value) > 200 {
				t.Errorf("journal item after a read = %d bytes, %v; want it compacted to the one entry", len(it.Value), err)
			}
			if strings.Contains(r.logs.String(), "wait in memory only") {
				t.Errorf("some bumps were not recorded in the journal")
			}

			// A restart (the first daemon is never flushed: killed)
			// recovers the one bump at its due time.
			restarted := NewRebumper(r.pipeline.cfg.Writer, NewMetrics(nil), r.log)
			restarted.EnableJournal(store, rs, group)
			if !restarted.recoverJournal(0) {
				t.Fatal("the restarted daemon could not read the journal")
			}
			if n := restarted.Pending(); n != 1 || !restarted.queue[0].due.Equal(due) {
				t.Fatalf("restart recovered %d bumps (first due %v), want 1 due %v", n, restarted.queue[0].due, due)
			}
			if dropped := restarted.Flush(ctx); dropped != 0 {
				t.Fatalf("Flush dropped %d", dropped)
			}
			if got := r.get("ns:user:1"); got != "11" {
				t.Errorf("ns:user:1 = %q, want 11: the recovered bump applied once", got)
			}
			if pending, err := PendingRebumps(store, rs, group); err != nil || len(pending) != 0 {
				t.Errorf("journal holds %d entries, %v after the bump was applied", len(pending), err)
			}
		})
	}
}

// TestRebumpJournalManyKeys schedules bumps of many keys, all recorded in
// one journal item, against memcached with small items: when the item is
// full, the bumps due first are applied early to make room, never
// dropped; the journal holds exactly the bumps pending, one entry each,
// and a restart recovers them all.
func TestRebumpJournalManyKeys(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		keys int
	}{
		{"64KiB items", []string{"-I", "64k", "-o", "slab_chunk_max=32768"}, 3000},
		{"1KiB items", []string{"-I", "1k", "-o", "slab_chunk_max=512"}, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mc := testsvc.PrivateMemcached(t, testsvc.MemcachedOptions{Args: tc.args})
			r := newRig(t, rebumpRules, rigOptions{mcAddr: mc.Addr})
			rs := r.pipeline.cfg.Rules
			group := "cw-" + testsvc.Unique()
			store := cacheops.NewTokenLog(r.mc, r.log)
			m := NewMetrics(nil)
			rb := NewRebumper(r.pipeline.cfg.Writer, m, r.log)
			rb.EnableJournal(store, rs, group)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			key := func(i int) string { return fmt.Sprintf("ns:user:%d", i) }
			var batch []rules.Op
			for i := range tc.keys {
				r.set(key(i), "10")
				batch = append(batch, rules.Op{Kind: rules.OpBump, Rule: rs.Rules()[0], Key: r.key(key(i)), Source: rules.Position{Topic: "t", Partition: 5}})
				if len(batch) == 10 || i == tc.keys-1 {
					if err := rb.ScheduleBatch(ctx, batch); err != nil {
						t.Fatalf("batch ending at key %d: %v", i, err)
					}
					batch = nil
				}
			}
			if strings.Contains(r.logs.String(), "wait in memory only") {
				t.Errorf("some bumps were not recorded in the journal")
			}
			pendingN := rb.Pending()
			early := metricValue(m.rebumpsEarly.WithLabelValues("journal_full"))
			t.Logf("%d keys: %d bumps pending, %v applied early", tc.keys, pendingN, early)
			if early == 0 || int(early)+pendingN != tc.keys {
				t.Fatalf("%d pending and %v applied early, want some applied early and %d in all", pendingN, early, tc.keys)
			}
			bumped := 0
			for i := range tc.keys {
				switch got := r.get(key(i)); got {
				case "11":
					bumped++
				case "10":
				default:
					t.Fatalf("%s = %q, want 10 or 11", key(i), got)
				}
			}
			if bumped != int(early) {
				t.Errorf("%d keys bumped a second time, want the %v applied early", bumped, early)
			}
			pending, err := PendingRebumps(store, rs, group)
			if err != nil {
				t.Fatal(err)
			}
			held := rb.heldEntries()
			if len(pending) != len(held) {
				t.Errorf("journal holds %d entries for %d pending bumps", len(pending), len(held))
			}
			for _, pr := range pending {
				if !held[journalEntry{item: pr.Journal, member: pr.member}] {
					t.Fatalf("journal entry %+v is no pending bump's", pr)
				}
			}

			restarted := NewRebumper(r.pipeline.cfg.Writer, NewMetrics(nil), r.log)
			restarted.EnableJournal(store, rs, group)
			if !restarted.recoverJournal(0) {
				t.Fatal("the restarted daemon could not read the journal")
			}
			if n := restarted.Pending(); n != pendingN {
				t.Fatalf("restart recovered %d bumps, want %d", n, pendingN)
			}
			if dropped := restarted.Flush(ctx); dropped != 0 {
				t.Fatalf("Flush dropped %d", dropped)
			}
			for i := range tc.keys {
				if got := r.get(key(i)); got != "11" {
					t.Fatalf("%s = %q after the restart's flush, want 11 (bumped once, early or recovered)", key(i), got)
				}
			}
			if pending, err := PendingRebumps(store, rs, group); err != nil || len(pending) != 0 {
				t.Errorf("journal holds %d entries, %v after every bump was applied", len(pending), err)
			}
		})
	}
}

// TestRebumperMaxPending checks the bound on pending bumps: past it, the
// bumps due first are applied at once.
func TestRebumperMaxPending(t *testing.T) {
	r := newRig(t, rebumpRules, rigOptions{})
	r.rebump.maxPending = 10
	clock := time.Now()
	r.rebump.now = func() time.Time { clock = clock.Add(time.Millisecond); return clock }
	for i := range 25 {
		r.set(fmt.Sprint("k", i), "1")
		r.rebump.Schedule(bumpOp(r, fmt.Sprint("k", i), time.Hour))
	}
	if n := r.rebump.Pending(); n != 10 {
		t.Fatalf("%d pending, want the bound, 10", n)
	}
	for i := range 25 {
		want := "2" // the 15 due first were applied early
		if i >= 15 {
			want = "1"
		}
		if got := r.get(fmt.Sprint("k", i)); got != want {
			t.Errorf("k%d = %q, want %s", i, got, want)
		}
	}
	if n := metricValue(r.metrics.rebumpsEarly.WithLabelValues("max_pending")); n != 15 {
		t.Errorf("early (max_pending) = %v, want 15", n)
	}
}

// losingApplier reports every op applied and applies none, as a route to
// memcached that loses writes after answering would.
type losingApplier struct{}

func (losingApplier) Apply(_ context.Context, ops []rules.Op, results []cacheops.Result) error {
	for i := range results {
		results[i] = cacheops.Result{Outcome: cacheops.OutcomeIncr}
	}
	return nil
}

// TestRebumpObserved: the consistency observer samples the delayed second
// bumps as it does first bumps: one lost after memcached "answered" is
// reported with its key, one applied is consistent.
func TestRebumpObserved(t *testing.T) {
	r := newRig(t, rebumpRules, rigOptions{})
	r.set("lost", "10")
	r.set("kept", "20")
	logs := &testsvc.LogBuffer{}
	o, err := observer.New(observer.Config{Sample: 1, MaxPerSecond: 1e6, Windows: []time.Duration{100 * time.Millisecond}, ConfirmAfter: 50 * time.Millisecond},
		observer.Deps{Cache: r.mc, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	for _, c := range []struct {
		key string
		w   Applier
	}{{"lost", losingApplier{}}, {"kept", r.pipeline.cfg.Writer}} {
		rb := NewRebumper(c.w, NewMetrics(nil), r.log)
		rb.SetObserver(o)
		rb.Schedule(bumpOp(r, c.key, time.Hour))
		if n := rb.Flush(context.Background()); n != 0 {
			t.Fatalf("%d delayed bumps not applied", n)
		}
	}
	waitFor(t, 10*time.Second, func() string {
		if n := o.Pending(); n > 0 {
			return "checks pending"
		}
		return ""
	})
	c := o.Totals()[0]
	if c.Inconsistent != 1 || c.Consistent != 1 {
		t.Fatalf("delayed bumps: %+v, want the lost one inconsistent and the applied one consistent\n%s", c, logs.String())
	}
	if !strings.Contains(logs.String(), "key="+r.key("lost")+" ") {
		t.Errorf("the report does not name %s:\n%s", r.key("lost"), logs.String())
	}
}
