package kafka

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/pipeline"
	"github.com/cachewarden/cachewarden/rules"
)

// TestOffsetCommitter drives the committer with a commit function the
// test releases one call at a time.
func TestOffsetCommitter(t *testing.T) {
	calls := make(chan int64)
	results := make(chan error)
	var failures []string
	c := newOffsetCommitter(func(next int64) error {
		calls <- next
		return <-results
	}, func(err error, attempt int) { failures = append(failures, fmt.Sprintf("%d: %v", attempt, err)) })
	c.backoff = func(int) time.Duration { return time.Millisecond }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.run(ctx)
	}()
	room := func(limit int) int {
		t.Helper()
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Millisecond)
		defer rcancel()
		n, err := c.room(rctx, limit)
		if errors.Is(err, context.DeadlineExceeded) {
			return 0 // would wait
		}
		if err != nil {
			t.Fatalf("room: %v", err)
		}
		return n
	}
	expectCommit := func(want int64) {
		t.Helper()
		select {
		case got := <-calls:
			if got != want {
				t.Fatalf("commit of %d, want %d", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no commit of %d", want)
		}
	}

	if n := room(100); n != 100 {
		t.Fatalf("room before the first batch = %d, want 100", n)
	}
	c.begin(1000)
	c.applied(1040) // 40 applied, committing
	expectCommit(1040)
	if n := room(100); n != 60 {
		t.Fatalf("room with 40 uncommitted = %d, want 60", n)
	}
	c.applied(1070)
	c.applied(1100) // 100 uncommitted: the next batch must wait
	if n := room(100); n != 0 {
		t.Fatalf("room with 100 uncommitted = %d, want to wait", n)
	}
	results <- nil     // 1040 committed
	expectCommit(1100) // the latest applied, not 1070
	if n := room(100); n != 40 {
		t.Fatalf("room after committing 1040 = %d, want 40", n)
	}
	results <- nil
	// The commit's acknowledgement lands in the committer's goroutine.
	for deadline := time.Now().Add(5 * time.Second); room(100) != 100; {
		if time.Now().After(deadline) {
			t.Fatalf("room with everything committed = %d, want 100", room(100))
		}
		time.Sleep(time.Millisecond)
	}

	// A failed commit is tried again; meanwhile the offset stays
	// uncommitted.
	c.applied(1101)
	expectCommit(1101)
	results <- errors.New("coordinator moved")
	expectCommit(1101)
	if n := room(1); n != 0 {
		t.Fatalf("room(1) while 1101 is uncommitted = %d, want to wait", n)
	}
	results <- nil
	for deadline := time.Now().Add(5 * time.Second); room(1) != 1; {
		if time.Now().After(deadline) {
			t.Fatal("1101 not committed after the retry")
		}
		time.Sleep(time.Millisecond)
	}
	if len(failures) != 1 || failures[0] != "1: offset 1101: coordinator moved" {
		t.Errorf("failures reported: %q", failures)
	}
	cancel()
	<-done
}

func TestBatchSourceTake(t *testing.T) {
	chunk := func(offsets ...int64) []pipeline.Message {
		var ms []pipeline.Message
		for _, o := range offsets {
			ms = append(ms, pipeline.Message{Pos: rules.Position{Topic: "t", Offset: o}})
		}
		return ms
	}
	offsets := func(ms []pipeline.Message) []int64 {
		var out []int64
		for _, m := range ms {
			out = append(out, m.Pos.Offset)
		}
		return out
	}
	for _, tc := range []struct {
		name      string
		pending   []pipeline.Message
		highWater int64
		max       int
		stopAtEnd bool
		end       int64 // for takeBefore; 0: test take
		want      []int64
		wantEnd   bool
		left      int
	}{
		{name: "take all", pending: chunk(5, 6, 7), highWater: 20, max: 10, want: []int64{5, 6, 7}},
		{name: "take up to max", pending: chunk(5, 6, 7), highWater: 20, max: 2, want: []int64{5, 6}, left: 1},
		{name: "first batch stops at the last stable offset", pending: chunk(5, 6, 7), highWater: 7, max: 10, stopAtEnd: true, want: []int64{5, 6}, wantEnd: true, left: 1},
		{name: "unknown last stable offset does not stop", pending: chunk(5, 6), max: 10, stopAtEnd: true, want: []int64{5, 6}},
		{name: "before end", pending: chunk(5, 6, 7, 8), max: 10, end: 7, want: []int64{5, 6}, wantEnd: true, left: 2},
		{name: "end-1 taken", pending: chunk(5, 6), max: 10, end: 7, want: []int64{5, 6}, wantEnd: true},
		{name: "gap past end", pending: chunk(5, 9), max: 10, end: 7, want: []int64{5}, wantEnd: true, left: 1},
		{name: "before end, max first", pending: chunk(5, 6, 7), max: 1, end: 7, want: []int64{5}, left: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := batchSource{pending: tc.pending, stable: tc.highWater}
			var got []pipeline.Message
			var end bool
			if tc.end > 0 {
				got, end = s.takeBefore(nil, tc.max, tc.end)
			} else {
				got, end = s.take(nil, tc.max, tc.stopAtEnd)
			}
			if !slices.Equal(offsets(got), tc.want) || end != tc.wantEnd || len(s.pending) != tc.left {
				t.Errorf("took %v, end %v, %d left; want %v, %v, %d left", offsets(got), end, len(s.pending), tc.want, tc.wantEnd, tc.left)
			}
		})
	}
}

