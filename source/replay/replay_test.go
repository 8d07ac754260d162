package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/decode"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/pipeline"
	"github.com/cachewarden/cachewarden/planout"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

// ndjson joins message values into an NDJSON file body.
func ndjson(values ...[]byte) string {
	var b strings.Builder
	for _, v := range values {
		b.Write(v)
		b.WriteByte('\n')
	}
	return b.String()
}

func (r *rig) replayer(cfg Config) *Replayer {
	r.t.Helper()
	cfg.Pipeline = r.pipeline
	if cfg.Logger == nil {
		cfg.Logger = r.log
	}
	rp, err := New(cfg)
	if err != nil {
		r.t.Fatal(err)
	}
	return rp
}

// TestReplayFile replays a file in batches of two against real memcached
// and MySQL: bumps and set ops are applied batch by batch, counter deltas
// spread over several batches end as one recount per key, with the
// values MySQL has.
func TestReplayFile(t *testing.T) {
	db, dsn := testsvc.MySQL(t)
	r := newRig(t, daemonRules, rigOptions{mysqlDSN: dsn})
	createComments(t, db, 9, 3)
	createComments(t, db, 10, 2)

	comment := func(op string, id, post int) []byte {
		if op == "d" {
			return debezium(op, "blog", "comments", row("id", id, "post_id", post), nil).Value
		}
		return debezium(op, "blog", "comments", nil, row("id", id, "post_id", post)).Value
	}
	input := ndjson(
		comment("c", 1, 9), // batch 1
		debezium("c", "shop", "users", nil, row("id", 1, "name", "a")).Value,
		comment("c", 2, 10), // batch 2
		[]byte("not json"),
		comment("d", 1, 9), // batch 3
		debezium("c", "shop", "user_interests", nil, row("user_id", 7, "interest_id", 2)).Value,
		debezium("u", "shop", "users", row("id", 1, "name", "a"), row("id", 1, "name", "b")).Value, // batch 4
		comment("c", 3, 9),
		nil, // batch 5: a tombstone
		debezium("d", "shop", "user_interests", row("user_id", 7, "interest_id", 1), nil).Value,
	)

	for _, tt := range []struct {
		name        string
		maxPending  int
		setAppend   bool
		recounts    int64
		setRebuilds int64
		bumpedUser1 string
	}{
		// Post 9 has deltas in batches 1, 3 and 4, post 10 in batch 2:
		// two keys, two recounts. interests:7 has tokens in batches 3
		// and 5: its rule has no load query, so it is deleted, once.
		{"one recount per key", 0, false, 2, 1, "12"},
		// Appending instead, the tokens land in order.
		{"set tokens appended", 0, true, 2, 0, "14"},
		// With room for one key the recounts and rebuilds run after every
		// batch that has one: a key seen again is recounted again.
		{"recounts run early", 1, false, 4, 2, "16"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.maxPending == 0 && !tt.setAppend {
				r.set("ns:user:1", "10")
			}
			r.set("interests:7", "+1 ")
			r.set("comments:9", "100")
			r.set("comments:10", "50")
			before := testsvc.Metric(t, r.reg, "cachewarden_ops_total", "kind=recount", "outcome=recounted")

			var report bytes.Buffer
			rp := r.replayer(Config{BatchSize: 2, MaxPendingRecounts: tt.maxPending, SetAppend: tt.setAppend, Report: &report})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			sum, err := rp.Replay(ctx, Input{File: strings.NewReader(input), FileLines: 10})
			if err != nil {
				t.Fatalf("Replay: %v", err)
			}
			if got := r.get("comments:9"); got != "3" {
				t.Errorf("comments:9 = %q, want MySQL's 3", got)
			}
			if got := r.get("comments:10"); got != "2" {
				t.Errorf("comments:10 = %q, want MySQL's 2", got)
			}
			if got := r.get("ns:user:1"); got != tt.bumpedUser1 {
				t.Errorf("ns:user:1 = %q, want %s (bumped in two batches)", got, tt.bumpedUser1)
			}
			wantSet := "<missing>"
			if tt.setAppend {
				wantSet = "+1 +2 -1 "
			}
			if got := r.get("interests:7"); got != wantSet {
				t.Errorf("interests:7 = %q, want %q", got, wantSet)
			}
			recounted := testsvc.Metric(t, r.reg, "cachewarden_ops_total", "kind=recount", "outcome=recounted") - before
			if int64(recounted) != tt.recounts || sum.Recounts != tt.recounts {
				t.Errorf("%v recounts applied, summary %d; want %d", recounted, sum.Recounts, tt.recounts)
			}
			if n := testsvc.Metric(t, r.reg, "cachewarden_ops_total", "kind=count", "outcome=incr"); n != 0 {
				t.Errorf("%v counter deltas applied; replay must recount instead", n)
			}
			want := Summary{Messages: 10, Events: 8, Skipped: 1, Poison: 1, Recounts: tt.recounts, SetRebuilds: tt.setRebuilds}
			// Ops: bumps of user 1 (batches 1 and 4), the bumps of the
			// generations of the set and count rules' tables that cover
			// the poison message (its table is unknown), and the two set
			// appends when appending.
			want.Ops = 4
			if tt.setAppend {
				want.Ops = 6
			}
			got := sum
			got.Duration = 0
			if got != want {
				t.Errorf("summary %+v, want %+v", got, want)
			}
			if rep := report.String(); !strings.HasPrefix(rep, "line 4: cdc: decode") || strings.Count(rep, "\n") != 1 {
				t.Errorf("report = %q, want one line for line 4", rep)
			}
		})
	}
}

