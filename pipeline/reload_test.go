package pipeline

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

// TestSetRulesBetweenBatches swaps the rules while a batch waits for
// memcached: that batch finishes with the rules it was planned with, and
// the next batch is planned with the new ones.
func TestSetRulesBetweenBatches(t *testing.T) {
	addr := testsvc.ClosedAddr(t)
	r := newRig(t, daemonRules, rigOptions{mcAddr: addr})
	done := make(chan error, 1)
	var b Batch
	go func() {
		done <- r.pipeline.Process(context.Background(), &b, []Message{userMessage(t, 0, 1)}, CoalesceOptions{})
	}()
	waitFor(t, 10*time.Second, func() string {
		if n := metricValue(r.metrics.applyRetries); n < 1 {
			return "the batch is not waiting for memcached yet"
		}
		return ""
	})
	renamed := strings.ReplaceAll(strings.ReplaceAll(daemonRules, "ns:user:{id}", "ns:member:{id}"), "PREFIX", r.prefix)
	rs, err := rulefile.Parse("renamed.yaml", []byte(renamed))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.pipeline.SetRules(rs, nil, nil); err != nil {
		t.Fatal(err)
	}
	if r.pipeline.Rules() != rs {
		t.Error("Rules() does not return the rules set")
	}
	testsvc.PrivateMemcached(t, testsvc.MemcachedOptions{Addr: addr})
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Process: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the batch did not finish after memcached came back")
	}
	if err := r.pipeline.Process(context.Background(), &b, []Message{userMessage(t, 1, 2)}, CoalesceOptions{}); err != nil {
		t.Fatal(err)
	}
	for key, bumped := range map[string]bool{"ns:user:1": true, "ns:member:1": false, "ns:member:2": true, "ns:user:2": false} {
		if got := r.get(key); (got != "<missing>") != bumped {
			t.Errorf("%s = %q, bumped want %v", key, got, bumped)
		}
	}
}

// TestSetRulesConcurrent plans batches on several goroutines while the
// rules change under them (run with -race): every batch is planned
// wholly with one rule set.
func TestSetRulesConcurrent(t *testing.T) {
	r := newRig(t, daemonRules, rigOptions{})
	var sets [2]string
	var swaps sync.WaitGroup
	var stop atomic.Bool
	for i, key := range []string{"ns:user:{id}", "ns:member:{id}"} {
		rs, err := rulefile.Parse("rules.yaml", []byte(strings.ReplaceAll(strings.ReplaceAll(daemonRules, "ns:user:{id}", key), "PREFIX", r.prefix)))
		if err != nil {
			t.Fatal(err)
		}
		sets[i] = strings.TrimSuffix(strings.SplitN(key, "{", 2)[0], ":")
		swaps.Go(func() {
			for !stop.Load() {
				r.pipeline.SetRules(rs, nil, nil)
			}
		})
	}
	defer swaps.Wait()
	defer stop.Store(true)
	errs := make(chan error, 4)
	for g := range 4 {
		go func() {
			var b Batch
			for i := range 500 {
				msgs := []Message{userMessage(t, int64(i), g*100+i), userMessage(t, int64(i)+1, g*100+i+50)}
				r.pipeline.Plan(&b, msgs, CoalesceOptions{})
				if len(b.Ops) != 2 {
					errs <- fmt.Errorf("%d ops, want 2", len(b.Ops))
					return
				}
				a, c := strings.Contains(b.Ops[0].Key, sets[0]+":"), strings.Contains(b.Ops[1].Key, sets[0]+":")
				if a != c {
					errs <- fmt.Errorf("one batch planned with two rule sets: %s, %s", b.Ops[0].Key, b.Ops[1].Key)
					return
				}
			}
			errs <- nil
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}
