package observer

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/rules"
)

// BenchmarkObserverSampledChange is the observer's cost per sampled
// change, end to end against a real memcached: the read before the bump,
// scheduling, and the check after the window (a bump of a rule with three
// hot-key copies, so three items per change). It reports the time and the
// memcached reads per change; ns/op includes the window wait spread over
// the changes in flight.
func BenchmarkObserverSampledChange(b *testing.B) {
	addr := testsvc.Memcached(b)
	mc := memcache.New(addr)
	o, err := New(Config{Sample: 1, MaxPerSecond: 1e9, Windows: []time.Duration{time.Millisecond}, MemcachedPerSecond: 1e9, MaxPending: 1 << 30},
		Deps{Cache: mc})
	if err != nil {
		b.Fatal(err)
	}
	defer o.Close()
	rule := &rules.Rule{Name: "bench", Kind: rules.BumpRule, Copies: 3}
	prefix := "obsbench" + testsvc.Unique() + ":"
	ops := make([]rules.Op, 3)
	res := make([]cacheops.Result, 3)
	for i := range res {
		res[i] = cacheops.Result{Outcome: cacheops.OutcomeIncr}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for c := range ops {
			ops[c] = rules.Op{Kind: rules.OpBump, Rule: rule, Key: prefix + strconv.Itoa(i%1000) + "#" + strconv.Itoa(c),
				Source: rules.Position{Topic: "t", Offset: int64(i)}}
		}
		done := o.BeforeApply(context.Background(), ops)
		done(ops, res)
	}
	for o.Pending() > 0 {
		time.Sleep(time.Millisecond)
	}
	b.StopTimer()
	reads := testutilCounter(o.m.mcReads)
	b.ReportMetric(reads/float64(b.N), "mc-reads/change")
	b.ReportMetric(float64(o.Totals()[0].Judged()+o.Totals()[0].NotJudged)/float64(b.N), "items/change")
}

// BenchmarkObserverBeforeApply is what the observer adds to every batch
// the daemon applies at the default 1% sample: the sampling decision per
// op (a batch of 2,000 bumps of distinct events; the sampled ones are
// dropped by an exhausted budget, so no memcached read is made).
//
// With a Truth and ops that carry binary log positions (as with exact
// counters), it also records the batch's latest position per partition
// for counters judged at a position (position.go).
func BenchmarkObserverBeforeApply(b *testing.B) {
	for _, positions := range []bool{false, true} {
		b.Run("positions="+strconv.FormatBool(positions), func(b *testing.B) { benchBeforeApply(b, positions, false) })
	}
	// With sampled changes waiting for their checks, every batch's ops
	// are looked up among their keys (watch.go): 1,000 keys watched.
	b.Run("watching", func(b *testing.B) { benchBeforeApply(b, false, true) })
}

// noTruth is a Truth the benchmark never asks.
type noTruth struct{}

func (noTruth) Count(context.Context, string, []rules.Value) (int64, error) { return 0, nil }
func (noTruth) LoadMembers(context.Context, string, []rules.Value) ([]string, error) {
	return nil, nil
}

func benchBeforeApply(b *testing.B, positions, watching bool) {
	deps := Deps{Cache: memcache.New("127.0.0.1:1")}
	if positions {
		deps.Truth = noTruth{}
	}
	o, err := New(Config{Sample: 0.01, MaxPerSecond: 1e9, MemcachedPerSecond: 1e-9}, deps)
	if err != nil {
		b.Fatal(err)
	}
	defer o.Close()
	o.mcBudget.tokens = 0
	if watching {
		for i := range 1000 {
			o.watch.add("w" + strconv.Itoa(i))
		}
	}
	rule := &rules.Rule{Name: "bench", Kind: rules.BumpRule}
	ops := make([]rules.Op, 2000)
	for i := range ops {
		ops[i] = rules.Op{Kind: rules.OpBump, Rule: rule, Key: "k" + strconv.Itoa(i), Source: rules.Position{Topic: "t", Partition: i % 4, Offset: int64(i)}}
		if positions {
			ops[i].Source.BinlogFile, ops[i].Source.BinlogPos = "mysql-bin.000042", int64(1000+300*i)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if done := o.BeforeApply(context.Background(), ops); done != nil {
			done(ops, nil)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(ops)), "ns/applied-op")
}