// TestReplayDryRunFile checks that a dry run of a file writes exactly what
// PlanStream writes, on stdout and on the error stream, followed on stdout
// by the recounts and set rebuilds a replay runs at its end.
func TestReplayDryRunFile(t *testing.T) {
	input, err := os.ReadFile("../../cmd/cachewarden/testdata/plan/maxwell.ndjson")
	if err != nil {
		t.Fatal(err)
	}
	rs, err := rulefile.LoadPaths("../../cmd/cachewarden/testdata/plan/inventory.yaml")
	if err != nil {
		t.Fatal(err)
	}
	w := cacheops.NewTextApplier(memcache.New(testsvc.ClosedAddr(t)), nil, nil, cacheops.Config{}, nil)
	p, err := pipeline.New(pipeline.Config{Rules: rs, Writer: w})
	if err != nil {
		t.Fatal(err)
	}
	dec := &decode.Decoder{Format: decode.FormatMaxwell}
	var planOut, planErr bytes.Buffer
	psum, err := planout.Stream(context.Background(), bytes.NewReader(input), &planOut, &planErr, dec, rs, planout.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var out, report bytes.Buffer
	rp, err := New(Config{Pipeline: p, Report: &report, BatchSize: 3})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := rp.DryRun(context.Background(), Input{File: bytes.NewReader(input), Decoder: dec}, &out)
	if err != nil {
		t.Fatal(err)
	}
	want := planOut.String() + endOpLines(t, rs, planOut.String())
	if out.String() != want || planOut.Len() == 0 {
		t.Errorf("dry run output differs from plan's followed by the end ops:\n--- dry run\n%s--- want\n%s", out.String(), want)
	}
	if report.String() != planErr.String() || planErr.Len() == 0 {
		t.Errorf("dry run reports differ from plan's:\n--- dry run\n%s--- plan\n%s", report.String(), planErr.String())
	}
	if sum.Messages != int64(psum.Lines) || sum.Ops != int64(psum.Ops) || sum.Poison != int64(psum.Failed) || sum.Events != int64(psum.Events) {
		t.Errorf("summary %+v does not match plan's %+v", sum, psum)
	}
}

// endOpLines derives, from `plan` output, the lines a dry run adds at
// its end: one per counter or set key, in key order, without "line".
func endOpLines(t *testing.T, rs *rules.RuleSet, plan string) string {
	t.Helper()
	byName := map[string]*rules.Rule{}
	for _, r := range rs.Rules() {
		byName[r.Name] = r
	}
	ends := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(plan), "\n") {
		var op struct{ Rule, Op, Key string }
		if err := json.Unmarshal([]byte(line), &op); err != nil {
			t.Fatalf("plan line %q: %v", line, err)
		}
		kind := ""
		switch {
		case op.Op == "count" || op.Op == "recount":
			kind = "recount"
		case strings.HasPrefix(op.Op, "set_") && byName[op.Rule].Query != "":
			kind = "set_rebuild"
		case strings.HasPrefix(op.Op, "set_"):
			kind = "set_delete"
		default:
			continue
		}
		if _, ok := ends[op.Key]; !ok {
			ends[op.Key] = fmt.Sprintf(`{"rule":%q,"op":%q,"key":%q}`, op.Rule, kind, op.Key) + "\n"
		}
	}
	keys := make([]string, 0, len(ends))
	for k := range ends {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(ends[k])
	}
	if b.Len() == 0 {
		t.Fatal("the plan has no counter or set op: the end ops prove nothing")
	}
	return b.String()
}

// TestReplaySummaryString checks the summary line.
func TestReplaySummaryString(t *testing.T) {
	s := Summary{Messages: 5000, Events: 4990, Skipped: 7, Poison: 3, Ops: 3200, Recounts: 45, Failed: 1, Duration: 2 * time.Second}
	s.SetRebuilds = 12
	want := "5000 messages in 2s (2500 msg/s): 4990 events, 7 skipped, 3 poison; 3200 ops, 45 recounts, 12 set rebuilds, 1 failed"
	if got := s.String(); got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	s.PendingRecounts = 9
	if got := s.String(); !strings.HasSuffix(got, "; 9 recounts and set rebuilds not run") {
		t.Errorf("String() = %q, want the recounts not run", got)
	}
	if s.Failures() != 4 {
		t.Errorf("Failures() = %d, want 4", s.Failures())
	}
}

// TestReplayInterrupted cancels a replay that waits for memcached: it
// returns the context's error and counts the recounts it did not run.
func TestReplayInterrupted(t *testing.T) {
	r := newRig(t, daemonRules, rigOptions{mcAddr: testsvc.ClosedAddr(t)})
	input := ndjson(
		debezium("c", "blog", "comments", nil, row("id", 1, "post_id", 9)).Value,
		debezium("c", "blog", "comments", nil, row("id", 2, "post_id", 10)).Value,
		debezium("c", "shop", "users", nil, row("id", 1)).Value,
	)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	var sum Summary
	var err error
	go func() {
		defer close(done)
		sum, err = r.replayer(Config{}).Replay(ctx, Input{File: strings.NewReader(input)})
	}()
	waitFor(t, 10*time.Second, func() string {
		if testsvc.Metric(t, r.reg, "cachewarden_apply_retries_total") < 1 {
			return "no retry yet"
		}
		return ""
	})
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Replay ignored the cancellation")
	}
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Replay = %v, want context.Canceled", err)
	}
	if sum.PendingRecounts != 2 || sum.Recounts != 0 {
		t.Errorf("summary %+v, want 2 recounts not run", sum)
	}
}
