package consumer

import (
	"context"
	"testing"
	"time"

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