func TestLogGap(t *testing.T) {
	for _, tc := range []struct {
		name                    string
		expect, first, logStart int64
		gap                     bool
		reason                  string
	}{
		{"unknown start", -1, 500, 400, false, ""},
		{"contiguous", 100, 100, 0, false, ""},
		{"marker or compaction gap", 100, 103, 0, false, ""},
		{"fetched before retention", 100, 100, 150, false, ""},
		{"removed by retention", 100, 150, 150, true, pipeline.LostRetention},
		{"reset to the end past retention", 100, 900, 150, true, pipeline.LostRetention},
		{"log restarted before the commit", 5000, 0, 0, true, pipeline.LostOffsetReset},
	} {
		gap, why := logGap(tc.expect, tc.first, tc.logStart)
		if gap != tc.gap || (gap && gapReason(tc.expect, tc.first) != tc.reason) {
			t.Errorf("%s: logGap = %v (%s), reason %s; want %v, %s", tc.name, gap, why, gapReason(tc.expect, tc.first), tc.gap, tc.reason)
		}
	}
}

// TestCoverGapWaitsForLease: the fallback bumps of a log gap that the
// write guard refuses (the membership may have expired) are not given up,
// which would leave the partition unconsumed while it stays assigned: the
// partition waits for its lease, as a refused batch does, then sends them,
// and counts the lost changes once.
func TestCoverGapWaitsForLease(t *testing.T) {
	r := newRig(t, fallbackRules, rigOptions{})
	r.set("fb:shop.users", "5")
	d := &Daemon{p: r.pipeline, lease: newMemberLease(time.Minute), m: r.metrics, log: r.log}
	release, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	guarded := cacheops.WithGuard(release, func() error { return d.lease.check("m1", time.Now()) })
	go func() {
		time.Sleep(100 * time.Millisecond)
		d.lease.ack("m1", time.Now())
	}()
	if !d.coverGap(guarded, release, r.log, "m1", "t", pipeline.LostRetention, rules.Position{Topic: "t", Offset: 7}) {
		t.Fatal("coverGap gave up on a refused write while the partition is still assigned")
	}
	if got := r.get("fb:shop.users"); got != "6" {
		t.Errorf("fb:shop.users = %q, want 6 (bumped once the lease held)", got)
	}
	if n := metricValue(r.metrics.abandoned); n != 1 {
		t.Errorf("abandoned = %v, want 1", n)
	}
	if n := testsvc.Metric(t, r.reg, "cachewarden_invalidations_lost_total", "reason="+pipeline.LostRetention, "covered=fallback"); n != 1 {
		t.Errorf("lost retention/fallback = %v, want 1", n)
	}
}
