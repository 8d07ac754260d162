package consumer

import (
	"context"
	"errors"
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
	r := newRig(t, rebumpRules, rigOptions{mcAddr: deadAddr(t)})
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
